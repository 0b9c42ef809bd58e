/* tools/common: one scan of DIR/objects.
 *
 * Every fan-out directory @00 .. @ff is read, and every regular file
 * in it stat'ed (never followed: AT_SYMLINK_NOFOLLOW).  Files are
 * grouped into objects by NAME, the part of the file name before the
 * first '.', which the filter's names never contain (docs/format.md,
 * "Object names").  The scan yields:
 *
 *   - total_bytes: the sum of st_blocks * 512 of every file under
 *     objects/, which is what max-size caps ("du" of objects/);
 *   - pinned: the objects in use, as /proc/locks says: an flock on
 *     their NAME.idx's inode, or on their write log NAME.wlog's (a
 *     writeback proxy whose object was withdrawn, or nbd-fscache
 *     writeback, holds only that).  This is a hint, read without
 *     touching any lock, so that a scan never makes a proxy's open
 *     find the object busy.  Culling still takes the locks itself
 *     (cull.c);
 *   - dirty: the idle objects whose write log holds data not yet
 *     written back (fscache-mode=writeback): the only copy of what
 *     their clients wrote.  They are never culled, so they are never
 *     candidates; the scan counts them, in use or not;
 *   - cand: the cull candidates, i.e. every other object, least
 *     recently used first.  Last use is NAME.idx's mtime (the filter
 *     rewrites the index at open, at every commit that changed
 *     something, and at close).  Objects that cannot be used any
 *     more come first whatever their age: an index without its data
 *     or sums file (what a crash in the middle of a cull leaves), or
 *     files without an index.  Only the CANDMAX first are kept (the
 *     "culltable"), in a max-heap while scanning so that memory stays
 *     bounded however many objects the cache holds; "truncated" says
 *     that a new scan will find more once those are culled.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "safeopen.h"
#include "wlog.h"

#include "objects.h"

/* ---- /proc/locks ------------------------------------------------- */

struct lock_id {
  unsigned maj, min;
  uint64_t ino;
};

struct lock_set {
  struct lock_id *v;
  size_t n, cap;
};

static int
lock_cmp (const void *a, const void *b)
{
  const struct lock_id *x = a, *y = b;
  if (x->maj != y->maj) return x->maj < y->maj ? -1 : 1;
  if (x->min != y->min) return x->min < y->min ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

/* Lines look like "1: FLOCK  ADVISORY  WRITE 2931 fe:00:10952910 0 EOF"
 * (a blocked waiter has "->" after the number: not a holder).
 */
static int
read_locks (struct lock_set *ls)
{
  FILE *fp = fopen ("/proc/locks", "re");
  char line[512];

  if (fp == NULL)
    return -1;
  while (fgets (line, sizeof line, fp)) {
    char type[16], dev[64];
    unsigned maj, min;
    uint64_t ino;
    char *p = strchr (line, ':');
    if (p == NULL)
      continue;
    if (sscanf (p + 1, " %15s %*s %*s %*s %63s", type, dev) != 2 ||
        strcmp (type, "FLOCK") != 0)
      continue;
    if (sscanf (dev, "%x:%x:%" SCNu64, &maj, &min, &ino) != 3)
      continue;
    if (ls->n == ls->cap) {
      size_t ncap = ls->cap ? ls->cap * 2 : 64;
      struct lock_id *nv = realloc (ls->v, ncap * sizeof *nv);
      if (nv == NULL) {
        fclose (fp);
        return -1;
      }
      ls->v = nv;
      ls->cap = ncap;
    }
    ls->v[ls->n++] = (struct lock_id) { maj, min, ino };
  }
  fclose (fp);
  qsort (ls->v, ls->n, sizeof *ls->v, lock_cmp);
  return 0;
}

static bool
is_locked (const struct lock_set *ls, dev_t dev, ino_t ino)
{
  struct lock_id k = { major (dev), minor (dev), (uint64_t) ino };
  return ls->n > 0 &&
    bsearch (&k, ls->v, ls->n, sizeof *ls->v, lock_cmp) != NULL;
}

/* ---- the candidate heap ------------------------------------------ */

/* Cull order: unusable objects first, then by last use.  A lone
 * NAME.stats is not broken but the history of an invalidated object
 * (nbd-fscache invalidate leaves it for the next open to carry on):
 * it ages like an object, by its own mtime.
 */
static bool
unusable (const struct fscd_object *o)
{
  if ((o->files & ~FSCD_F_QUOTA) == FSCD_F_STATS)
    return false;
  return !(o->files & FSCD_F_IDX) ||
    (o->files & (FSCD_F_DATA | FSCD_F_SUMS)) != (FSCD_F_DATA | FSCD_F_SUMS);
}

static int
cull_order (const struct fscd_object *a, const struct fscd_object *b)
{
  bool ua = unusable (a), ub = unusable (b);
  if (ua != ub)
    return ua ? -1 : 1;
  if (a->mtime.tv_sec != b->mtime.tv_sec)
    return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
  if (a->mtime.tv_nsec != b->mtime.tv_nsec)
    return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
  if (a->fan != b->fan)
    return a->fan < b->fan ? -1 : 1;
  return strcmp (a->name, b->name);
}

static int
cull_order_q (const void *a, const void *b)
{
  return cull_order (a, b);
}

static void
swap_obj (struct fscd_object *a, struct fscd_object *b)
{
  struct fscd_object t = *a;
  *a = *b;
  *b = t;
}

/* Max-heap on cull_order: the root is the candidate culled last. */
static void
heap_up (struct fscd_object *h, size_t i)
{
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (cull_order (&h[p], &h[i]) >= 0)
      break;
    swap_obj (&h[p], &h[i]);
    i = p;
  }
}

