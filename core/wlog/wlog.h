/* libfscache: the write log of fscache-mode=writeback.
 *
 * In writeback mode a client's write is acknowledged once it is in the
 * object's write log, NAME.wlog, beside the object's other files: an
 * append-only file of checksummed records (docs/format.md, "Write
 * log"), each a write, zero or trim of whole 4 KiB units, tagged with
 * a sequence number and its epoch, which a FLUSH or a completed FUA
 * write ends (rule 6, atop writeback.c).  A FLUSH (or FUA) syncs the
 * log: one local fdatasync, never an upstream round trip.
 * Reads see the newest logged version of every unit through an
 * in-memory extent map and take the rest from the object (cache and
 * upstream).  A background writer (writeback.c) sends the log to the
 * upstream one epoch at a time, each epoch followed by an upstream
 * flush, so that the upstream always holds a state the client had at
 * one of its flushes or completed FUA writes plus part of the next
 * epoch; only then does the log's tail advance and its space get
 * punched.  docs/design.md, "Writeback", says why a log and not dirty
 * bits in the index.
 *
 * The log is independent of the object's index: the object stays a
 * clean copy of the upstream (the writer keeps it so with
 * fsc_object_write_begin/end, as a writethrough write would), and can
 * be withdrawn, evicted, culled or discarded without losing a dirty
 * byte.  The log has its own flock: one process at a time.
 *
 * Like everything in core/, these return -1 with errno and print
 * nothing; what the caller should say loudly comes back as notices.
 */
#ifndef FSC_WLOG_H
#define FSC_WLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fscache.h"

struct fsc_wlog;

#define FSC_WLOG_UNIT 4096u             /* the log's unit of data */
#define FSC_WLOG_SAMPLES 8              /* coherency sample regions */
#define FSC_WLOG_DEFAULT_DIRTY_MAX (UINT64_C (1) << 30)

/* The upstream's coherency sample, region by region (the filter's
 * fscache-validate=sample), so that the log can tell regions its own
 * pending writes may have changed from regions someone else changed.
 */
struct fsc_wlog_sample {
  unsigned n;                           /* 0: not sampled */
  uint64_t off[FSC_WLOG_SAMPLES];
  uint32_t len[FSC_WLOG_SAMPLES];
  uint64_t hash[FSC_WLOG_SAMPLES];      /* XXH3 of each region */
};

struct fsc_wlog_params {
  const void *key;              /* the object's key (fsc_object_params) */
  size_t key_len;
  uint64_t size;                /* upstream size now */
  const char *generation;       /* NULL or the fscache-generation */
  struct fsc_wlog_sample sample;/* the upstream's now (n = 0: none) */
  uint64_t dirty_max;           /* bytes of log before writes wait */
};

/* Why a log with dirty data does not fit the upstream (ESTALE). */
enum fsc_wlog_mismatch {
  FSC_WLOG_FITS = 0,
  FSC_WLOG_SIZE_CHANGED = 1,
  FSC_WLOG_GENERATION_CHANGED = 2,
  FSC_WLOG_SAMPLE_CHANGED = 3,
};
extern const char *fsc_wlog_mismatch_name (int m);

/* What a log holds (fsc_wlog_open, fsc_wlog_counters, fsc_wlog_inspect). */
struct fsc_wlog_info {
  uint64_t dirty_bytes;         /* data, zeroes and trims not yet
                                 * written back (bytes of the export) */
  uint64_t log_bytes;           /* bytes of log they take */
  uint64_t records;
  uint64_t epochs;              /* flush epochs waiting */
  uint64_t oldest_ms;           /* realtime ms of the oldest, 0: none */
  uint64_t size;                /* upstream size recorded */
  bool has_generation;          /* and its fscache-generation, if any */
  char generation[FSC_GEN_MAX + 1];
  int mismatch;                 /* enum fsc_wlog_mismatch */
  uint64_t dropped_records;     /* torn records cut off at open */
  uint64_t damaged_records;     /* flushed records found damaged: their
                                 * bad units read as EIO and stop the
                                 * writer */
  bool created;                 /* no log was there */
  /* A log that stops decoding before a durable point (Rule 7 atop
   * wlog.c): the open is refused with EUCLEAN and the file is left as
   * it is.  The counters above then describe the intact records before
   * the damage, the ones a salvage (FSC_WLOG_SALVAGE) writes back.
   */
  bool damaged;
  uint64_t damage_seq;          /* the first record that does not decode */
  uint64_t damage_pos;          /* ... its byte offset in the log file */
  uint64_t damage_cover;        /* the marker after it that covers it:
                                 * every record below was synced */
  uint64_t lost_records;        /* intact writes, zeroes and trims found
                                 * after the damage: written back by
                                 * nothing, since the damaged one would
                                 * come first */
  uint64_t lost_bytes;          /* ... the export bytes they cover */
  uint64_t lost_start, lost_end;/* ... the span of the export they touch
                                 * (lost_end 0: none) */
  uint64_t lost_last_seq;       /* the last record found after it */
};

