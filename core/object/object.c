/* libfscache: objects, their lookup and their life (the seed's
 * cookies and the object state machine).
 *
 * An object is the cached copy of one upstream export: a sparse data
 * file the size of the export (holes = not cached), a sums file with
 * the XXH3-64 hash of every 4 KiB sub-block of each cached block, and
 * an index (index.h) that records which blocks are present and, for
 * each, the XXH3-64 of its sub-block hashes.  In memory, blocks are
 * grouped by 64 (struct group in internal.h, allocated on first use).
 *
 * States (enum fsc_object_state):
 *
 *   LOOKING_UP -> (CREATING ->) AVAILABLE -> WITHDRAWN
 *
 * fsc_object_open looks the key up in this process first (connections
 * share one object; a second opener waits for the first lookup, and an
 * open racing with the last close waits for the close), then on disk:
 * the index is locked (flock, one process per object), its superblock
 * checked against the coherency data (check_sb, in the order of the
 * seed's check_aux: identity, then coherency), and either reused or
 * started cold.  Anything wrong with the files makes the object
 * WITHDRAWN: uncached, every request goes upstream.
 *
 * Withdrawal (fsc_withdraw, withdraw.c) is the one answer to a failure
 * of the cache's own files: the files are unlinked, so that nothing
 * stale survives, and the object stays listed, withdrawn, until its
 * last user closes it.  An object held by another process is joined:
 * this process's requests go to that one (share-*.c, reached from here
 * only through the table of share-hooks.h, since sharing sits above
 * the object core).  One that cannot be
 * joined (writeback, offline, another upstream) is served uncached
 * here; a write through it leaves a mark (NAME.stale) beside the
 * object's files, and the holder withdraws its copy when it sees the
 * mark: at open, at close and every commit interval.
 *
 * Finding the object on disk, reused or cold, is lookup.c's; naming
 * and opening its files, files.c's.  The
 * operations live beside this file: retrieval (retrieve.c),
 * storage and invalidation (store.c), commits (commit.c), and the
 * checksums they share (sums.c).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uuid/uuid.h>
#include "xxh.h"

#include "internal.h"
#include "lookup.h"
#include "share-hooks.h"
#include "safeopen.h"
#include "utils.h"

static void
free_object (struct fsc_object *o)
{
  fsc_hook_share_stop (o);
  fsc_hook_share_leave (o);
  (void) fsc_reclaim_finish (o);
  fsc_gtable_free (o);
  free (o->dirty);
  free (o->evict.punch);
  free (o->evict.pq);
  free (o->evict.gq);
  free (o->scache);
  free (o->key);
  fsc_catchup_free (o);
  fsc_mrc_free (o->mrc);
  fsc_data_close (o);
  if (o->files.sfd >= 0) close (o->files.sfd);
  if (o->files.ifd >= 0) close (o->files.ifd);
  if (o->files.fandirfd >= 0) close (o->files.fandirfd);
  pthread_mutex_destroy (&o->lock);
  pthread_cond_destroy (&o->cond);
  for (unsigned q = 0; q < FSC_CLAIM_QUEUES; ++q)
    pthread_cond_destroy (&o->claim_cond[q]);
  free (o);
}

static struct fsc_object *find_locked (struct fsc_cache *c,
                                       const struct fsc_object_params *p,
                                       bool full);

/* A new object for P, looking up, not listed.  NULL with errno. */
static struct fsc_object *
new_object (struct fsc_cache *c, const struct fsc_object_params *p)
{
  struct fsc_object *o = calloc (1, sizeof *o);
  if (o == NULL)
    return NULL;
  o->cache = c;
  o->ops = &fsc_local_ops;
  o->refs = 1;
  o->files.fandirfd = o->files.ifd = o->files.sfd = -1;
  o->verify = p->verify;
  o->geom.block_size = p->block_size;
  o->geom.bshift = __builtin_ctz (p->block_size);
  o->geom.pshift = PIECE_SHIFT_OF (o->geom.bshift);
  o->geom.size = p->size;
  o->geom.nblocks = DIV_ROUND_UP (p->size, (uint64_t) p->block_size);
  o->geom.ngroups = DIV_ROUND_UP (o->geom.nblocks, (uint64_t) FSC_GROUP_BLOCKS);
  fsc_zero_csums (&o->geom);
  o->state = FSC_OBJ_LOOKING_UP;
  o->evict.max_size = p->max_size;
  o->evict.quota = UINT64_MAX;
  o->pager.res_max = p->resident_groups ? p->resident_groups
    : FSC_RESIDENT_DEFAULT;
  const char *nc = getenv ("NBD_FSCACHE_TEST_NO_CLAIM");
  o->test_no_claim = nc && strcmp (nc, "1") == 0;
  pthread_mutex_init (&o->lock, NULL);
  pthread_cond_init (&o->cond, NULL);
  for (unsigned q = 0; q < FSC_CLAIM_QUEUES; ++q)
    pthread_cond_init (&o->claim_cond[q], NULL);
  pthread_mutex_init (&o->cu_lock, NULL);
  o->key = malloc (p->key_len);
  if (o->key == NULL || fsc_gtable_init (o) == -1) {
    free_object (o);
    errno = ENOMEM;
    return NULL;
  }
  memcpy (o->key, p->key, p->key_len);
  /* The curve is statistics: without memory for it, none. */
  o->mrc = p->no_mrc ? NULL : fsc_mrc_new ();
  o->mrc_since = fsc_wall_ms () / 1000;
  o->key_len = p->key_len;
  return o;
}

