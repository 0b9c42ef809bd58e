/* libfscache: the metadata of emptied spans (issue 45: what a cap
 * counts besides data).
 *
 * A cap counts an object's three files as du does (evict.c), and
 * evicting a block punched only its data and its own 8 bytes of
 * hashes.  But the file system allocates in pages: a page of the sums
 * file holds the hashes of 512 blocks of 4 KiB (or 32 of 64 KiB), and
 * a page of the index the two slots of each of two groups (128 blocks).
 * A punch of less than a page frees nothing, so every page that ever
 * held one block's hashes or one group's record stayed allocated for
 * good: with 4 KiB blocks scattered over a large export, each cached
 * block brought a page of hashes and a page of records with it.  On the
 * CloudPhysics sample with a cap of 1% of its footprint (8.6 MB) the
 * index alone grew to 12.2 MB, past the cap, and the cache ended up
 * holding no data at all (tools/bench/eviction.sh: a miss ratio of
 * 0.965 where LRU has 0.922).
 *
 * So after the punches of an eviction (evict.c, step c), for each
 * page of metadata the punched blocks touched:
 *
 *  T1. A sums page is punched whole once none of the blocks whose
 *      hashes it holds has data: not present (a zero block has no
 *      hashes), not claimed by a fetch, store or punch, not evicted
 *      with its space still to punch.  Those blocks are claimed (as a
 *      fetch claims them, group.fetching) while the page is punched,
 *      so that no fill writes hashes there meanwhile.
 *  T2. An index page (the slots of groups 2k and 2k + 1) is punched
 *      whole once neither group has a present block, a record that
 *      may name one (disk_max), a change waiting for a commit
 *      (dirty), a queued punch or a claim, the whole groups claimed
 *      meanwhile.  The newest record of each then says "nothing"
 *      already, and a hole reads as no record (docs/format.md): what
 *      the index says does not change, at any crash point.  Their
 *      next record goes to slot 0 again, after the space is reserved
 *      again (commit.c's fsc_reserve_groups).
 *
 * The groups of a page are made resident and pinned first
 * (fsc_groups_pin: a group paged out may have present blocks that only
 * its record knows about).  A page whose blocks are only in flight
 * when its last block leaves (claimed by a fill next to it, say) is
 * left until an eviction next touches it; a sweep over the files'
 * allocated pages for those was tried and freed nothing more on the
 * CloudPhysics sample (idx 1.43 and sums 0.79 MB at a 1% cap, against
 * 1.41 and 0.81 without).  What is left costs space, never data.
 * No lock is held across the punches (o->lock only to look and claim).
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "utils.h"

#define META_PAGE 4096          /* the file system's page, as punched */

/* Under o->lock: claim blocks B0..B1 (their groups pinned) if none has
 * data, a claim or space still to punch, and, with RECORDS, their
 * groups have no present block, no record that may name one, no
 * change to commit and no punch queued (T1, T2).  True if claimed.
 */
static bool
claim_quiet (struct fsc_object *o, uint64_t b0, uint64_t b1, bool records)
{
  for (uint64_t gi = GROUP_OF (b0); gi <= GROUP_OF (b1); ++gi) {
    const struct group *g = grp (o, gi);
    uint64_t m = group_span_bits (gi, b0, b1);
    if (g == NULL || g->loading || g->writers ||
        (((g->present & ~g->zero) | g->fetching | g->evicted) & m) ||
        (records && (g->present || g->disk_max || g->dirty || g->on_punch)))
      return false;
  }
  for (uint64_t gi = GROUP_OF (b0); gi <= GROUP_OF (b1); ++gi)
    grp (o, gi)->fetching |= group_span_bits (gi, b0, b1);
  return true;
}

/* Release claim_quiet's claim; with RECORDS the groups have no record
 * and no reserved space any more.
 */
