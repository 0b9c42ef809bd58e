/* libfscache: recording an access trace (trace.c; the file format is
 * docs/format.md, "Access traces").
 */
#ifndef FSC_TRACE_H
#define FSC_TRACE_H

#include <stdbool.h>
#include <stdint.h>

/* The file's layout (docs/format.md, "Access traces"), little-endian;
 * the one definition for the writer here and nbd-fscache's reader.
 */
#define FSC_TRACE_MAGIC "NBDFSTRC"      /* 8 bytes, no NUL */
#define FSC_TRACE_VERSION 1
#define FSC_TRACE_HEADER_SIZE 64
#define FSC_TRACE_UNIT_SHIFT 12         /* entries are 4 KiB units */
#define FSC_TRACE_UNIT (1u << FSC_TRACE_UNIT_SHIFT)
enum {                                  /* header field offsets */
  FSC_TH_MAGIC = 0, FSC_TH_VERSION = 8, FSC_TH_HEADER_SIZE = 12,
  FSC_TH_SIZE = 16, FSC_TH_BLOCK_SIZE = 24, FSC_TH_UNIT = 28,
  FSC_TH_STARTED = 32, FSC_TH_KEY_LO = 40, FSC_TH_KEY_HI = 48,
  FSC_TH_CHECKSUM = 56,
};
#define FSC_TRACE_CHUNK_MAGIC "FTRC"    /* 4 bytes, no NUL */
#define FSC_TRACE_CHUNK_HEAD 8          /* magic, then a u32 count */
#define FSC_TRACE_ENTRY 16              /* offset u64, length u32, ms u32 */
#define FSC_TRACE_CHUNK_MAX 4096        /* entries per chunk */

struct fsc_trace;

/* Create (truncate) PATH for a trace of at most LIMIT bytes of
 * distinct data.  Returns 0, or -1 with errno.
 */
extern int fsc_trace_open (const char *path, uint64_t limit,
                           struct fsc_trace **tp);

/* Tie the trace to the object of key hash KEY_LO/KEY_HI, of SIZE bytes
 * in blocks of BLOCK_SIZE, and write the header: the first call does,
 * later ones only compare.  Returns 1 if reads of that object are
 * traced, 0 if the trace is another object's, -1 with errno if the
 * header could not be written (nothing is traced then).
 */
extern int fsc_trace_bind (struct fsc_trace *t, uint64_t key_lo,
                           uint64_t key_hi, uint64_t size,
                           uint32_t block_size);

/* A client read of [OFFSET, OFFSET+COUNT) of the bound object. */
extern void fsc_trace_note (struct fsc_trace *t, uint64_t offset,
                            uint64_t count);

/* Write what is pending and close; *RECORDED gets the bytes recorded.
 * Returns 0, or -1 with errno if any write failed (the file then holds
 * the chunks before the failure).
 */
extern int fsc_trace_close (struct fsc_trace *t, uint64_t *recorded);

#endif /* FSC_TRACE_H */