/* After a successful lookup: the background walk, and the socket for
 * other processes.
 */
static void
start_local (struct fsc_object *o, const struct fsc_object_params *p)
{
  int e = errno;
  /* Leaked space only costs room: failing to start the walk is no
   * reason to refuse the object (the next unclean open walks).
   */
  if (o->reclaim.wanted)
    (void) fsc_reclaim_start (o, o->reclaim.unclean,
                              fsc_object_linger_done);
  /* Nor is failing to share it: the others are served uncached. */
  if (!p->exclusive && !p->offline)
    (void) fsc_hook_share_start (o);
  errno = e;
}

static void
list_object (struct fsc_cache *c, struct fsc_object *o)
{
  SCOPED_LOCK (&c->lock);
  o->next = c->objects;
  c->objects = o;
  o->listed = true;
}

static void
unlist_object (struct fsc_cache *c, struct fsc_object *o)
{
  SCOPED_LOCK (&c->lock);
  if (o->listed) {
    for (struct fsc_object **pp = &c->objects; *pp; pp = &(*pp)->next)
      if (*pp == o) {
        *pp = o->next;
        break;
      }
    o->listed = false;
  }
  pthread_cond_broadcast (&c->ready_cond);
}

int
fsc_object_open_local (struct fsc_cache *c,
                       const struct fsc_object_params *p,
                       struct fsc_object **objp, struct fsc_open_info *info)
{
  memset (info, 0, sizeof *info);
  struct fsc_object *o = new_object (c, p);
  if (o == NULL)
    return -1;
  FSC_STAT_ADD (&c->stats, objects_opened, 1);
  if (fsc_lookup (o, p, info) == -1) {
    int e = errno;
    free_object (o);
    errno = e;
    return -1;
  }
  start_local (o, p);
  o->ready = true;
  list_object (c, o);
  *objp = o;
  return 0;
}

int
fsc_object_open (struct fsc_cache *c, const struct fsc_object_params *p,
                 struct fsc_object **objp, struct fsc_open_info *info)
{
  memset (info, 0, sizeof *info);
  if (p->key_len == 0 || !is_power_of_2 (p->block_size) ||
      p->block_size < SUB_SIZE || p->block_size > FSC_MAX_BLOCK_SIZE ||
      p->validate < FSC_VALIDATE_NONE || p->validate > FSC_VALIDATE_SAMPLE ||
      (p->generation && strlen (p->generation) > FSC_GEN_MAX)) {
    errno = EINVAL;
    return -1;
  }
  FSC_STAT_ADD (&c->stats, objects_opened, 1);

  struct fsc_object *o = new_object (c, p);
  if (o == NULL)
    return -1;

  /* Already open, or being looked up, in this process: share it.
   * Otherwise list ours before looking it up, so that concurrent opens
   * of one key wait for one lookup instead of racing for the lock.
   */
  pthread_mutex_lock (&c->lock);
  struct fsc_object *shared = find_locked (c, p, true);
  if (shared == NULL) {
    o->next = c->objects;
    c->objects = o;
    o->listed = true;
  }
  pthread_mutex_unlock (&c->lock);
  if (shared) {
    free_object (o);
    if (shared->refusal.refused) {
      *info = shared->refusal;
      fsc_object_close (shared);
      errno = EPERM;
      return -1;
    }
    *objp = shared;
    info->shared = true;
    info->state = fsc_object_state (shared);
    info->present_blocks = fsc_object_present_blocks (shared);
    return 0;
  }

