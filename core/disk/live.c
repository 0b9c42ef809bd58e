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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "safeopen.h"

void
fsc_ostats_snapshot (struct fsc_object *o, struct fsc_ostats *out)
{
  uint64_t blocks = 0, bytes = 0;

  pthread_mutex_lock (&o->lock);
  for (unsigned i = 0; i < FSC_OSTATS_MAX; ++i)
    out->v[i] = __atomic_load_n (&o->ostats.v[i], __ATOMIC_RELAXED);
  out->last_reason = o->ostats.last_reason;
  /* The gauges walk the resident groups (at most a few ten thousand,
   * groups.c), letting the lock go every GAUGE_BATCH groups rather
   * than holding it for the walk (readers wait on it).  The sum may
   * then mix instants, which statistics may.
   */
  enum { GAUGE_BATCH = 1024 };
  uint64_t gi = o->pager.gtop ? fsc_grp_next (o, 0) : UINT64_MAX;
  for (unsigned k = 0; o->pager.gtop && gi < o->geom.ngroups;
       gi = fsc_grp_next (o, gi + 1)) {
    const struct group *g = grp (o, gi);
    blocks += __builtin_popcountll (g->present);
    for (uint64_t t = g->present; t; t &= t - 1)
      bytes += block_held (o, g, gi * FSC_GROUP_BLOCKS + __builtin_ctzll (t));
    if (++k == GAUGE_BATCH) {
      k = 0;
      pthread_mutex_unlock (&o->lock);
      pthread_mutex_lock (&o->lock);
    }
  }
  /* And the groups not in memory (groups.c); after a crash, those the
   * census has counted so far.
   */
  blocks += o->pager.nonres_blocks;
  bytes += o->pager.nonres_bytes;
  o->gauge_ms = fsc_mono_ms ();
  o->gauge_blocks = blocks;
  o->gauge_bytes = bytes;
  pthread_mutex_unlock (&o->lock);
  out->v[FSC_OSTAT_present_blocks] = blocks;
  out->v[FSC_OSTAT_cached_bytes] = bytes;
}

/* The walk above visits every resident group and every present block:
 * a commit's superblock took it every 256 dirty groups, so a cache
 * filling at random did work in its size per commit, holding the lock
 * the hits need in batches (2.7% of a filling proxy's samples with 60k
 * blocks cached, and growing with them; issue 44).  The gauges are
 * statistics: a second old will do, except at a clean close
 * (write_sb walks afresh then).
 */
#define GAUGE_MAX_AGE_MS 1000

void
fsc_ostats_snapshot_recent (struct fsc_object *o, struct fsc_ostats *out)
{
  pthread_mutex_lock (&o->lock);
  if (o->gauge_ms == 0 || fsc_mono_ms () - o->gauge_ms >= GAUGE_MAX_AGE_MS) {
    pthread_mutex_unlock (&o->lock);
    fsc_ostats_snapshot (o, out);
    return;
  }
  for (unsigned i = 0; i < FSC_OSTATS_MAX; ++i)
    out->v[i] = __atomic_load_n (&o->ostats.v[i], __ATOMIC_RELAXED);
  out->last_reason = o->ostats.last_reason;
  out->v[FSC_OSTAT_present_blocks] = o->gauge_blocks;
  out->v[FSC_OSTAT_cached_bytes] = o->gauge_bytes;
  pthread_mutex_unlock (&o->lock);
}

void
fsc_object_counters (struct fsc_object *o, struct fsc_ostats *out)
{
  fsc_ostats_snapshot (o, out);
}

void
fsc_live_format (FILE *fp, const struct fsc_live_head *h,
                 const struct fsc_ostats *s)
{
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
           h->pid, h->updated_ms / 1000, h->updated_ms % 1000,
           h->interval_s, h->open ? 1 : 0, h->key_hash_hi, h->key_hash_lo,
           h->incarnation, h->size, h->block_size);
  if (h->cap)
    fprintf (fp, "cap %" PRIu64 "\n", h->cap);
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    fprintf (fp, "%s %" PRIu64 "\n", fsc_ostat_name (i), s->v[i]);
  fprintf (fp, "last_reason %s\n",
           s->last_reason ? fsc_reason_name (s->last_reason) : "none");
  if (h->mrc_n) {
    fprintf (fp, "mrc_since %" PRIu64 "\nmrc_refs %" PRIu64 "\n",
             h->mrc_since, h->mrc_refs);
    for (unsigned i = 0; i < h->mrc_n && i < FSC_LIVE_MRC_MAX; ++i)
      fprintf (fp, "mrc %" PRIu64 " %.4f\n", h->mrc_bytes[i], h->mrc_hit[i]);
  }
}

