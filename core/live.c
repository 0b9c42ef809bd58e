/* libfscache: an object's counters as the outside sees them.
 *
 * The counters themselves (ostats.h) are bumped where things happen,
 * with relaxed atomics.  This file gives them to the outside:
 *
 *   - fsc_ostats_snapshot: a copy, with the gauges (present blocks,
 *     cached bytes) counted now from the group table.  commit.c saves
 *     it in every superblock it writes;
 *   - fsc_live_publish: NAME.stats, text, rewritten through
 *     NAME.stats.tmp.PID and rename so that a reader (nbd-fscache
 *     stat) sees a whole file, old or new, and never takes a lock the
 *     proxy needs.  The committer calls it every round (2 s by
 *     default) and close once more with "open 0";
 *   - fsc_live_load: the counters of a NAME.stats of the same key, for
 *     an object whose index was lost (a withdrawal unlinks it, damage
 *     makes it unreadable), so that its history still goes on, and
 *     after a crash, when they are newer than the superblock's (which
 *     are saved only with commits and at close).
 *
 * The format is docs/format.md, "Live statistics".  Failing to write
 * the file costs only the statistics, never the cache.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

void
fsc_ostats_snapshot (struct fsc_object *o, struct fsc_ostats *out)
{
  uint64_t blocks = 0, bytes = 0;

  pthread_mutex_lock (&o->lock);
  for (unsigned i = 0; i < FSC_OSTATS_MAX; ++i)
    out->v[i] = __atomic_load_n (&o->ostats.v[i], __ATOMIC_RELAXED);
  out->last_reason = o->ostats.last_reason;
  /* The gauges walk the allocated groups: a few hundred thousand for a
   * TiB cached, so the lock is let go every GAUGE_BATCH groups rather
   * than held for the walk (readers wait on it).  The sum may then mix
   * instants, which statistics may.
   */
  enum { GAUGE_BATCH = 1024 };
  uint64_t gi = o->gtop ? fsc_grp_next (o, 0) : UINT64_MAX;
  for (unsigned k = 0; o->gtop && gi < o->ngroups;
       gi = fsc_grp_next (o, gi + 1)) {
    const struct group *g = grp (o, gi);
    blocks += __builtin_popcountll (g->present);
    for (uint64_t t = g->present; t; t &= t - 1) {
      unsigned x = __builtin_ctzll (t);
      bytes += held_bytes (o, gi * FSC_GROUP_BLOCKS + x, g->pieces[x]);
    }
    if (++k == GAUGE_BATCH) {
      k = 0;
      pthread_mutex_unlock (&o->lock);
      pthread_mutex_lock (&o->lock);
    }
  }
  pthread_mutex_unlock (&o->lock);
  out->v[FSC_OSTAT_present_blocks] = blocks;
  out->v[FSC_OSTAT_cached_bytes] = bytes;
}

void
fsc_object_counters (struct fsc_object *o, struct fsc_ostats *out)
{
  fsc_ostats_snapshot (o, out);
}

static uint64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

