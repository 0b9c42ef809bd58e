/* libfscache: storage and invalidation.
 *
 * Storage writes blocks into the data and sums files and publishes them
 * in the bitmaps: fills of what misses fetched (fsc_fill_blocks, from
 * retrieve.c or a fill thread) and writethrough stores of what
 * clients write (fsc_object_write_end).  Invalidation drops the blocks
 * a write, trim or zero touches before it goes upstream
 * (fsc_object_write_begin).
 *
 * A writethrough zero request stores the whole blocks it covers as
 * zero blocks (docs/format.md, "Zero blocks"): present, with the
 * checksum of zeroes and the zero bit, their data file space punched
 * instead of written.  A hit serves them without reading anything.
 * The punch needs no ordering against the record: a zero block's data
 * is never read, and space a crash leaves under one is reclaimed at
 * the next unclean open (evict.c).  Partially covered end blocks are
 * merged like a write's; trims only invalidate.
 *
 * Rules 2 and 3 of crash safety and coherency (rule 1 is in commit.c):
 *  2. A block is dropped on disk before its upstream content changes:
 *     fsc_object_write_begin clears the bits, and when disk_max says a
 *     record on disk may still name the block it waits for a commit
 *     that started after the change (group commit: concurrent writers
 *     share one).
 *  3. Each group has an epoch, bumped by every invalidation, and a count
 *     of writes in flight upstream.  A fetch captures the epoch when it
 *     claims blocks and only marks them present if it is unchanged and
 *     no write was in flight when it claimed: its upstream read might
 *     have seen the data before that write.  A writethrough store is
 *     made only by a write that overlapped no other write, and only if
 *     the epoch did not move, since the order in which overlapping
 *     writes land upstream is unknown.
 *
 * A failed write of a cache file withdraws the object, except ENOSPC
 * and EDQUOT, which only pause fills for NOFILL_SECONDS.
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
#include "share-hooks.h"
#include "utils.h"

/* Handle a failed write to the data file.  EAGAIN is no failure:
 * fsc_make_room said not to store (over budget with nothing to evict,
 * or space low), so the blocks are simply not cached.
 */
static void
fill_failed (struct fsc_object *o, int err)
{
  if (err == EAGAIN)
    return;
  FSC_STAT_ADD (&o->cache->stats, fill_errors, 1);
  FSC_OSTAT_ADD (o, io_errors, 1);
  if (err == ENOSPC || err == EDQUOT) {
    FSC_STAT_ADD (&o->cache->stats, nofill_events, 1);
    pthread_mutex_lock (&o->lock);
    if (time (NULL) >= o->nofill_until)
      FSC_NOTICE (o, FSC_NOTICE_NOFILL);
    o->nofill_until = time (NULL) + NOFILL_SECONDS;
    pthread_mutex_unlock (&o->lock);
  }
  else
    fsc_withdraw (o, err);
}

/* Block BLK's K sub-block hashes into VEC: those the range [START,
 * START+LEN) covers from SUMS (one per 4 KiB from START), 0 for the
 * others.  Returns the pieces of the block the range covers, 0 for all
 * of them.
 */
static unsigned
block_sums (const struct fsc_object *o, uint64_t blk, uint64_t start,
            uint64_t len, const uint64_t *sums, uint64_t *vec, unsigned *k)
{
  const uint64_t bs = block_start (&o->geom, blk),
    be = block_end (&o->geom, blk);
  const uint64_t lo = MAX (bs, start), hi = MIN (be, start + len);
  *k = DIV_ROUND_UP (be - bs, SUB_SIZE);
  memset (vec, 0, *k * sizeof *vec);
  const uint64_t j0 = (lo - bs) >> SUB_SHIFT;
  const uint64_t j1 = DIV_ROUND_UP (hi - bs, SUB_SIZE);
  const uint64_t first = (lo - start) >> SUB_SHIFT;
  for (uint64_t j = j0; j < j1; ++j)
    vec[j] = sums[first + (j - j0)];
  unsigned p = pieces_of (&o->geom, blk, lo, hi);
  return p == full_pieces (&o->geom, blk) ? 0 : p;
}

