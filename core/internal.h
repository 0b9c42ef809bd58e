/* libfscache: what the files of core/ share, and nobody else: the
 * cache's and the object's state.  Each file's own interface is in a
 * header of its own where one has grown (fill.h, hit.h, fetch.h,
 * lookup.h, share-int.h, wlog-int.h).
 *
 * Locking, in the order they may be taken:
 *   cache->lock   the object list and the committer's state
 *   obj->lock     everything in the object and its groups
 * Neither is ever held across upstream or disk I/O (commits serialise
 * on obj->committing, a flag waited on with obj->cond).
 */
#ifndef FSC_INTERNAL_H
#define FSC_INTERNAL_H

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <sys/stat.h>

#include "fscache.h"
#include "files.h"
#include "index.h"
#include "io.h"
#include "keyenc.h"
#include "objops.h"
#include "utils.h"
#include "mrc.h"
#include "cost.h"

/* The fill thread, its jobs and its meters (fill.c). */
#include "fill.h"

struct fsc_share_hooks;

/* The latency guard's state (core/ops/guard.c). */
/* Per cache: the cache disk's side. */
struct fsc_guard {
  bool enabled;                 /* fsc_cache_set_guard, before use */
  uint64_t hit_ns;              /* moving average of a small hit's
                                 * time (relaxed atomics) */
  uint64_t hit_n;               /* small hits timed */
  uint64_t last_hit_ns;         /* the last one's time */
  uint64_t slow_share;          /* the share of them over 2 ms, of
                                 * 1024, a moving average */
};

/* Per object: its upstream's side, and the object's route. */
struct fsc_guard_obj {
  uint64_t up_ns;               /* moving average of a small upstream
                                 * read's time */
  uint64_t up_n;
  bool rerouting;               /* hits go upstream now */
  uint64_t switched_ms;         /* monotonic ms of the last switch */
  uint64_t tick;                /* hits seen: every PROBE_EVERY-th
                                 * takes the other path */
  uint64_t probed_disk_ms;      /* the last disk probe, rerouted */
  uint64_t seen_hit_n;          /* the guard's hit_n at the last look */
  uint64_t fast_probes;         /* fast disk probes in a row */
};

struct fsc_cache {
  int dirfd;                    /* the cache directory */
  int objdirfd;                 /* its objects/ subdirectory */
  unsigned char uuid[16];
  struct fsc_io io;
  struct fsc_stats stats;
  unsigned commit_interval_ms;
  pthread_key_t scratch_key;    /* per-thread bounce buffer */
  const struct fsc_share_hooks *share; /* the sharing layer above the
                                 * object core (share-hooks.h), or NULL */

  pthread_mutex_t lock;
  pthread_cond_t cond;          /* wakes the committer */
  pthread_cond_t ready_cond;    /* an object's lookup finished */
  struct fsc_object *objects;   /* open objects, linked by ->next */
  pthread_t committer;
  bool committer_running;
  /* Reclaimer threads that closed their lingering object themselves,
   * joined by fsc_cache_close (object.c, fsc_object_linger_done).
   */
  struct fsc_ended_thread {
    pthread_t thread;
    struct fsc_ended_thread *next;
  } *ended;
  bool stopping;
  bool commit_wanted;

  /* Background fills: a FIFO under fill_lock, at most fsc_fill_bound
   * queued (fill_bytes, also read without the lock: atomic stores);
   * FSC_FILLERS threads (fill.c) run between fsc_cache_start and close.
   */
#define FSC_FILLERS 4
  pthread_mutex_t fill_lock;
  pthread_cond_t fill_cond;             /* wakes a fill thread */
  pthread_cond_t fill_idle_cond;        /* the queue ran empty */
  struct fsc_fill *fill_head, **fill_tail;
  struct fsc_fill *fill_current[FSC_FILLERS]; /* the jobs being written,
                                         * one slot per thread */
  size_t fill_bytes;
  uint64_t fill_hold_until;             /* monotonic ns: the thread writes
                                         * nothing before (a probe of
                                         * cost.c, fill.c); 0: no hold.
                                         * Relaxed atomics */
  pthread_t filler[FSC_FILLERS];
  unsigned fillers;                     /* threads started */
  unsigned filler_slots;                /* slots taken (fill.c) */
  bool filler_running;
  bool fill_stopping;
  /* Big buffers given back, for reuse (fill.c), under fill_lock. */
#define BUF_CLASSES 8
  void *buf_pool[BUF_CLASSES];
  size_t buf_pool_bytes;