/* O's curve into H: a point at each half octave of the block size,
 * up to the export's size (and the size itself).
 */
static void
curve (struct fsc_object *o, struct fsc_live_head *h)
{
  h->mrc_n = 0;
  if (o->mrc == NULL)
    return;
  h->mrc_since = o->mrc_since;
  for (unsigned k = 0; h->mrc_n < FSC_LIVE_MRC_MAX; ++k) {
    double blocks = ldexp (1.0, (int) (k / 2)) * (k % 2 ? M_SQRT2 : 1.0);
    uint64_t b = (uint64_t) blocks;
    bool last = b >= o->geom.nblocks;
    if (last)
      b = o->geom.nblocks;
    h->mrc_bytes[h->mrc_n] = MIN (b << o->geom.bshift, o->geom.size);
    h->mrc_hit[h->mrc_n++] = fsc_mrc_hit_ratio (o->mrc, b, &h->mrc_refs);
    if (last)
      break;
  }
  if (h->mrc_refs == 0)
    h->mrc_n = 0;
}

int
fsc_live_write (int dirfd, const char *name, const struct fsc_live_head *h,
                const struct fsc_ostats *s)
{
  char *text = NULL;
  size_t len = 0;
  int r = -1;
  FILE *fp = open_memstream (&text, &len);
  if (fp == NULL)
    return -1;
  fsc_live_format (fp, h, s);
  if (fclose (fp) != 0)
    goto out;
  char tmp[FSC_NAME_MAX + 32], dst[FSC_NAME_MAX + 8];
  snprintf (tmp, sizeof tmp, "%s.stats.tmp.%ld", name, (long) getpid ());
  snprintf (dst, sizeof dst, "%s.stats", name);
  int fd = fsc_open_regular (dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd == -1)
    goto out;
  /* No fsync: statistics may be a round behind after a power cut (the
   * superblock's copy is durable), and a sync every round would cost
   * the disk more than the numbers are worth.
   */
  bool ok = write (fd, text, len) == (ssize_t) len;
  close (fd);
  if (!ok || renameat (dirfd, tmp, dirfd, dst) == -1) {
    int e = errno;
    unlinkat (dirfd, tmp, 0);
    errno = e;
    goto out;
  }
  r = 0;
 out:
  free (text);
  return r;
}

void
fsc_live_publish (struct fsc_object *o, bool open, bool force)
{
  const uint64_t now = fsc_wall_ms ();
  const uint64_t interval = o->cache->commit_interval_ms;
  /* Only while we hold the object (ifd, with its flock): an object
   * another process holds is that process's to publish.
   */
  if (o->files.fandirfd < 0 || o->files.ifd < 0 || o->pager.gtop == NULL)
    return;
  pthread_mutex_lock (&o->lock);
  bool due = force || now >= o->live_next;
  if (due)
    o->live_next = now + interval;
  struct fsc_live_head h = {
    .pid = (long) getpid (), .updated_ms = now,
    .interval_s = (interval + 999) / 1000, .open = open,
    .key_hash_hi = o->sb.key_hash_hi, .key_hash_lo = o->sb.key_hash_lo,
    .incarnation = o->sb.incarnation, .size = o->geom.size,
    .block_size = o->geom.block_size,
  };
  const uint64_t cap = fsc_budget_of (o);
  h.cap = cap == UINT64_MAX ? 0 : cap;
  pthread_mutex_unlock (&o->lock);
  if (!due)
    return;
  curve (o, &h);
  struct fsc_ostats s;
  fsc_ostats_snapshot (o, &s);
  int e = errno;
  fsc_live_write (o->files.fandirfd, o->files.name, &h, &s);
  errno = e;
}

