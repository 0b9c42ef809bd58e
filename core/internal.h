/* libfscache: what the files of core/ share, and nobody else.
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
#include "index.h"
#include "io.h"
#include "keyenc.h"
#include "utils.h"

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
  uint64_t epochs[FSC_FILL_MAX_GROUPS];
  unsigned char *data;          /* LEN bytes, from fsc_buf_get */
};

/* A throughput meter (fill.c): bytes per second of busy time, "busy"
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

struct fsc_cache {
  int dirfd;                    /* the cache directory */
  int objdirfd;                 /* its objects/ subdirectory */
  unsigned char uuid[16];
  struct fsc_io io;
  struct fsc_stats stats;
  unsigned commit_interval_ms;
  pthread_key_t scratch_key;    /* per-thread bounce buffer */

  pthread_mutex_t lock;
  pthread_cond_t cond;          /* wakes the committer */
  pthread_cond_t ready_cond;    /* an object's lookup finished */
  struct fsc_object *objects;   /* open objects, linked by ->next */
  pthread_t committer;
  bool committer_running;
  bool stopping;
  bool commit_wanted;

  /* Background fills: a FIFO under fill_lock, at most FILL_MAX_BYTES
   * queued (fill_bytes, also read without the lock: atomic stores);
   * the thread runs between fsc_cache_start and close.
   */
  pthread_mutex_t fill_lock;
  pthread_cond_t fill_cond;             /* wakes the fill thread */
  pthread_cond_t fill_idle_cond;        /* the queue ran empty */
  struct fsc_fill *fill_head, **fill_tail;
  struct fsc_fill *fill_current;        /* the job being written */
  size_t fill_bytes;
  pthread_t filler;
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

  /* Is the cache disk the bottleneck (fill.c, fsc_fill_slower)? */
  struct fsc_meter up_meter;            /* every upstream read */
  uint64_t up_latency_ns;               /* a moving average of one
                                         * upstream read's time (relaxed
                                         * atomics; fsc_upstream_remote) */
  struct fsc_meter fill_meter;          /* fills written (thread and
                                         * inline) and synced */

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
  bool on_punch;                /* on obj->punch */
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
  char name[FSC_NAME_MAX + 1];
  char fan[FSC_FAN_MAX + 1];
  int fandirfd, ifd, sfd;       /* -1 when uncached */
  int *dfds;                    /* data segments (data.c); NULL when
                                 * uncached */
  uint64_t nseg;
  unsigned char *seg_dirty;     /* written since the last sync */
  bool verify;
  uint32_t block_size;
  unsigned bshift;
  unsigned pshift;              /* log2 of the piece size */
  uint64_t size, nblocks, ngroups;
  uint64_t zcsum, zcsum_last;   /* index checksum of an all-zero block,
                                 * and of the last block if short
                                 * (fsc_zero_csums) */
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

  pthread_mutex_t lock;
  pthread_cond_t cond;          /* fetch done, commit done */
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
  bool written;                 /* saw a write: fingerprint stale */
  int withdraw_err;             /* errno that withdrew it */
  unsigned pending_fills;       /* queued on the cache's fill thread */
  bool busy;                    /* another process holds it: uncached */
  struct share_server *share;   /* share-owner.c: serving others */
  struct fsc_join *join;        /* share-*.c: joined another's: a shell */
  struct fsc_open_info refusal; /* share-*.c: its owner refused us */
  bool test_no_claim;           /* NBD_FSCACHE_TEST_NO_CLAIM: a read
                                 * does not wait for a block another
                                 * request is fetching (tests only) */
  bool marked;                  /* busy, and the stale mark is made */
  unsigned notices;             /* FSC_NOTICE_* not yet taken */

  /* Skipped fills to make up (catchup.c), under their own leaf lock. */
  pthread_mutex_t cu_lock;
  struct cu_range *cu;          /* a ring of ranges */
  size_t cu_head, cu_len, cu_cap;
  uint64_t cu_pending;          /* their bytes */
  bool cu_on;                   /* noting (fsc_catchup_enable) */

  /* Size cap (evict.c), under lock unless said otherwise. */
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

  /* The reclaimer thread (evict.c), started by fsc_object_open and
   * joined by fsc_object_close.
   */
  pthread_t reclaim_thread;
  bool reclaim_joinable;        /* started, not joined */
  bool reclaim_running;         /* under lock */
  bool reclaim_done;            /* under lock: the walk finished */
  bool reclaim_closing;         /* under lock: the close waits for it */
  bool reclaim_stop;            /* under lock: stop at the next group
                                 * (an open wants the object anew) */
  bool reclaim_unclean;         /* the previous user crashed */
  bool reclaim_wanted;          /* lookup asks for the thread */
  unsigned test_walk_delay_ms;  /* NBD_FSCACHE_TEST_WALK_DELAY_MS: a
                                 * pause after each group the walk
                                 * looks at (tests only) */
  bool lingering;               /* under cache->lock: no reference left,
                                 * kept open for the walk, whose thread
                                 * closes it when done (evict.c) */
};

