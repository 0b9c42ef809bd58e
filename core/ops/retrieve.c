/* libfscache: retrieval, the read path (the seed's read_or_alloc_page
 * and friends, by blocks instead of pages).
 *
 * A read is cut into runs, decided under obj->lock and served without
 * it:
 *
 *   hit       present blocks: one pread from the data file, verified
 *             against the index checksum (whole blocks) or through the
 *             block's sub-block hashes (a part of a block: only the
 *             4 KiB pieces served are read and hashed); zero blocks
 *             are zeroes, nothing read (their checksum is that of
 *             zeroes, checked against the index's);
 *   miss      absent blocks, or blocks held in pieces without those
 *             the read needs, claimed (the group's fetching bits) and
 *             read upstream in one request of at most 4 MiB, then
 *             filled into the cache (store.c), in the background when
 *             the fill threads have room (fill.c).  A random read
 *             fetches only the pieces it covers of the blocks at its
 *             ends (a 4 KiB read of a 64 KiB block: 4 KiB upstream);
 *             sequential and near reads, and prefetches, whole blocks;
 *   uncached  the object is withdrawn or fills are paused, or the
 *             cache disk is the bottleneck (fill.c: the fill queue
 *             over half full, and fills written at less than a third
 *             of the upstream's rate; or fills slower than the
 *             upstream and past their budget) and this is a client's
 *             read: read upstream, store nothing (the last counted as
 *             a skipped fill).
 *
 * Serving hits (the reads, the checks, a bad block dropped) is hit.c's,
 * fetching a miss run and handing its fill over fetch.c's.
 *
 * A miss on a block somebody else is fetching waits for that fetch
 * instead of repeating it (dedup), on the block's claim queue
 * (internal.h, fsc_claim_wake: invariant C1 in docs/design.md), unless
 * the fetch is done and its fill waits for the disk: the bytes are
 * then copied from the fill job (fill.c); a whole-block prefetch
 * (readahead) skips it.  A miss whose fill the fill queue refuses
 * (full: the disk is behind) is answered all the same; if the disk is
 * the bottleneck its blocks are released unstored, counted as skipped,
 * else it fills inline; a prefetch's (readahead, NBD_CMD_CACHE) always
 * fills inline.  A hit that fails its checksum drops the block and
 * reads it again as a miss; a failed read of a cache file withdraws
 * the object and the request goes upstream.  Only upstream errors
 * reach the caller.
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
#include "hit.h"
#include "fetch.h"
#include "guard.h"
#include "utils.h"

/* What read_pinned does with the run starting at a block, as classify
 * decides under the lock: serve it from the cache, fetch and fill it,
 * or read it upstream uncached; or nothing yet: look again (AGAIN: the
 * groups were read in, or a fetch waited for changed something), or go
 * on to the next block (NEXT: a whole-block prefetch skipping a block
 * somebody fetches, or a read served from a fill still in memory).
 */
enum run_kind { RUN_HIT, RUN_MISS, RUN_UNCACHED, RUN_AGAIN, RUN_NEXT };

/* What a fetch claiming blocks of G must find at publication time: the
 * epoch now, or, if a write is in flight upstream (its data may or may
 * not be what our read sees), a value no epoch ever equals.  Caller
 * holds o->lock.
 */
#define EPOCH_NEVER UINT64_MAX
static uint64_t
claim_epoch (const struct group *g)
{
  return g->writers ? EPOCH_NEVER : g->epoch;
}

/* Can present block B serve its part of [OFFSET, END)?  Yes if it is
 * held whole (a zero block is), or holds the pieces that part needs,
 * unless WHOLE (a prefetch, which wants whole blocks).  Sets *PIECES,
 * *CSUM and *ZERO unless they are NULL.  Caller holds o->lock.
 */
