/* libfscache: the client's operations on the write log (wlog.c has
 * the overview): reads, writes, zeroes and trims.
 *
 * They sit on top of the log (wl_append, fsc_wlog_flush in wlog.c)
 * and its extent map (wlog-map.c), and add what a client request needs
 * around its records.  A read serves the logged pieces from a snapshot
 * of the map and the gaps from the object, with no lock held across
 * upstream I/O (rule 11).  A write, zero or trim owns the units it
 * touches (range locks) and reads the rest of a partly covered unit
 * before it logs the unit whole, so overlapping writes are serialized
 * (rule 10).  Both rules are listed atop wlog.c and stated in full
 * here, by the code that keeps them.
 *
 * A file of its own because these are per request and keep no state
 * of the log's but the list of owned units (wl->rmw): the order,
 * durability and space of records are the log's (wlog.c).
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

#include "wlog-int.h"

/*----------------------------------------------------------------------
 * Reads.
 */

/* Read [OFF, OFF+LEN) of record E's data into DST, verifying every
 * unit it touches.  OFF is unit-aligned relative to E; LEN may end at
 * E's end.  Returns 0, or -1 with errno EIO (bad or unreadable).
 */
int
wl_read_units (struct fsc_wlog *wl, const struct wl_entry *e, uint64_t off,
               uint64_t len, unsigned char *dst)
{
  uint64_t rel = off - e->off;
  ssize_t n = fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd, dst, len,
                            e->pos + wl_hdr_bytes (e) + rel);
  if (n != (ssize_t) len) {
    errno = EIO;
    return -1;
  }
  for (uint64_t u = 0; u < len; u += FSC_WLOG_UNIT) {
    uint64_t ul = MIN ((uint64_t) FSC_WLOG_UNIT, len - u);
    if (XXH3_64bits (dst + u, ul) != e->hashes[(rel + u) / FSC_WLOG_UNIT]) {
      errno = EIO;
      return -1;
    }
  }
  return 0;
}

/* Serve [S, T) of logged record E into DST. */
static int
read_logged (struct fsc_wlog *wl, const struct wl_entry *e, uint64_t s,
             uint64_t t, unsigned char *dst)
{
  if (e->type != WL_DATA) {
    memset (dst, 0, t - s);
    return 0;
  }
  uint64_t ua = e->off + ROUND_DOWN (s - e->off, (uint64_t) FSC_WLOG_UNIT);
  uint64_t ub = MIN (e->off + ROUND_UP (t - e->off, (uint64_t) FSC_WLOG_UNIT),
                     e->off + e->len);
  if (ua == s && ub == t)
    return wl_read_units (wl, e, s, t - s, dst);
  unsigned char *b = malloc (ub - ua);
  if (b == NULL)
    return -1;
  int r = wl_read_units (wl, e, ua, ub - ua, b);
  if (r == 0)
    memcpy (dst, b + (s - ua), t - s);
  free (b);
  return r;
}

/* Rule 11 (no lock across upstream I/O): a read holds wl->punch (and
 * wl->lock) only while it reads the log, never across the misses it
 * sends to the object (the cache or the upstream).  wl->punch prefers
 * writers: a reader holding it across a slow miss would stall the
 * writer's retire behind it, and every later read, of dirty and cached
 * data too, behind the writer.  So a read works in two phases: the
 * logged pieces from a snapshot of the map, under the lock; then the
 * gaps between them, without it.  A gap was not dirty at the snapshot;
 * what is written there later is a later write, which a read that
 * overlaps it may or may not see, as on a disk.
 * Broken by tests/writeback/test-wb-hang.sh.
 */