/* Write the export's bytes [START, START+LEN) of the NB blocks from
 * BLK (at SRC: whole blocks, or only some pieces of the end blocks)
 * and their sub-block hashes into the cache files, and compute each
 * block's index checksum into CSUMS and the pieces written into PCS
 * (0: the whole block; PCS may be NULL when only whole blocks are
 * written).  SCAN: see fsc_make_room.  Returns 0 or -1
 * with errno.
 */
static int
store_blocks (struct fsc_object *o, uint64_t blk, uint64_t nb,
              uint64_t start, uint64_t len, const unsigned char *src,
              uint64_t *csums, uint16_t *pcs, bool scan)
{
  const uint64_t k = DIV_ROUND_UP (len, SUB_SIZE);
  CLEANUP_FREE uint64_t *sums = malloc (k * sizeof *sums);
  CLEANUP_FREE unsigned char *le = malloc (k * 8);

  if (sums == NULL || le == NULL)
    return -1;
  /* Room within the object's budget and above the free space floor:
   * the data, and the sums' pages at worst.
   */
  const uint64_t room = len + ROUND_UP (k * 8, 4096) + 4096;
  if (fsc_make_room (o, room, scan) == -1)
    return -1;
  fsc_sub_hashes (src, len, sums);
  for (uint64_t j = 0; j < k; ++j)
    put_le64 (le + 8 * j, sums[j]);
  /* START is a multiple of 4 KiB: its hashes go where its block's do. */
  int r = 0;
  if (fsc_data_pwrite (o, src, len, start) == -1 ||
      fsc_io_pwrite (&o->cache->io, FSC_FILE_SUMS, o->files.sfd, le, k * 8,
                     (start >> SUB_SHIFT) * 8) == -1)
    r = -1;
  int err = errno;
  fsc_room_done (o, room);
  if (r == -1) {
    errno = err;
    return -1;
  }
  for (uint64_t i = 0; i < nb; ++i) {
    uint64_t vec[MAX_SUBS];
    unsigned kb;
    unsigned p = block_sums (o, blk + i, start, len, sums, vec, &kb);
    if (pcs)
      pcs[i] = p;
    csums[i] = fsc_sums_csum (vec, kb);
  }
  FSC_STAT_ADD (&o->cache->stats, fill_bytes, len);
  FSC_OSTAT_ADD (o, stored_bytes, len);
  return 0;
}

/* What an end block filled in pieces held before: its pieces P and
 * checksum CSUM when the fill began, and what it holds with the new
 * pieces added (MP, MCSUM), if HAVE.
 */
struct merge {
  bool have;
  unsigned p, mp;
  uint64_t csum, mcsum;
};

/* Block BLK was just written in pieces NP (a claimed block, so nobody
 * else fills it meanwhile): if it held other pieces, work out the
 * union, trusting the old pieces' hashes in the sums file only if they
 * still match its checksum.
 */
static void
merge_pieces (struct fsc_object *o, uint64_t blk, unsigned np,
              struct merge *m)
{
  m->have = false;
  pthread_mutex_lock (&o->lock);
  struct group *g = grp (o, GROUP_OF (blk));
  bool was = g && (g->present & BIT_OF (blk)) && g->pieces[IDX_OF (blk)];
  if (was) {
    m->p = g->pieces[IDX_OF (blk)];
    m->csum = g->csum[IDX_OF (blk)];
  }
  pthread_mutex_unlock (&o->lock);
  if (!was)
    return;