#define FSC_OSTAT_ADD(o, field, n)                                       \
  __atomic_add_fetch (&(o)->ostats.v[FSC_OSTAT_##field], (n),           \
                      __ATOMIC_RELAXED)
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

/* live.c: rewrite NAME.stats (OPEN: the object is still open) if it
 * is due, or always if FORCE.  Failing costs only the statistics.
 */
extern void fsc_live_publish (struct fsc_object *obj, bool open, bool force);

/* commit.c: write the superblock if a counter changed since the last
 * one was written.  Returns 0, or -1 (object withdrawn).
 */
extern int fsc_object_save_counters (struct fsc_object *obj);

/* live.c: read the counters of OBJ's NAME.stats into OUT if it is
 * there, readable and of OBJ's key, with the incarnation and the time
 * (seconds) it gives if those are not NULL.  Returns 0, or -1 (nothing
 * set).
 */
extern int fsc_live_load (struct fsc_object *obj, struct fsc_ostats *out,
                          uint64_t *incarnation, uint64_t *updated);

/* object.c: if another process marked OBJ stale (it wrote upstream
 * while we held the object), withdraw it.  Returns true if it did.
 */
extern bool fsc_object_check_stale (struct fsc_object *obj);

/* object.c: true if OBJ has uncommitted changes.  Takes obj->lock. */
extern bool fsc_object_has_dirty (struct fsc_object *obj);

/* cache.c: the calling thread's scratch buffer of at least SIZE bytes
 * (reused across calls), or NULL with errno.
 */
extern void *fsc_scratch (struct fsc_cache *cache, size_t size);

/* fill.c: a fill job with room for LEN bytes, or NULL with errno if
 * fills are not done in the background (ENOTSUP: no thread, or it is
 * stopping; ENOMEM).
 */
extern struct fsc_fill *fsc_fill_new (struct fsc_cache *cache, size_t len);

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

/* fill.c: set up meter M, whose busy time adds to the stats counter
 * *BUSY_US; and free it.
 */
extern void fsc_meter_init (struct fsc_meter *m, uint64_t *busy_us);
extern void fsc_meter_destroy (struct fsc_meter *m);

/* fill.c: an operation of meter M begins; it ends having moved BYTES
 * (0 if it failed).  Take m->lock.
 */
extern void fsc_meter_begin (struct fsc_meter *m);
extern void fsc_meter_end (struct fsc_meter *m, uint64_t bytes);

/* fill.c: free a job that was not submitted. */
extern void fsc_fill_free (struct fsc_cache *cache, struct fsc_fill *f);

/* fill.c: a buffer of at least SIZE bytes, mapped apart from malloc's
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

/* cache.c: ask the committer to run soon. */
extern void fsc_cache_kick (struct fsc_cache *cache);


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
#define BIT_OF(b) (UINT64_C (1) << ((b) % FSC_GROUP_BLOCKS))
#define IDX_OF(b) ((b) % FSC_GROUP_BLOCKS)

/* Longest name of an object's file: NAME and a suffix. */
#define FILE_NAME_MAX (FSC_NAME_MAX + 32)

static inline uint64_t
block_start (const struct fsc_object *o, uint64_t b)
{
  return b << o->bshift;
}

/* End (exclusive) of block B; the last block may be short. */
static inline uint64_t
block_end (const struct fsc_object *o, uint64_t b)
{
  return MIN ((b + 1) << o->bshift, o->size);
}

/* Sub-blocks per block, and the offset of block B's hashes in the
 * sums file.
 */
static inline unsigned
subs_per_block (const struct fsc_object *o)
{
  return o->block_size >> SUB_SHIFT;
}

static inline uint64_t
sums_offset (const struct fsc_object *o, uint64_t b)
{
  return b * subs_per_block (o) * 8;
}

/* data.c: the data in segment files of FSC_SEG_SIZE bytes: NAME.data
 * for the first, NAME.data.I for segment I >= 1.  Open (creating) them
 * all, setting *SIZES_OK if each has its length; truncate them to
 * their lengths, empty; close them; unlink them (by name, opened or
 * not); read, write (returns 0 or -1), sync what was written, punch,
 * and count allocated bytes.  All but unlink return -1 with errno on
 * failure; pread returns the bytes read, which may be short.
 */
#define FSC_SEG_SHIFT 40
#define FSC_SEG_SIZE (UINT64_C (1) << FSC_SEG_SHIFT)
#define FSC_SEG_SUFFIX_MAX 28
extern int fsc_data_open (struct fsc_object *o, bool *sizes_ok);
extern int fsc_data_reset (struct fsc_object *o);
extern void fsc_data_close (struct fsc_object *o);
extern void fsc_data_unlink (const struct fsc_object *o);
extern ssize_t fsc_data_pread (struct fsc_object *o, void *buf, size_t n,
                               uint64_t off);
extern int fsc_data_pwrite (struct fsc_object *o, const void *buf, size_t n,
                            uint64_t off);
extern int fsc_data_sync (struct fsc_object *o);
extern int fsc_data_punch (struct fsc_object *o, uint64_t off, uint64_t len);
extern uint64_t fsc_data_allocated (const struct fsc_object *o);

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

/* object.c: open (creating if needed, mode 0600 whatever the umask)
 * the object's file NAME+SUFFIX, refusing symlinks (ELOOP) and anything
 * not our own regular file with one link (EPERM; a FIFO or a device is
 * never waited on: safeopen.h).  Returns the descriptor or -1 with
 * errno.
 */
extern int fsc_open_file (struct fsc_object *o, const char *suffix);
/* object.c: the same with open FLAGS of the caller's (O_RDONLY, say:
 * tools that must not create anything, inspect.c).
 */
extern int fsc_open_file_flags (const struct fsc_object *o,
                                const char *suffix, int flags);
/* object.c: the same for file NAME in directory DIRFD. */
extern int fsc_openat_own (int dirfd, const char *name, int flags);

/* groups.c: set up and free O's group table; allocate group GI (and
 * its path) if absent, returning it or NULL (no memory); the first
 * allocated group at GI or after, or o->ngroups.  Under o->lock once
 * the object is listed.
 */
extern int fsc_gtable_init (struct fsc_object *o);
extern void fsc_gtable_free (struct fsc_object *o);
extern struct group *fsc_grp_alloc (struct fsc_object *o, uint64_t gi);
extern uint64_t fsc_grp_next (const struct fsc_object *o, uint64_t gi);

/* groups.c: paging (see the top of groups.c).  Make groups G0..G1
 * resident, reading the records of those that are not, and pin them
 * (not paged out until unpinned).  Without o->lock.  Returns 0, or -1
 * with errno and no pins held if a record could not be read or a group
 * held (the object is withdrawn then).
 */
extern int fsc_groups_pin (struct fsc_object *o, uint64_t g0, uint64_t g1);
/* groups.c: pin G0..G1 if all are resident (not loading) and return
 * true; else pin nothing and return false.  Caller holds o->lock.
 */
extern bool fsc_groups_pin_resident (struct fsc_object *o, uint64_t g0,
                                     uint64_t g1);
/* groups.c: drop the pins of G0..G1 (taken by a successful
 * fsc_groups_pin).  Without o->lock.
 */
extern void fsc_groups_unpin (struct fsc_object *o, uint64_t g0,
                              uint64_t g1);
/* groups.c: page out unused groups until at most o->res_max are
 * resident, or none more can go.  Caller holds o->lock.
 */
extern void fsc_groups_trim (struct fsc_object *o);
/* groups.c: read the records of up to N groups with records from
 * group *GI on (wrapping), so that the eviction policy sees them;
 * *FIRST is set to the first of them, *GI moves past them.  Without
 * o->lock.  Returns 0 or -1 with errno.
 */
extern int fsc_groups_page_in (struct fsc_object *o, uint64_t *first,
                               uint64_t *gi, unsigned n);
/* groups.c: fill G (of group REC->group, slot SLOT on disk) from the
 * record REC, dropping what damage could have made wrong.
 */
extern void fsc_group_from_rec (struct fsc_object *o, struct group *g,
                                const struct fsc_grec *rec, int slot);
/* groups.c: the present blocks of G (group GI) and their bytes. */
extern void fsc_group_count (const struct fsc_object *o, uint64_t gi,
                             const struct group *g, uint64_t *blocks,
                             uint64_t *bytes);
/* groups.c: the census (after a crash, or an index without gauges):
 * count every non-resident group's record into o->nonres_*.  Stops
 * early (returning 0) if the object is withdrawn.  Without o->lock.
 */
extern int fsc_groups_census (struct fsc_object *o);

/* Group GI (< o->ngroups), or NULL if none is allocated. */
static inline struct group *
grp (const struct fsc_object *o, uint64_t gi)
{
  if (gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT) >= o->ntop)
    return NULL;                /* too large to cache: none */
  const struct gmid *m = o->gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
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
  return UINT64_C (1) << o->pshift;
}