int
fsc_live_parse (FILE *fp, struct fsc_live_head *h, struct fsc_ostats *out)
{
  char line[256];
  bool format = false;

  memset (h, 0, sizeof *h);
  memset (out, 0, sizeof *out);
  while (fgets (line, sizeof line, fp)) {
    char name[64], val[64], *end;
    if (sscanf (line, "%63s %63s", name, val) != 2)
      continue;
    if (strcmp (name, "format") == 0)
      format = strcmp (val, "1") == 0;
    else if (strcmp (name, "key_hash") == 0) {
      char hi[17];
      if (strlen (val) == 32) {
        memcpy (hi, val, 16);
        hi[16] = '\0';
        h->key_hash_hi = strtoull (hi, NULL, 16);
        h->key_hash_lo = strtoull (val + 16, NULL, 16);
        h->have_key = true;
      }
    }
    else if (strcmp (name, "pid") == 0)
      h->pid = strtol (val, NULL, 10);
    else if (strcmp (name, "open") == 0)
      h->open = strcmp (val, "1") == 0;
    else if (strcmp (name, "incarnation") == 0)
      h->incarnation = strtoull (val, NULL, 16);
    else if (strcmp (name, "updated") == 0) {
      h->updated_ms = strtoull (val, &end, 10) * 1000;
      if (*end == '.')
        h->updated_ms += strtoull (end + 1, NULL, 10) % 1000;
    }
    else if (strcmp (name, "interval") == 0)
      h->interval_s = strtoull (val, NULL, 10);
    else if (strcmp (name, "size") == 0)
      h->size = strtoull (val, NULL, 10);
    else if (strcmp (name, "block_size") == 0)
      h->block_size = strtoul (val, NULL, 10);
    else if (strcmp (name, "cap") == 0)
      h->cap = strtoull (val, NULL, 10);
    else if (strcmp (name, "mrc_since") == 0)
      h->mrc_since = strtoull (val, NULL, 10);
    else if (strcmp (name, "mrc_refs") == 0)
      h->mrc_refs = strtoull (val, NULL, 10);
    else if (strcmp (name, "mrc") == 0) {
      double hit;
      unsigned long long bytes;
      if (h->mrc_n < FSC_LIVE_MRC_MAX &&
          sscanf (line, "mrc %llu %lf", &bytes, &hit) == 2) {
        h->mrc_bytes[h->mrc_n] = bytes;
        h->mrc_hit[h->mrc_n++] = hit;
      }
    }
    else if (strcmp (name, "last_reason") == 0) {
      for (int r = 1; r < FSC_REASONS; ++r)
        if (strcmp (val, fsc_reason_name (r)) == 0)
          out->last_reason = r;
    }
    else {
      int i = fsc_ostat_index (name);
      errno = 0;
      unsigned long long v = strtoull (val, &end, 10);
      if (i >= 0 && *end == '\0' && errno == 0)
        out->v[i] = v;
    }
  }
  return format ? 0 : -1;
}

int
fsc_live_read (int dirfd, const char *name, struct fsc_live_head *h,
               struct fsc_ostats *out)
{
  char file[FSC_NAME_MAX + 8];
  snprintf (file, sizeof file, "%s.stats", name);
  int fd = fsc_open_regular (dirfd, file, O_RDONLY, 0);
  if (fd == -1)
    return -1;
  FILE *fp = fdopen (fd, "r");
  if (fp == NULL) {
    close (fd);
    return -1;
  }
  int r = fsc_live_parse (fp, h, out);
  fclose (fp);
  return r;
}

int
fsc_live_load (struct fsc_object *o, struct fsc_ostats *out,
               uint64_t *incarnation, uint64_t *updated)
{
  struct fsc_live_head h;
  struct fsc_ostats s;
  uint64_t lo, hi;

  fsc_key_hash (o->key, o->key_len, &lo, &hi);
  if (fsc_live_read (o->files.fandirfd, o->files.name, &h, &s) == -1 ||
      !h.have_key || h.key_hash_lo != lo || h.key_hash_hi != hi)
    return -1;
  *out = s;
  if (incarnation)
    *incarnation = h.incarnation;
  if (updated)
    *updated = h.updated_ms / 1000;     /* whole seconds */
  return 0;
}