void
fsc_live_publish (struct fsc_object *o, bool open, bool force)
{
  const uint64_t now = now_ms ();
  const uint64_t interval = o->cache->commit_interval_ms;

  /* Only while we hold the object (ifd, with its flock): an object
   * another process holds is that process's to publish.
   */
  if (o->fandirfd < 0 || o->ifd < 0 || o->gtop == NULL)
    return;
  pthread_mutex_lock (&o->lock);
  bool due = force || now >= o->live_next;
  if (due)
    o->live_next = now + interval;
  uint64_t inc = o->sb.incarnation;
  uint64_t klo = o->sb.key_hash_lo, khi = o->sb.key_hash_hi;
  pthread_mutex_unlock (&o->lock);
  if (!due)
    return;

  struct fsc_ostats s;
  fsc_ostats_snapshot (o, &s);
  int e = errno;
  char *text = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&text, &len);
  if (fp == NULL)
    goto out;
  fprintf (fp, "# nbd-fscache object statistics, format 1\n"
           "format 1\n"
           "pid %ld\n"
           "updated %" PRIu64 ".%03" PRIu64 "\n"
           "interval %" PRIu64 "\n"
           "open %d\n"
           "key_hash %016" PRIx64 "%016" PRIx64 "\n"
           "incarnation %016" PRIx64 "\n"
           "size %" PRIu64 "\n"
           "block_size %" PRIu32 "\n",
           (long) getpid (), now / 1000, now % 1000,
           (interval + 999) / 1000, open ? 1 : 0, khi, klo, inc,
           o->size, o->block_size);
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    fprintf (fp, "%s %" PRIu64 "\n", fsc_ostat_name (i), s.v[i]);
  fprintf (fp, "last_reason %s\n",
           s.last_reason ? fsc_reason_name (s.last_reason) : "none");
  if (fclose (fp) != 0)
    goto out;

  char tmp[FSC_NAME_MAX + 32], dst[FSC_NAME_MAX + 8];
  snprintf (tmp, sizeof tmp, "%s.stats.tmp.%ld", o->name, (long) getpid ());
  snprintf (dst, sizeof dst, "%s.stats", o->name);
  int fd = openat (o->fandirfd, tmp,
                   O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                   0600);
  if (fd == -1)
    goto out;
  /* No fsync: statistics may be a round behind after a power cut (the
   * superblock's copy is durable), and a sync every round would cost
   * the disk more than the numbers are worth.
   */
  bool ok = write (fd, text, len) == (ssize_t) len;
  close (fd);
  if (!ok || renameat (o->fandirfd, tmp, o->fandirfd, dst) == -1)
    unlinkat (o->fandirfd, tmp, 0);
 out:
  free (text);
  errno = e;
}

int
fsc_live_load (struct fsc_object *o, struct fsc_ostats *out,
               uint64_t *incarnation, uint64_t *updated)
{
  char file[FSC_NAME_MAX + 8], line[256], want[40];
  snprintf (file, sizeof file, "%s.stats", o->name);
  int fd = openat (o->fandirfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1)
    return -1;
  FILE *fp = fdopen (fd, "r");
  if (fp == NULL) {
    close (fd);
    return -1;
  }
  uint64_t lo, hi;
  fsc_key_hash (o->key, o->key_len, &lo, &hi);
  snprintf (want, sizeof want, "%016" PRIx64 "%016" PRIx64, hi, lo);

  struct fsc_ostats s = { .last_reason = 0 };
  bool format = false, key = false;
  uint64_t inc = 0, upd = 0;
  while (fgets (line, sizeof line, fp)) {
    char name[64], val[64];
    if (sscanf (line, "%63s %63s", name, val) != 2)
      continue;
    if (strcmp (name, "format") == 0)
      format = strcmp (val, "1") == 0;
    else if (strcmp (name, "key_hash") == 0)
      key = strcmp (val, want) == 0;
    else if (strcmp (name, "incarnation") == 0)
      inc = strtoull (val, NULL, 16);
    else if (strcmp (name, "updated") == 0)
      upd = strtoull (val, NULL, 10);   /* whole seconds */
    else if (strcmp (name, "last_reason") == 0) {
      for (int r = 1; r < FSC_REASONS; ++r)
        if (strcmp (val, fsc_reason_name (r)) == 0)
          s.last_reason = r;
    }
    else {
      int i = fsc_ostat_index (name);
      char *end;
      errno = 0;
      unsigned long long v = strtoull (val, &end, 10);
      if (i >= 0 && *end == '\0' && errno == 0)
        s.v[i] = v;
    }
  }
  fclose (fp);
  if (!format || !key)
    return -1;
  *out = s;
  if (incarnation)
    *incarnation = inc;
  if (updated)
    *updated = upd;
  return 0;
}