  const uint64_t bs = block_start (&o->geom, blk),
    be = block_end (&o->geom, blk);
  const unsigned k = DIV_ROUND_UP (be - bs, SUB_SIZE);
  uint64_t old[MAX_SUBS], cur[MAX_SUBS];
  if (fsc_sums_read (&o->cache->io, &o->files, &o->geom, blk, k, old) !=
      (ssize_t) (8 * k))
    return;                     /* keep only the new pieces */
  memcpy (cur, old, k * sizeof *cur);
  /* The new pieces' hashes are in the file already: the old pieces
   * that were fetched again hash the same unless the upstream changed
   * under us, and then the old checksum fails and only the new
   * pieces are kept.
   */
  fsc_sums_mask (&o->geom, old, k, m->p);
  if (fsc_sums_csum (old, k) != m->csum)
    return;
  unsigned mp = m->p | np;
  fsc_sums_mask (&o->geom, cur, k, mp);
  m->mp = mp == full_pieces (&o->geom, blk) ? 0 : mp;
  m->mcsum = fsc_sums_csum (cur, k);
  m->have = true;
}

/* An evicted block keeps its bytes until the punch (evict.c) gets to
 * it, and a fetch may claim it first.  Filled whole, its old bytes are
 * overwritten; filled in pieces, those the pieces leave out would stay
 * allocated under a present block, counted by du against the cap but
 * freed by no eviction.  So the claimant punches an end block of the
 * run [B, B+N) that it fills in part before writing it (blocks within
 * the run are filled whole).  Returns 0, or -1 with errno.
 */
static int
punch_stale_ends (struct fsc_object *o, uint64_t b, uint64_t n,
                  uint64_t start, uint64_t len)
{
  const uint64_t ends[2] = { b, b + n - 1 };
  for (unsigned i = 0; i < (n > 1 ? 2u : 1u); ++i) {
    const uint64_t blk = ends[i];
    const uint64_t bs = block_start (&o->geom, blk),
      be = block_end (&o->geom, blk);
    if (start <= bs && start + len >= be)
      continue;                         /* whole: overwritten */
    pthread_mutex_lock (&o->lock);
    struct group *g = grp (o, GROUP_OF (blk));
    bool stale = g && (g->evicted & ~g->present & BIT_OF (blk));
    pthread_mutex_unlock (&o->lock);
    if (!stale)
      continue;
    if (fsc_data_punch (o, bs, be - bs) == -1)
      return -1;
    pthread_mutex_lock (&o->lock);
    g->evicted &= ~BIT_OF (blk);        /* ours, claimed: nobody refilled */
    pthread_mutex_unlock (&o->lock);
  }
  return 0;
}

void
fsc_fill_blocks (struct fsc_object *o, uint64_t b, uint64_t n,
                 const unsigned char *data, uint64_t start, uint64_t len,
                 const uint64_t *epochs, unsigned flags)
{
  const uint64_t g0 = GROUP_OF (b), g1 = GROUP_OF (b + n - 1);
  uint64_t csums[MAX_RUN_BLOCKS];
  uint16_t pcs[MAX_RUN_BLOCKS];
  struct merge m[2] = { { .have = false }, { .have = false } };
  bool fill_ok = false;

  if (data != NULL) {
    if (fsc_reserve_groups (o, g0, g1) == -1 ||
        punch_stale_ends (o, b, n, start, len) == -1 ||
        store_blocks (o, b, n, start, len, data, csums, pcs,
                      flags & FSC_FILL_SCAN) == -1)
      fill_failed (o, errno);
    else {
      fill_ok = true;
      if (pcs[0])
        merge_pieces (o, b, pcs[0], &m[0]);
      if (n > 1 && pcs[n - 1])
        merge_pieces (o, b + n - 1, pcs[n - 1], &m[1]);
    }
  }

  bool kick = false;
  pthread_mutex_lock (&o->lock);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t blk = b + i;
    struct group *g = group_of (o, blk, false);
    g->fetching &= ~BIT_OF (blk);
    if (!fill_ok || o->state != FSC_OBJ_AVAILABLE ||
        g->epoch != epochs[GROUP_OF (blk) - g0])
      continue;
    const unsigned x = IDX_OF (blk);
    const bool was = g->present & BIT_OF (blk);
    const struct merge *mm = i == 0 ? &m[0] : i == n - 1 ? &m[1] : NULL;
    unsigned np = pcs[i];
    uint64_t nc = csums[i];
    if (was && g->pieces[x] == 0)
      continue;                 /* whole already: nothing to add */
    if (was && mm && mm->have && g->pieces[x] == mm->p &&
        g->csum[x] == mm->csum) {
      np = mm->mp;              /* the old pieces and the new */
      nc = mm->mcsum;
    }
    g->present |= BIT_OF (blk);
    g->zero &= ~BIT_OF (blk);
    g->pieces[x] = np;
    g->csum[x] = nc;
    if (!was)
      fsc_note_filled (o, blk, flags & FSC_FILL_PREFETCHED);
    else if (!(flags & FSC_FILL_SCAN))
      g->referenced |= BIT_OF (blk);    /* read again: a reuse */
    if (np)
      FSC_STAT_ADD (&o->cache->stats, piece_fills, 1);
    FSC_OSTAT_ADD (o, stored_blocks, 1);
    o->data_dirty = true;
    if (fsc_mark_dirty (o, GROUP_OF (blk), g) == -1)
      fill_ok = false;
  }
  kick = o->ndirty >= DIRTY_KICK;
  /* Dirty groups stay in memory until committed (groups.c): past
   * DIRTY_MAX of them, a filler faster than the committer commits
   * itself, so that memory stays bounded whatever the fill rate.
   */
  bool commit = o->ndirty >= DIRTY_MAX;
  uint64_t target = o->change_seq;
  pthread_cond_broadcast (&o->cond);
  if (n)
    fsc_claim_wake (o, b, b + n - 1);
  pthread_mutex_unlock (&o->lock);
  if (commit)
    (void) fsc_commit_upto (o, target);     /* failing: withdrawn */
  else if (kick)
    fsc_cache_kick (o->cache);
}