/* The pieces of block B that [LO, HI) (within the block, LO < HI)
 * overlaps.
 */
static inline unsigned
pieces_of (const struct fsc_object *o, uint64_t b, uint64_t lo, uint64_t hi)
{
  uint64_t bs = block_start (o, b);
  unsigned p0 = (lo - bs) >> o->pshift, p1 = (hi - 1 - bs) >> o->pshift;
  return ((2u << p1) - 1) & ~((1u << p0) - 1);
}

/* All the pieces of block B (the last block may have fewer). */
static inline unsigned
full_pieces (const struct fsc_object *o, uint64_t b)
{
  return pieces_of (o, b, block_start (o, b), block_end (o, b));
}

/* Bytes held by present block B, whose pieces are P. */
static inline uint64_t
held_bytes (const struct fsc_object *o, uint64_t b, unsigned p)
{
  uint64_t len = block_end (o, b) - block_start (o, b);
  return p == 0 ? len
    : MIN (len, (uint64_t) __builtin_popcount (p) << o->pshift);
}

/* Bytes present block B of group G holds in the data file: none for a
 * zero block.  Caller holds o->lock.
 */
static inline uint64_t
block_held (const struct fsc_object *o, const struct group *g, uint64_t b)
{
  return (g->zero & BIT_OF (b)) ? 0 : held_bytes (o, b, g->pieces[IDX_OF (b)]);
}

