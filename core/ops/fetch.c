/* libfscache: fetching a miss run (retrieve.c claims it): what to
 * fetch of its blocks (the read's window, the pieces its end blocks
 * hold), one upstream read timed by the upstream meter, the client's
 * part copied out, and the fill handed to the fill threads, or done
 * inline, or skipped when the cache disk is the bottleneck (fill.c).
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "fetch.h"
#include "guard.h"
#include "utils.h"

/* Copy the part of [start, end) that lies in the client's window. */
static void
copy_out (void *buf, uint64_t offset, uint32_t count,
          const unsigned char *src, uint64_t start, uint64_t end)
{
  uint64_t lo = MAX (start, offset), hi = MIN (end, offset + count);
  if (lo < hi)
    memcpy ((unsigned char *) buf + (lo - offset), src + (lo - start),
            hi - lo);
}

static uint64_t
overlap (uint64_t start, uint64_t end, uint64_t offset, uint32_t count)
{
  uint64_t lo = MAX (start, offset), hi = MIN (end, offset + count);
  return lo < hi ? hi - lo : 0;
}

/* Read LEN bytes at OFFSET upstream into DST, timed by the cache's
 * upstream meter (fill.c: is the cache disk the bottleneck?).
 */
int
fsc_up_pread (struct fsc_object *o, const struct fsc_upstream *up, void *dst,
              uint64_t len, uint64_t offset)
{
  struct fsc_meter *m = &o->cache->up_meter;
  const uint64_t t0 = fsc_mono_ns ();
  fsc_meter_begin (m);
  int r = up->pread (up->opaque, dst, len, offset);
  int e = errno;
  fsc_meter_end (m, r == 0 ? len : 0);
  if (r == 0) {
    const uint64_t ns = fsc_mono_ns () - t0;
    fsc_upstream_latency (o->cache, ns);
    fsc_guard_up_time (o, len, ns);
  }
  errno = e;
  return r;
}

/* What fetch_run fetches of the N claimed blocks from B: [*START,
 * *END), from the read's window and the pieces its end blocks hold
 * (HELD_FIRST, HELD_LAST).
 */
static void
fetch_range (struct fsc_object *o, uint64_t b, uint64_t n, const void *buf,
             uint64_t offset, uint32_t count, unsigned rflags,
             unsigned held_first, unsigned held_last, uint64_t *startp,
             uint64_t *endp)
{
  const uint64_t ps = piece_size (o);
  uint64_t start = block_start (&o->geom, b),
    end = block_end (&o->geom, b + n - 1);
  /* What the client's window needs of the run, in whole pieces (all of
   * it for a prefetch).
   */
  const bool exact = !buf && (rflags & FSC_PREFETCH_EXACT);
  const uint64_t wlo = buf || exact ? MAX (start, offset & ~(ps - 1)) : end;
  const uint64_t whi = buf || exact
    ? MIN (end, ROUND_UP (offset + count, ps)) : start;
  if ((buf && !(rflags & (FSC_READ_SEQUENTIAL | FSC_READ_NEAR))) || exact) {
    start = wlo;
    end = whi;
  }
  /* Whole blocks, but never again the pieces the end blocks already
   * hold, unless the window needs them (they are then fetched again
   * rather than served in a second pass).  A read starts after the last
   * piece its first block holds before the window, and ends before the
   * first one its last block holds after it: the pieces beyond stay
   * absent for a later read, where fetching through them would fetch a
   * held piece twice (a stream whose requests overtake each other
   * lands pieces mid-block).  A prefetch, which is there to complete
   * blocks, fetches them gap by gap (below).
   */
  if (held_first) {
    const uint64_t bs = block_start (&o->geom, b);
    if (buf) {
      unsigned below = held_first;
      if (wlo < block_end (&o->geom, b))
        below &= (1u << ((wlo - bs) >> o->geom.pshift)) - 1;
      /* the pieces not fetched at the start */
      const unsigned skip = below ? 32 - __builtin_clz (below) : 0;
      start = MAX (start, MIN (bs + ((uint64_t) skip << o->geom.pshift),
                               wlo));
    }
    else {
      /* A prefetch: from the first piece it wants that the block
       * lacks, up to the next one it holds (then a run of one block:
       * retrieve.c, classify_miss; the caller comes back for the next
       * gap).
       */
      const unsigned want = prefetch_want (&o->geom, b, !exact, offset,
                                           offset + count);
      unsigned a, z;
      prefetch_gap (want, held_first, &a, &z);
      start = MAX (start, bs + ((uint64_t) a << o->geom.pshift));
      if (z < FSC_PIECES)
        end = MIN (end, bs + ((uint64_t) z << o->geom.pshift));
    }
  }
  if (held_last) {
    const uint64_t bl = b + n - 1, bls = block_start (&o->geom, bl);
    uint64_t t;
    if (buf) {
      unsigned w1 = whi > bls ? (unsigned) DIV_ROUND_UP (whi - bls, ps) : 0;
      unsigned above = held_last & ~((1u << w1) - 1);
      t = above ? bls + ((uint64_t) __builtin_ctz (above) << o->geom.pshift)
        : block_end (&o->geom, bl);
    }
    else {
      uint64_t top = 31 - __builtin_clz (full_pieces (&o->geom, bl) &
                                         ~held_last);
      t = MIN (block_end (&o->geom, bl), bls + ((top + 1) << o->geom.pshift));
    }
    end = MIN (end, MAX (t, whi));
  }
  *startp = start;
  *endp = end;
}