static bool
holds (struct fsc_object *o, uint64_t b, uint64_t offset, uint64_t end,
       bool whole, uint16_t *pieces, uint64_t *csum, bool *zero)
{
  const struct group *g = grp (o, GROUP_OF (b));
  if (g == NULL || !(g->present & BIT_OF (b)))
    return false;
  unsigned p = g->pieces[IDX_OF (b)];
  if (p != 0) {
    unsigned want = whole ? full_pieces (&o->geom, b)
      : pieces_of (&o->geom, b, MAX (offset, block_start (&o->geom, b)),
                   MIN (end, block_end (&o->geom, b)));
    if ((p & want) != want)
      return false;
  }
  if (pieces)
    *pieces = p;
  if (csum)
    *csum = g->csum[IDX_OF (b)];
  if (zero)
    *zero = g->zero & BIT_OF (b);
  return true;
}

/* PIN: the groups G0..G1 the read touches; *PINNED is set once they
 * are pinned (groups.c), in the first critical section when they are
 * resident (a hit costs no lock of its own for it), or else by reading
 * them in without the lock.
 */
struct read_pin {
  uint64_t g0, g1;
  bool pinned, tried;
};

/* One read's constants (read_pinned), for its phases below. */
struct read_ctx {
  void *buf;                    /* NULL: a prefetch */
  uint32_t count;
  uint64_t offset, end;
  uint64_t last;                /* the last block */
  unsigned flags;
  bool whole;                   /* a prefetch that wants whole blocks */
  uint64_t max_run, max_hit;    /* blocks in a fetched run, a hit run */
  uint64_t waited;              /* the block last waited for */
  uint64_t gap_block;           /* a prefetch's block with gaps left */
  unsigned gap_pieces;          /* ... and the pieces it held then */
  bool space_looked;            /* nostore is known (classify_absent) */
  bool nostore;                 /* a client's read while nothing new
                                 * can be stored (fsc_space_low) */
};

/* The bytes [*LO, *HI) of the read's window that N blocks from B hold. */
static void
run_window (const struct fsc_object *o, const struct read_ctx *rc,
            uint64_t b, uint64_t n, uint64_t *lo, uint64_t *hi)
{
  *lo = MAX (block_start (&o->geom, b), rc->offset);
  *hi = MIN (block_end (&o->geom, b + n - 1), rc->end);
}

/* One run, as classify found it, for its serving. */
struct run {
  enum run_kind kind;
  uint64_t n;                   /* blocks */
  bool bypass;                  /* uncached: the disk is behind */
  unsigned held_first, held_last; /* a miss's end blocks' pieces held */
  bool gap;                     /* a prefetch fetching one gap of a
                                 * block holding pieces beyond it */
  struct end_sums es;
  uint64_t csums[FSC_GROUP_BLOCKS];
  uint16_t pieces[FSC_GROUP_BLOCKS];
  bool zeros[FSC_GROUP_BLOCKS];
  uint64_t epochs[MAX_RUN_GROUPS];
};

/* A hit run from B (present, its pieces, hash and zero bit in R[0]):
 * extend it, take the end blocks' hashes, count it in flight.  Caller
 * holds o->lock.
 */