  if (fsc_lookup (o, p, info) == -1) {
    info->err = errno;
    fsc_data_close (o);
    if (o->files.sfd >= 0) { close (o->files.sfd); o->files.sfd = -1; }
    if (o->files.ifd >= 0) { close (o->files.ifd); o->files.ifd = -1; }
    /* Another process holds it: join that one's (share-joiner.c). */
    if (o->busy && !p->exclusive && !p->offline) {
      if (fsc_hook_share_join (o, p, info) == 0) {
        info->err = 0;
        info->busy = false;
        pthread_mutex_lock (&o->lock);
        o->state = FSC_OBJ_AVAILABLE;
        pthread_mutex_unlock (&o->lock);
        goto ready;
      }
      if (errno == EPERM) {
        /* Refused: every opener hears it (openers waiting for this
         * lookup too), and it stays listed only while they do.
         */
        info->refused = true;
        o->refusal = *info;
        pthread_mutex_lock (&o->lock);
        o->state = FSC_OBJ_WITHDRAWN;
        pthread_mutex_unlock (&o->lock);
        pthread_mutex_lock (&c->lock);
        o->ready = true;
        pthread_cond_broadcast (&c->ready_cond);
        pthread_mutex_unlock (&c->lock);
        fsc_object_close (o);
        errno = EPERM;
        return -1;
      }
    }
    if (o->busy)
      FSC_STAT_ADD (&c->stats, objects_busy, 1);
    /* Uncached: nothing on disk is used or kept open.  It stays
     * listed, so other connections share the verdict until the last
     * one closes it (as a withdrawn cookie in FS-Cache).
     */
    pthread_mutex_lock (&o->lock);
    o->state = FSC_OBJ_WITHDRAWN;
    pthread_mutex_unlock (&o->lock);
    /* A busy object keeps its directory, to mark the holder's copy
     * stale if it writes.
     */
    if (o->files.fandirfd >= 0 && !o->busy) {
      close (o->files.fandirfd);
      o->files.fandirfd = -1;
    }
  }
  else
    start_local (o, p);
 ready:
  pthread_mutex_lock (&c->lock);
  o->ready = true;
  pthread_cond_broadcast (&c->ready_cond);
  pthread_mutex_unlock (&c->lock);

  info->state = fsc_object_state (o);
  if (!info->joined)
    info->present_blocks = fsc_object_present_blocks (o);
  *objp = o;
  return 0;
}

/* Would a lookup with P accept lingering O as it is (check_sb)?  Its
 * superblock in memory is what its last close left on disk (the
 * fingerprint the last user set, the stale mark), and its files are
 * the size they were opened at.  Caller holds cache->lock.
 */
static bool
lingering_fits (struct fsc_object *o, const struct fsc_object_params *p)
{
  SCOPED_LOCK (&o->lock);
  return o->state == FSC_OBJ_AVAILABLE && !o->refusal.refused &&
    fsc_check_sb (o, &o->sb, p, true,
                  sums_offset (&o->geom, o->geom.nblocks)) == FSC_OK;
}

/* The object of P's key open in this process, with a reference (once
 * its lookup has finished), or NULL.  Caller holds c->lock.  FULL: P
 * holds everything a lookup checks (fsc_object_open); else
 * (fsc_object_get, before the caller has sampled the upstream) a
 * lingering object is not returned: the caller opens it in full.
 */
static struct fsc_object *
find_locked (struct fsc_cache *c, const struct fsc_object_params *p,
             bool full)
{
 again:
  for (struct fsc_object *o = c->objects; o; o = o->next) {
    if (o->key_len == p->key_len && memcmp (o->key, p->key, p->key_len) == 0) {
      if (o->lingering && !o->closing && !full)
        return NULL;
      if (o->lingering && !o->closing) {
        /* Left by its last user while its walk runs (evict.c).  Taken
         * back as it is (the walk goes on) if the opener's identity and
         * coherency data are what a lookup would accept; else the walk
         * stops, it closes, and it is looked up anew.
         */
        if (lingering_fits (o, p))
          o->lingering = false;
        else
          fsc_reclaim_unlinger (o);
      }
      if (o->closing) {
        /* Its last user is committing and closing it, and still holds
         * the index lock: wait until it is gone, then look it up anew
         * (else we would find the index locked and go uncached).
         */
        pthread_cond_wait (&c->ready_cond, &c->lock);
        goto again;
      }
      if (o->geom.block_size != p->block_size || o->geom.size != p->size)
        continue;
      o->refs++;
      while (!o->ready)
        pthread_cond_wait (&c->ready_cond, &c->lock);
      return o;
    }
  }
  return NULL;
}