/* Zero blocks (docs/format.md, "Zero blocks"): the index checksum an
 * all-zero block B has, so that a zero block is checked without
 * reading anything.
 */
static inline uint64_t
zero_csum (const struct fsc_object *o, uint64_t b)
{
  return block_end (o, b) - block_start (o, b) == o->block_size
    ? o->zcsum : o->zcsum_last;
}

/* sums.c: hash each 4 KiB sub-block of LEN bytes at P into OUT;
 * returns how many (the last may be short).
 */
extern unsigned fsc_sub_hashes (const unsigned char *p, uint64_t len,
                                uint64_t *out);

/* sums.c: the index checksum of a block from its K sub-block hashes. */
extern uint64_t fsc_sums_csum (const uint64_t *sums, unsigned k);

/* sums.c: the index checksum of a whole block of LEN bytes at P. */
extern uint64_t fsc_block_csum (const unsigned char *p, uint64_t len);

/* sums.c: set O->zcsum and O->zcsum_last from its geometry (block_size,
 * size, nblocks).
 */
extern void fsc_zero_csums (struct fsc_object *o);

/* sums.c: copy into SUMS the K hashes of block B kept from an earlier
 * check against CSUM with PIECES, and return true; or false if none are
 * kept.  Remember them after a check.  Take o->lock (the _locked one:
 * the caller holds it).
 */
extern bool fsc_scache_get_locked (struct fsc_object *o, uint64_t b,
                                   uint64_t csum, unsigned pieces,
                                   uint64_t *sums, unsigned k);
extern bool fsc_scache_get (struct fsc_object *o, uint64_t b, uint64_t csum,
                            unsigned pieces, uint64_t *sums, unsigned k);