static void
classify_hit (struct fsc_object *o, const struct read_ctx *rc, uint64_t b,
              struct run *r)
{
  r->kind = RUN_HIT;
  while (b + r->n <= rc->last && r->n < rc->max_hit &&
         holds (o, b + r->n, rc->offset, rc->end, rc->whole,
                &r->pieces[r->n], &r->csums[r->n], &r->zeros[r->n]))
    r->n++;
  const uint64_t n = r->n;
  /* The run spans at most two groups (n <= FSC_GROUP_BLOCKS):
   * count the hit in flight in each, so that eviction does not
   * punch what it reads (evict.c), and mark the blocks referenced
   * but the one a sequential stream's last read left off in.
   */
  /* The end blocks read in part: their hashes, if cached. */
  r->es.have[0] = r->es.have[1] = false;
  for (int e = 0; o->verify && rc->buf && e < 2; ++e) {
    uint64_t eb = e == 0 ? b : b + n - 1;
    if ((e == 1 && n == 1) || r->zeros[eb - b] ||
        (block_start (&o->geom, eb) >= rc->offset &&
         block_end (&o->geom, eb) <= rc->end))
      continue;
    unsigned kb = DIV_ROUND_UP (block_end (&o->geom, eb) -
                                block_start (&o->geom, eb), SUB_SIZE);
    r->es.blk[e] = eb;
    r->es.have[e] = fsc_scache_get_locked (o, eb, r->csums[eb - b],
                                           r->pieces[eb - b], r->es.sums[e],
                                           kb);
  }
  for (uint64_t gi = GROUP_OF (b); gi <= GROUP_OF (b + n - 1); ++gi) {
    struct group *hg = grp (o, gi);
    hg->readers++;
    if (rc->buf) {
      const uint64_t run = group_span_bits (gi, b, b + n - 1);
      uint64_t ref = run & ~hg->unread;
      /* A stream's read starts where its last one ended: the block
       * holding that point inside it was the last read's, and hitting
       * it again is no reuse (4 KiB reads of a 64 KiB block hit it 15
       * times in a row).  The blocks it begins afresh were cached
       * before it came: a reuse.  (All of a stream's hits used to set
       * no bit; on the CloudPhysics sample, where three quarters of
       * the bytes read continue a stream and many are read again, the
       * policy then lost to ARC by 4.4 points at a quarter of the
       * footprint: issue 45.)
       */
      const uint32_t bs = o->geom.block_size;
      if ((rc->flags & FSC_READ_SEQUENTIAL) && rc->offset % bs) {
        uint64_t sb = rc->offset / bs;
        if (GROUP_OF (sb) == gi)
          ref &= ~BIT_OF (sb);
      }
      hg->referenced |= ref;
      hg->unread &= ~run;
    }
  }
}

/* Extend an uncached run from B over the blocks not held.  Caller holds
 * o->lock.
 */
static void
extend_uncached (struct fsc_object *o, const struct read_ctx *rc, uint64_t b,
                 struct run *r)
{
  r->kind = RUN_UNCACHED;
  while (b + r->n <= rc->last && r->n < rc->max_run &&
         !holds (o, b + r->n, rc->offset, rc->end, rc->whole, NULL, NULL,
                 NULL))
    r->n++;
}

/* A miss run from B (G its group, free to claim): claim it and the
 * blocks after it, then charge the fill budget, or take the claims
 * back and make the run uncached.  Caller holds o->lock.
 */
static void
classify_miss (struct fsc_object *o, const struct read_ctx *rc, uint64_t b,
               struct group *g, struct run *r)
{
  r->kind = RUN_MISS;
  const uint64_t g0 = GROUP_OF (b);
  r->held_first = present (o, b) ? g->pieces[IDX_OF (b)] : 0;
  g->fetching |= BIT_OF (b);
  r->epochs[0] = claim_epoch (g);
  /* A prefetch never fetches a piece the cache holds (a random read's,
   * in a block a stream's readahead or NBD_CMD_CACHE then completes).
   * A block holding pieces beyond its first gap is a run of its own
   * whose fetch is that gap (fetch.c), and read_pinned comes back
   * for the next (r->gap); a block held in pieces ends a run, to
   * start its own, whose fetch skips the pieces it starts with.
   * Fetched through, they were read upstream twice: 64 KiB more than
   * the image in test-fscache-parallel.sh's readahead part (CI, stop
   * 57), and each time in test-fscache-prefetch-pieces.sh.
   */
  if (!rc->buf && r->held_first) {
    const unsigned want = prefetch_want (&o->geom, b, rc->whole,
                                         rc->offset, rc->end);
    unsigned a, z;
    r->gap = prefetch_gap (want, r->held_first, &a, &z);
  }
  while (!r->gap && b + r->n <= rc->last && r->n < rc->max_run) {
    uint64_t nb = b + r->n;
    struct group *ng = group_of (o, nb, true);
    if (ng == NULL || (ng->fetching & BIT_OF (nb)) ||
        holds (o, nb, rc->offset, rc->end, rc->whole, NULL, NULL, NULL) ||
        (!rc->buf && present (o, nb) && ng->pieces[IDX_OF (nb)] != 0))
      break;
    ng->fetching |= BIT_OF (nb);
    r->epochs[GROUP_OF (nb) - g0] = claim_epoch (ng);
    r->n++;
  }
  const uint64_t bl = b + r->n - 1;
  r->held_last = r->n == 1 ? r->held_first
    : present (o, bl) ? grp (o, GROUP_OF (bl))->pieces[IDX_OF (bl)] : 0;
  /* The budget is charged what this run will fill (a random
   * read's window, else whole blocks), decided before the lock
   * is let go: refused, the claims are taken back, and nobody
   * can have seen them.  Charged the rest of the request per
   * run, a long read over a partly cached export spent 4 MiB per
   * hole and bypassed the rest, fetching blocks held in pieces
   * for nothing.  A prefetch refused fetches nothing: readahead
   * went too far.
   */
  uint64_t rs = block_start (&o->geom, b), re = block_end (&o->geom, bl);
  if (rc->buf && !(rc->flags & (FSC_READ_SEQUENTIAL | FSC_READ_NEAR))) {
    rs = MAX (rs, rc->offset);
    re = MIN (re, rc->end);
  }
  if ((rc->buf || (rc->flags & FSC_PREFETCH_SPECULATIVE)) &&
      !fsc_fill_budget (o->cache, re - rs, rc->buf == NULL)) {
    for (uint64_t i = b; i <= bl; ++i)
      grp (o, GROUP_OF (i))->fetching &= ~BIT_OF (i);
    r->kind = RUN_UNCACHED;
    r->bypass = rc->buf != NULL;
    if (rc->buf)
      FSC_NOTICE (o, FSC_NOTICE_SKIPPED);
  }
}