  /* Bytes of prefetches' big fetches in flight (retrieve.c,
   * fsc_object_prefetch), atomic.
   */
  uint64_t big_fetch_bytes;

  /* Fills admitted while the upstream is faster than the disk
   * (fill.c, fsc_fill_budget): a token bucket, bytes and when last
   * refilled.
   */
  pthread_mutex_t budget_lock;
  uint64_t budget_bytes, budget_ns;
  int test_budget;                      /* NBD_FSCACHE_TEST_BUDGET: 1
                                         * engaged whatever the rates,
                                         * 0 never (nor the full
                                         * queue's skip), -1 unset */
  size_t direct_min;                    /* data writes from this size
                                         * on bypass the page cache
                                         * (data.c; FSC_DIRECT_MIN, or
                                         * NBD_FSCACHE_TEST_DIRECT_MIN) */
  uint64_t budget_burst;                /* the bucket's size (fill.c);
                                         * NBD_FSCACHE_TEST_BURST sets
                                         * a smaller one for tests */

  /* Is the cache disk the bottleneck (fill.c, fsc_fill_slower)? */
  struct fsc_meter up_meter;            /* every upstream read */
  uint64_t up_latency_ns;               /* a moving average of one
                                         * upstream read's time (relaxed
                                         * atomics; fsc_upstream_remote) */
  struct fsc_meter fill_meter;          /* fills written (thread and
                                         * inline) and synced */
  struct fsc_guard guard;               /* hits' latency (guard.c) */
  struct fsc_cost cost;                 /* what fills cost the clients
                                         * (cost.c; fill.c steps it) */

  /* The free space floor (evict.c), checked at most every
   * SPACE_CHECK_MS: atomics, no lock.
   */
  unsigned min_free_pct;        /* of blocks; 0: none */
  unsigned min_free_files_pct;  /* of inodes; 0: none */
  uint64_t space_checked_ms;    /* monotonic ms of the last check */
  bool space_low;               /* below a floor, or the stop mark */
};

/* In-memory state of FSC_GROUP_BLOCKS consecutive blocks.  Allocated
 * on first use, so a huge export with little cached costs little.
 */
struct group {
  uint64_t present;             /* may be served now */
  uint64_t disk_max;            /* may be present in a durable or
                                 * in-flight record */
  uint64_t fetching;            /* claimed by a fetch or store */
  uint64_t referenced;          /* hit since the clock hand passed */
  uint64_t probation;           /* new, not yet hit again (evict.c) */
  uint64_t ghost;               /* evicted from probation lately */
  uint64_t unread;              /* prefetched, not read yet: its first
                                 * hit is its first use, not a reuse */
  uint64_t evicted;             /* evicted, space not yet punched */
  uint32_t epoch;               /* bumped by every invalidation */
  uint32_t writers;             /* writes in flight upstream */
  uint32_t readers;             /* hits in flight (atomic decrement) */
  uint32_t pins;                /* requests using it (groups.c): not
                                 * paged out; decremented atomically */
  bool loading;                 /* its record is being read (groups.c):
                                 * wait on obj->cond before use */
  bool touched;                 /* pinned since the pager's hand passed */
  bool counted;                 /* a placeholder whose record the census
                                 * had counted in nonres_* (groups.c) */
  uint8_t slot;                 /* slot of the newest record on disk */
  bool has_record;
  bool dirty;                   /* on obj->dirty */
  bool reserved;                /* index space allocated */
  bool on_punch;                /* on obj->evict.punch */
  uint64_t zero;                /* present blocks that are all zeroes:
                                 * whole, their data a hole never read,
                                 * their csum that of zeroes (a subset
                                 * of present, cleared with it) */
  uint64_t csum[FSC_GROUP_BLOCKS];
  uint16_t pieces[FSC_GROUP_BLOCKS];  /* of a present block, the pieces
                                       * held; 0: the whole block */
};

/* The group table (groups.c): leaves of GT_LEAF group pointers, mid
 * nodes of GT_MID leaves, and a top level of mid nodes.
 */