static void
heap_down (struct fscd_object *h, size_t n, size_t i)
{
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && cull_order (&h[l], &h[m]) > 0) m = l;
    if (r < n && cull_order (&h[r], &h[m]) > 0) m = r;
    if (m == i)
      break;
    swap_obj (&h[m], &h[i]);
    i = m;
  }
}

static int
push (struct fscd_object **v, size_t *n, size_t *cap, struct fscd_object *o)
{
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 64;
    struct fscd_object *nv = realloc (*v, ncap * sizeof *nv);
    if (nv == NULL)
      return -1;
    *v = nv;
    *cap = ncap;
  }
  (*v)[(*n)++] = *o;
  return 0;
}

/* Offer O (taking its name) to the candidates. */
static int
add_candidate (struct fscd_scan *s, size_t candmax, struct fscd_object *o)
{
  if (s->ncand < candmax) {
    if (push (&s->cand, &s->ncand, &s->candcap, o) == -1)
      return -1;
    heap_up (s->cand, s->ncand - 1);
    return 0;
  }
  s->truncated = true;
  if (candmax == 0 || cull_order (o, &s->cand[0]) >= 0) {
    free (o->name);
    return 0;
  }
  free (s->cand[0].name);
  s->cand[0] = *o;
  heap_down (s->cand, s->ncand, 0);
  return 0;
}

/* ---- one fan-out directory --------------------------------------- */

struct entry {
  char *file;
  size_t namelen;               /* bytes before the first '.' */
  struct stat st;
};

static int
entry_cmp (const void *a, const void *b)
{
  const struct entry *x = a, *y = b;
  size_t n = x->namelen < y->namelen ? x->namelen : y->namelen;
  int c = memcmp (x->file, y->file, n);
  if (c != 0)
    return c;
  if (x->namelen != y->namelen)
    return x->namelen < y->namelen ? -1 : 1;
  return strcmp (x->file, y->file);
}