/* A prefetch back for block B's next gap (read_pinned, G its group):
 * has the last pass stored nothing?  Then (no room, an error; the block
 * evicted) it would fetch the same gap again, and again: it goes on.
 * Caller holds o->lock.
 */
static bool
gap_stalled (struct fsc_object *o, struct read_ctx *rc, uint64_t b,
             const struct group *g)
{
  const unsigned p = g && present (o, b) ? g->pieces[IDX_OF (b)] : 0;
  rc->gap_block = UINT64_MAX;
  return (p & ~rc->gap_pieces) == 0;
}

/* Block B is not held: somebody fetching it, or a miss, or uncached.
 * Called with o->lock held; returns with it held, except for RUN_AGAIN
 * and RUN_NEXT, which return with it released.
 */
static enum run_kind
classify_absent (struct fsc_object *o, struct read_ctx *rc, uint64_t b,
                 struct run *r)
{
  struct fsc_stats *st = &o->cache->stats;
  struct group *g = group_of (o, b, true);
  if (g && (g->fetching & BIT_OF (b)) && rc->whole && rc->gap_block != b) {
    /* A whole-block prefetch: somebody is already fetching it.  An
     * exact one waits below like a read: the fetch in flight (or
     * its background fill, which keeps the claim) may be of other
     * pieces of the block, and skipping would leave the pieces this
     * one covers unfetched (nbd-fscache warm --trace replaying two
     * entries of one block, one after the other).
     */
    pthread_mutex_unlock (&o->lock);
    return RUN_NEXT;
  }
  if (g && (g->fetching & BIT_OF (b)) && rc->buf && !g->writers &&
      !o->test_no_claim) {
    /* Claimed: if by a fill waiting for the disk (fill.c), its
     * bytes are in memory and served from there, unless a write
     * changed the block since (the epoch) or is in flight.
     */
    const uint64_t epoch = g->epoch;
    pthread_mutex_unlock (&o->lock);
    uint64_t lo, hi;
    run_window (o, rc, b, 1, &lo, &hi);
    if (fsc_fill_copy (o->cache, o, b, epoch, lo, hi,
                       (unsigned char *) rc->buf + (lo - rc->offset))) {
      FSC_STAT_ADD (st, hit_bytes, hi - lo);
      FSC_STAT_ADD (st, pending_hit_bytes, hi - lo);
      FSC_OSTAT_ADD (o, hit_bytes, hi - lo);
      return RUN_NEXT;
    }
    /* Not in the fill queue: a fetch in flight, or done meanwhile.
     * Look again from the start (the block may be present now).
     */
    pthread_mutex_lock (&o->lock);
    g = grp (o, GROUP_OF (b));
    if (g == NULL || !(g->fetching & BIT_OF (b))) {
      pthread_mutex_unlock (&o->lock);
      return RUN_AGAIN;
    }
  }
  if (g && (g->fetching & BIT_OF (b)) && !o->test_no_claim) {
    /* Somebody is fetching it: wait for a change, then look again.
     * Not for the claim to end: its fetch may hand its bytes to the
     * fill queue (fsc_fill_submit wakes us), from where they are
     * served above, rather than wait for the disk to write them.
     */
    if (fsc_fill_held (o->cache)) {
      /* Maybe by a fill a probe holds (fill.c): not for the probe's
       * length.  End the hold, and look again.
       */
      pthread_mutex_unlock (&o->lock);
      fsc_fill_unhold (o->cache);
      return RUN_AGAIN;
    }
    if (rc->waited != b)
      FSC_STAT_ADD (st, dedup_waits, 1);
    rc->waited = b;
    if (o->state == FSC_OBJ_AVAILABLE) {
      const unsigned q = fsc_claim_queue (b);
      o->claim_waiting[q]++;
      pthread_cond_wait (&o->claim_cond[q], &o->lock);
      o->claim_waiting[q]--;
      FSC_STAT_ADD (st, dedup_wakeups, 1);
    }
    pthread_mutex_unlock (&o->lock);
    return RUN_AGAIN;
  }
  if (rc->gap_block == b && gap_stalled (o, rc, b, g)) {
    pthread_mutex_unlock (&o->lock);
    return RUN_NEXT;
  }
  /* Uncached: the object cannot fill now (no memory for a group,
   * a full disk), or a client's read while the cache disk is
   * behind and the bottleneck (fill.c: congested, and slower than
   * the upstream), or the upstream faster than the disk and the
   * fills past their budget (fsc_fill_budget, asked in
   * classify_miss once the run is claimed, so that it is charged the
   * run), congested or not: a full queue must not open the way around
   * the budget (a fast NBD server then had everything filled inline,
   * at 0.2 of no cache).  That read bypasses the cache: it claims
   * nothing (nobody waits for it), fetches just its bytes and stores
   * nothing, counted as skipped, at the upstream's speed.  So does a
   * client's read while nothing new can be stored (the free space
   * floor, DIR/fscache.stop; counted in lowspace_skips): claimed as a
   * miss, a stream of 4 KiB reads fetched every 64 KiB block again
   * for each of its reads, only for the fill to drop them (277
   * upstream reads of 64 KiB for 2 MiB read, stop 57).  (So does a
   * block being fetched here, one the test knob does not wait for.)
   */
  if (g == NULL || time (NULL) < o->nofill_until ||
      (g->fetching & BIT_OF (b)))
    extend_uncached (o, rc, b, r);
  else if (rc->buf && !rc->space_looked) {
    /* Can anything new be stored?  Asked once per client read, and
     * only by one that misses (a hit never asks), outside the lock: it
     * may look at the file system (every SPACE_CHECK_MS).  Then look
     * again.
     */
    pthread_mutex_unlock (&o->lock);
    rc->nostore = fsc_space_low (o->cache);
    rc->space_looked = true;
    return RUN_AGAIN;
  }
  else if (rc->nostore) {
    FSC_STAT_ADD (st, lowspace_skips, 1);
    extend_uncached (o, rc, b, r);
  }
  else if (rc->buf && fsc_fill_congested (o->cache) &&
           fsc_fill_slower (o->cache)) {
    r->bypass = true;
    FSC_NOTICE (o, FSC_NOTICE_SKIPPED);
    extend_uncached (o, rc, b, r);
  }
  else
    classify_miss (o, rc, b, g, r);
  return r->kind;
}

