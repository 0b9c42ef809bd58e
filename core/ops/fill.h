/* libfscache: the fill thread (fill.c): fill jobs, the queue that
 * hands them to the thread, the fill budget; the meters that tell
 * whether the cache disk or the upstream is the bottleneck (meter.c),
 * and the buffers fills and commits borrow (bufs.c), both on the
 * ground floor.  Included by internal.h.
 */
#ifndef FSC_FILL_H
#define FSC_FILL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fsc_cache;
struct fsc_object;

/* A fill handed to the cache's fill thread: N claimed blocks from
 * BLOCK of OBJ (a reference is held), their bytes in DATA.
 */
#define FSC_FILL_MAX_GROUPS (1024 / 64 + 2)
struct fsc_fill {
  struct fsc_fill *next;
  struct fsc_object *obj;
  unsigned readers;             /* copying from DATA (fsc_fill_copy) */
  bool done;                    /* written: the last reader frees it */
  uint64_t block, nblocks;
  uint64_t start;               /* export offset of DATA: the first
                                 * block's start, or one of its pieces */
  size_t len;
  size_t cap;                   /* of DATA's buffer */
  unsigned flags;               /* FSC_FILL_* */
  bool held;                    /* a client's, queued in a probe's hold:
                                 * dropped if the probe finds the
                                 * fills costly (filler) */
  uint64_t epochs[FSC_FILL_MAX_GROUPS];
  unsigned char *data;          /* LEN bytes, from fsc_buf_get */
};

/* A throughput meter (meter.c): bytes per second of busy time, "busy"
 * meaning at least one measured operation in progress, so that
 * overlapping operations (the upstream's concurrent fetches) count
 * their time once and idle time (no client asking) not at all.  Bytes
 * and busy time add up in a window; once it holds METER_WINDOW_NS of
 * busy time, the next end closes it, and its rate moves the average
 * RATE a quarter of the way (an exponential moving average over the
 * last few windows).  Begin and end take LOCK; RATE is read without it.
 */
struct fsc_meter {
  pthread_mutex_t lock;
  unsigned active;              /* operations in progress */
  uint64_t mark_ns;             /* busy time is counted up to here */
  uint64_t win_ns, win_bytes;   /* the window being filled */
  uint64_t total_ns;            /* all busy time, for BUSY_US */
  uint64_t *busy_us;            /* the stats counter it adds to */
  uint64_t rate;                /* bytes/s (relaxed atomics); 0 until
                                 * the first window closes */
  uint64_t peak;                /* the best window's rate, decaying
                                 * (relaxed atomics) */
};

/* fill.c: a fill job with room for LEN bytes, or NULL with errno if
 * fills are not done in the background (ENOTSUP: no thread, or it is
 * stopping; ENOMEM).
 */
extern struct fsc_fill *fsc_fill_new (struct fsc_cache *cache, size_t len);

/* fill.c: the fill queue's bound in bytes: a quarter second of the
 * fills' peak rate, from 16 to 128 MiB (16 until measured).  No lock.
 */
extern size_t fsc_fill_bound (struct fsc_cache *cache);

/* fill.c: bytes the fill queue has room for now (a hint: no lock
 * held after).  Takes cache->fill_lock.
 */
extern size_t fsc_fill_room (struct fsc_cache *cache);

/* fill.c: queue F for OBJ (taking a reference on OBJ), or -1 with
 * errno EAGAIN if the queue is full (the cache disk is behind) or the
 * thread is stopping; F is then still the caller's.
 */
extern int fsc_fill_submit (struct fsc_cache *cache, struct fsc_object *obj,
                            struct fsc_fill *f);

/* fill.c: if a fill job of OBJ, queued or being written, holds the
 * bytes [LO, HI) of block B with claim epoch EPOCH, copy them to DST
 * and return true.  Takes cache->fill_lock, never obj->lock.
 */
extern bool fsc_fill_copy (struct fsc_cache *cache, struct fsc_object *obj,
                           uint64_t b, uint64_t epoch, uint64_t lo,
                           uint64_t hi, void *dst);

/* fill.c: true if the cache disk is the bottleneck: fills are written
 * at less than a third of the upstream's rate (their meters' rates).
 * A client's read whose fill a full queue refuses then skips it rather
 * than wait for the disk.  No lock.
 */
extern bool fsc_fill_slower (struct fsc_cache *cache);