struct fsc_object *
fsc_object_get (struct fsc_cache *c, const struct fsc_object_params *p)
{
  SCOPED_LOCK (&c->lock);
  return find_locked (c, p, false);
}

struct fsc_object *
fsc_object_ref (struct fsc_object *o)
{
  SCOPED_LOCK (&o->cache->lock);
  o->refs++;
  return o;
}

static void close_object (struct fsc_object *o);

void
fsc_object_close (struct fsc_object *o)
{
  struct fsc_cache *c = o->cache;

  pthread_mutex_lock (&c->lock);
  if (o->refs == 1 && fsc_reclaim_may_linger (o)) {
    /* The last user, while the walk after a crash runs: the object
     * will linger until the walk ends (evict.c), without keeping this
     * user waiting; its changes are made durable now, as a close
     * would (our reference still held).
     */
    pthread_mutex_unlock (&c->lock);
    (void) fsc_object_commit (o);
    pthread_mutex_lock (&c->lock);
  }
  if (--o->refs > 0) {
    pthread_mutex_unlock (&c->lock);
    return;
  }
  if (!o->closing && fsc_reclaim_may_linger (o)) {
    o->lingering = true;
    pthread_mutex_unlock (&c->lock);
    return;
  }
  /* Stay listed, marked closing, until the files are closed: an open
   * of the same key meanwhile waits for us instead of finding the
   * index locked.
   */
  o->closing = true;
  pthread_mutex_unlock (&c->lock);
  close_object (o);
}

void
fsc_object_linger_done (struct fsc_object *o)
{
  struct fsc_cache *c = o->cache;

  pthread_mutex_lock (&c->lock);
  bool mine = o->lingering && o->refs == 0;
  o->lingering = false;
  if (mine)
    o->closing = true;
  pthread_mutex_unlock (&c->lock);
  if (!mine)
    return;
  /* This is the reclaimer thread, and nobody joins it through the
   * object, which it closes and frees: the cache does, at its close
   * (fsc_cache_close).  Detached, as first written, it could still be
   * on its way out of close_object when the cache was closed and the
   * filter unloaded: nbdkit died of SIGSEGV at exit, in code no longer
   * mapped.  (With no memory for the note: detached, as before.)
   */
  o->reclaim.joinable = false;
  struct fsc_ended_thread *e = malloc (sizeof *e);
  if (e) {
    e->thread = pthread_self ();
    pthread_mutex_lock (&c->lock);
    e->next = c->ended;
    c->ended = e;
    pthread_mutex_unlock (&c->lock);
  }
  else
    pthread_detach (pthread_self ());
  close_object (o);
}

/* The last reference is gone and O is marked closing: its
 * implementation lets go (a joined one, share-joiner.c, has nothing of
 * its own on disk), then it leaves the list.
 */
static void
close_object (struct fsc_object *o)
{
  o->ops->close (o);
  unlist_object (o->cache, o);
  free_object (o);
}

/* The local object's close (objops.h). */
void
fsc_local_close (struct fsc_object *o)
{
  /* Other processes' requests first: their sockets close, and they
   * take the object over once we let go of the index.
   */
  fsc_hook_share_stop (o);

  /* The census and the walk for unnamed space end first, so that the
   * gauges saved and the clean mark are right: here they have ended
   * (the object lingered for them, evict.c), or an open of it stopped
   * them (the index stays unclean, and that open walks again), or the
   * process is stopping, which gave them a second and stopped them
   * (cache.c, stop_walks: they take seconds per GiB of index and of
   * scattered data; the index stays unclean).  Requests never wait for
   * them, nor does a disconnect.
   */
  bool reclaimed = fsc_reclaim_finish (o);
  if (!fsc_object_check_stale (o) &&
      fsc_object_state (o) == FSC_OBJ_AVAILABLE &&
      fsc_object_commit (o) == 0) {
    /* Evictions just made durable leave no space behind: the next
     * open reclaims unnamed space only after a crash.
     */
    fsc_punch_pending (o);
    if (reclaimed ||
        (!o->reclaim.unclean && o->pager.census_next >= o->geom.ngroups))
      fsc_write_sb (o, FSC_SB_CLEAN, 0, NULL);
  }
  /* The last word, while we still hold the lock on the index. */
  fsc_live_publish (o, false, true);
  fsc_data_close (o);
  if (o->files.sfd >= 0) { close (o->files.sfd); o->files.sfd = -1; }
  if (o->files.ifd >= 0) {     /* drops the flock */
    close (o->files.ifd);
    o->files.ifd = -1;
  }
}