#define GT_LEAF_SHIFT 6
#define GT_MID_SHIFT 9
#define GT_LEAF (1u << GT_LEAF_SHIFT)
#define GT_MID (1u << GT_MID_SHIFT)
struct gleaf { struct group *g[GT_LEAF]; unsigned n; };
struct gmid { struct gleaf *l[GT_MID]; };

/* A block's sub-block hashes, read from the sums file and checked
 * against the index checksum CSUM (with PIECES), kept so that the next
 * hit on part of the block need not read them again (sums.c).
 */
#define SCACHE_SUBS 16                  /* blocks up to 64 KiB */
#define SCACHE_MAX 16384                /* entries per object */
struct scache_entry {
  uint64_t block;                       /* UINT64_MAX: empty */
  uint64_t csum;
  uint16_t pieces;
  uint64_t sums[SCACHE_SUBS];
};

/* An object's geometry: what its size and block size make of it, set
 * at open and fixed after.  With struct fsc_files, all that reading the
 * files takes without an object to serve (inspect.c).
 */
struct fsc_geom {
  uint32_t block_size;
  unsigned bshift;
  unsigned pshift;              /* log2 of the piece size */
  uint64_t size, nblocks, ngroups;
  uint64_t zcsum, zcsum_last;   /* index checksum of an all-zero block,
                                 * and of the last block if short
                                 * (fsc_zero_csums) */
};

/* An object's files (files.h names them; data.c, the segments). */
struct fsc_files {
  char name[FSC_NAME_MAX + 1];
  char fan[FSC_FAN_MAX + 1];
  int fandirfd, ifd, sfd;       /* -1 when uncached */
  int *dfds;                    /* data segments (data.c); NULL when
                                 * uncached */
  int *ddfds;                   /* the same opened O_DIRECT, for big
                                 * writes (data.c); -1 where the file
                                 * system refused it */
  bool direct_off;              /* a direct write was refused: none
                                 * more (data.c) */
  uint64_t nseg;
  unsigned char *seg_dirty;     /* written since the last sync */
};

/* reclaim.c's call back into object.c as its thread ends
 * (fsc_reclaim_start).
 */
struct fsc_object;
typedef void fsc_reclaim_ended_fn (struct fsc_object *o);

/* An object's group table and its paging (groups.c). */
struct fsc_pager {
  struct gmid **gtop;           /* the group table (groups.c) */
  uint64_t ntop;                /* its top level's entries */
  uint64_t ngalloc;             /* groups allocated (resident) */
  uint64_t res_max;             /* groups kept resident (groups.c) */
  uint64_t phand;               /* the pager's hand: a group index */
  uint64_t census_next;         /* groups below it are counted in
                                 * nonres_* while not resident */
  uint64_t nonres_blocks;       /* present blocks and their bytes in */
  uint64_t nonres_bytes;        /* the records of groups not resident */
  uint64_t pager_events;        /* loads and page-outs (the census
                                 * rereads what raced with one) */
  struct group *gfree;          /* groups paged out, for reuse (linked
                                 * through their first bytes) */
  struct gleaf *lfree;          /* empty leaves, the same */
  uint64_t ngfree, nlfree;
};

/* An object's size cap and eviction (evict.c), under o->lock unless
 * said otherwise.
 */
struct fsc_evict {
  uint64_t max_size;            /* fscache-max-size; 0: none */
  uint64_t quota;               /* from NAME.quota; 0: none */
  uint64_t pending_alloc;       /* bytes being written by fills */
  uint64_t hand;                /* main clock hand: a group index */
  uint64_t lhand;               /* where eviction reads groups in next */
  uint64_t nprobation;          /* present blocks on probation */
  uint64_t *pq;                 /* probation FIFO of block numbers (a
                                 * ring; entries may be stale) */
  size_t pq_head, pq_len, pq_cap;
  uint64_t *gq;                 /* ghost FIFO: blocks evicted from
                                 * probation, at most a budget's worth */
  size_t gq_head, gq_len, gq_cap;
  uint64_t *punch;              /* groups with evicted blocks to punch */
  size_t npunch, punch_cap;
  bool evicting;                /* an eviction is under way */
  bool quota_bad_said;          /* a bad quota record was noticed */
  struct timespec quota_mtime;  /* of the quota record last read */
  uint64_t quota_ino;
};

