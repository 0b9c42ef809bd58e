/* libfscache: serving hits, the read path's first kind of run
 * (retrieve.c decides the runs).  A hit run is read from the data file
 * in one pread and verified: whole blocks against the index checksum,
 * a part of a block through the block's sub-block hashes (only the
 * 4 KiB pieces served are read and hashed), zero blocks are zeroes.  A
 * block that fails its check is dropped, so that the caller fetches
 * it again as a miss; a failed read of a cache file withdraws the
 * object, and the caller goes upstream.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xxh.h"

#include "internal.h"
#include "hit.h"
#include "utils.h"

/* Block BAD failed its checksum: drop it (if nobody changed it
 * meanwhile) so that the caller refetches it from upstream.
 */
static void
drop_bad (struct fsc_object *o, uint64_t bad, uint64_t csum)
{
  FSC_STAT_ADD (&o->cache->stats, verify_failures, 1);
  FSC_OSTAT_ADD (o, verify_failures, 1);
  pthread_mutex_lock (&o->lock);
  struct group *g = group_of (o, bad, false);
  if (g && (g->present & BIT_OF (bad)) && g->csum[IDX_OF (bad)] == csum) {
    g->present &= ~BIT_OF (bad);
    g->zero &= ~BIT_OF (bad);
    fsc_note_gone (o, g, BIT_OF (bad));
    if (fsc_mark_dirty (o, GROUP_OF (bad), g) == -1) {
      pthread_mutex_unlock (&o->lock);
      fsc_withdraw (o, ENOMEM);
      return;
    }
  }
  pthread_mutex_unlock (&o->lock);
}

/* A failed read of a cache file. */
static void
read_failed (struct fsc_object *o, ssize_t r)
{
  FSC_STAT_ADD (&o->cache->stats, read_errors, 1);
  FSC_OSTAT_ADD (o, io_errors, 1);
  fsc_withdraw (o, r == -1 ? errno : EIO);
}

static const uint64_t *
end_sums_of (const struct end_sums *es, uint64_t blk)
{
  for (int i = 0; es && i < 2; ++i)
    if (es->have[i] && es->blk[i] == blk)
      return es->sums[i];
  return NULL;
}

/* Serve the part [LO, HI) of present block BLK, which does not cover
 * all of it, into BUF (the client's window starts at OFFSET).  Returns
 * true if served.
 */
static bool
hit_partial (struct fsc_object *o, uint64_t blk, void *buf, uint64_t offset,
             uint64_t lo, uint64_t hi, uint64_t csum, unsigned pieces,
             const uint64_t *pre)
{
  struct fsc_io *io = &o->cache->io;
  unsigned char *out = (unsigned char *) buf + (lo - offset);
  const uint64_t bs = block_start (&o->geom, blk),
    be = block_end (&o->geom, blk);
  ssize_t r;

  if (!o->verify) {
    r = fsc_data_pread (o, out, hi - lo, lo);
    if (r != (ssize_t) (hi - lo)) {
      read_failed (o, r);
      return false;
    }
    return true;
  }

  /* The block's sub-block hashes, checked against the index (those of
   * pieces it does not hold count as 0).
   */
  const unsigned kb = DIV_ROUND_UP (be - bs, SUB_SIZE);
  uint64_t sums[MAX_SUBS];
  if (pre)
    memcpy (sums, pre, kb * sizeof *sums);
  else if (!fsc_scache_get (o, blk, csum, pieces, sums, kb)) {
    r = fsc_sums_read (io, &o->files, &o->geom, blk, kb, sums);
    if (r == -1) {
      read_failed (o, r);
      return false;
    }
    fsc_sums_mask (&o->geom, sums, kb, pieces);
    if (fsc_sums_csum (sums, kb) != csum) {
      drop_bad (o, blk, csum);
      return false;
    }
    fsc_scache_put (o, blk, csum, pieces, sums, kb);
  }

  /* Only the sub-blocks we serve. */
  const uint64_t s0 = (lo - bs) >> SUB_SHIFT, s1 = (hi - 1 - bs) >> SUB_SHIFT;
  const uint64_t ds = bs + (s0 << SUB_SHIFT);
  const uint64_t de = MIN (bs + ((s1 + 1) << SUB_SHIFT), be);
  /* Sub-block aligned (a 4 KiB read): straight into the client's
   * buffer, no bounce.
   */
  unsigned char *tmp = lo == ds && hi == de ? out
    : fsc_scratch (o->cache, de - ds);
  if (tmp == NULL) {
    /* No memory for a bounce buffer: serve this object uncached
     * rather than spin on the same block.
     */
    fsc_withdraw (o, ENOMEM);
    return false;
  }
  r = fsc_data_pread (o, tmp, de - ds, ds);
  if (r != (ssize_t) (de - ds)) {
    read_failed (o, r);
    return false;
  }
  if (!fsc_sums_check_subs (sums, s0, tmp, de - ds)) {
    drop_bad (o, blk, csum);
    return false;
  }
  if (tmp != out)
    memcpy (out, tmp + (lo - ds), hi - lo);
  return true;
}