extern void fsc_scache_put (struct fsc_object *o, uint64_t b, uint64_t csum,
                            unsigned pieces, const uint64_t *sums,
                            unsigned k);

/* sums.c: zero the K sub-block hashes of a block at SUMS that lie in
 * none of its pieces P (0: the whole block, nothing to zero), as the
 * index checksum of a block held in pieces counts them.
 */
extern void fsc_sums_mask (const struct fsc_object *o, uint64_t *sums,
                           unsigned k, unsigned p);

/* commit.c: queue group GI for the next commit.  Caller holds
 * o->lock.  Returns 0, or -1 (ENOMEM).
 */
extern int fsc_mark_dirty (struct fsc_object *o, uint64_t gi,
                           struct group *g);

/* commit.c: write o->sb, with SET_FLAGS set, CLEAR_FLAGS cleared and
 * (if not NULL) *FINGERPRINT, into the other slot and sync.  Returns 0
 * or -1 (object withdrawn).  Takes o->lock.
 */
extern int fsc_write_sb (struct fsc_object *o, uint32_t set_flags,
                         uint32_t clear_flags, const uint64_t *fingerprint);

/* commit.c: before the first change to the object's files after a
 * clean open (a data or sums write or punch, an index record, the
 * sample mode's stale mark), make the superblock's not-clean mark
 * durable, once: see "Crash safety" in docs/design.md.  Returns 0 (at
 * once if it is, or if the object was not opened clean), or -1 (the
 * object withdrawn).  Takes o->lock; never call it holding the lock
 * or the index (o->committing).
 */
extern int fsc_object_mark_in_use (struct fsc_object *o);

/* commit.c: make every change up to TARGET (a change_seq) durable.
 * Returns 0, or -1 if the object is (or became) withdrawn.  Takes
 * o->lock.
 */
extern int fsc_commit_upto (struct fsc_object *o, uint64_t target);

/* commit.c: make sure the index has room for the records of groups
 * G0..G1, so that no commit fails for want of space.  Returns 0 or -1.
 */
extern int fsc_reserve_groups (struct fsc_object *o, uint64_t g0,
                               uint64_t g1);

/* object.c: the name of the object's file with SUFFIX (".idx",
 * ".data", ".sums", ".stale") in its fan-out directory, in BUF.
 */
extern const char *fsc_file_name (const struct fsc_object *o,
                                  const char *suffix,
                                  char buf[FILE_NAME_MAX]);

/* object.c: withdraw O (uncached from now on) because of ERR, and
 * unlink its files.  Takes o->lock.
 */
extern void fsc_withdraw (struct fsc_object *o, int err);

/* object.c: leave the stale mark for the process holding O. */
extern void fsc_mark_stale (struct fsc_object *o);

/* evict.c: before writing LEN bytes of new blocks into O's files,
 * make sure they fit in its budget (the smaller of fscache-max-size
 * and its quota), evicting blocks if needed (their removal is durable
 * before this returns), and that the cache's filesystem is above its
 * free space floor.  With SCAN (a prefetch's or a sequential stream's
 * blocks), no referenced block is evicted for them.  Returns 0 (LEN
 * bytes reserved: call fsc_room_done after writing), or -1 with errno
 * EAGAIN (do not store: nothing could be evicted, or space is low) or
 * another error (withdraw).
 */
extern int fsc_make_room (struct fsc_object *o, uint64_t len, bool scan);
extern void fsc_room_done (struct fsc_object *o, uint64_t len);

/* evict.c: drop blocks that were invalidated and punch their space
 * when O has a budget (called with the groups' bits already cleared).
 * Caller holds o->lock.
 */
extern void fsc_note_dropped (struct fsc_object *o, uint64_t gi,
                              uint64_t bits);

/* evict.c: block B became present after a fill: on probation until
 * hit again.  Holds o->lock.
 */
extern void fsc_note_filled (struct fsc_object *o, uint64_t b,
                             bool prefetched);

/* evict.c: BITS of G stop being present (evicted, invalidated, bad).
 * Holds o->lock.
 */
static inline void
fsc_note_gone (struct fsc_object *o, struct group *g, uint64_t bits)
{
  o->nprobation -= __builtin_popcountll (bits & g->probation);
  g->probation &= ~bits;
  g->unread &= ~bits;
}