/* Flags of fsc_wlog_open. */
#define FSC_WLOG_CREATE 1u      /* create the log if missing */
#define FSC_WLOG_SALVAGE 2u     /* a damaged log (EUCLEAN without it)
                                 * opens with the records before the
                                 * damage only, for a tool to write them
                                 * back; nothing may be appended */

/* Open the write log of the object with P->key in CACHE, taking its
 * lock, and recover it: records are checked from the durable tail on.
 * The first bad one ends the log if nothing after it shows it was
 * synced (a torn tail, never promised: cut off); if a later marker
 * covers it, the log is damaged and the open fails with EUCLEAN,
 * INFO->damage_* saying where, the file unchanged (Rule 7 atop
 * wlog.c).  A log with records is checked against P: a
 * different size or generation, or a sampled region that differs
 * although no pending record touches it, is ESTALE (INFO->mismatch
 * says which), and nothing is changed.  An empty log takes P's
 * coherency data.  Errors: ENOENT (no log, without FSC_WLOG_CREATE),
 * EBUSY (another process has it), EBADMSG (header unreadable or of
 * another key: refuse rather than guess), EUCLEAN (damaged in the
 * middle), ESTALE, I/O errors.
 */
extern int fsc_wlog_open (struct fsc_cache *cache,
                          const struct fsc_wlog_params *p, unsigned flags,
                          struct fsc_wlog **wlp, struct fsc_wlog_info *info);

/* Stop the writer (if started), write the header, drop the lock. */
extern void fsc_wlog_close (struct fsc_wlog *wl);

/* True if the log holds records not yet written back. */
extern bool fsc_wlog_dirty (struct fsc_wlog *wl);

/* The client's operations.  Each returns 0 or -1 with errno: EIO once
 * the log failed (a cache write or sync error: everything after it may
 * be lost, so nothing more is accepted), or an upstream error reading
 * the rest of a unit for an unaligned write.  A write is acknowledged
 * once it is in the log (FUA: durable, and its epoch ended, so that
 * what is written after it reaches the upstream after it); writes
 * beyond the dirty bound
 * wait for the writer.  OBJ and UP serve what the log does not hold
 * (the rest of a unit an unaligned write covers).
 */
extern int fsc_wlog_pwrite (struct fsc_wlog *wl, struct fsc_object *obj,
                            const struct fsc_upstream *up, const void *buf,
                            uint32_t count, uint64_t offset, bool fua);
/* FLAGS of a zero: FSC_WLOG_FUA (1, as the bool FUA of the others),
 * FSC_WLOG_NO_HOLE (the client's NBD_CMD_FLAG_NO_HOLE: written back
 * as a zero that keeps the range allocated, never merged with a zero
 * that may trim).
 */
#define FSC_WLOG_FUA 1u
#define FSC_WLOG_NO_HOLE 2u
extern int fsc_wlog_zero (struct fsc_wlog *wl, struct fsc_object *obj,
                          const struct fsc_upstream *up, uint32_t count,
                          uint64_t offset, unsigned flags);
extern int fsc_wlog_trim (struct fsc_wlog *wl, uint32_t count,
                          uint64_t offset, bool fua);
/* End the current epoch and make everything before it durable. */
extern int fsc_wlog_flush (struct fsc_wlog *wl);

/* Read through the log: the newest logged version of each unit
 * (verified; a bad one fails with EBADMSG, never the upstream's older
 * data: the caller answers EIO), the rest through fsc_object_read
 * (OBJ, UP, FLAGS), whose upstream errors come back as they are.
 */
