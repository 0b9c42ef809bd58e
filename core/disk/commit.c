/* libfscache: commits, making an object's changes durable.
 *
 * Fills and invalidations change the in-memory bitmaps and queue their
 * group on obj->dirty (fsc_mark_dirty); a commit writes a record for
 * every queued group into the other of its two index slots, with a new
 * sequence number, so that a torn write leaves the old record whole.
 *
 * Rule 1 of crash safety (the others are in store.c): a fill writes the
 * data, then marks the block present in memory and the group dirty; a
 * commit syncs the data and sums files before it writes any record
 * naming that data, then syncs the index.  So no durable record ever
 * names data that is not on disk.
 *
 * Rule 5: nothing changes in the object's files while its superblock
 * on disk says CLEAN (a clean close; the next open then trusts that no
 * space lies unnamed and skips the walk, evict.c).  After a clean open
 * the first change (a data or sums write or punch: data.c; a commit
 * with records to write; the stale fingerprint mark, store.c; the
 * walk's punches, evict.c) first makes a superblock without CLEAN
 * durable, once (fsc_object_mark_in_use).  Not at open: an open syncs
 * nothing, and a session of hits writes nothing before its close.
 *
 * Commits serialise on obj->committing (a flag waited on with
 * obj->cond, never a lock held across I/O).  fsc_commit_upto is group
 * commit: a caller that needs its change durable waits for a commit in
 * progress, which may already cover it, before starting its own.  The
 * cache's committer thread (cache.c) commits every object with changes
 * every commit interval; client flushes and writers that must drop
 * blocks durably (store.c) call fsc_commit_upto directly.  Any error
 * withdraws the object.
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
#include "utils.h"

/* Queue group GI for the next commit.  Caller holds o->lock. */
int
fsc_mark_dirty (struct fsc_object *o, uint64_t gi, struct group *g)
{
  o->change_seq++;
  if (g->dirty)
    return 0;
  if (o->ndirty == o->dirty_cap) {
    size_t ncap = o->dirty_cap ? o->dirty_cap * 2 : 64;
    uint64_t *p = realloc (o->dirty, ncap * sizeof *p);
    if (p == NULL)
      return -1;
    o->dirty = p;
    o->dirty_cap = ncap;
  }
  o->dirty[o->ndirty++] = gi;
  g->dirty = true;
  return 0;
}

/* Wait for and take the right to write to the index.  Holds o->lock. */
static void
io_claim (struct fsc_object *o)
{
  while (o->committing)
    pthread_cond_wait (&o->cond, &o->lock);
  o->committing = true;
}

static void
io_release (struct fsc_object *o)
{
  o->committing = false;
  pthread_cond_broadcast (&o->cond);
}

/* Write o->sb (after EDIT changed it under the lock) into the other
 * slot, and sync if SYNC.  Returns 0 or -1 (object withdrawn).
 */
static int
write_sb (struct fsc_object *o, uint32_t set_flags, uint32_t clear_flags,
          const uint64_t *fingerprint, bool sync)
{
  unsigned char buf[FSC_SB_SIZE];
  struct fsc_ostats ost;

  if (set_flags & FSC_SB_CLEAN)
    fsc_ostats_snapshot (o, &ost);      /* the last word: exact */
  else
    fsc_ostats_snapshot_recent (o, &ost);
  pthread_mutex_lock (&o->lock);
  if (o->state == FSC_OBJ_WITHDRAWN) {
    pthread_mutex_unlock (&o->lock);
    return -1;
  }
  io_claim (o);
  /* The counters go with every superblock (docs/format.md, "Object
   * counters"); those a newer build left past ours are kept.
   */
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    o->sb.ostats.v[i] = ost.v[i];
  o->sb.ostats.last_reason = ost.last_reason;
  o->sb.ncounters = MAX (o->sb.ncounters, (uint32_t) FSC_OSTATS_COUNT);
  o->sb.counters_time = (uint64_t) time (NULL);
  o->sb.flags = (o->sb.flags | set_flags) & ~clear_flags;
  if (fingerprint)
    o->sb.fingerprint = *fingerprint;
  o->sb.seq = ++o->seq;
  int slot = 1 - o->sb_slot;
  fsc_sb_encode (&o->sb, buf);
  pthread_mutex_unlock (&o->lock);

  int r = fsc_io_pwrite (&o->cache->io, FSC_FILE_INDEX, o->files.ifd, buf,
                         FSC_SB_SIZE, (uint64_t) slot * FSC_SB_SIZE);
  if (r == 0 && sync)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_INDEX, o->files.ifd);
  int e = errno;

  pthread_mutex_lock (&o->lock);
  if (r == 0)
    o->sb_slot = slot;
  io_release (o);
  pthread_mutex_unlock (&o->lock);
  if (r == -1) {
    FSC_STAT_ADD (&o->cache->stats, commit_errors, 1);
    FSC_OSTAT_ADD (o, io_errors, 1);
    fsc_withdraw (o, e);
  }
  return r;
}