static unsigned
suffix_bit (const char *suffix)
{
  if (strcmp (suffix, ".idx") == 0) return FSCD_F_IDX;
  if (strcmp (suffix, ".data") == 0) return FSCD_F_DATA;
  if (strcmp (suffix, ".sums") == 0) return FSCD_F_SUMS;
  if (strcmp (suffix, ".stale") == 0) return FSCD_F_STALE;
  if (strcmp (suffix, ".quota") == 0) return FSCD_F_QUOTA;
  if (strcmp (suffix, ".stats") == 0) return FSCD_F_STATS;
  if (strcmp (suffix, ".wlog") == 0) return FSCD_F_WLOG;
  return FSCD_F_OTHER;
}

static uint64_t
allocated (const struct stat *st)
{
  uint64_t b;
  if (st->st_blocks <= 0 ||
      __builtin_mul_overflow ((uint64_t) st->st_blocks, 512, &b))
    return 0;
  return b;
}

bool
fscd_wlog_dirty (int fanfd, const char *name, uint64_t *bytes,
                 bool *damaged)
{
  struct fsc_wlog_info info;
  *bytes = 0;
  if (damaged)
    *damaged = false;
  if (fsc_wlog_inspect (fanfd, name, &info) == -1) {
    /* Damaged (EUCLEAN: Rule 7 of core/wlog/wlog.c) or unreadable: it may
     * hold the only copy of flushed writes, so it counts as dirty and
     * is never culled.
     */
    int e = errno;
    if (e == EUCLEAN)
      *bytes = info.dirty_bytes;
    if (damaged)
      *damaged = e == EUCLEAN || e == EBADMSG;
    return e != ENOENT;
  }
  *bytes = info.dirty_bytes;
  return info.records > 0;
}

int
fscd_open_fan (int objdirfd, unsigned fan, char name[4])
{
  snprintf (name, 4, "@%02x", fan & 0xff);
  /* Only an @xx that is ours alone (safeopen.c rule 1): in another
   * user's, anything could have been planted.
   */
  return fsc_own_subdir (objdirfd, name, false, name, NULL, 0);
}