/* fill.c: may a client's read fill LEN more bytes?  Always, unless
 * fills are slower than the upstream; then they are admitted at a
 * fiftieth of the fills' own rate, after a burst of 64 MiB, so that
 * they take a bounded share of the CPUs a fast upstream's reads need
 * too.  Before the rates are known, only within that burst; that
 * alone applies to a SPECULATIVE prefetch (readahead).  Takes
 * cache->budget_lock.
 */
extern bool fsc_fill_budget (struct fsc_cache *cache, uint64_t len,
                             bool speculative);

/* fill.c: true if fills are slower than the upstream, so that client
 * reads fill only within the budget above.  No lock.
 */
extern bool fsc_fill_budgeted (struct fsc_cache *cache);

/* fill.c: LEN bytes at START of O were read upstream and not stored
 * (a skip, a bypass, a dropped job): counted, and noted for the
 * catch-up.  Takes no lock of the caller's.
 */
extern void fsc_fill_skipped (struct fsc_object *o, uint64_t start,
                              uint64_t len);

/* probe.c: are fills off for the measure of what they cost the
 * clients (core/base/cost.c): a verdict "costly", or a probe holding
 * them?  Then readahead pauses too, over a link as well: its
 * prefetches are fills, and the verdict was measured with it paused.
 * No lock.
 */
extern bool fsc_fill_cost_off (struct fsc_cache *cache);

/* probe.c: step the measure; true in a stretch of the verdict
 * "costly" (the budget engages: fill.c, budget_engaged).  Starts and
 * ends the probes' holds.  No lock held.
 */
extern bool fsc_fill_cost_engaged (struct fsc_cache *cache);

/* probe.c: is a probe of core/base/cost.c holding the fills in their
 * queue now; and end that hold (a reader is about to wait for a held
 * job's claim).  Neither needs a lock held; unhold takes fill_lock.
 */
extern bool fsc_fill_held (struct fsc_cache *cache);
extern void fsc_fill_unhold (struct fsc_cache *cache);

/* fill.c: note one upstream read's time; and is the upstream remote,
 * its reads taking REMOTE_NS (1 ms) or more on average?  No lock.
 */
extern void fsc_upstream_latency (struct fsc_cache *cache, uint64_t ns);
extern bool fsc_upstream_remote (struct fsc_cache *cache);

/* fill.c: true if the fill queue is more than half full, i.e. the
 * cache disk is behind the upstream (whether it is also the bottleneck
 * is fsc_fill_slower's question).  No lock.
 */
extern bool fsc_fill_congested (struct fsc_cache *cache);

/* meter.c: set up meter M, whose busy time adds to the stats counter
 * *BUSY_US; and free it.
 */
extern void fsc_meter_init (struct fsc_meter *m, uint64_t *busy_us);
extern void fsc_meter_destroy (struct fsc_meter *m);

/* meter.c: an operation of meter M begins; it ends having moved BYTES
 * (0 if it failed).  Take m->lock.
 */
extern void fsc_meter_begin (struct fsc_meter *m);
extern void fsc_meter_end (struct fsc_meter *m, uint64_t bytes);

/* meter.c: a meter that has no rate yet, but has moved bytes in busy
 * time and has nothing in progress, takes its partial window as its
 * first rate.  True if M has a rate now.  Take m->lock.
 */
extern bool fsc_meter_first (struct fsc_meter *m);

/* fill.c: free a job that was not submitted. */
extern void fsc_fill_free (struct fsc_cache *cache, struct fsc_fill *f);

/* bufs.c: a buffer of at least SIZE bytes, mapped apart from malloc's
 * arenas or reused, its capacity in *CAP; or NULL.  Give it back with
 * fsc_buf_put (P may be NULL); fsc_buf_pool_free unmaps those kept.
 * Takes cache->fill_lock.
 */
extern void *fsc_buf_get (struct fsc_cache *cache, size_t size, size_t *cap);
extern void fsc_buf_put (struct fsc_cache *cache, void *p, size_t cap);
extern void fsc_buf_pool_free (struct fsc_cache *cache);

/* fill.c: start the fill thread (without it fills are synchronous), and
 * stop it after finishing every queued job.
 */
extern int fsc_fill_start (struct fsc_cache *cache);
extern void fsc_fill_stop (struct fsc_cache *cache);

#endif /* FSC_FILL_H */