/* The reclaimer thread of an object (reclaim.c), started by
 * fsc_object_open and joined by fsc_object_close.
 */
struct fsc_reclaim {
  pthread_t thread;
  bool joinable;                /* started, not joined */
  bool running;                 /* under lock */
  fsc_reclaim_ended_fn *ended;  /* fsc_reclaim_start's ENDED */
  bool done;                    /* under lock: the walk finished */
  bool closing;                 /* under lock: the close waits for it */
  bool stop;                    /* under lock: stop at the next group
                                 * (an open wants the object anew) */
  bool unclean;                 /* the previous user crashed */
  bool wanted;                  /* lookup asks for the thread */
  unsigned test_walk_delay_ms;  /* NBD_FSCACHE_TEST_WALK_DELAY_MS: a
                                 * pause after each group the walk
                                 * looks at (tests only) */
};

#define FSC_CLAIM_SHIFT 6       /* struct fsc_object's claim_cond: */
#define FSC_CLAIM_QUEUES (1u << FSC_CLAIM_SHIFT)        /* 64 (a mask) */

struct fsc_object {
  struct fsc_cache *cache;
  struct fsc_object *next;      /* cache->objects; under cache->lock */
  unsigned refs;                /* under cache->lock */
  bool ready;                   /* lookup done; under cache->lock */
  uint64_t tag;                 /* the netfs's (fsc_object_set_tag);
                                 * atomic */
  bool closing;                 /* last reference gone, closing; under
                                 * cache->lock */
  unsigned char *key;
  size_t key_len;
  struct fsc_files files;       /* its files, by name and descriptor */
  bool verify;
  struct fsc_geom geom;         /* its size and block size, and what
                                 * they make of it */
  struct fsc_pager pager;       /* the group table and its paging
                                 * (groups.c) */
  struct fsc_guard_obj guard;   /* its upstream's latency and its
                                 * hits' route (guard.c) */

  pthread_mutex_t lock;
  pthread_cond_t cond;          /* fetch done, commit done */
  /* Reads waiting for a block's claim (retrieve.c), by a hash of the
   * block (fsc_claim_queue), and how many wait on each; under lock.
   * Not o->cond: a stream's reads wait at its front, and every change
   * to the object (each fill stored, each commit) woke them all, a
   * herd of context switches that cost a cold stream a third of its
   * CPU (docs/design.md, invariant C1).  Whoever releases a claim or
   * hands a fetch's bytes to the fill queue wakes the queues of its
   * blocks (fsc_claim_wake); a withdrawal wakes them all.
   */
  pthread_cond_t claim_cond[FSC_CLAIM_QUEUES];
  unsigned claim_waiting[FSC_CLAIM_QUEUES];
  int state;                    /* enum fsc_object_state */
  bool listed;                  /* on cache->objects */
  time_t nofill_until;          /* ENOSPC: no fills before this */
  struct fsc_sb sb;             /* newest superblock written */
  int sb_slot;
  uint64_t seq;                 /* last sequence number used */
  uint64_t *dirty;              /* groups to write at the next commit */
  size_t ndirty, dirty_cap;
  uint64_t change_seq;          /* bumped by each change to persist */
  uint64_t durable_seq;         /* changes up to here are durable */
  bool committing;
  bool unclean_due;             /* opened clean: the not-clean mark is
                                 * still to be made durable, before the
                                 * first change (fsc_object_mark_in_use);
                                 * atomic read, set under lock */
  bool unclean_marking;         /* under lock: a thread is writing it */
  bool data_dirty;              /* data written since the last sync */
  uint64_t gauge_ms;            /* the last gauges' walk (live.c), its
                                 * present blocks and cached bytes;
                                 * under lock */
  uint64_t gauge_blocks, gauge_bytes;
  bool written;                 /* saw a write: fingerprint stale */
  int withdraw_err;             /* errno that withdrew it */
  unsigned pending_fills;       /* queued on the cache's fill thread */
  bool busy;                    /* another process holds it: uncached */
  struct share_server *share;   /* share-owner.c: serving others */
  struct fsc_join *join;        /* share-*.c: joined another's: a shell */
  const struct fsc_object_ops *ops; /* objops.h: fsc_join_ops if join,
                                     * else fsc_local_ops */
  struct fsc_open_info refusal; /* share-*.c: its owner refused us */
  bool test_no_claim;           /* NBD_FSCACHE_TEST_NO_CLAIM: a read
                                 * does not wait for a block another
                                 * request is fetching (tests only) */
  bool marked;                  /* busy, and the stale mark is made */
  unsigned notices;             /* FSC_NOTICE_* not yet taken (atomic:
                                 * raised with FSC_NOTICE) */