/* The first phase of each run: under o->lock, what to do with the
 * blocks from B (struct run), the claims and hit counts taken.  The
 * lock is released on return.
 */
static enum run_kind
classify (struct fsc_object *o, struct read_ctx *rc, uint64_t b,
          struct read_pin *pin, struct run *r)
{
  r->n = 1;
  r->bypass = false;
  r->gap = false;
  r->held_first = r->held_last = 0;
  pthread_mutex_lock (&o->lock);
  if (!pin->pinned && !pin->tried) {
    pin->tried = true;
    if (fsc_groups_pin_resident (o, pin->g0, pin->g1))
      pin->pinned = true;
    else {
      pthread_mutex_unlock (&o->lock);
      pin->pinned = fsc_groups_pin (o, pin->g0, pin->g1) == 0;
      return RUN_AGAIN;         /* look again, with the lock */
    }
  }
  if (o->state != FSC_OBJ_AVAILABLE) {
    r->kind = RUN_UNCACHED;
    r->n = rc->last - b + 1;
  }
  else if (holds (o, b, rc->offset, rc->end, rc->whole, &r->pieces[0],
                  &r->csums[0], &r->zeros[0]))
    classify_hit (o, rc, b, r);
  else {
    enum run_kind k = classify_absent (o, rc, b, r);
    if (k == RUN_AGAIN || k == RUN_NEXT)
      return k;                 /* released already */
  }
  pthread_mutex_unlock (&o->lock);
  return r->kind;
}

