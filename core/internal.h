/* libfscache: structures shared by cache.c and object.c only.
 *
 * Locking, in the order they may be taken:
 *   cache->lock   the object list and the committer's state
 *   obj->lock     everything in the object and its groups
 * Neither is ever held across upstream or disk I/O (commits serialise
 * on obj->committing, a flag waited on with obj->cond).
 */
#ifndef FSC_INTERNAL_H
#define FSC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "fscache.h"
#include "io.h"
#include "keyenc.h"

/* A fill handed to the cache's fill thread: N claimed blocks from
 * BLOCK of OBJ (a reference is held), their bytes in DATA.
 */
#define FSC_FILL_MAX_GROUPS (1024 / 64 + 2)
struct fsc_fill {
  struct fsc_fill *next;
  struct fsc_object *obj;
  uint64_t block, nblocks;
  size_t len;
  uint64_t epochs[FSC_FILL_MAX_GROUPS];
  unsigned char data[];
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
   * queued; the thread runs between fsc_cache_start and close.
   */
  pthread_mutex_t fill_lock;
  pthread_cond_t fill_cond;
  struct fsc_fill *fill_head, **fill_tail;
  size_t fill_bytes;
  pthread_t filler;
  bool filler_running;
  bool fill_stopping;
};

/* In-memory state of FSC_GROUP_BLOCKS consecutive blocks.  Allocated
 * on first use, so a huge export with little cached costs little.
 */
struct group {
  uint64_t present;             /* may be served now */
  uint64_t disk_max;            /* may be present in a durable or
                                 * in-flight record */
  uint64_t fetching;            /* claimed by a fetch or store */
  uint32_t epoch;               /* bumped by every invalidation */
  uint32_t writers;             /* writes in flight upstream */
  uint8_t slot;                 /* slot of the newest record on disk */
  bool has_record;
  bool dirty;                   /* on obj->dirty */
  bool reserved;                /* index space allocated */
  uint64_t csum[FSC_GROUP_BLOCKS];
};

struct fsc_object {
  struct fsc_cache *cache;
  struct fsc_object *next;      /* cache->objects; under cache->lock */
  unsigned refs;                /* under cache->lock */
  bool ready;                   /* lookup done; under cache->lock */
  bool closing;                 /* last reference gone, closing; under
                                 * cache->lock */
  unsigned char *key;
  size_t key_len;
  char name[FSC_NAME_MAX + 1];
  char fan[FSC_FAN_MAX + 1];
  int fandirfd, ifd, dfd, sfd;  /* -1 when uncached */
  bool verify;
  uint32_t block_size;
  unsigned bshift;
  uint64_t size, nblocks, ngroups;
  struct group **groups;        /* ngroups pointers */

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
  bool data_dirty;              /* data written since the last sync */
  bool written;                 /* saw a write: fingerprint stale */
  int withdraw_err;             /* errno that withdrew it */
  unsigned pending_fills;       /* queued on the cache's fill thread */
  bool busy;                    /* another process holds it: uncached */
  bool marked;                  /* busy, and the stale mark is made */
  unsigned notices;             /* FSC_NOTICE_* not yet taken */
};

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

/* cache.c: a fill job with room for LEN bytes, or NULL if fills are
 * not done in the background now (no thread, queue full, no memory).
 */
extern struct fsc_fill *fsc_fill_new (struct fsc_cache *cache, size_t len);

/* cache.c: queue F for OBJ (taking a reference on OBJ). */
extern void fsc_fill_submit (struct fsc_cache *cache, struct fsc_object *obj,
                             struct fsc_fill *f);

/* cache.c: free a job that was not submitted. */
extern void fsc_fill_free (struct fsc_cache *cache, struct fsc_fill *f);

/* object.c: store and publish a queued fill (the fill thread). */
extern void fsc_fill_run (struct fsc_fill *f);

/* cache.c: ask the committer to run soon. */
extern void fsc_cache_kick (struct fsc_cache *cache);

#endif /* FSC_INTERNAL_H */