  /* Skipped fills to make up (catchup.c), under their own leaf lock. */
  pthread_mutex_t cu_lock;
  uint64_t **cu_map;            /* per chunk of blocks, its bits or NULL */
  uint64_t cu_nchunks, cu_chunks; /* the table's length, chunks held */
  uint64_t cu_cursor;           /* the next block fsc_catchup_take looks at */
  /* The miss-ratio curve of clients' reads (mrc.c), since MRC_SINCE
   * (seconds since the epoch): NULL without memory for it.
   */
  struct fsc_mrc *mrc;
  uint64_t mrc_since;
  uint64_t cu_pending;          /* their bytes */
  bool cu_on;                   /* noting (fsc_catchup_enable) */

  struct fsc_evict evict;       /* the size cap (evict.c) */

  /* The object's own counters (ostats.h), with relaxed atomics; saved
   * in the superblock (commit.c) and published in NAME.stats (live.c).
   */
  struct fsc_ostats ostats;
  uint64_t live_next;           /* ms: when NAME.stats is next due */

  /* Checked sub-block hashes (sums.c), direct-mapped by block number;
   * allocated on first use.  Under lock.
   */
  struct scache_entry *scache;
  size_t nscache;                       /* a power of 2, or 0 */

  struct fsc_reclaim reclaim;   /* the reclaimer thread (reclaim.c) */
  bool lingering;               /* under cache->lock: no reference left,
                                 * kept open for the walk, whose thread
                                 * closes it when done (evict.c) */
};

/* O's budget in bytes (the smaller of fscache-max-size and its quota),
 * UINT64_MAX for none: what evict.c keeps O to, and what live.c
 * publishes as its cap.  Reads under o->lock, or racily for a hint.
 */
static inline uint64_t
fsc_budget_of (const struct fsc_object *o)
{
  uint64_t b = o->evict.max_size ? o->evict.max_size : UINT64_MAX;
  return MIN (b, o->evict.quota);
}