/* Read present block BLK into DST and verify it (a zero block, ZERO,
 * is zeroes without reading); false if unusable.
 */
static bool
read_block (struct fsc_object *o, uint64_t blk, unsigned char *dst,
            uint64_t csum, bool zero)
{
  uint64_t s = block_start (&o->geom, blk), len = block_end (&o->geom, blk) - s;
  if (zero) {
    memset (dst, 0, len);
    return csum == zero_csum (&o->geom, blk);
  }
  ssize_t r = fsc_data_pread (o, dst, len, s);
  if (r != (ssize_t) len)
    return false;
  return fsc_block_csum (dst, len) == csum;
}

int
fsc_object_write_begin (struct fsc_object *o, uint64_t offset,
                        uint64_t count, bool keep, struct fsc_write *w)
{
  return fsc_object_write_begin_flags (o, offset, count,
                                       keep ? FSC_WRITE_KEEP : 0, w);
}

static int write_begin_pinned (struct fsc_object *o, uint64_t offset,
                               uint64_t count, unsigned flags,
                               struct fsc_write *w);

/* The groups the write touches are pinned (groups.c) while it drops
 * their blocks; from then on its count in their writers keeps them in
 * memory until fsc_object_write_end.
 */
int
fsc_local_write_begin (struct fsc_object *o, uint64_t offset,
                       uint64_t count, unsigned flags,
                       struct fsc_write *w)
{
  memset (w, 0, sizeof *w);
  w->offset = offset;
  w->count = count;
  FSC_OSTAT_ADD (o, write_requests, 1);
  FSC_OSTAT_ADD (o, write_bytes, count);
  if (count == 0 || offset >= o->geom.size)
    return 0;
  count = MIN (count, o->geom.size - offset);
  const uint64_t g0 = GROUP_OF (offset >> o->geom.bshift);
  const uint64_t g1 = GROUP_OF ((offset + count - 1) >> o->geom.bshift);
  /* Failing, the object is withdrawn: write_begin_pinned sees it. */
  bool pinned = fsc_groups_pin (o, g0, g1) == 0;
  int r = write_begin_pinned (o, offset, count, flags, w);
  int e = errno;
  /* The blocks are dropped: joiners' maps of them are stale from now
   * on, before the write goes upstream (share-epochs.c).
   */
  fsc_hook_share_bump (o, g0, g1);
  if (pinned)
    fsc_groups_unpin (o, g0, g1);
  errno = e;
  return r;
}