static void
release (struct fsc_object *o, uint64_t b0, uint64_t b1, bool records)
{
  pthread_mutex_lock (&o->lock);
  for (uint64_t gi = GROUP_OF (b0); gi <= GROUP_OF (b1); ++gi) {
    struct group *g = grp (o, gi);
    g->fetching &= ~group_span_bits (gi, b0, b1);
    if (records) {
      g->has_record = false;
      g->reserved = false;
      g->slot = 0;
    }
  }
  pthread_cond_broadcast (&o->cond);
  fsc_claim_wake (o, b0, b1);
  pthread_mutex_unlock (&o->lock);
}

/* Punch FD's page at OFF if blocks B0..B1 are quiet (claim_quiet).
 * A failed punch (a file system without holes) leaves the page: space,
 * never data.
 */
static void
punch_page_if_quiet (struct fsc_object *o, int fd, uint64_t off,
                     uint64_t b0, uint64_t b1, bool records)
{
  uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  if (fsc_groups_pin (o, g0, g1) == -1)
    return;                     /* withdrawn: nothing more to do */
  pthread_mutex_lock (&o->lock);
  bool claimed = claim_quiet (o, b0, b1, records);
  pthread_mutex_unlock (&o->lock);
  if (claimed) {
    bool punched = punch_hole (fd, off, META_PAGE) == 0;
    release (o, b0, b1, records && punched);
  }
  fsc_groups_unpin (o, g0, g1);
}

/* T1 for the sums page at OFF (a multiple of META_PAGE). */
static void
sums_page (struct fsc_object *o, uint64_t off)
{
  uint64_t per = (uint64_t) subs_per_block (&o->geom) * 8;
  uint64_t nb = o->geom.nblocks;
  uint64_t b0 = off / per;
  if (per == 0 || b0 >= nb)
    return;
  uint64_t b1 = MIN (DIV_ROUND_UP (off + META_PAGE, per), nb) - 1;
  punch_page_if_quiet (o, o->files.sfd, off, b0, b1, false);
}

/* T2 for the index page of groups PG and PG + 1 (PG even). */
static void
index_page (struct fsc_object *o, uint64_t pg)
{
  uint64_t nb = o->geom.nblocks;
  uint64_t b0 = pg * FSC_GROUP_BLOCKS;
  if (b0 >= nb)
    return;
  uint64_t b1 = MIN ((pg + 2) * FSC_GROUP_BLOCKS, nb) - 1;
  punch_page_if_quiet (o, o->files.ifd, fsc_grec_offset (pg, 0), b0, b1,
                       true);
}

void
fsc_trim_meta (struct fsc_object *o, uint64_t gi, uint64_t punched)
{
  const struct fsc_geom *geom = &o->geom;
  uint64_t nb = geom->nblocks;
  if (punched == 0 || nb == 0)
    return;

  /* T1: the sums pages of the blocks punched. */
  uint64_t per = (uint64_t) subs_per_block (geom) * 8;  /* bytes a block */
  if (per) {
    uint64_t first = gi * FSC_GROUP_BLOCKS + __builtin_ctzll (punched);
    uint64_t last = gi * FSC_GROUP_BLOCKS + 63 - __builtin_clzll (punched);
    uint64_t p0 = ROUND_DOWN (sums_offset (geom, first), META_PAGE);
    uint64_t p1 = sums_offset (geom, last + 1);
    for (uint64_t p = p0; p < p1; p += META_PAGE)
      sums_page (o, p);
  }

  /* T2: the index page of GI and its neighbour, if it holds index
   * space (a group paged out: only its record knows; the pin looks).
   */
  uint64_t pg = gi & ~UINT64_C (1);
  bool any = false;
  pthread_mutex_lock (&o->lock);
  for (uint64_t g = pg; g < MIN (pg + 2, geom->ngroups); ++g) {
    const struct group *gr = grp (o, g);
    if (gr == NULL || gr->has_record || gr->reserved)
      any = true;
  }
  pthread_mutex_unlock (&o->lock);
  if (any)
    index_page (o, pg);
}