int
fsc_wlog_read (struct fsc_wlog *wl, struct fsc_object *obj, void *buf,
               uint32_t count, uint64_t offset,
               const struct fsc_upstream *up, unsigned flags)
{
  unsigned char *out = buf;
  struct wl_segs s = { 0 };
  int r = 0, err = 0;
  uint64_t end = offset + count;

  /* Phase 1: the logged pieces. */
  pthread_rwlock_rdlock (&wl->punch);
  pthread_mutex_lock (&wl->lock);
  wl_map_visit (wl->root, offset, end, wl_collect, &s);
  pthread_mutex_unlock (&wl->lock);
  if (s.nomem) {
    /* A partial list would serve stale upstream bytes for the rest. */
    pthread_rwlock_unlock (&wl->punch);
    free (s.v);
    errno = ENOMEM;
    return -1;
  }
  for (size_t i = 0; i < s.n && r == 0; ++i) {
    uint64_t a = MAX (s.v[i].start, offset), b = MIN (s.v[i].end, end);
    if (read_logged (wl, s.v[i].e, a, b, out + (a - offset)) == -1) {
      err = errno;
      if (err != ENOMEM) {
        pthread_mutex_lock (&wl->lock);
        wl_notice (wl, FSC_WLOG_NOTICE_BADREAD, err, a);
        pthread_mutex_unlock (&wl->lock);
        err = EBADMSG;          /* ours, not the upstream's */
      }
      r = -1;
    }
  }
  pthread_rwlock_unlock (&wl->punch);
  if (r == -1) {
    free (s.v);
    errno = err;
    return -1;
  }

  /* Phase 2: the gaps, from the object, without a lock. */
  uint64_t cur = offset;
  for (size_t i = 0; i <= s.n && r == 0; ++i) {
    uint64_t a = i < s.n ? MAX (s.v[i].start, offset) : end;
    if (cur < a)
      r = fsc_object_read (obj, out + (cur - offset), a - cur, cur, up,
                           flags);
    if (i < s.n)
      cur = MIN (s.v[i].end, end);
  }
  free (s.v);
  return r;
}

/*----------------------------------------------------------------------
 * Writes, zeroes and trims.
 */

/* Rule 10 (overlapping writes): writes whose units overlap are
 * serialized, whatever their alignment.  Every client write, zero and
 * trim owns the units it touches (a range lock, wl->rmw) from before
 * it reads anything until its records are applied, so an unaligned
 * write's read-modify-write cannot read a unit, let an overlapping
 * aligned write land, and then log the old unit over it.  Range locks
 * rather than sub-unit records: the format, recovery and the writer's
 * batches stay as they are, and the list holds at most one entry per
 * request in flight (16 at iodepth 16), scanned under wl->lock.
 * Broken by tests/writeback/test-wb-overlap.sh.
 */

/* Wait until no write owns a unit of [A, B), then own it. */
static void
range_lock (struct fsc_wlog *wl, uint64_t a, uint64_t b, struct wl_rmw *me)
{
  pthread_mutex_lock (&wl->lock);
  for (;;) {
    bool busy = false;
    for (struct wl_rmw *m = wl->rmw; m && !busy; m = m->next)
      if (m->start < b && m->end > a)
        busy = true;
    if (!busy)
      break;
    pthread_cond_wait (&wl->cond, &wl->lock);
  }
  me->start = a;
  me->end = b;
  me->next = wl->rmw;
  wl->rmw = me;
  pthread_mutex_unlock (&wl->lock);
}

static void
range_unlock (struct fsc_wlog *wl, struct wl_rmw *me)
{
  pthread_mutex_lock (&wl->lock);
  for (struct wl_rmw **p = &wl->rmw; *p; p = &(*p)->next)
    if (*p == me) {
      *p = me->next;
      break;
    }
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
}

/* The export's end, for units: the last unit may be short. */
static uint64_t
unit_end (const struct fsc_wlog *wl, uint64_t x)
{
  return MIN (ROUND_UP (x, (uint64_t) FSC_WLOG_UNIT), wl->size);
}

/* Write BUF (NULL: zeroes) over [OFFSET, OFFSET+COUNT) as data,
 * reading the rest of partly covered units first.  The caller owns
 * the units (range_lock).
 */
