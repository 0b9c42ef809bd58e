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
 * A bitmap of the object's blocks, one bit a block, not a bounded list
 * (issue 44): a list of 64 Ki ranges overflowed on a random read from a
 * fast upstream (8 GiB of 64 KiB reads: a fifth forgotten), when the
 * disk had room for all of it later.  Sparse: chunks of CU_CHUNK
 * blocks (512 bytes of bits) allocated as a skip first lands in them
 * and freed when emptied, under a table of one pointer per chunk
 * allocated at the first note (2 MiB for 64 TiB of 64 KiB blocks); so
 * at most one bit per block of the export, 2 MiB a TiB, whatever the
 * pattern.  Taken back in address order from a cursor that wraps, in
 * runs of neighbouring blocks (a stream's skips come back as one).
 * Dropped only if memory cannot be had, or by an upstream error at
 * fill time, counted (catchup_dropped_bytes).  Memory only: a crash or
 * a stop forgets them, which costs the next reader a fetch, never
 * data.  Counters: catchup_noted_bytes (a block noted again while
 * pending counts once), catchup_done_bytes, catchup_dropped_bytes in
 * the cache's stats; pending is noted minus done minus dropped
 * (fsc_catchup_pending, per object).
 *
 * Under its own lock (o->cu_lock, a leaf: nothing else is taken under
 * it), so that a note costs a skip a few word operations and never
 * o->lock.  tests/unit/unit-catchup.c notes 100,000 scattered blocks and
 * takes every one back.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "utils.h"

#define CU_CHUNK 4096                   /* blocks per chunk of bits */
#define CU_WORDS (CU_CHUNK / 64)

/* The bytes of blocks [B, B + N), the last one cut at the export's end. */
static uint64_t
range_bytes (const struct fsc_object *o, uint64_t b, uint64_t n)
{
  return MIN (n << o->geom.bshift, o->geom.size - (b << o->geom.bshift));
}

/* Under cu_lock: set bits [B, E) of one chunk's words W; the number
 * newly set.
 */
static uint64_t
set_bits (uint64_t *w, uint64_t b, uint64_t e)
{
  uint64_t n = 0;
  for (uint64_t i = b; i < e; ) {
    uint64_t k = i / 64, lo = i % 64, hi = MIN (e - k * 64, (uint64_t) 64);
    uint64_t mask = (hi == 64 ? ~UINT64_C (0) : (UINT64_C (1) << hi) - 1) &
      ~((UINT64_C (1) << lo) - 1);
    n += (uint64_t) __builtin_popcountll (mask & ~w[k]);
    w[k] |= mask;
    i = k * 64 + hi;
  }
  return n;
}

void
fsc_catchup_note (struct fsc_object *o, uint64_t offset, uint64_t len)
{
  if (len == 0 || o->geom.size == 0 || offset >= o->geom.size)
    return;
  uint64_t b = offset >> o->geom.bshift;
  uint64_t e = ((MIN (offset + len, o->geom.size) - 1) >> o->geom.bshift) + 1;
  struct fsc_stats *st = &o->cache->stats;
  uint64_t added = 0, lost = 0;

  pthread_mutex_lock (&o->cu_lock);
  if (!o->cu_on) {
    pthread_mutex_unlock (&o->cu_lock);
    return;
  }
  if (o->cu_map == NULL) {
    o->cu_nchunks = (o->geom.nblocks + CU_CHUNK - 1) / CU_CHUNK;
    o->cu_map = calloc (o->cu_nchunks, sizeof *o->cu_map);
  }
  for (uint64_t i = b; i < e; ) {
    uint64_t c = i / CU_CHUNK, ce = MIN (e, (c + 1) * CU_CHUNK);
    uint64_t *w = o->cu_map ? o->cu_map[c] : NULL;
    if (w == NULL && o->cu_map &&
        (w = o->cu_map[c] = calloc (CU_WORDS, sizeof *w)) != NULL)
      o->cu_chunks++;
    if (w == NULL)                      /* no memory: not remembered */
      lost += range_bytes (o, i, ce - i);
    else {
      /* Only the export's last block may be short: if this sets it,
       * it counts its own bytes.
       */
      uint64_t last = o->geom.nblocks - 1, lb = last - c * CU_CHUNK;
      bool short_new = ce == o->geom.nblocks &&
        !(w[lb / 64] & (UINT64_C (1) << (lb % 64)));
      uint64_t n = set_bits (w, i - c * CU_CHUNK, ce - c * CU_CHUNK);
      added += n << o->geom.bshift;
      if (short_new)
        added -= ((uint64_t) 1 << o->geom.bshift) - range_bytes (o, last, 1);
    }
    i = ce;
  }
  o->cu_pending += added;
  pthread_mutex_unlock (&o->cu_lock);
  if (added)
    FSC_STAT_ADD (st, catchup_noted_bytes, added);
  if (lost) {
    FSC_STAT_ADD (st, catchup_noted_bytes, lost);
    FSC_STAT_ADD (st, catchup_dropped_bytes, lost);
  }
}

/* Under cu_lock: the first set block at or after B, wrapping once;
 * false if none.
 */
static bool
find_set (struct fsc_object *o, uint64_t from, uint64_t *found)
{
  uint64_t nb = o->geom.nblocks;
  for (uint64_t pass = 0; pass < 2; ++pass) {
    uint64_t start = pass ? 0 : from, end = pass ? MIN (from, nb) : nb;
    for (uint64_t i = start; i < end; ) {
      uint64_t c = i / CU_CHUNK;
      uint64_t *w = o->cu_map[c];
      if (w == NULL) {
        i = (c + 1) * CU_CHUNK;
        continue;
      }
      uint64_t k = (i % CU_CHUNK) / 64;
      uint64_t bits = w[k] & (~UINT64_C (0) << (i % 64));
      if (bits) {
        uint64_t f = c * CU_CHUNK + k * 64 + (uint64_t) __builtin_ctzll (bits);
        if (f < end) {
          *found = f;
          return true;
        }
        break;
      }
      i = c * CU_CHUNK + (k + 1) * 64;
    }
  }
  return false;
}

static bool
test_clear (struct fsc_object *o, uint64_t b)
{
  uint64_t *w = o->cu_map[b / CU_CHUNK];
  if (w == NULL)
    return false;
  uint64_t k = (b % CU_CHUNK) / 64, m = UINT64_C (1) << (b % 64);
  if (!(w[k] & m))
    return false;
  w[k] &= ~m;
  return true;
}

/* Under cu_lock: free chunk C if no bit of it is left. */
static void
maybe_free_chunk (struct fsc_object *o, uint64_t c)
{
  uint64_t *w = o->cu_map[c];
  for (unsigned k = 0; w && k < CU_WORDS; ++k)
    if (w[k])
      return;
  if (w) {
    free (w);
    o->cu_map[c] = NULL;
    o->cu_chunks--;
  }
}

int
fsc_catchup_take (struct fsc_object *o, uint64_t max, uint64_t *offset,
                  uint64_t *len)
{
  int r = 0;
  uint64_t first;
  pthread_mutex_lock (&o->cu_lock);
  if (o->cu_map && o->cu_chunks && find_set (o, o->cu_cursor, &first)) {
    uint64_t n = MAX (max >> o->geom.bshift, (uint64_t) 1), b = first;
    while (b < o->geom.nblocks && b - first < n && test_clear (o, b))
      b++;
    for (uint64_t c = first / CU_CHUNK; c <= (b - 1) / CU_CHUNK; ++c)
      maybe_free_chunk (o, c);
    o->cu_cursor = b;
    *offset = first << o->geom.bshift;
    *len = range_bytes (o, first, b - first);
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

/* Under cu_lock (or alone): forget everything. */
static void
free_map (struct fsc_object *o)
{
  for (uint64_t c = 0; o->cu_map && c < o->cu_nchunks; ++c)
    free (o->cu_map[c]);
  free (o->cu_map);
  o->cu_map = NULL;
  o->cu_nchunks = o->cu_chunks = o->cu_cursor = 0;
  o->cu_pending = 0;
}

void
fsc_catchup_enable (struct fsc_object *o, bool on)
{
  pthread_mutex_lock (&o->cu_lock);
  o->cu_on = on;
  if (!on)
    free_map (o);
  pthread_mutex_unlock (&o->cu_lock);
}

void
fsc_catchup_free (struct fsc_object *o)
{
  free_map (o);
  pthread_mutex_destroy (&o->cu_lock);
}