/* write_begin's invalidation of blocks B0..B1 for W, their groups
 * allocated: count the write in flight, bump the epochs, drop the
 * blocks.  Clears *KEEP if another write overlaps.  Returns whether a
 * record on disk may still name one of them (a commit must follow).
 * Caller holds o->lock.
 */
static bool
drop_locked (struct fsc_object *o, struct fsc_write *w, uint64_t b0,
             uint64_t b1, bool *keep)
{
  struct fsc_stats *st = &o->cache->stats;
  const uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  bool need_sync = false;
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    uint64_t mask = group_span_bits (gi, b0, b1);
    struct group *g = grp (o, gi);
    if (g->writers > 0)
      *keep = false;            /* overlapping writes: order unknown */
    g->writers++;
    g->epoch++;
    if (w->epochs)
      w->epochs[gi - g0] = g->epoch;
    uint64_t dropped = g->present & mask;
    if (dropped) {
      g->present &= ~mask;
      g->zero &= ~mask;
      fsc_note_gone (o, g, dropped);
      FSC_STAT_ADD (st, invalidated_blocks, __builtin_popcountll (dropped));
      FSC_OSTAT_ADD (o, invalidated_blocks, __builtin_popcountll (dropped));
      fsc_note_dropped (o, gi, dropped);      /* punch later, if capped */
    }
    if (g->disk_max & mask) {
      need_sync = true;
      if (fsc_mark_dirty (o, gi, g) == -1) {
        pthread_mutex_unlock (&o->lock);
        fsc_withdraw (o, ENOMEM);
        pthread_mutex_lock (&o->lock);
      }
    }
  }
  return need_sync;
}

/* Under O's lock, at a write: the superblock flags its first write
 * must set before it reaches the upstream, or 0.  FP_STALE (the
 * sample's fingerprint is no longer known); WRITTEN (issue 43): the
 * fleet's peers may hold the ranges as they were, and a process that
 * opens the object later (a restart, another proxy of the host) must
 * not ask them; kept in memory only, it was lost at a restart.
 */
static uint32_t
first_write_locked (struct fsc_object *o)
{
  if (o->written)
    return 0;
  o->written = true;
  uint32_t f = 0;
  if (o->sb.validate == FSC_VALIDATE_SAMPLE &&
      !(o->sb.flags & FSC_SB_FP_STALE))
    f |= FSC_SB_FP_STALE;
  if (!(o->sb.flags & FSC_SB_WRITTEN))
    f |= FSC_SB_WRITTEN;
  return f;
}