/* Fetch N claimed blocks from B upstream, give the client its part,
 * and fill the cache: in the background when the cache's fill threads
 * run and have room, so that the reply does not wait for local writes
 * (others missing on these blocks wait for the fill as for a fetch);
 * else here.  A read that is neither sequential nor near the last one
 * fetches only the pieces of the end blocks it covers, and so does an
 * exact prefetch (FSC_PREFETCH_EXACT); other prefetches and streams
 * fetch whole blocks.  EPOCHS holds the claim epoch of each
 * group from B's.  Returns 0 or -1 (upstream error).
 */
int
fsc_fetch_run (struct fsc_object *o, uint64_t b, uint64_t n, void *buf,
              uint64_t offset, uint32_t count, const struct fsc_upstream *up,
              const uint64_t *epochs, unsigned rflags, unsigned held_first,
              unsigned held_last, uint64_t *missed)
{
  const unsigned fflags = buf == NULL
    ? FSC_FILL_PREFETCHED | FSC_FILL_SCAN
    : (rflags & FSC_READ_SEQUENTIAL) ? FSC_FILL_SCAN : 0;
  struct fsc_stats *st = &o->cache->stats;
  uint64_t start, end;
  fetch_range (o, b, n, buf, offset, count, rflags, held_first, held_last,
               &start, &end);
  uint64_t len = end - start;
  bool direct = buf && start >= offset && end <= offset + count;
  /* The fill job owns its buffer: read straight into the client's
   * buffer only when the fill will not need it afterwards.
   */
  struct fsc_fill *f = fsc_fill_new (o->cache, len);
  size_t cap = 0;
  unsigned char *dst = f ? f->data
    : direct ? (unsigned char *) buf + (start - offset)
    : fsc_buf_get (o->cache, len, &cap);
  int r = -1, e = ENOMEM;

  if (dst != NULL) {
    r = fsc_up_pread (o, up, dst, len, start);
    e = errno;
    FSC_STAT_ADD (st, upstream_reads, 1);
    FSC_OSTAT_ADD (o, upstream_reads, 1);
    if (r == 0) {
      FSC_STAT_ADD (st, upstream_read_bytes, len);
      FSC_OSTAT_ADD (o, upstream_bytes, len);
    }
  }
  if (r == 0) {
    if (buf) {
      if (dst != (unsigned char *) buf + (start - offset))
        copy_out (buf, offset, count, dst, start, end);
      uint64_t mb = overlap (start, end, offset, count);
      FSC_STAT_ADD (st, miss_bytes, mb);
      FSC_OSTAT_ADD (o, miss_bytes, mb);
      *missed += mb;
    }
    else {
      FSC_STAT_ADD (st, prefetch_bytes, len);
      FSC_OSTAT_ADD (o, prefetch_bytes, len);
    }
  }

  /* Hand the fill over.  The queue refuses a job when it is full: the
   * cache disk is behind.  If it is also the bottleneck (fill.c,
   * fsc_fill_slower: fills are written at less than a third of the
   * upstream's rate), a client's read, whose bytes are already in its
   * buffer, does not wait for the disk: its blocks are released
   * unstored (absent, or holding the pieces they held; a later miss
   * may fill them) and the skip is counted.  Otherwise the backlog is
   * a passing one (a stall, a burst) and the read fills inline, as one
   * more writer.  A prefetch always fills inline: nobody has its bytes
   * but the fill, and skipping would fetch them twice (readahead
   * pauses while the disk is behind, so that this is rare).
   */
  bool skip = false;
  if (f && r == 0) {
    f->block = b;
    f->nblocks = n;
    f->start = start;
    f->flags = fflags;
    f->held = buf != NULL && fsc_fill_held (o->cache);
    memcpy (f->epochs, epochs, (GROUP_OF (b + n - 1) - GROUP_OF (b) + 1)
            * sizeof *epochs);
    if (fsc_fill_submit (o->cache, o, f) == 0)   /* takes a ref on O */
      return 0;
    skip = buf && fsc_fill_slower (o->cache);
  }
  if (skip) {
    fsc_fill_skipped (o, start, len);
    FSC_NOTICE (o, FSC_NOTICE_SKIPPED);
  }
  /* An inline fill writes, as the fill threads do: the fill meter
   * counts it (fill.c).
   */
  const bool store = r == 0 && !skip;
  if (store)
    fsc_meter_begin (&o->cache->fill_meter);
  fsc_fill_blocks (o, b, n, store ? dst : NULL, start, len, epochs, fflags);
  if (store)
    fsc_meter_end (&o->cache->fill_meter, len);
  if (f)
    fsc_fill_free (o->cache, f);
  else if (!direct)
    fsc_buf_put (o->cache, dst, cap);
  if (r == -1)
    errno = e;
  return r;
}