/* The N blocks of a hit run from B are no longer in flight (the
 * readers classify_hit counted in their groups).
 */
static void
hits_done (struct fsc_object *o, uint64_t b, uint64_t n)
{
  for (uint64_t gi = GROUP_OF (b); gi <= GROUP_OF (b + n - 1); ++gi)
    __atomic_sub_fetch (&grp (o, gi)->readers, 1, __ATOMIC_RELEASE);
}

/* Serve hit run R from B: in sub-runs of zero blocks and of blocks with
 * data; the first block that fails ends the run (it is no longer
 * present).  Returns the blocks served; they are no longer in flight.
 */
static uint64_t
serve_hit (struct fsc_object *o, const struct read_ctx *rc, uint64_t b,
           struct run *r)
{
  const uint64_t n = r->n;
  uint64_t done = rc->buf ? 0 : n;
  while (done < n) {
    uint64_t k = done + 1;
    while (k < n && r->zeros[k] == r->zeros[done])
      k++;
    uint64_t got = r->zeros[done]
      ? fsc_hit_zero (o, b + done, k - done, rc->buf, rc->offset, rc->count,
                  &r->csums[done])
      : fsc_hit_run (o, b + done, k - done, rc->buf, rc->offset, rc->count,
                 &r->csums[done], &r->pieces[done], &r->es);
    done += got;
    if (done < k)
      break;
  }
  hits_done (o, b, n);
  return done;
}

/* Hit run R from B, or its bytes of the read from upstream if the
 * latency guard says the cache disk is slower now (guard.c; a prefetch
 * has nothing to serve); if that upstream read fails, from the disk
 * after all.  Times the hits it serves for the guard.  Returns the
 * blocks served.
 */
static uint64_t
serve_hit_guarded (struct fsc_object *o, const struct read_ctx *rc,
                   uint64_t b, struct run *r, const struct fsc_upstream *up)
{
  if (rc->buf == NULL || !fsc_guard_enabled (o))
    return serve_hit (o, rc, b, r);
  uint64_t lo, hi;
  run_window (o, rc, b, r->n, &lo, &hi);
  if (fsc_guard_reroute (o, hi - lo) &&
      fsc_up_pread (o, up, (unsigned char *) rc->buf + (lo - rc->offset),
                    hi - lo, lo) == 0) {
    hits_done (o, b, r->n);
    return r->n;
  }
  fsc_io_disk_mark ();
  uint64_t done = serve_hit (o, rc, b, r);
  /* A hit served from the page cache is the disk's fastest: however
   * long it took, it waited for a CPU (base/io.h), which no reroute
   * cures.  A hit that read the disk is timed by its reads of the
   * disk (io.c): the clock is read only for them.
   */
  if (done == r->n)
    fsc_guard_hit_time (o, hi - lo,
                        fsc_io_disk_touched () ? fsc_io_disk_ns () : 0);
  return done;
}

/* Serve uncached run R from B: its bytes of the read from upstream,
 * stored nowhere (a prefetch reads nothing).  0 or -1.
 */