static int
write_begin_pinned (struct fsc_object *o, uint64_t offset, uint64_t count,
                    unsigned flags, struct fsc_write *w)
{
  bool keep = flags & FSC_WRITE_KEEP;

  const uint64_t b0 = offset >> o->geom.bshift;
  const uint64_t b1 = (offset + count - 1) >> o->geom.bshift;
  const uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  const bool head_partial = block_start (&o->geom, b0) < offset ||
    (b0 == b1 && block_end (&o->geom, b1) > offset + count);
  const bool tail_partial = b1 != b0 &&
    block_end (&o->geom, b1) > offset + count;

  pthread_mutex_lock (&o->lock);
  if (o->state != FSC_OBJ_AVAILABLE) {
    bool mark = o->busy && !o->marked;
    o->marked = true;
    pthread_mutex_unlock (&o->lock);
    if (mark)
      fsc_mark_stale (&o->files);
    return 0;
  }
  uint32_t mark = first_write_locked (o);

  /* Partial end blocks that are present: keep their old bytes so the
   * new block can be stored whole afterwards (read-modify-write).
   */
  uint64_t hcsum = 0, tcsum = 0;
  uint32_t hepoch = 0, tepoch = 0;
  bool want_head = false, want_tail = false, hzero = false, tzero = false;
  /* Only whole blocks: one held in pieces is simply dropped. */
  if (keep && head_partial && present (o, b0) &&
      grp (o, GROUP_OF (b0))->pieces[IDX_OF (b0)] == 0) {
    want_head = true;
    hcsum = grp (o, GROUP_OF (b0))->csum[IDX_OF (b0)];
    hepoch = grp (o, GROUP_OF (b0))->epoch;
    hzero = grp (o, GROUP_OF (b0))->zero & BIT_OF (b0);
  }
  if (keep && tail_partial && present (o, b1) &&
      grp (o, GROUP_OF (b1))->pieces[IDX_OF (b1)] == 0) {
    want_tail = true;
    tcsum = grp (o, GROUP_OF (b1))->csum[IDX_OF (b1)];
    tepoch = grp (o, GROUP_OF (b1))->epoch;
    tzero = grp (o, GROUP_OF (b1))->zero & BIT_OF (b1);
  }
  pthread_mutex_unlock (&o->lock);

  if (mark && fsc_object_mark_in_use (o) == 0)
    fsc_write_sb (o, mark, 0, NULL);

  if (keep) {
    w->epochs = malloc ((g1 - g0 + 1) * sizeof *w->epochs);
    if (w->epochs == NULL)
      keep = false;
  }
  if (keep && want_head) {
    w->head = malloc (o->geom.block_size);
    if (w->head && !read_block (o, b0, w->head, hcsum, hzero)) {
      free (w->head);
      w->head = NULL;
    }
  }
  if (keep && want_tail) {
    w->tail = malloc (o->geom.block_size);
    if (w->tail && !read_block (o, b1, w->tail, tcsum, tzero)) {
      free (w->tail);
      w->tail = NULL;
    }
  }

  /* Invalidate: clear the bits, bump the epochs, and note whether a
   * record on disk may still name any of the blocks.
   */
  pthread_mutex_lock (&o->lock);
  if (w->head && grp (o, GROUP_OF (b0))->epoch != hepoch) {
    free (w->head);
    w->head = NULL;
  }
  if (w->tail && grp (o, GROUP_OF (b1))->epoch != tepoch) {
    free (w->tail);
    w->tail = NULL;
  }
  /* Every group must exist to count the write in flight: without the
   * count a fill could store what upstream held before this write.
   */
  for (uint64_t gi = g0; gi <= g1; ++gi)
    if (fsc_grp_alloc (o, gi) == NULL) {
      pthread_mutex_unlock (&o->lock);
      free (w->head);
      free (w->tail);
      free (w->epochs);
      w->head = w->tail = NULL;
      w->epochs = NULL;
      fsc_withdraw (o, ENOMEM);
      return 0;
    }
  if (o->state != FSC_OBJ_AVAILABLE)
    keep = false;
  bool need_sync = drop_locked (o, w, b0, b1, &keep);
  uint64_t c = o->change_seq;
  pthread_mutex_unlock (&o->lock);

  w->keep = keep;
  w->counted = true;
  w->first_group = g0;
  w->ngroups = g1 - g0 + 1;
  /* FSC_WRITE_NOSYNC: the caller makes the drop durable itself before
   * anything could depend on it (the writeback writer, whose log still
   * holds the new bytes until it has committed).
   */
  if (need_sync && !(flags & FSC_WRITE_NOSYNC))
    fsc_commit_upto (o, c);   /* on failure the object is withdrawn */
  return 0;
}

/* Punch the data and sums space of the N claimed blocks from B, to be
 * stored as zero blocks.  Returns 0, or -1 with errno.
 */
static int
punch_zero (struct fsc_object *o, uint64_t b, uint64_t n)
{
  uint64_t s = block_start (&o->geom, b), e = block_end (&o->geom, b + n - 1);
  uint64_t ss = sums_offset (&o->geom, b), se = sums_offset (&o->geom, b + n);
  if (fsc_data_punch (o, s, e - s) == -1 ||
      punch_hole (o->files.sfd, ss, se - ss) == -1)
    return -1;
  return 0;
}

