/* libfscache: what the write log's files (wlog.c, the log;
 * wlog-map.c, its extent map; wlog-client.c, the client's operations;
 * wlog-recover.c, recovery, close and inspection; wlog-format.c, the
 * bytes on disk) and writeback.c (the writer) share, and nobody else.
 * Each prototype below says which file owns the function.
 *
 * Locking: wl->lock guards everything in struct fsc_wlog but the file
 * and the writer's private state; it is never held across I/O.  It
 * nests inside nothing of the object's: the object's functions are
 * called without it.  wl->punch is a rwlock held for reading by every
 * reader of log data and for writing by whoever punches or truncates
 * retired space, so a reader never reads space freed under it.  Neither
 * is held across upstream I/O or a read of the object (rule 11, wlog.c).
 */
#ifndef FSC_WLOG_INT_H
#define FSC_WLOG_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "wlog.h"

/* On-disk layout (docs/format.md, "Write log"). */
#define WL_MAGIC "FSCWLOG"              /* 8 bytes with the NUL */
#define WL_VERSION 1
#define WL_SLOT 4096u                   /* header slots 0 and 1 */
#define WL_START (2 * WL_SLOT)          /* first record */
#define WL_REC_MAGIC 0x524c5746u        /* "FWLR" little-endian */
#define WL_REC_HDR 64u
#define WL_REC_UNITS 64u                /* units per record at most */

/* WL_FLUSH is a marker written after a sync (a client flush, a FUA
 * write): its offset field is the sequence number below which every
 * record was durable then.  Recovery tells by it a torn record that was
 * never promised (not covered: cut off) from a damaged one that was
 * (covered: kept, its units fail).  It covers no bytes of the export.
 */
enum wl_type { WL_DATA = 1, WL_ZERO = 2, WL_TRIM = 3, WL_FLUSH = 4,
               WL_VOID = 5, WL_ZERO_ALLOC = 6 };
/* WL_ZERO is a zero the client let trim (NBD_CMD_FLAG_NO_HOLE clear:
 * written back with may_trim), WL_ZERO_ALLOC one it asked to keep
 * allocated (NO_HOLE: written back without may_trim).  Both read as
 * zeroes.  (Logs from before WL_ZERO_ALLOC hold only WL_ZERO; a binary
 * from before it finds a WL_ZERO_ALLOC record undecodable, as in
 * docs/format.md, "Zero records".)
 */
#define WL_IS_ZERO(t) ((t) == WL_ZERO || (t) == WL_ZERO_ALLOC)
/* WL_VOID fills the slot of a record whose write failed (ENOSPC, EIO):
 * only its header is written, its length field is the slot's size, and
 * it covers no bytes of the export.  In memory its off and len are 0.
 */

/* One record, in memory from its append (or recovery) until the writer
 * retires it.
 */
struct wl_entry {
  uint64_t seq, epoch;
  uint64_t off, len;            /* export bytes; OFF unit-aligned */
  uint64_t pos, rsize;          /* where in the log, and its size */
  uint64_t time_ms;
  uint32_t nunits;              /* data units (0 for zero and trim) */
  uint8_t type;                 /* enum wl_type */
  bool done;                    /* its bytes are in the file */
  bool bad;                     /* found damaged at recovery */
  uint64_t *hashes;             /* XXH3 of each unit (data) */
  struct wl_ext *spare[2];      /* its map nodes, allocated by append
                                 * so that applying it cannot fail;
                                 * NULL once applied */
};

/* The extent map: disjoint extents, each the newest logged version of
 * its bytes, in a treap ordered by start.
 */
struct wl_ext {
  uint64_t start, end;
  struct wl_entry *e;
  uint32_t prio;
  struct wl_ext *l, *r;
};

/* The units a client write, zero or trim owns (rule 10, wlog.c). */
struct wl_rmw {
  uint64_t start, end;
  struct wl_rmw *next;
};

struct fsc_wlog {
  struct fsc_cache *cache;
  int fd;
  uint64_t incarnation;
  uint64_t key_lo, key_hi, key_len;
  uint64_t size;
  char generation[FSC_GEN_MAX + 1];
  bool has_generation;
  struct fsc_wlog_sample sample;        /* of the upstream at the tail */
  uint64_t dirty_max;