static int
serve_uncached (struct fsc_object *o, const struct read_ctx *rc, uint64_t b,
                const struct run *r, const struct fsc_upstream *up,
                uint64_t *missed)
{
  struct fsc_stats *st = &o->cache->stats;
  if (rc->buf == NULL)
    return 0;
  uint64_t lo, hi;
  run_window (o, rc, b, r->n, &lo, &hi);
  int ret = fsc_up_pread (o, up, (unsigned char *) rc->buf + (lo - rc->offset),
                      hi - lo, lo);
  FSC_STAT_ADD (st, upstream_reads, 1);
  FSC_OSTAT_ADD (o, upstream_reads, 1);
  if (ret == -1)
    return -1;
  FSC_STAT_ADD (st, upstream_read_bytes, hi - lo);
  FSC_STAT_ADD (st, miss_bytes, hi - lo);
  FSC_OSTAT_ADD (o, upstream_bytes, hi - lo);
  FSC_OSTAT_ADD (o, miss_bytes, hi - lo);
  *missed += hi - lo;
  if (r->bypass)
    fsc_fill_skipped (o, lo, hi - lo);
  return 0;
}

/* The read path shared by reads (BUF != NULL) and prefetch, in two
 * phases per run of blocks: classify it under the lock (claims and hit
 * counts taken), then serve it without the lock.  Adds the bytes of
 * BUF served from upstream to *MISSED.
 */
static int
read_pinned (struct fsc_object *o, void *buf, uint32_t count,
             uint64_t offset, const struct fsc_upstream *up, unsigned flags,
             uint64_t *missed, struct read_pin *pin)
{
  struct read_ctx rc = {
    .buf = buf, .count = count, .offset = offset, .flags = flags,
    /* A prefetch wants whole blocks, unless exact. */
    .whole = !buf && !(flags & FSC_PREFETCH_EXACT),
    .waited = UINT64_MAX,
    .gap_block = UINT64_MAX,
  };
  if (count == 0)
    return 0;
  if (ADD_OVERFLOW (offset, (uint64_t) count, &rc.end)
      || rc.end > o->geom.size) {
    errno = EINVAL;
    return -1;
  }
  rc.last = (rc.end - 1) >> o->geom.bshift;
  rc.max_run =
    MAX (1, MIN ((uint64_t) MAX_RUN_BLOCKS, MAX_FETCH_BYTES >> o->geom.bshift));
  rc.max_hit = MIN (rc.max_run, (uint64_t) FSC_GROUP_BLOCKS);

  uint64_t b = offset >> o->geom.bshift;
  while (b <= rc.last) {
    struct run r;
    switch (classify (o, &rc, b, pin, &r)) {
    case RUN_AGAIN:
      break;
    case RUN_NEXT:
      b++;
      break;
    case RUN_HIT:
      b += serve_hit_guarded (o, &rc, b, &r, up);
      break;
    case RUN_MISS:
      if (fsc_fetch_run (o, b, r.n, buf, offset, count, up, r.epochs, flags,
                     r.held_first, r.held_last, missed) == -1)
        return -1;
      if (r.gap) {              /* its next gap, once this one is in */
        rc.gap_block = b;
        rc.gap_pieces = r.held_first;
      }
      else
        b += r.n;
      break;
    case RUN_UNCACHED:
      if (serve_uncached (o, &rc, b, &r, up, missed) == -1)
        return -1;
      b += r.n;
      break;
    }
  }
  return 0;
}

/* The groups [OFFSET, OFFSET+COUNT) touches are pinned (groups.c)
 * for the read (read_pinned).  If one cannot be read in, the object is
 * withdrawn and the read goes upstream.
 */
static int
do_read (struct fsc_object *o, void *buf, uint32_t count, uint64_t offset,
         const struct fsc_upstream *up, unsigned flags, uint64_t *missed)
{
  uint64_t end;
  if (count == 0 || ADD_OVERFLOW (offset, (uint64_t) count, &end) ||
      end > o->geom.size) {
    struct read_pin none = { .tried = true };
    return read_pinned (o, buf, count, offset, up, flags, missed, &none);
  }
  struct read_pin pin = {
    .g0 = GROUP_OF (offset >> o->geom.bshift),
    .g1 = GROUP_OF ((end - 1) >> o->geom.bshift),
  };
  int r = read_pinned (o, buf, count, offset, up, flags, missed, &pin);
  int e = errno;
  if (pin.pinned)
    fsc_groups_unpin (o, pin.g0, pin.g1);
  errno = e;
  return r;
}