static int
write_data (struct fsc_wlog *wl, struct fsc_object *obj,
            const struct fsc_upstream *up, const void *buf, uint64_t count,
            uint64_t offset, bool fua)
{
  uint64_t a = ROUND_DOWN (offset, (uint64_t) FSC_WLOG_UNIT);
  uint64_t b = unit_end (wl, offset + count);
  if (a == offset && b == offset + count && buf)
    return wl_append (wl, WL_DATA, offset, count, buf, fua);

  unsigned char *tmp = malloc (b - a);
  if (tmp == NULL)
    return -1;
  int r = 0;
  /* The rest of the first and the last unit, each read once. */
  uint64_t tu = ROUND_DOWN (offset + count, (uint64_t) FSC_WLOG_UNIT);
  if (a < offset)
    r = fsc_wlog_read (wl, obj, tmp, MIN (a + FSC_WLOG_UNIT, b) - a, a, up,
                       0);
  if (r == 0 && offset + count < b && !(tu == a && a < offset))
    r = fsc_wlog_read (wl, obj, tmp + (tu - a), b - tu, tu, up, 0);
  if (r == 0) {
    if (buf)
      memcpy (tmp + (offset - a), buf, count);
    else
      memset (tmp + (offset - a), 0, count);
    r = wl_append (wl, WL_DATA, a, b - a, tmp, fua);
  }
  int e = errno;
  free (tmp);
  errno = e;
  return r;
}

/* Own the units of [OFFSET, OFFSET+COUNT) around a client operation. */
#define UNITS_OF(wl, offset, count)                             \
  ROUND_DOWN ((offset), (uint64_t) FSC_WLOG_UNIT),              \
  unit_end ((wl), (offset) + (count))

int
fsc_wlog_pwrite (struct fsc_wlog *wl, struct fsc_object *obj,
                 const struct fsc_upstream *up, const void *buf,
                 uint32_t count, uint64_t offset, bool fua)
{
  if (count == 0)
    return fua ? fsc_wlog_flush (wl) : 0;
  struct wl_rmw me;
  range_lock (wl, UNITS_OF (wl, offset, count), &me);
  int r = write_data (wl, obj, up, buf, count, offset, fua);
  int e = errno;
  range_unlock (wl, &me);
  errno = e;
  return r;
}

int
fsc_wlog_zero (struct fsc_wlog *wl, struct fsc_object *obj,
               const struct fsc_upstream *up, uint32_t count,
               uint64_t offset, unsigned flags)
{
  const bool fua = flags & FSC_WLOG_FUA;
  /* The ragged ends are written as data, which keeps them allocated
   * either way.
   */
  const enum wl_type type = flags & FSC_WLOG_NO_HOLE ? WL_ZERO_ALLOC
    : WL_ZERO;
  if (count == 0)
    return fua ? fsc_wlog_flush (wl) : 0;
  uint64_t end = offset + count;
  uint64_t a = ROUND_UP (offset, (uint64_t) FSC_WLOG_UNIT);
  uint64_t b = end == wl->size ? end
    : ROUND_DOWN (end, (uint64_t) FSC_WLOG_UNIT);
  struct wl_rmw me;
  int r = 0;
  range_lock (wl, UNITS_OF (wl, offset, count), &me);
  if (a >= b)                   /* within one unit */
    r = write_data (wl, obj, up, NULL, count, offset, fua);
  else {
    if (offset < a)
      r = write_data (wl, obj, up, NULL, a - offset, offset, false);
    if (r == 0 && b < end)
      r = write_data (wl, obj, up, NULL, end - b, b, false);
    if (r == 0)
      r = wl_append (wl, type, a, b - a, NULL, fua);
  }
  int e = errno;
  range_unlock (wl, &me);
  errno = e;
  return r;
}

int
fsc_wlog_trim (struct fsc_wlog *wl, uint32_t count, uint64_t offset,
               bool fua)
{
  /* Only whole units: a trim is advisory, its ragged ends may stay. */
  uint64_t end = offset + count;
  uint64_t a = ROUND_UP (offset, (uint64_t) FSC_WLOG_UNIT);
  uint64_t b = end == wl->size ? end
    : ROUND_DOWN (end, (uint64_t) FSC_WLOG_UNIT);
  if (a >= b)
    return fua ? fsc_wlog_flush (wl) : 0;
  struct wl_rmw me;
  range_lock (wl, a, b, &me);
  int r = wl_append (wl, WL_TRIM, a, b - a, NULL, fua);
  int e = errno;
  range_unlock (wl, &me);
  errno = e;
  return r;
}
