/* libfscache: skipped fills, remembered so that they can be made up.
 *
 * When the cache disk is the bottleneck (fill.c: the fill budget, the
 * full queue's skip), a client's read is served without being stored:
 * the client must not wait for the disk.  From an upstream faster than
 * the disk that left most of what was read uncached for good (108 MiB
 * of a 1 GiB random read from nbdkit null, still 108 MiB after 30 s
 * idle), and the next reader fetched it all again.  So every skipped
 * range is noted here (fsc_catchup_note, at the two places retrieve.c
 * skips), and someone with an upstream (the filter's catch-up worker,
 * plugin/catchup.c) takes them back (fsc_catchup_take) while clients
 * are idle, and fills them as a prefetch does: blocks present or being
 * fetched by then are skipped, the size cap, quotas, the free space
 * floor and fscache.stop apply as to any fill.
 *
 * Bounded: at most CATCHUP_MAX ranges per object, whole blocks,
 * neighbours merged as they come (a stream's skips make one range);
 * when full, the oldest is dropped and counted (catchup_dropped_bytes).
 * Memory only: a crash or a stop forgets them, which costs the next
 * reader a fetch, never data.  Counters: catchup_noted_bytes,
 * catchup_done_bytes, catchup_dropped_bytes in the cache's stats;
 * pending is noted minus done minus dropped (fsc_catchup_pending, per
 * object).
 *
 * The ranges are a ring of (first block, blocks) under their own lock
 * (o->cu_lock, a leaf: nothing else is taken under it), so that a
 * note costs a skip a few instructions and never o->lock.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "utils.h"

/* 64 Ki ranges of 16 bytes: 1 MiB per object at most. */
#define CATCHUP_MAX ((size_t) 1 << 16)

struct cu_range {
  uint64_t b, n;                /* first block, blocks */
};

/* The bytes of blocks [B, B + N), the last one cut at the export's end. */
static uint64_t
range_bytes (const struct fsc_object *o, uint64_t b, uint64_t n)
{
  return MIN (n << o->geom.bshift, o->geom.size - (b << o->geom.bshift));
}

void
fsc_catchup_note (struct fsc_object *o, uint64_t offset, uint64_t len)
{
  if (len == 0 || o->geom.size == 0)
    return;
  uint64_t b = offset >> o->geom.bshift;
  uint64_t e = MIN (offset + len, o->geom.size);
  uint64_t n = ((e - 1) >> o->geom.bshift) - b + 1;
  /* Counted as fsc_catchup_take hands them out, up to the export's
   * end: the counters then add up (noted = done + dropped + pending)
   * for an export whose last block is short.
   */
  uint64_t bytes = range_bytes (o, b, n);
  struct fsc_stats *st = &o->cache->stats;

  pthread_mutex_lock (&o->cu_lock);
  if (!o->cu_on) {
    pthread_mutex_unlock (&o->cu_lock);
    return;
  }
  if (o->cu_len > 0) {
    struct cu_range *last = &o->cu[(o->cu_head + o->cu_len - 1) % o->cu_cap];
    if (last->b + last->n == b) {       /* a stream: one range */
      last->n += n;
      o->cu_pending += bytes;
      pthread_mutex_unlock (&o->cu_lock);
      FSC_STAT_ADD (st, catchup_noted_bytes, bytes);
      return;
    }
  }
  if (o->cu_len == o->cu_cap && o->cu_cap < CATCHUP_MAX) {
    size_t ncap = o->cu_cap ? MIN (o->cu_cap * 2, CATCHUP_MAX) : 64;
    struct cu_range *p = malloc (ncap * sizeof *p);
    if (p) {
      for (size_t i = 0; i < o->cu_len; ++i)
        p[i] = o->cu[(o->cu_head + i) % o->cu_cap];
      free (o->cu);
      o->cu = p;
      o->cu_head = 0;
      o->cu_cap = ncap;
    }
  }
  uint64_t dropped = 0;
  if (o->cu_len == o->cu_cap) {
    if (o->cu_cap == 0) {               /* no memory: not remembered */
      pthread_mutex_unlock (&o->cu_lock);
      FSC_STAT_ADD (st, catchup_dropped_bytes, bytes);
      return;
    }
    dropped = range_bytes (o, o->cu[o->cu_head].b, o->cu[o->cu_head].n);
    o->cu_head = (o->cu_head + 1) % o->cu_cap;
    o->cu_len--;
    o->cu_pending -= MIN (o->cu_pending, dropped);
  }
  o->cu[(o->cu_head + o->cu_len++) % o->cu_cap] = (struct cu_range) { b, n };
  o->cu_pending += bytes;
  pthread_mutex_unlock (&o->cu_lock);
  FSC_STAT_ADD (st, catchup_noted_bytes, bytes);
  if (dropped)
    FSC_STAT_ADD (st, catchup_dropped_bytes, dropped);
}

int
fsc_catchup_take (struct fsc_object *o, uint64_t max, uint64_t *offset,
                  uint64_t *len)
{
  int r = 0;
  pthread_mutex_lock (&o->cu_lock);
  if (o->cu_len > 0) {
    struct cu_range *first = &o->cu[o->cu_head];
    uint64_t n = MAX (max >> o->geom.bshift, (uint64_t) 1);
    n = MIN (n, first->n);
    *offset = first->b << o->geom.bshift;
    *len = MIN (n << o->geom.bshift, o->geom.size - *offset);
    first->b += n;
    first->n -= n;
    if (first->n == 0) {
      o->cu_head = (o->cu_head + 1) % o->cu_cap;
      o->cu_len--;
    }
    o->cu_pending -= MIN (o->cu_pending, *len);
    r = 1;
  }
  pthread_mutex_unlock (&o->cu_lock);
  return r;
}

void
fsc_catchup_done (struct fsc_object *o, uint64_t bytes, bool filled)
{
  if (filled)
    FSC_STAT_ADD (&o->cache->stats, catchup_done_bytes, bytes);
  else
    FSC_STAT_ADD (&o->cache->stats, catchup_dropped_bytes, bytes);
}

uint64_t
fsc_catchup_pending (struct fsc_object *o)
{
  pthread_mutex_lock (&o->cu_lock);
  uint64_t p = o->cu_pending;
  pthread_mutex_unlock (&o->cu_lock);
  return p;
}

void
fsc_catchup_enable (struct fsc_object *o, bool on)
{
  pthread_mutex_lock (&o->cu_lock);
  o->cu_on = on;
  if (!on) {
    free (o->cu);
    o->cu = NULL;
    o->cu_head = o->cu_len = o->cu_cap = 0;
    o->cu_pending = 0;
  }
  pthread_mutex_unlock (&o->cu_lock);
}

void
fsc_catchup_free (struct fsc_object *o)
{
  free (o->cu);
  o->cu = NULL;
  pthread_mutex_destroy (&o->cu_lock);
}