#define FSC_OSTAT_ADD(o, field, n)                                       \
  __atomic_add_fetch (&(o)->ostats.v[FSC_OSTAT_##field], (n),           \
                      __ATOMIC_RELAXED)
/* Raise notice WHAT on O, its lock held or not: an atomic OR, since
 * fsc_object_take_notices looks without the lock.
 */
#define FSC_NOTICE(o, what)                                             \
  __atomic_or_fetch (&(o)->notices, (what), __ATOMIC_RELAXED)
#define FSC_OSTAT_SET(o, field, n)                                       \
  __atomic_store_n (&(o)->ostats.v[FSC_OSTAT_##field], (n),             \
                    __ATOMIC_RELAXED)

/* A client read just used OBJ (its last_use, in seconds). */
static inline void
fsc_note_use (struct fsc_object *o)
{
  FSC_OSTAT_SET (o, last_use, (uint64_t) time (NULL));
}

/* live.c: copy OBJ's counters, with the gauges computed now, into
 * OUT.  Takes obj->lock.
 */
extern void fsc_ostats_snapshot (struct fsc_object *obj,
                                 struct fsc_ostats *out);

/* live.c: the same, but the gauges may be up to a second old (those of
 * the last walk): for the superblocks of commits, which come every 256
 * dirty groups while the cache fills.
 */
extern void fsc_ostats_snapshot_recent (struct fsc_object *obj,
                                        struct fsc_ostats *out);

/* live.c: rewrite NAME.stats (OPEN: the object is still open) if it
 * is due, or always if FORCE.  Failing costs only the statistics.
 */
extern void fsc_live_publish (struct fsc_object *obj, bool open, bool force);

/* commit.c: commits (commit.h). */
#include "commit.h"

/* live.c: read the counters of OBJ's NAME.stats into OUT if it is
 * there, readable and of OBJ's key, with the incarnation and the time
 * (seconds) it gives if those are not NULL.  Returns 0, or -1 (nothing
 * set).
 */
extern int fsc_live_load (struct fsc_object *obj, struct fsc_ostats *out,
                          uint64_t *incarnation, uint64_t *updated);

/* withdraw.c: if another process marked OBJ stale (it wrote upstream
 * while we held the object), withdraw it.  Returns true if it did.
 */
extern bool fsc_object_check_stale (struct fsc_object *obj);

/* object.c: true if OBJ has uncommitted changes.  Takes obj->lock. */
extern bool fsc_object_has_dirty (struct fsc_object *obj);

/* bufs.c: the calling thread's scratch buffer of at least SIZE bytes
 * (reused across calls), or NULL with errno.
 */
extern void *fsc_scratch (struct fsc_cache *cache, size_t size);


/*----------------------------------------------------------------------
 * Shared by the object files (object.c, retrieve.c, store.c, commit.c,
 * sums.c).
 */

#define MAX_FETCH_BYTES (4u << 20)      /* one upstream read at most */
#define INLINE_FETCH_BYTES (1u << 20)   /* a prefetch's piece */
#define BIG_FETCH_MAX (16u << 20)       /* prefetches' 4 MiB fetches in
                                         * flight (retrieve.c) */
#define MAX_RUN_BLOCKS 1024             /* 4 MiB of 4K blocks */
#define MAX_RUN_GROUPS (MAX_RUN_BLOCKS / FSC_GROUP_BLOCKS + 2)
_Static_assert (MAX_RUN_GROUPS <= FSC_FILL_MAX_GROUPS,
                "a fill job must hold a whole run's epochs");
#define DIRTY_KICK 256                  /* dirty groups that wake the
                                         * committer early */
#define DIRTY_MAX 4096                  /* dirty groups a fill commits
                                         * itself past (store.c) */
#define NOFILL_SECONDS 10               /* pause after ENOSPC */
#define SUB_SHIFT 12                    /* 4 KiB sub-blocks */
#define SUB_SIZE (UINT64_C (1) << SUB_SHIFT)
#define MAX_SUBS (FSC_MAX_BLOCK_SIZE >> SUB_SHIFT)

#define GROUP_OF(b) ((b) / FSC_GROUP_BLOCKS)

/* The claim queue a read waiting for block B's claim waits on: a
 * hash of B, so that the reads at a stream's front (which wait on
 * neighbouring blocks, of one group) spread over the queues.
 */
static inline unsigned
fsc_claim_queue (uint64_t b)
{
  return (b * UINT64_C (0x9E3779B97F4A7C15)) >> (64 - FSC_CLAIM_SHIFT);
}

/* Wake the reads waiting for the claims of blocks B0..B1 of O.  Caller
 * holds o->lock and has just released claims there, or made their
 * bytes readable elsewhere (fill.c's queue).  A run as long as the
 * queues are many wakes them all.
 */
static inline void
fsc_claim_wake (struct fsc_object *o, uint64_t b0, uint64_t b1)
{
  uint64_t qs = 0;
  if (b1 - b0 >= FSC_CLAIM_QUEUES - 1)
    qs = UINT64_MAX;
  else
    for (uint64_t b = b0; b <= b1; ++b)
      qs |= UINT64_C (1) << fsc_claim_queue (b);
  for (unsigned q = 0; q < FSC_CLAIM_QUEUES; ++q)
    if ((qs & (UINT64_C (1) << q)) && o->claim_waiting[q])
      pthread_cond_broadcast (&o->claim_cond[q]);
}

#define BIT_OF(b) (UINT64_C (1) << ((b) % FSC_GROUP_BLOCKS))
#define IDX_OF(b) ((b) % FSC_GROUP_BLOCKS)

/* The bits of group GI's blocks within blocks [B0, B1] (0 if none). */
static inline uint64_t
group_span_bits (uint64_t gi, uint64_t b0, uint64_t b1)
{
  uint64_t lo = gi * FSC_GROUP_BLOCKS, hi = lo + FSC_GROUP_BLOCKS - 1;
  if (b0 > lo)
    lo = b0;
  if (b1 < hi)
    hi = b1;
  if (lo > hi)
    return 0;
  unsigned n = hi - lo + 1;
  return (n == FSC_GROUP_BLOCKS ? ~UINT64_C (0)
          : (UINT64_C (1) << n) - 1) << IDX_OF (lo);
}

static inline uint64_t
block_start (const struct fsc_geom *g, uint64_t b)
{
  return b << g->bshift;
}

/* End (exclusive) of block B; the last block may be short. */
static inline uint64_t
block_end (const struct fsc_geom *g, uint64_t b)
{
  return MIN ((b + 1) << g->bshift, g->size);
}

/* Sub-blocks per block, and the offset of block B's hashes in the
 * sums file.
 */
static inline unsigned
subs_per_block (const struct fsc_geom *g)
{
  return g->block_size >> SUB_SHIFT;
}

static inline uint64_t
sums_offset (const struct fsc_geom *g, uint64_t b)
{
  return b * subs_per_block (g) * 8;
}

/* data.c: an object's data segment files (data.h). */
#include "data.h"

/* The bytes file FD allocates, as du counts them (0 if FD is -1 or
 * cannot be stat'ed), and punching a hole into it that keeps its size
 * (0 or -1 with errno): the cap's accounting and its evictions.
 */
static inline uint64_t
fd_allocated (int fd)
{
  struct stat st;
  return fd >= 0 && fstat (fd, &st) == 0 ? (uint64_t) st.st_blocks * 512 : 0;
}

static inline int
punch_hole (int fd, uint64_t off, uint64_t len)
{
  return fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t) off, (off_t) len);
}