  pthread_mutex_t lock;
  pthread_cond_t cond;                  /* retired, rewound, writer's
                                         * work, read-modify-writes */
  pthread_cond_t apply_cond;            /* applied up to apply_want,
                                         * failed */
  uint64_t apply_want;                  /* the lowest applied_seq a
                                         * waiter on apply_cond needs;
                                         * UINT64_MAX: none waits */
  pthread_cond_t sync_cond;             /* a sync ended, failed */
  bool writer_idle;                     /* the writer waits for work */
  pthread_rwlock_t punch;

  /* Header state. */
  uint64_t hdr_gen;
  int hdr_slot;                         /* slot of the newest header */
  uint64_t tail_pos, tail_seq;          /* durable tail */

  /* Appends. */
  uint64_t head_pos, next_seq;
  uint64_t applied_seq;                 /* records below are in the map */
  uint64_t durable_seq;                 /* records below are synced */
  bool syncing;
  bool resetting;                       /* the writer is rewinding */
  uint64_t epoch;                       /* of new records */
  bool epoch_used;                      /* a record has it: a flush
                                         * starts the next one */
  uint64_t marked_seq;                  /* a marker covers records below */
  uint64_t last_data_seq;               /* after the newest record that
                                         * is not a marker (rule 9) */
  uint64_t first_epoch;                 /* of the oldest record */
  bool failed;
  int err;
  bool salvage;                         /* opened past damage (Rule 7):
                                         * nothing is appended, and the
                                         * file is never cut or rewound */
  bool unreserved;                      /* the last reservation failed
                                         * (said once until one works) */
  uint64_t holes;                       /* WL_VOID records not yet
                                         * written: nothing applies past
                                         * the first, appends retry them
                                         * first (rule 9) */

  /* Records from ring_seq to next_seq - 1, a ring.  ring_seq is
   * tail_seq but while the writer moves the tail: it changes only when
   * records are retired.
   */
  uint64_t ring_seq;
  struct wl_entry **ring;
  size_t rhead, rlen, rcap;
  uint64_t dirty_bytes;                 /* export bytes they cover */
  struct wl_ext *root;
  uint32_t prng;

  struct wl_rmw *rmw;                   /* owned units (range_lock) */

  /* Notices for the caller (FSC_WLOG_NOTICE_*). */
  unsigned notices;
  int notice_err;
  uint64_t notice_off;

  /* The writer (writeback.c). */
  struct fsc_object *obj;
  struct fsc_wb_upstream up;
  pthread_t writer;
  bool writer_running;
  bool stopping;
  bool unordered;                       /* test knob: ignore epochs */
  bool fua_unordered;                   /* test knob: a FUA write does
                                         * not close its epoch (rule 6
                                         * broken) */
  bool halted;                          /* the writer met a bad record
                                         * or could not move the tail:
                                         * it sends nothing more */
  unsigned outage;                      /* consecutive failed rounds */
  int last_err;                         /* errno of the last failed
                                         * round, 0 after a good one */
};

/* wlog.c: the log. */
static inline struct wl_entry *
wl_entry_at (struct fsc_wlog *wl, size_t i)
{
  return wl->ring[(wl->rhead + i) % wl->rcap];
}
/* Free E with its hashes and unused map nodes (NULL: nothing). */
extern void wl_free_entry (struct wl_entry *e);
/* Add E at the ring's end; -1 if the ring cannot grow. */
extern int wl_ring_push (struct fsc_wlog *wl, struct wl_entry *e);
/* Write the header to the other slot and sync (one caller at a time). */
extern int wl_write_header (struct fsc_wlog *wl);
/* Append one client operation: TYPE over [OFF, OFF+LEN), DATA for
 * WL_DATA; with FUA, durable (and its epoch closed) on return.  0, or
 * -1 with errno.
 */
extern int wl_append (struct fsc_wlog *wl, int type, uint64_t off,
                      uint64_t len, const unsigned char *data, bool fua);
