/* libfscache: every read, write and sync of a cache file goes through
 * here.
 *
 * Two reasons for one layer: the loops that turn short reads and
 * writes into whole ones are written once, and tests can make the
 * cache's own I/O fail on purpose.  A fault spec (from the environment
 * variable NBD_FSCACHE_FAULTS, see tests/README.md) names an operation,
 * a kind of file, the Nth such call (counted from 1 per process and
 * cache) and an errno:
 *
 *   write:data:3:EIO        the 3rd write to a data file fails with EIO
 *   sync:index:1+:EIO       every index sync from the 1st on fails
 *   read:any:10+:EIO        every read from the 10th on fails
 *
 * Kinds: data, index, sums (the sub-block checksums), wlog (the write
 * log of writeback mode), any.
 *
 * Faults are matched in order; several may be given, separated by
 * commas.  Counters are atomic, so no lock is taken.
 */
#ifndef FSC_IO_H
#define FSC_IO_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum fsc_file_kind {
  FSC_FILE_DATA = 0,
  FSC_FILE_INDEX = 1,
  FSC_FILE_SUMS = 2,
  FSC_FILE_WLOG = 3,            /* the write log (writeback mode) */
  FSC_FILE_KINDS = 4,
};

enum fsc_io_op {
  FSC_OP_READ = 0,
  FSC_OP_WRITE = 1,
  FSC_OP_SYNC = 2,
  FSC_OPS = 3,
};

#define FSC_IO_MAX_FAULTS 8

struct fsc_fault {
  int op;                       /* enum fsc_io_op */
  int kind;                     /* enum fsc_file_kind, or -1 for any */
  uint64_t nth;                 /* 1-based call number */
  bool sticky;                  /* fail from nth on, not only at nth */
  int err;                      /* errno to fail with */
};

/* Called after each successful write (BUF, N, OFF) or sync (BUF NULL)
 * of a cache file: tests record these to rebuild crash states.
 */
typedef void fsc_io_trace_fn (void *opaque, int op, int kind,
                              const void *buf, size_t n, uint64_t off);

struct fsc_io {
  fsc_io_trace_fn *trace;       /* NULL: no tracing */
  void *trace_opaque;
  struct fsc_fault faults[FSC_IO_MAX_FAULTS];
  unsigned nfaults;
  uint64_t calls[FSC_OPS][FSC_FILE_KINDS];  /* atomic counters */
  uint64_t injected;                        /* atomic: faults fired */
};

/* Parse SPEC (may be NULL or "") into IO.  Returns -1 with errno =
 * EINVAL on a malformed spec.
 */
extern int fsc_io_init (struct fsc_io *io, const char *spec);

/* Read up to N bytes at OFF, looping over short reads.  Returns the
 * number read (less than N only at end of file) or -1 with errno.
 */
extern ssize_t fsc_io_pread (struct fsc_io *io, int kind, int fd,
                             void *buf, size_t n, uint64_t off);

/* Whether this thread's reads of data files since its last
 * fsc_io_disk_mark needed the disk: fsc_io_pread reads data files from
 * the page cache first (RWF_NOWAIT) and notes a read that could not be
 * served from there.  The latency guard (core/ops/guard.c) times only
 * hits that read the disk: a hit from memory that took long waited for
 * a CPU, not the disk, and the upstream is no cure for that.  Where
 * RWF_NOWAIT is refused (kernels before 4.14, some file systems) every
 * read counts as the disk's, as before.
 */
extern void fsc_io_disk_mark (void);
extern bool fsc_io_disk_touched (void);
/* The time those of them that needed the disk took, in nanoseconds
 * (the clock is read only for them).
 */
extern uint64_t fsc_io_disk_ns (void);

/* Write all N bytes at OFF.  Returns 0 or -1 with errno. */
extern int fsc_io_pwrite (struct fsc_io *io, int kind, int fd,
                          const void *buf, size_t n, uint64_t off);

/* fdatasync FD.  Returns 0 or -1 with errno. */
extern int fsc_io_sync (struct fsc_io *io, int kind, int fd);

#endif /* FSC_IO_H */