/* The group table and its paging (groups.c). */
#include "groups.h"

/* Group GI (< o->geom.ngroups), or NULL if none is allocated. */
static inline struct group *
grp (const struct fsc_object *o, uint64_t gi)
{
  if (gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT) >= o->pager.ntop)
    return NULL;                /* too large to cache: none */
  const struct gmid *m = o->pager.gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
  if (m == NULL)
    return NULL;
  const struct gleaf *l = m->l[(gi >> GT_LEAF_SHIFT) & (GT_MID - 1)];
  return l ? l->g[gi & (GT_LEAF - 1)] : NULL;
}

/* The group of block B, allocated if ALLOC.  Caller holds o->lock. */
static inline struct group *
group_of (struct fsc_object *o, uint64_t b, bool alloc)
{
  uint64_t gi = GROUP_OF (b);
  struct group *g = grp (o, gi);
  if (g == NULL && alloc)
    g = fsc_grp_alloc (o, gi);
  return g;
}

static inline bool
present (struct fsc_object *o, uint64_t b)
{
  struct group *g = grp (o, GROUP_OF (b));
  return g && (g->present & BIT_OF (b));
}

/* Pieces (docs/format.md): a block is fetched and held whole or in
 * pieces of block_size / FSC_PIECES bytes, at least one 4 KiB
 * sub-block, so that a small random read fetches what it asks for
 * and not a whole block.  A present block's pieces are a bit mask,
 * 0 meaning the whole block (as version 1 of the index had it).
 */
#define FSC_PIECES 16
#define PIECE_SHIFT_OF(bshift) \
  ((bshift) >= SUB_SHIFT + 4 ? (bshift) - 4 : SUB_SHIFT)

static inline uint64_t
piece_size (const struct fsc_object *o)
{
  return UINT64_C (1) << o->geom.pshift;
}

/* The pieces of block B that [LO, HI) (within the block, LO < HI)
 * overlaps.
 */
static inline unsigned
pieces_of (const struct fsc_geom *g, uint64_t b, uint64_t lo, uint64_t hi)
{
  uint64_t bs = block_start (g, b);
  unsigned p0 = (lo - bs) >> g->pshift, p1 = (hi - 1 - bs) >> g->pshift;
  return ((2u << p1) - 1) & ~((1u << p0) - 1);
}

/* All the pieces of block B (the last block may have fewer). */
static inline unsigned
full_pieces (const struct fsc_geom *g, uint64_t b)
{
  return pieces_of (g, b, block_start (g, b), block_end (g, b));
}

/* Bytes held by present block B, whose pieces are P. */
static inline uint64_t
held_bytes (const struct fsc_geom *g, uint64_t b, unsigned p)
{
  uint64_t len = block_end (g, b) - block_start (g, b);
  return p == 0 ? len
    : MIN (len, (uint64_t) __builtin_popcount (p) << g->pshift);
}

/* Bytes present block B of group G holds in the data file: none for a
 * zero block.  Caller holds o->lock.
 */
