/* nbd-fscache warm: reading an access trace (docs/format.md, "Access
 * traces").  See trace-read.c for the validation rules.
 */
#ifndef NBD_FSCACHE_TRACE_READ_H
#define NBD_FSCACHE_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

/* One range of the trace, in recorded order. */
struct trace_entry {
  uint64_t offset;              /* bytes, a multiple of unit */
  uint64_t length;              /* bytes, clipped to the export's end */
};

struct trace {
  uint64_t size;                /* export size the trace was recorded on */
  uint32_t block_size;          /* the object's block size then */
  uint32_t unit;                /* 4096 */
  uint64_t started_ms;          /* milliseconds since the epoch */
  struct trace_entry *entries;  /* malloc'd, nr_entries of them */
  size_t nr_entries;
  uint64_t total_bytes;         /* sum of the entries' lengths */
  size_t good_chunks;           /* chunks read, all valid */
  /* Why reading stopped before the end of the file, NULL if it did
   * not (a static string), and at which byte of the file.
   */
  const char *stopped;
  uint64_t stopped_at;
};

/* Read and validate the trace in FILE.  Returns 0 and fills *T (free
 * it with trace_free) if at least the header is good: a bad or
 * truncated chunk only ends the entries early (T->stopped says why).
 * Returns -1 with a message in ERRBUF (what is wrong, without the file
 * name) if the file cannot be read or its header is not that of a
 * version 1 trace.  Prints nothing.
 */
extern int trace_read (const char *file, struct trace *t,
                       char *errbuf, size_t errlen);

/* Free what trace_read allocated. */
extern void trace_free (struct trace *t);

#endif /* NBD_FSCACHE_TRACE_READ_H */