/* Release claimed block BK of the writethrough store W and publish it,
 * stored whole with checksum CSUM (a zero block if ZERO), unless an
 * invalidation came after W's (rule 3).
 */
static void
publish_store (struct fsc_object *o, const struct fsc_write *w, uint64_t bk,
               uint64_t csum, bool zero)
{
  pthread_mutex_lock (&o->lock);
  struct group *g = grp (o, GROUP_OF (bk));
  g->fetching &= ~BIT_OF (bk);
  if (o->state == FSC_OBJ_AVAILABLE &&
      g->epoch == w->epochs[GROUP_OF (bk) - w->first_group]) {
    g->present |= BIT_OF (bk);
    g->csum[IDX_OF (bk)] = csum;
    g->pieces[IDX_OF (bk)] = 0;         /* stored whole */
    if (zero) {
      /* No space to evict: not on probation, never a victim. */
      g->zero |= BIT_OF (bk);
      g->referenced &= ~BIT_OF (bk);
      g->unread &= ~BIT_OF (bk);
      g->evicted &= ~BIT_OF (bk);       /* punched already */
      FSC_STAT_ADD (&o->cache->stats, zero_blocks, 1);
    }
    else {
      g->zero &= ~BIT_OF (bk);
      fsc_note_filled (o, bk, false);
      o->data_dirty = true;
    }
    fsc_mark_dirty (o, GROUP_OF (bk), g);
    FSC_STAT_ADD (&o->cache->stats, stored_blocks, 1);
    FSC_OSTAT_ADD (o, stored_blocks, 1);
  }
  pthread_cond_broadcast (&o->cond);
  fsc_claim_wake (o, bk, bk);
  pthread_mutex_unlock (&o->lock);
}

/* Write the blocks of W claimed in CLAIMED (1; B0..B1) from BUF (NULL:
 * a zero request) and W's head and tail, whole runs at a time, and
 * publish them (0).  On an error the rest stay claimed (2), to be
 * released unstored.
 */
static void
store_claimed (struct fsc_object *o, const struct fsc_write *w,
               const void *buf, uint8_t *claimed, uint64_t b0, uint64_t b1)
{
  const bool zero = buf == NULL;
  const uint64_t offset = w->offset;
  const uint64_t nb = b1 - b0 + 1;
  for (uint64_t i = 0; i < nb; ) {
    if (claimed[i] != 1) {
      i++;
      continue;
    }
    uint64_t blk = b0 + i;
    const unsigned char *src;
    uint64_t j = i + 1;
    if (blk == b0 && w->head)
      src = w->head;
    else if (blk == b1 && w->tail)
      src = w->tail;
    else {
      src = zero ? NULL
        : (const unsigned char *) buf + (block_start (&o->geom, blk) - offset);
      while (j < nb && claimed[j] == 1 && !(b0 + j == b1 && w->tail))
        j++;
    }
    if (src == NULL) {
      /* Zero blocks: their space punched, nothing written. */
      if (punch_zero (o, blk, j - i) == -1) {
        if (errno != EOPNOTSUPP)
          fill_failed (o, errno);
        for (; i < nb; ++i)
          if (claimed[i] == 1)
            claimed[i] = 2;
        break;
      }
      for (uint64_t k = i; k < j; ++k) {
        publish_store (o, w, b0 + k, zero_csum (&o->geom, b0 + k), true);
        claimed[k] = 0;
      }
      i = j;
      continue;
    }
    uint64_t *csums = malloc ((j - i) * sizeof *csums);
    uint64_t s = block_start (&o->geom, blk),
      e = block_end (&o->geom, b0 + j - 1);
    if (csums == NULL ||
        store_blocks (o, blk, j - i, s, e - s, src, csums, NULL,
                      false) == -1) {
      fill_failed (o, errno);
      free (csums);
      for (; i < nb; ++i)
        if (claimed[i] == 1)
          claimed[i] = 2;
      break;
    }
    for (uint64_t k = i; k < j; ++k) {
      publish_store (o, w, b0 + k, csums[k - i], false);
      claimed[k] = 0;
    }
    free (csums);
    i = j;
  }

}