int
fsc_local_read (struct fsc_object *o, void *buf, uint32_t count,
                uint64_t offset, const struct fsc_upstream *up,
                unsigned flags)
{
  uint64_t missed;
  return fsc_read_counted (o, buf, count, offset, up, flags, &missed);
}

int
fsc_read_counted (struct fsc_object *o, void *buf, uint32_t count,
                  uint64_t offset, const struct fsc_upstream *up,
                  unsigned flags, uint64_t *missedp)
{
  uint64_t missed = 0;
  if (o->verify && count > 0)
    fsc_scache_prefetch (o, offset >> o->geom.bshift);
  FSC_STAT_ADD (&o->cache->stats, read_requests, 1);
  /* The miss-ratio curve counts what clients ask for, hit or not. */
  if (o->mrc && count > 0 && offset < o->geom.size) {
    uint64_t e = MIN (offset + count, o->geom.size);
    for (uint64_t b = offset >> o->geom.bshift;
         b <= (e - 1) >> o->geom.bshift; ++b)
      fsc_mrc_access (o->mrc, b);
  }
  int r = do_read (o, buf, count, offset, up, flags, &missed);
  *missedp = missed;
  /* A request is a hit if nothing of it came from upstream (a failed
   * one counts as a miss).
   */
  if (missed || r == -1)
    FSC_OSTAT_ADD (o, miss_requests, 1);
  else
    FSC_OSTAT_ADD (o, hit_requests, 1);
  fsc_note_use (o);
  return r;
}

int
fsc_local_prefetch (struct fsc_object *o, uint64_t offset, uint64_t count,
                    const struct fsc_upstream *up, unsigned flags)
{
  if (offset > o->geom.size) {
    errno = EINVAL;
    return -1;
  }
  count = MIN (count, o->geom.size - offset);
  /* Nothing new can be stored (fscache-min-free, DIR/fscache.stop): a
   * prefetch would read the upstream only to drop the bytes, and the
   * client then reads them again.  A stream from a fast NBD server read
   * half as much again as it asked for so (readahead's 1.6 GB on top of
   * its 2 GiB), and ran at 0.63 of the bare proxy (docs/benchmarks.md,
   * stop 50).  Readahead, NBD_CMD_CACHE and the catch-up all come here.
   */
  if (fsc_space_low (o->cache))
    return 0;
  while (count > 0) {
    /* A prefetch's fetch holds its bytes until they are queued or
     * written: 4 MiB per request thread added up (16 threads, 64 MiB,
     * for a client's 4 MiB NBD_CMD_CACHE requests).  So at most
     * BIG_FETCH_MAX bytes of such big fetches are in flight, and only
     * while the fill queue has room for them; the others go in 1 MiB
     * pieces (docs/design.md, "Memory and start-up that do not
     * grow"): more upstream reads, the same bytes.
     */
    struct fsc_cache *c = o->cache;
    bool big = false;
    if (count > INLINE_FETCH_BYTES &&
        fsc_fill_room (c) >= MAX_FETCH_BYTES) {
      uint64_t cur = __atomic_load_n (&c->big_fetch_bytes, __ATOMIC_RELAXED);
      while (cur + MAX_FETCH_BYTES <= BIG_FETCH_MAX &&
             !(big = __atomic_compare_exchange_n (&c->big_fetch_bytes, &cur,
                                                  cur + MAX_FETCH_BYTES,
                                                  false, __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED)))
        ;
    }
    uint32_t n = MIN (count, (uint64_t) (big ? MAX_FETCH_BYTES
                                         : INLINE_FETCH_BYTES));
    uint64_t missed = 0;
    int r = do_read (o, NULL, n, offset, up, flags & FSC_PREFETCH_EXACT,
                     &missed);
    if (big)
      __atomic_sub_fetch (&c->big_fetch_bytes, MAX_FETCH_BYTES,
                          __ATOMIC_RELAXED);
    if (r == -1)
      return -1;
    offset += n;
    count -= n;
  }
  return 0;
}