/* evict.c: punch the space of blocks evicted (and committed) or
 * dropped by writes that is still queued; failures are ignored (the
 * space stays until the next unclean open reclaims it).
 */
extern void fsc_punch_pending (struct fsc_object *o);

/* evict.c: punch the space of the data and sums files that no present
 * block covers (see "Space nobody names" in evict.c), claiming what it
 * punches so that it may run beside requests.  Returns 0, 1 if the
 * object began to close while a block it must look at again was still
 * claimed (not finished), or -1 with errno (EOPNOTSUPP where holes
 * cannot be punched).
 */
extern int fsc_reclaim_unnamed (struct fsc_object *o);

/* evict.c: start the reclaimer thread of an object just opened: the
 * census if the gauges are not known (groups.c), then after a crash
 * (UNCLEAN) fsc_reclaim_unnamed, else that only if the data files hold
 * clearly more than the blocks do.  Returns 0 or -1 with errno.
 * fsc_reclaim_finish waits for it to end (it ends early only if the
 * object is withdrawn) and tells whether it finished its work (true if
 * it never started).  Without o->lock.
 */
extern int fsc_reclaim_start (struct fsc_object *o, bool unclean);
extern bool fsc_reclaim_finish (struct fsc_object *o);

/* catchup.c: note a skipped fill of [OFFSET, OFFSET + LEN) (whole
 * blocks around it), and free the ranges when the object goes.
 */
struct cu_range;
extern void fsc_catchup_note (struct fsc_object *o, uint64_t offset,
                              uint64_t len);
extern void fsc_catchup_free (struct fsc_object *o);

/* evict.c: may O linger when its last reference goes (stay open,
 * unreferenced, o->lingering, while its walk runs on; the reclaimer
 * thread closes it when done)?  Only while the walk runs, not if the
 * cache is closing, nor for a shell or a withdrawn object.  Caller
 * holds cache->lock.
 */
extern bool fsc_reclaim_may_linger (struct fsc_object *o);

/* evict.c: stop O's walk (and census) at the next group, if it runs:
 * it ends unfinished, and the index stays unclean.  Takes o->lock.
 */
extern void fsc_reclaim_stop (struct fsc_object *o);

/* evict.c: somebody wants lingering O: mark it closing and stop its
 * walk at the next group, so that its thread closes it soon (the
 * waiter then opens it anew: a lookup, with its checks).  Caller holds
 * cache->lock.
 */
extern void fsc_reclaim_unlinger (struct fsc_object *o);

/* object.c: called by the reclaimer thread when its walk ends: close
 * O if it lingered and nobody took it back meanwhile.  Without locks.
 */
extern void fsc_object_linger_done (struct fsc_object *o);

/* evict.c: the committer's look at O: take up a changed quota record
 * and shrink O to its budget.
 */
extern void fsc_object_check_budget (struct fsc_object *o);

/* evict.c: O's budget in bytes (the smaller of fscache-max-size and
 * its quota), UINT64_MAX for none.  Reads under o->lock, or racily for
 * a hint.
 */
extern uint64_t fsc_budget_of (const struct fsc_object *o);

/* evict.c: O's allocated bytes (its three files, as du counts them). */
extern uint64_t fsc_object_allocated (struct fsc_object *o);

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


/* share-*.c: one object for the whole host (share-int.h). */
extern int fsc_share_start (struct fsc_object *o);
extern void fsc_share_stop (struct fsc_object *o);
extern int fsc_share_join (struct fsc_object *o,
                           const struct fsc_object_params *p,
                           struct fsc_open_info *info);
extern void fsc_share_leave (struct fsc_object *o);
extern struct fsc_object *fsc_share_detach_local (struct fsc_object *o);
extern int fsc_share_read (struct fsc_object *o, void *buf, uint32_t count,
                           uint64_t offset, const struct fsc_upstream *up,
                           unsigned flags);
extern int fsc_share_prefetch (struct fsc_object *o, uint64_t offset,
                               uint64_t count, const struct fsc_upstream *up,
                               unsigned flags);
extern int fsc_share_write_begin (struct fsc_object *o, uint64_t offset,
                                  uint64_t count, unsigned flags,
                                  struct fsc_write *w);
extern void fsc_share_write_end (struct fsc_object *o, struct fsc_write *w,
                                 const void *buf, bool upstream_ok);
extern int fsc_share_commit (struct fsc_object *o);
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