static inline uint64_t
block_held (const struct fsc_object *o, const struct group *g, uint64_t b)
{
  return (g->zero & BIT_OF (b)) ? 0 : held_bytes (&o->geom, b,
                                                  g->pieces[IDX_OF (b)]);
}

/* Zero blocks (docs/format.md, "Zero blocks"): the index checksum an
 * all-zero block B has, so that a zero block is checked without
 * reading anything.
 */
static inline uint64_t
zero_csum (const struct fsc_geom *g, uint64_t b)
{
  return block_end (g, b) - block_start (g, b) == g->block_size
    ? g->zcsum : g->zcsum_last;
}

/* Checksums and the hash cache (sums.c). */
#include "sums.h"

/* withdraw.c: withdraw O (uncached from now on) because of ERR, and
 * unlink its files.  Takes o->lock.
 */
extern void fsc_withdraw (struct fsc_object *o, int err);

/* evict.c: the size cap (evict.h). */
#include "evict.h"

/* evict.c: BITS of G stop being present (evicted, invalidated, bad).
 * Holds o->lock.
 */
static inline void
fsc_note_gone (struct fsc_object *o, struct group *g, uint64_t bits)
{
  o->evict.nprobation -= __builtin_popcountll (bits & g->probation);
  g->probation &= ~bits;
  g->unread &= ~bits;
}

/* reclaim.c: the reclaimer thread (reclaim.h). */
#include "reclaim.h"

/* catchup.c: note a skipped fill of [OFFSET, OFFSET + LEN) (whole
 * blocks around it), and free the ranges when the object goes.
 */
extern void fsc_catchup_note (struct fsc_object *o, uint64_t offset,
                              uint64_t len);
extern void fsc_catchup_free (struct fsc_object *o);

/* object.c: called by the reclaimer thread when its walk ends: close
 * O if it lingered and nobody took it back meanwhile.  Without locks.
 */
extern void fsc_object_linger_done (struct fsc_object *o);

/* store.c: store N claimed blocks from B and publish those nothing
 * invalidated since EPOCHS (one per group from B's) were taken.  DATA
 * holds the export's bytes [START, START+LEN): all of the blocks, or
 * at either end only some of a block's pieces, which are then added to
 * those it holds.  DATA NULL (a failed fetch): release only.
 */
#define FSC_FILL_PREFETCHED 1u  /* nobody read these blocks yet */
#define FSC_FILL_SCAN       2u  /* a prefetch or a sequential stream's:
                                 * may not take a referenced block's
                                 * place (evict.c) */
extern void fsc_fill_blocks (struct fsc_object *o, uint64_t b, uint64_t n,
                             const unsigned char *data, uint64_t start,
                             uint64_t len, const uint64_t *epochs,
                             unsigned flags);


/* share-*.c: one object for the whole host (share-int.h).  The layers
 * below sharing reach these only through share-hooks.h's table; cache.c,
 * above it, calls them directly.
 */
extern int fsc_share_start (struct fsc_object *o);
extern void fsc_share_stop (struct fsc_object *o);
extern int fsc_share_join (struct fsc_object *o,
                           const struct fsc_object_params *p,
                           struct fsc_open_info *info);
extern void fsc_share_leave (struct fsc_object *o);
extern struct fsc_object *fsc_share_detach_local (struct fsc_object *o);
/* retrieve.c: fsc_object_read of an object held here, with the bytes
 * that came from the upstream in *MISSED.
 */
extern int fsc_read_counted (struct fsc_object *o, void *buf, uint32_t count,
                             uint64_t offset, const struct fsc_upstream *up,
                             unsigned flags, uint64_t *missed);
extern void fsc_share_bump (struct fsc_object *o, uint64_t g0, uint64_t g1);
extern void fsc_share_bump_all (struct fsc_object *o);
/* object.c: open the object for P in this process, holding it (no
 * joining), listed; for share-link.c's takeover.  Returns 0 or -1 (busy,
 * or the files failed).
 */
extern int fsc_object_open_local (struct fsc_cache *c,
                                  const struct fsc_object_params *p,
                                  struct fsc_object **objp,
                                  struct fsc_open_info *info);
/* object.c: a new reference unless the object is closing. */
extern bool fsc_object_tryref (struct fsc_object *o);

#endif /* FSC_INTERNAL_H */