static int
scan_fan (int objdirfd, unsigned fan, const struct lock_set *ls,
          size_t candmax, struct fscd_scan *s)
{
  char fanname[4];
  struct entry *ev = NULL;
  size_t n = 0, cap = 0;
  struct dirent *d;
  int ret = -1;

  int fd = fscd_open_fan (objdirfd, fan, fanname);
  if (fd == -1 && (errno == EPERM || errno == ENOTDIR)) {
    fscd_log (LOG_WARNING, "objects/%s: skipped: not a directory of this "
              "user's alone (owned by another user, writable by others, or "
              "not a directory)", fanname);
    return 0;
  }
  if (fd == -1)
    return errno == ENOENT ? 0 : -1;
  DIR *dir = fdopendir (fd);
  if (dir == NULL) {
    close (fd);
    return -1;
  }
  while ((errno = 0, d = readdir (dir)) != NULL) {
    struct stat st;
    if (d->d_name[0] == '.' &&
        (d->d_name[1] == '\0' || strcmp (d->d_name, "..") == 0))
      continue;
    if (fstatat (fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) == -1 ||
        !S_ISREG (st.st_mode))
      continue;
    uint64_t b = allocated (&st);
    if (__builtin_add_overflow (s->total_bytes, b, &s->total_bytes))
      s->total_bytes = UINT64_MAX;
    s->nfiles++;
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 32;
      struct entry *nv = realloc (ev, ncap * sizeof *nv);
      if (nv == NULL)
        goto out;
      ev = nv;
      cap = ncap;
    }
    ev[n].file = strdup (d->d_name);
    if (ev[n].file == NULL)
      goto out;
    ev[n].namelen = strcspn (d->d_name, ".");
    ev[n].st = st;
    n++;
  }
  if (errno != 0)
    goto out;
  qsort (ev, n, sizeof *ev, entry_cmp);

  for (size_t i = 0; i < n; ) {
    size_t j = i;
    struct fscd_object o = { .fan = fan };
    struct timespec newest = { 0, 0 };
    bool wlog_locked = false;

    while (j < n && ev[j].namelen == ev[i].namelen &&
           memcmp (ev[j].file, ev[i].file, ev[i].namelen) == 0) {
      const char *suffix = ev[j].file + ev[j].namelen;
      unsigned bit = suffix_bit (suffix);
      const struct stat *st = &ev[j].st;
      o.files |= bit;
      if (__builtin_add_overflow (o.bytes, allocated (st), &o.bytes))
        o.bytes = UINT64_MAX;
      if (bit == FSCD_F_IDX) {
        o.mtime = st->st_mtim;
        o.dev = st->st_dev;
        o.ino = st->st_ino;
      }
      if (bit == FSCD_F_WLOG)
        wlog_locked = is_locked (ls, st->st_dev, st->st_ino);
      if (st->st_mtim.tv_sec > newest.tv_sec ||
          (st->st_mtim.tv_sec == newest.tv_sec &&
           st->st_mtim.tv_nsec > newest.tv_nsec))
        newest = st->st_mtim;
      j++;
    }
    if (!(o.files & FSCD_F_IDX))
      o.mtime = newest;
    o.name = strndup (ev[i].file, ev[i].namelen);
    if (o.name == NULL)
      goto out;
    s->nobjects++;
    if (o.files & FSCD_F_WLOG) {
      bool damaged;
      o.dirty = fscd_wlog_dirty (fd, o.name, &o.dirty_bytes, &damaged);
      s->damaged_objects += damaged;
      if (o.dirty) {
        s->dirty_objects++;
        if (__builtin_add_overflow (s->dirty_bytes, o.dirty_bytes,
                                    &s->dirty_bytes))
          s->dirty_bytes = UINT64_MAX;
      }
    }
    if (((o.files & FSCD_F_IDX) && is_locked (ls, o.dev, o.ino)) ||
        wlog_locked) {
      o.locked = true;
      if (push (&s->pinned, &s->npinned, &s->pinnedcap, &o) == -1) {
        free (o.name);
        goto out;
      }
    }
    else if (o.dirty) {
      if (push (&s->dirty, &s->ndirty, &s->dirtycap, &o) == -1) {
        free (o.name);
        goto out;
      }
    }
    else if (add_candidate (s, candmax, &o) == -1) {
      free (o.name);
      goto out;
    }
    i = j;
  }
  ret = 0;

 out:
  for (size_t i = 0; i < n; ++i)
    free (ev[i].file);
  free (ev);
  closedir (dir);
  return ret;
}

/* ---- the scan ---------------------------------------------------- */

void
fscd_scan_free (struct fscd_scan *s)
{
  for (size_t i = 0; i < s->ncand; ++i)
    free (s->cand[i].name);
  for (size_t i = 0; i < s->npinned; ++i)
    free (s->pinned[i].name);
  for (size_t i = 0; i < s->ndirty; ++i)
    free (s->dirty[i].name);
  free (s->cand);
  free (s->pinned);
  free (s->dirty);
  memset (s, 0, sizeof *s);
}

static double
mono_now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

int
fscd_scan (int objdirfd, size_t candmax, struct fscd_scan *s)
{
  struct lock_set ls = { NULL, 0, 0 };
  double t0 = mono_now ();
  struct stat st;

  memset (s, 0, sizeof *s);
  s->locks_known = read_locks (&ls) == 0;
  if (!s->locks_known)
    ls.n = 0;
  if (fstat (objdirfd, &st) == -1) {
    free (ls.v);
    return -1;
  }
  for (unsigned fan = 0; fan < 256; ++fan) {
    if (scan_fan (objdirfd, fan, &ls, candmax, s) == -1) {
      if (errno == ENOMEM) {
        free (ls.v);
        fscd_scan_free (s);
        errno = ENOMEM;
        return -1;
      }
      fscd_log (LOG_WARNING, "objects/@%02x: cannot scan: %s",
                fan, strerror (errno));
    }
  }
  free (ls.v);
  qsort (s->cand, s->ncand, sizeof *s->cand, cull_order_q);
  s->seconds = mono_now () - t0;
  return 0;
}