/* Serve N zero blocks from B (their checksums in CSUMS): zeroes where
 * the client's window overlaps them, nothing read.  Returns how many
 * were served; fewer than N means block B+return has a checksum other
 * than that of zeroes (damage) and is no longer present.
 */
uint64_t
fsc_hit_zero (struct fsc_object *o, uint64_t b, uint64_t n, void *buf,
              uint64_t offset, uint32_t count, const uint64_t *csums)
{
  uint64_t i = 0;
  for (; i < n; ++i)
    if (o->verify && csums[i] != zero_csum (&o->geom, b + i)) {
      drop_bad (o, b + i, csums[i]);
      break;
    }
  if (i == 0)
    return 0;
  uint64_t lo = MAX (block_start (&o->geom, b), offset);
  uint64_t hi = MIN (block_end (&o->geom, b + i - 1), offset + count);
  memset ((unsigned char *) buf + (lo - offset), 0, hi - lo);
  FSC_STAT_ADD (&o->cache->stats, hit_bytes, hi - lo);
  FSC_OSTAT_ADD (o, hit_bytes, hi - lo);
  return i;
}

/* Serve N present blocks from B (their checksums and pieces in CSUMS
 * and PIECES; only the blocks at the window's ends may be held in
 * pieces).  Returns how many were served; fewer than N means block
 * B+return failed its checksum or could not be read and is no longer
 * present (or the object was withdrawn).
 */
uint64_t
fsc_hit_run (struct fsc_object *o, uint64_t b, uint64_t n, void *buf,
             uint64_t offset, uint32_t count, const uint64_t *csums,
             const uint16_t *pieces, const struct end_sums *es)
{
  struct fsc_stats *st = &o->cache->stats;
  const uint64_t wend = offset + count;
  const uint64_t start = block_start (&o->geom, b),
    end = block_end (&o->geom, b + n - 1);

  if (start >= offset && end <= wend) {
    /* Whole blocks: one read straight into the client's buffer. */
    unsigned char *dst = (unsigned char *) buf + (start - offset);
    ssize_t r = fsc_data_pread (o, dst, end - start, start);
    if (r != (ssize_t) (end - start)) {
      read_failed (o, r);
      return 0;
    }
    uint64_t good = n;
    for (uint64_t i = 0; o->verify && i < n; ++i) {
      uint64_t bs = block_start (&o->geom, b + i),
        be = block_end (&o->geom, b + i);
      if (fsc_block_csum (dst + (bs - start), be - bs) != csums[i]) {
        drop_bad (o, b + i, csums[i]);
        good = i;
        break;
      }
    }
    uint64_t hb = (good == n ? end : block_start (&o->geom, b + good)) - start;
    FSC_STAT_ADD (st, hit_bytes, hb);
    FSC_OSTAT_ADD (o, hit_bytes, hb);
    return good;
  }

  /* The window starts or ends inside the run: block by block. */
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t bs = block_start (&o->geom, b + i),
      be = block_end (&o->geom, b + i);
    uint64_t lo = MAX (bs, offset), hi = MIN (be, wend);
    if (lo == bs && hi == be) {
      if (fsc_hit_run (o, b + i, 1, buf, offset, count, &csums[i],
                       &pieces[i], NULL) == 0)
        return i;
      continue;
    }
    if (!hit_partial (o, b + i, buf, offset, lo, hi, csums[i], pieces[i],
                      end_sums_of (es, b + i)))
      return i;
    FSC_STAT_ADD (st, hit_bytes, hi - lo);
    FSC_OSTAT_ADD (o, hit_bytes, hi - lo);
  }
  return n;
}