int
fsc_object_mark_in_use (struct fsc_object *o)
{
  if (!__atomic_load_n (&o->unclean_due, __ATOMIC_ACQUIRE))
    return 0;
  pthread_mutex_lock (&o->lock);
  while (o->unclean_marking)
    pthread_cond_wait (&o->cond, &o->lock);
  bool todo = o->unclean_due;
  o->unclean_marking = todo;
  pthread_mutex_unlock (&o->lock);
  if (!todo)
    return 0;
  int r = write_sb (o, 0, FSC_SB_CLEAN, NULL, true);
  pthread_mutex_lock (&o->lock);
  o->unclean_marking = false;
  if (r == 0)
    __atomic_store_n (&o->unclean_due, false, __ATOMIC_RELEASE);
  pthread_cond_broadcast (&o->cond);
  pthread_mutex_unlock (&o->lock);
  return r;
}

/* A commit's writes, without the lock: the data and sums synced if
 * DSYNC, then the N records RECS of groups GIS into their SLOTS, synced.
 * 0, or -1 with errno.
 */
static int
write_records (struct fsc_object *o, bool dsync, const unsigned char *recs,
               const uint64_t *gis, const uint8_t *slots, size_t n)
{
  /* Rule 1: data before the records that name it. */
  int r = 0;
  if (dsync) {
    /* The kernel's writeback of the fills, done here: the disk's time
     * for them, which the fill meter counts (fill.c).
     */
    fsc_meter_begin (&o->cache->fill_meter);
    r = fsc_data_sync (o);
    fsc_meter_end (&o->cache->fill_meter, 0);
  }
  if (dsync && r == 0)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_SUMS, o->files.sfd);
  for (size_t i = 0; r == 0 && i < n; ++i)
    r = fsc_io_pwrite (&o->cache->io, FSC_FILE_INDEX, o->files.ifd,
                       recs + i * FSC_GREC_SIZE, FSC_GREC_SIZE,
                       fsc_grec_offset (gis[i], slots[i]));
  if (r == 0 && n > 0)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_INDEX, o->files.ifd);
  return r;
}

/* Make every change up to TARGET durable: return at once if it is,
 * wait for a commit in progress and look again (group commit: it may
 * cover us), else commit everything changed so far.  Returns 0, or -1
 * if the object is (or became) withdrawn.
 */