extern int fsc_wlog_read (struct fsc_wlog *wl, struct fsc_object *obj,
                          void *buf, uint32_t count, uint64_t offset,
                          const struct fsc_upstream *up, unsigned flags);

/* The writer's way to the upstream: each returns 0 or -1 with errno.
 * Called from the writer's threads, never under a lock of ours; at
 * most NPARALLEL at once (1 for a serial upstream).
 */
struct fsc_wb_upstream {
  int (*pwrite) (void *opaque, const void *buf, uint32_t count,
                 uint64_t offset);
  int (*zero) (void *opaque, uint32_t count, uint64_t offset);
  /* A zero that must leave the range allocated (NO_HOLE); NULL:
   * zeroes are written as data for it.
   */
  int (*zero_keep) (void *opaque, uint32_t count, uint64_t offset);
  int (*trim) (void *opaque, uint32_t count, uint64_t offset);
  int (*flush) (void *opaque);
  int (*pread) (void *opaque, void *buf, uint32_t count, uint64_t offset);
  /* After failures: drop the connection and open it again (the writer
   * then carries on); NULL if it cannot.  Returns 0 or -1.
   */
  int (*reopen) (void *opaque);
  void *opaque;
  unsigned nparallel;           /* requests in flight at most, >= 1 */
  bool can_trim;                /* else trims are not sent */
  bool can_zero;                /* else zeroes are written as data */
  bool can_flush;               /* else no flush (the upstream has
                                 * nothing to flush) */
};

/* Start the writer: it writes the log back through UP, keeping OBJ
 * (may be NULL: a tool draining a log without the object) a clean copy
 * of what it wrote.  Takes a reference on OBJ.  Returns 0 or -1.
 */
extern int fsc_wlog_start_writer (struct fsc_wlog *wl, struct fsc_object *obj,
                                  const struct fsc_wb_upstream *up);

/* Wait until everything logged so far is written back, or TIMEOUT_MS
 * passed (0: do not wait).  Returns the dirty bytes left, with errno
 * ESHUTDOWN if the wait ended early because the upstream refuses
 * requests until the process exits (else errno 0).
 */
extern uint64_t fsc_wlog_drain (struct fsc_wlog *wl, uint64_t timeout_ms);

/* Counters now. */
extern void fsc_wlog_counters (struct fsc_wlog *wl,
                               struct fsc_wlog_info *info);

/* Events the caller should say loudly once (fsc_wlog_take_notices). */
#define FSC_WLOG_NOTICE_FAILED   1u  /* log write/sync failed: EIO now */
#define FSC_WLOG_NOTICE_BADREAD  2u  /* a dirty unit failed its check */
#define FSC_WLOG_NOTICE_UPSTREAM 4u  /* the writer cannot reach the
                                      * upstream, retrying */
#define FSC_WLOG_NOTICE_BACK     8u  /* ... and reached it again */
#define FSC_WLOG_NOTICE_STALLED 16u  /* writes wait at the dirty bound */
#define FSC_WLOG_NOTICE_NORESERVE 32u /* the log's space (dirty-max) could
                                       * not be reserved: writes may fail
                                       * for space */
#define FSC_WLOG_NOTICE_WRITEFAIL 64u /* a record's write failed: its
                                       * request got EIO, later ones go
                                       * on once writes succeed again */
extern unsigned fsc_wlog_take_notices (struct fsc_wlog *wl, int *err,
                                       uint64_t *offset);

/* For tools: read the log of the object named NAME (a file name
 * without suffix) in fan-out directory DIRFD without locking or
 * changing it: its header and record headers (data not verified).
 * Returns 0, or -1 with errno (ENOENT: no log; EBADMSG: header
 * damaged; EUCLEAN: a record before a durable point damaged, INFO
 * filled as by fsc_wlog_open).
 */
extern int fsc_wlog_inspect (int dirfd, const char *name,
                             struct fsc_wlog_info *info);

/* The same for the object with KEY in CACHE. */
extern int fsc_wlog_peek (struct fsc_cache *cache, const void *key,
                          size_t key_len, struct fsc_wlog_info *info);

#endif /* FSC_WLOG_H */