bool
fsc_object_tryref (struct fsc_object *o)
{
  SCOPED_LOCK (&o->cache->lock);
  if (o->lingering && !o->closing)
    fsc_reclaim_unlinger (o);           /* opened anew: see evict.c */
  if (o->closing || o->refs == 0)
    return false;
  o->refs++;
  return true;
}

void
fsc_object_drain (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  while (o->pending_fills > 0)
    pthread_cond_wait (&o->cond, &o->lock);
}

bool
fsc_object_needs_fingerprint (struct fsc_object *o)
{
  /* Queued fills hold references; let them finish first, but only if
   * the answer can be yes: a closing connection should not wait for
   * the cache disk (a slow one takes seconds to write the queue).
   */
  {
    SCOPED_LOCK (&o->cache->lock);
    if (!o->written || o->sb.validate != FSC_VALIDATE_SAMPLE)
      return false;
  }
  fsc_object_drain (o);
  SCOPED_LOCK (&o->cache->lock);
  return o->refs == 1 && o->written && o->state == FSC_OBJ_AVAILABLE &&
    o->sb.validate == FSC_VALIDATE_SAMPLE;
}

void
fsc_object_set_fingerprint (struct fsc_object *o, uint64_t fp)
{
  if (fsc_object_commit (o) == 0)
    fsc_write_sb (o, 0, FSC_SB_FP_STALE, &fp);
}

/* Called after every request: with nothing raised, it reads the
 * field and takes no lock (the object's lock twice a hit, with the
 * read's own classify, was one of an idle proxy's hit costs, issue
 * 44).  Notices are raised with atomic ORs (FSC_NOTICE, the raisers
 * holding the lock or not), so none raised between the look and the
 * exchange is lost.
 * A withdrawal's errno is set under the lock before its notice, and
 * read under it.
 */
unsigned
fsc_object_take_notices (struct fsc_object *o, int *err)
{
  *err = 0;
  if (__atomic_load_n (&o->notices, __ATOMIC_RELAXED) == 0)
    return 0;
  SCOPED_LOCK (&o->lock);
  *err = o->withdraw_err;
  return __atomic_exchange_n (&o->notices, 0, __ATOMIC_RELAXED);
}

void
fsc_object_set_tag (struct fsc_object *o, uint64_t tag)
{
  __atomic_store_n (&o->tag, tag, __ATOMIC_RELEASE);
}

bool
fsc_object_written_ever (struct fsc_object *o)
{
  pthread_mutex_lock (&o->lock);
  bool w = o->written || (o->sb.flags & FSC_SB_WRITTEN);
  pthread_mutex_unlock (&o->lock);
  return w;
}

uint64_t
fsc_object_tag (struct fsc_object *o)
{
  return __atomic_load_n (&o->tag, __ATOMIC_ACQUIRE);
}

uint64_t
fsc_object_present_blocks (struct fsc_object *o)
{
  if (fsc_object_state (o) == FSC_OBJ_WITHDRAWN)
    return 0;
  struct fsc_ostats ost;
  fsc_ostats_snapshot (o, &ost);
  return ost.v[FSC_OSTAT_present_blocks];
}

bool
fsc_object_block_present (struct fsc_object *o, uint64_t blk)
{
  if (blk >= o->geom.nblocks)
    return false;
  uint64_t gi = GROUP_OF (blk);
  if (fsc_groups_pin (o, gi, gi) == -1)
    return false;
  pthread_mutex_lock (&o->lock);
  bool is = o->state == FSC_OBJ_AVAILABLE && present (o, blk);
  pthread_mutex_unlock (&o->lock);
  fsc_groups_unpin (o, gi, gi);
  return is;
}