int
fsc_commit_upto (struct fsc_object *o, uint64_t target)
{
  struct fsc_stats *st = &o->cache->stats;

  /* A commit with something to write is a change: the not-clean mark
   * first (an invalidation's commit may be the session's first).
   */
  pthread_mutex_lock (&o->lock);
  bool change = o->durable_seq < target;
  pthread_mutex_unlock (&o->lock);
  if (change && fsc_object_mark_in_use (o) == -1)
    return -1;

  pthread_mutex_lock (&o->lock);
  for (;;) {
    if (o->state != FSC_OBJ_AVAILABLE) {
      pthread_mutex_unlock (&o->lock);
      return -1;
    }
    if (o->durable_seq >= target) {
      pthread_mutex_unlock (&o->lock);
      return 0;
    }
    if (!o->committing)
      break;
    pthread_cond_wait (&o->cond, &o->lock);
  }
  o->committing = true;
  target = o->change_seq;
  struct timespec t0;
  clock_gettime (CLOCK_MONOTONIC, &t0);

  size_t n = o->ndirty;
  uint64_t *gis = o->dirty;
  o->dirty = NULL;
  o->ndirty = o->dirty_cap = 0;
  /* (A buffer of fill.c's: a commit's records are up to megabytes.) */
  size_t recs_cap = 0;
  unsigned char *recs = n ? fsc_buf_get (o->cache, n * FSC_GREC_SIZE,
                                         &recs_cap) : NULL;
  uint8_t *slots = n ? malloc (n) : NULL;
  uint64_t *written = n ? malloc (n * sizeof *written) : NULL;
  if (n && (!recs || !slots || !written)) {
    io_release (o);
    pthread_mutex_unlock (&o->lock);
    free (gis); free (slots); free (written);
    fsc_buf_put (o->cache, recs, recs_cap);
    fsc_withdraw (o, ENOMEM);
    return -1;
  }
  for (size_t i = 0; i < n; ++i) {
    struct group *g = grp (o, gis[i]);
    struct fsc_grec rec = {
      .group = gis[i], .seq = ++o->seq,
      .incarnation = o->sb.incarnation, .present = g->present,
      .zero = g->zero & g->present,
    };
    for (int j = 0; j < FSC_GROUP_BLOCKS; ++j)
      if ((g->present >> j) & 1) {
        rec.csum[j] = g->csum[j];
        rec.pieces[j] = g->pieces[j];
      }
    fsc_grec_encode (&rec, recs + i * FSC_GREC_SIZE);
    slots[i] = g->has_record ? 1 - g->slot : 0;
    written[i] = g->present;
    g->disk_max |= g->present;
    g->dirty = false;
  }
  bool dsync = o->data_dirty;
  o->data_dirty = false;
  pthread_mutex_unlock (&o->lock);

  int r = write_records (o, dsync, recs, gis, slots, n);
  int e = errno;

  pthread_mutex_lock (&o->lock);
  if (r == 0) {
    for (size_t i = 0; i < n; ++i) {
      struct group *g = grp (o, gis[i]);
      g->slot = slots[i];
      g->has_record = true;
      g->disk_max = written[i];
    }
    o->durable_seq = MAX (o->durable_seq, target);
  }
  io_release (o);
  pthread_mutex_unlock (&o->lock);
  free (gis); free (slots); free (written);
  fsc_buf_put (o->cache, recs, recs_cap);

  struct timespec t1;
  clock_gettime (CLOCK_MONOTONIC, &t1);
  const int64_t us = (int64_t) (t1.tv_sec - t0.tv_sec) * 1000000 +
    (t1.tv_nsec - t0.tv_nsec) / 1000;
  FSC_STAT_ADD (st, commit_us, us);
  FSC_STAT_MAX (st, commit_max_us, us);
  FSC_STAT_ADD (st, commits, 1);
  if (r == -1) {
    FSC_STAT_ADD (st, commit_errors, 1);
    FSC_OSTAT_ADD (o, io_errors, 1);
    fsc_withdraw (o, e);
    return -1;
  }
  return 0;
}

int
fsc_write_sb (struct fsc_object *o, uint32_t set_flags, uint32_t clear_flags,
              const uint64_t *fingerprint)
{
  return write_sb (o, set_flags, clear_flags, fingerprint, true);
}

int
fsc_object_save_counters (struct fsc_object *o)
{
  /* Only when a counter moved since the last superblock.  The
   * gauges follow the counters that move them.
   */
  bool changed = false;
  pthread_mutex_lock (&o->lock);
  for (unsigned i = 0; i < FSC_OSTAT_last_use && !changed; ++i)
    changed = __atomic_load_n (&o->ostats.v[i], __ATOMIC_RELAXED) !=
      o->sb.ostats.v[i];
  bool avail = o->state == FSC_OBJ_AVAILABLE;
  pthread_mutex_unlock (&o->lock);
  if (!changed || !avail)
    return 0;
  /* Not synced on its own: the next commit's index sync (or the clean
   * mark's at close) makes it durable, and until then a crash leaves
   * the other slot, older counters and the same flags, which is all a
   * statistic needs.  A sync of its own every round slowed cold fills.
   */
  return write_sb (o, 0, 0, NULL, false);
}

int
fsc_local_commit (struct fsc_object *o)
{
  pthread_mutex_lock (&o->lock);
  uint64_t now = o->change_seq;
  pthread_mutex_unlock (&o->lock);
  return fsc_commit_upto (o, now);
}

bool
fsc_object_has_dirty (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  return o->state == FSC_OBJ_AVAILABLE && o->durable_seq < o->change_seq;
}

/* Make sure the index has room for the records of groups G0..G1 so
 * that a commit never fails for want of space.  Returns 0 or -1.
 */
int
fsc_reserve_groups (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    pthread_mutex_lock (&o->lock);
    struct group *g = grp (o, gi);
    bool done = g && g->reserved;
    pthread_mutex_unlock (&o->lock);
    if (done)
      continue;
    int r = posix_fallocate (o->files.ifd, fsc_grec_offset (gi, 0),
                             2 * FSC_GREC_SIZE);
    if (r != 0 && r != EOPNOTSUPP && r != EINVAL) {
      errno = r;
      return -1;
    }
    pthread_mutex_lock (&o->lock);
    if ((g = grp (o, gi)) != NULL)
      g->reserved = true;
    pthread_mutex_unlock (&o->lock);
  }
  return 0;
}
void
fsc_cache_kick (struct fsc_cache *cache)
{
  SCOPED_LOCK (&cache->lock);
  cache->commit_wanted = true;
  pthread_cond_signal (&cache->cond);
}