extern void wl_retire (struct fsc_wlog *wl, size_t n);
/* Sync the log until every record below TARGET is durable (and every
 * record applied when a sync starts); shared by flushers and the
 * writer.  Caller holds wl->lock, dropped around the sync.  0, or -1
 * EIO once the log failed.
 */
extern int wl_sync_upto (struct fsc_wlog *wl, uint64_t target);
/* Reserve the log's space from the head to dirty-max past the tail
 * (fallocate, the size kept); a failure is a notice, not an error.
 * Called without wl->lock.
 */
extern void wl_reserve (struct fsc_wlog *wl);
extern void wl_notice (struct fsc_wlog *wl, unsigned what, int err,
                       uint64_t off);

/* wlog-format.c: the bytes on disk (docs/format.md, "Write log"). */
/* WL's header as generation GEN into the slot buffer P (WL_SLOT). */
extern void wl_encode_header (const struct fsc_wlog *wl, uint64_t gen,
                              unsigned char *p);
/* Slot P into WL's fields and *GEN; false if not a valid header. */
extern bool wl_decode_header (struct fsc_wlog *wl, const unsigned char *p,
                              uint64_t *gen);
/* Bytes of E's header and unit hashes: where its data starts. */
extern uint64_t wl_hdr_bytes (const struct wl_entry *e);
/* The size in the log of a record of NUNITS hashes and DATALEN bytes. */
extern uint64_t wl_rec_size (uint32_t nunits, uint64_t datalen);
/* E's record header, its hashes and checksum, into P. */
extern void wl_encode_rec (const struct fsc_wlog *wl,
                           const struct wl_entry *e, unsigned char *p);
/* A record header at P into E, unchecked: false if malformed. */
extern bool wl_decode_rec_head (const struct fsc_wlog *wl,
                                const unsigned char *p, struct wl_entry *e);
/* Does the checksum of the record header at P (NUNITS hashes) hold? */
extern bool wl_rec_csum_ok (const struct fsc_wlog *wl, const unsigned char *p,
                            uint32_t nunits);

/* wlog-client.c: read E's units [OFF, OFF+LEN), verified. */
extern int wl_read_units (struct fsc_wlog *wl, const struct wl_entry *e,
                          uint64_t off, uint64_t len, unsigned char *dst);

/* The extent map (wlog-map.c). */
/* Make [START, END) map to E in *ROOT with the caller's nodes X and
 * REST: it cannot fail (applying an append's record).
 */
extern void wl_map_insert_nodes (struct fsc_wlog *wl, struct wl_ext **root,
                                 uint64_t start, uint64_t end,
                                 struct wl_entry *e, struct wl_ext *x,
                                 struct wl_ext *rest);
extern void wl_map_insert (struct fsc_wlog *wl, struct wl_ext **root,
                           uint64_t start, uint64_t end, struct wl_entry *e);
/* The same, but out of memory it returns -1 (ENOMEM), the map as it
 * was, and leaves the log alone: for a private map (the writer's).
 */
extern int wl_map_try_insert (struct fsc_wlog *wl, struct wl_ext **root,
                              uint64_t start, uint64_t end,
                              struct wl_entry *e);
/* Remove the extents that still map to E (a retire): cannot fail. */
extern void wl_map_remove_entry (struct wl_ext **root,
                                 const struct wl_entry *e);
extern void wl_map_free (struct wl_ext *t);
typedef void wl_visit_fn (void *opaque, const struct wl_ext *x);
extern void wl_map_visit (const struct wl_ext *t, uint64_t a, uint64_t b,
                          wl_visit_fn *fn, void *opaque);

/* The extents a visit met, copied out (wl_collect is a wl_visit_fn,
 * wlog-map.c): what a reader, the writer's batch and a retire work
 * from.  NOMEM is set if the array could not grow; free V.
 */
struct wl_seg {
  uint64_t start, end;
  const struct wl_entry *e;
};
struct wl_segs {
  struct wl_seg *v;
  size_t n, cap;
  bool nomem;
};
extern void wl_collect (void *opaque, const struct wl_ext *x);

/* writeback.c: stop and join the writer. */
extern void wl_writer_stop (struct fsc_wlog *wl);

#endif /* FSC_WLOG_INT_H */