void
fsc_local_write_end (struct fsc_object *o, struct fsc_write *w,
                     const void *buf, bool upstream_ok)
{
  uint8_t *claimed = NULL;

  if (w->counted) {
    pthread_mutex_lock (&o->lock);
    for (uint64_t gi = w->first_group; gi < w->first_group + w->ngroups; ++gi)
      grp (o, gi)->writers--;
    pthread_cond_broadcast (&o->cond);  /* the reclaimer's second look */
    pthread_mutex_unlock (&o->lock);
    w->counted = false;
  }
  if (!w->keep || !upstream_ok || w->count == 0 || w->offset >= o->geom.size)
    goto out;

  const bool zero = buf == NULL;        /* a zero request */
  const uint64_t offset = w->offset;
  const uint64_t count = MIN (w->count, o->geom.size - offset);
  const uint64_t wend = offset + count;
  const uint64_t b0 = offset >> o->geom.bshift;
  const uint64_t b1 = (wend - 1) >> o->geom.bshift;
  const uint64_t nb = b1 - b0 + 1;

  /* Build whole partial blocks from the old bytes and the new ones
   * (zeroes for a zero request).
   */
  if (w->head) {
    uint64_t s = block_start (&o->geom, b0);
    uint64_t e = MIN (block_end (&o->geom, b0), wend);
    if (zero)
      memset ((unsigned char *) w->head + (offset - s), 0, e - offset);
    else
      memcpy ((unsigned char *) w->head + (offset - s), buf, e - offset);
  }
  if (w->tail) {
    uint64_t s = block_start (&o->geom, b1);
    if (zero)
      memset (w->tail, 0, wend - s);
    else
      memcpy (w->tail, (const unsigned char *) buf + (s - offset), wend - s);
  }

  claimed = calloc (nb, 1);
  if (claimed == NULL)
    goto out;

  /* Claim the blocks nobody touched since our invalidation. */
  pthread_mutex_lock (&o->lock);
  if (o->state != FSC_OBJ_AVAILABLE || time (NULL) < o->nofill_until) {
    pthread_mutex_unlock (&o->lock);
    goto out;
  }
  for (uint64_t i = 0; i < nb; ++i) {
    uint64_t blk = b0 + i;
    bool whole = block_start (&o->geom, blk) >= offset &&
      block_end (&o->geom, blk) <= wend;
    const void *data = whole ? (const void *) 1
      : blk == b0 && w->head ? w->head
      : blk == b1 && w->tail ? w->tail : NULL;
    struct group *g = grp (o, GROUP_OF (blk));
    if (data == NULL || g == NULL ||
        g->epoch != w->epochs[GROUP_OF (blk) - w->first_group] ||
        (g->present | g->fetching) & BIT_OF (blk))
      continue;
    g->fetching |= BIT_OF (blk);
    claimed[i] = 1;
  }
  pthread_mutex_unlock (&o->lock);

  if (fsc_reserve_groups (o, GROUP_OF (b0), GROUP_OF (b1)) == -1) {
    fill_failed (o, errno);
    memset (claimed, 2, nb);    /* release without storing */
  }

  store_claimed (o, w, buf, claimed, b0, b1);

  /* Release whatever is still claimed (errors). */
  pthread_mutex_lock (&o->lock);
  for (uint64_t i = 0; i < nb; ++i)
    if (claimed[i]) {
      struct group *g = grp (o, GROUP_OF (b0 + i));
      g->fetching &= ~BIT_OF (b0 + i);
    }
  pthread_cond_broadcast (&o->cond);
  fsc_claim_wake (o, b0, b1);
  pthread_mutex_unlock (&o->lock);

 out:
  free (claimed);
  free (w->epochs);
  free (w->head);
  free (w->tail);
  w->epochs = NULL;
  w->head = w->tail = NULL;
}
