/* libfscache: an object's group table, and the paging of its groups.
 *
 * An object's in-memory state lives in groups of FSC_GROUP_BLOCKS
 * blocks (struct group, internal.h), allocated only for groups with
 * something cached or in flight.  The table that finds them is three
 * levels deep (top, mid nodes of GT_MID leaves, leaves of GT_LEAF
 * group pointers), so that its memory follows what is resident, not
 * the export's size: a flat array of one pointer per group would be
 * 128 MiB for a 64 TiB export of 64 KiB blocks before anything is
 * cached; here it is the top level, 512 pointers, plus one mid node
 * and one leaf per region actually resident (4 KiB and 520 bytes).
 *
 * Paging.  The index on disk is the truth and the groups in memory a
 * cache of it, as a file system's inode cache: a group is read from
 * its record the first time a request needs it, and the object keeps
 * at most res_max groups resident (FSC_RESIDENT_DEFAULT: 16384 groups
 * of about 760 bytes, 12 MiB, whatever is cached), so that opening an
 * object reads only its superblock, and memory does not grow with the
 * cached amount.  A request pins the groups it touches
 * (fsc_groups_pin) before looking at them: those not resident are
 * allocated as placeholders marked loading, the lock is let go, their
 * records are read (consecutive groups in one read, at most one extra
 * index read per request), and the placeholders filled; others that
 * need them wait on obj->cond.  A pinned, busy (claimed, read, written,
 * queued for a commit or a punch) or loading group is never paged out;
 * the others go by CLOCK (touched is the second chance) when the
 * resident set grows past res_max (fsc_groups_trim), and never while
 * a commit is writing records (a group read back then could miss the
 * change in flight).  A group paged out had no change that its record
 * lacks, so reading it again gives it back as it was, less the
 * eviction policy's hints (probation, ghost, reference bits: as after
 * a restart, they cost hits, never data).
 *
 * Lookups (grp, internal.h) are three dependent loads and take no
 * lock of their own: the table changes only under o->lock, like the
 * groups themselves.
 *
 * Gauges.  The present blocks and bytes of the groups not resident are
 * kept in o->nonres_*: added when a group is paged out, taken off when
 * it is read in.  At a clean open they come from the superblock's
 * gauges; after a crash (or from an index without gauges) the census
 * (fsc_groups_census, run by the reclaimer thread) reads every record
 * once, in the background, in group order: groups below census_next
 * are counted, the others not yet, and a chunk whose groups were read
 * in or paged out while its records were being read is read again.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "utils.h"

int
fsc_gtable_init (struct fsc_object *o)
{
  /* An object too large to cache never has a group: one entry, so
   * that an 8 EiB export does not take 2^26 of them (or 2^30 with
   * 4 KiB blocks).  grp and fsc_grp_alloc check the range.
   */
  o->pager.ntop = o->geom.size > FSC_OBJECT_SIZE_MAX ? 1
    : DIV_ROUND_UP (o->geom.ngroups, (uint64_t) GT_LEAF * GT_MID);
  if (o->pager.ntop == 0)
    o->pager.ntop = 1;
  o->pager.gtop = calloc (o->pager.ntop, sizeof *o->pager.gtop);
  o->pager.ngalloc = 0;
  return o->pager.gtop ? 0 : -1;
}

struct group *
fsc_grp_alloc (struct fsc_object *o, uint64_t gi)
{
  if (gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT) >= o->pager.ntop) {
    errno = EFBIG;              /* too large to cache (fsc_gtable_init) */
    return NULL;
  }
  struct gmid **mp = &o->pager.gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
  if (*mp == NULL && (*mp = calloc (1, sizeof **mp)) == NULL)
    return NULL;
  struct gleaf **lp = &(*mp)->l[(gi >> GT_LEAF_SHIFT) & (GT_MID - 1)];
  if (*lp == NULL) {
    if (o->pager.lfree) {
      *lp = o->pager.lfree;
      o->pager.lfree = *(struct gleaf **) o->pager.lfree;
      o->pager.nlfree--;
      memset (*lp, 0, sizeof **lp);
    }
    else if ((*lp = calloc (1, sizeof **lp)) == NULL)
      return NULL;
  }
  struct group **gp = &(*lp)->g[gi & (GT_LEAF - 1)];
  if (*gp == NULL) {
    if (o->pager.gfree) {
      *gp = o->pager.gfree;
      o->pager.gfree = *(struct group **) o->pager.gfree;
      o->pager.ngfree--;
      memset (*gp, 0, sizeof **gp);
    }
    else if ((*gp = calloc (1, sizeof **gp)) == NULL)
      return NULL;
    (*lp)->n++;
    o->pager.ngalloc++;
  }
  return *gp;
}

uint64_t
fsc_grp_next (const struct fsc_object *o, uint64_t gi)
{
  while (gi < o->geom.ngroups) {
    if (gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT) >= o->pager.ntop)
      break;
    const struct gmid *m = o->pager.gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
    if (m == NULL) {
      gi = ((gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)) + 1)
        << (GT_LEAF_SHIFT + GT_MID_SHIFT);
      continue;
    }
    const struct gleaf *l = m->l[(gi >> GT_LEAF_SHIFT) & (GT_MID - 1)];
    if (l == NULL) {
      gi = ((gi >> GT_LEAF_SHIFT) + 1) << GT_LEAF_SHIFT;
      continue;
    }
    if (l->g[gi & (GT_LEAF - 1)])
      return gi;
    gi++;
  }
  return o->geom.ngroups;
}

void
fsc_gtable_free (struct fsc_object *o)
{
  if (o->pager.gtop == NULL)
    return;
  for (uint64_t t = 0; t < o->pager.ntop; ++t) {
    struct gmid *m = o->pager.gtop[t];
    if (m == NULL)
      continue;
    for (unsigned i = 0; i < GT_MID; ++i) {
      struct gleaf *l = m->l[i];
      if (l == NULL)
        continue;
      for (unsigned j = 0; j < GT_LEAF; ++j)
        free (l->g[j]);
      free (l);
    }
    free (m);
  }
  free (o->pager.gtop);
  o->pager.gtop = NULL;
  o->pager.ngalloc = 0;
  while (o->pager.gfree) {
    struct group *g = o->pager.gfree;
    o->pager.gfree = *(struct group **) g;
    free (g);
  }
  while (o->pager.lfree) {
    struct gleaf *l = o->pager.lfree;
    o->pager.lfree = *(struct gleaf **) l;
    free (l);
  }
  o->pager.ngfree = o->pager.nlfree = 0;
}

/*----------------------------------------------------------------------
 * Paging.
 */

#define FREE_LEAVES_MAX 1024    /* empty leaves kept for reuse */
#define FREE_GROUPS_MAX 1024    /* groups paged out kept for reuse */

void
fsc_group_from_rec (struct fsc_object *o, struct group *g,
                    const struct fsc_grec *rec, int slot)
{
  uint64_t mask = ~UINT64_C (0);
  if (rec->group == o->geom.ngroups - 1 && o->geom.nblocks % FSC_GROUP_BLOCKS)
    mask = (UINT64_C (1) << (o->geom.nblocks % FSC_GROUP_BLOCKS)) - 1;
  g->present = rec->present & mask;
  g->disk_max = rec->present;
  g->slot = slot;
  g->has_record = true;
  memcpy (g->csum, rec->csum, sizeof g->csum);
  /* Pieces: 0 (whole) or a non-empty set of the block's own; all the
   * pieces of the block read as whole.  Pieces a block does not have
   * could only come from damage or a forger: the block is dropped,
   * never served (the record's checksum vouches for the rest).
   */
  for (uint64_t t = g->present; t; t &= t - 1) {
    unsigned i = __builtin_ctzll (t);
    unsigned p = rec->pieces[i];
    unsigned full = full_pieces (&o->geom, rec->group * FSC_GROUP_BLOCKS + i);
    if (p & ~full)
      g->present &= ~(UINT64_C (1) << i);
    g->pieces[i] = p == full ? 0 : p;
  }
  /* Zero blocks: present, whole and with the checksum of zeroes, or
   * else damage, dropped like bad pieces.  A zero bit on an absent
   * block is ignored.  Versions 1 and 2 wrote zeroes where the bitmap
   * is (no zero blocks); the bytes are read the same in every version,
   * so that a record an upgrade leaves as it was reads the same after
   * the superblock says version 3.
   */
  uint64_t zero = rec->zero & g->present;
  for (uint64_t t = zero; t; t &= t - 1) {
    unsigned i = __builtin_ctzll (t);
    uint64_t b = rec->group * FSC_GROUP_BLOCKS + i;
    if (rec->pieces[i] != 0 || rec->csum[i] != zero_csum (&o->geom, b)) {
      g->present &= ~(UINT64_C (1) << i);
      zero &= ~(UINT64_C (1) << i);
    }
  }
  g->zero = zero;
  o->seq = MAX (o->seq, rec->seq);
}

void
fsc_group_count (const struct fsc_object *o, uint64_t gi,
                 const struct group *g, uint64_t *blocks, uint64_t *bytes)
{
  *blocks = __builtin_popcountll (g->present);
  *bytes = 0;
  for (uint64_t t = g->present; t; t &= t - 1)
    *bytes += block_held (o, g, gi * FSC_GROUP_BLOCKS + __builtin_ctzll (t));
}

/* Take group GI's counts off (SIGN < 0) or add them to (SIGN > 0) the
 * gauges of the groups not resident, if the census has counted it.
 */
static void
nonres_adjust (struct fsc_object *o, uint64_t gi, const struct group *g,
               int sign)
{
  if (gi >= o->pager.census_next)
    return;
  uint64_t blocks, bytes;
  fsc_group_count (o, gi, g, &blocks, &bytes);
  if (sign > 0) {
    o->pager.nonres_blocks += blocks;
    o->pager.nonres_bytes += bytes;
  }
  else {
    o->pager.nonres_blocks -= MIN (blocks, o->pager.nonres_blocks);
    o->pager.nonres_bytes -= MIN (bytes, o->pager.nonres_bytes);
  }
}

/* Read the records of groups G0..G1 (N of them) into BUF (N * 2 slots).
 * What the file lacks reads as zeroes (no valid record).  Returns 0 or
 * -1 with errno.
 */
static int
read_records (struct fsc_object *o, uint64_t g0, uint64_t n,
              unsigned char *buf)
{
  size_t len = n * 2 * FSC_GREC_SIZE;
  ssize_t r = fsc_io_pread (&o->cache->io, FSC_FILE_INDEX, o->files.ifd,
                            buf, len,
                            fsc_grec_offset (g0, 0));
  if (r == -1)
    return -1;
  memset (buf + r, 0, len - (size_t) r);
  return 0;
}

/* Fill the placeholders G0..G1 flagged in MINE from BUF (their records,
 * or NULL: none could be read, they stay empty).  Caller holds o->lock.
 */
static void
fill_placeholders (struct fsc_object *o, uint64_t g0, uint64_t g1,
                   const unsigned char *mine, const unsigned char *buf)
{
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    if (!mine[gi - g0])
      continue;
    struct group *g = grp (o, gi);
    struct fsc_grec rec;
    int slot = buf ? fsc_grec_pick (buf + (gi - g0) * 2 * FSC_GREC_SIZE, gi,
                                    o->sb.incarnation, &rec) : -1;
    if (slot >= 0) {
      fsc_group_from_rec (o, g, &rec, slot);
      /* Counted in nonres_* only if the census had passed it before
       * it became a placeholder (a placeholder is resident: the census
       * skips it).
       */
      if (g->counted) {
        uint64_t blocks, bytes;
        fsc_group_count (o, gi, g, &blocks, &bytes);
        o->pager.nonres_blocks -= MIN (blocks, o->pager.nonres_blocks);
        o->pager.nonres_bytes -= MIN (bytes, o->pager.nonres_bytes);
      }
    }
    g->loading = false;
    o->pager.pager_events++;
  }
}

int
fsc_groups_pin (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  const uint64_t n = g1 - g0 + 1;
  unsigned char mine_small[256], pinned_small[256];
  unsigned char *mine = n <= sizeof mine_small ? mine_small : calloc (n, 1);
  unsigned char *pinned = n <= sizeof pinned_small ? pinned_small
    : calloc (n, 1);
  bool wait = false, load = false;
  int r = 0, err = 0;

  if (mine == NULL || pinned == NULL) {
    if (mine != mine_small)
      free (mine);
    if (pinned != pinned_small)
      free (pinned);
    errno = ENOMEM;
    return -1;
  }
  if (mine == mine_small)
    memset (mine, 0, n);
  if (pinned == pinned_small)
    memset (pinned, 0, n);
  pthread_mutex_lock (&o->lock);
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    struct group *g = grp (o, gi);
    if (g == NULL) {
      if ((g = fsc_grp_alloc (o, gi)) == NULL) {
        err = ENOMEM;
        continue;
      }
      /* Nothing to read for an object that is not in use. */
      g->loading = o->state == FSC_OBJ_AVAILABLE;
      g->counted = gi < o->pager.census_next;
      mine[gi - g0] = g->loading;
      load |= g->loading;
    }
    else if (g->loading)
      wait = true;
    __atomic_add_fetch (&g->pins, 1, __ATOMIC_RELAXED);
    pinned[gi - g0] = 1;
    g->touched = true;
  }
  if (o->pager.ngalloc > o->pager.res_max)
    fsc_groups_trim (o);
  pthread_mutex_unlock (&o->lock);

  if (load) {
    /* One read per run of consecutive placeholders. */
    for (uint64_t a = 0; a < n; ) {
      if (!mine[a]) {
        a++;
        continue;
      }
      uint64_t b = a;
      while (b + 1 < n && mine[b + 1])
        b++;
      unsigned char *buf = malloc ((b - a + 1) * 2 * FSC_GREC_SIZE);
      int rr = buf ? read_records (o, g0 + a, b - a + 1, buf) : -1;
      if (rr == -1 && err == 0)
        err = errno;
      pthread_mutex_lock (&o->lock);
      fill_placeholders (o, g0 + a, g0 + b, mine + a, rr == 0 ? buf : NULL);
      pthread_cond_broadcast (&o->cond);
      pthread_mutex_unlock (&o->lock);
      free (buf);
      a = b + 1;
    }
  }
  if (wait) {
    pthread_mutex_lock (&o->lock);
    for (uint64_t gi = g0; gi <= g1; ++gi) {
      struct group *g;
      while ((g = grp (o, gi)) != NULL && g->loading)
        pthread_cond_wait (&o->cond, &o->lock);
    }
    pthread_mutex_unlock (&o->lock);
  }
  if (mine != mine_small)
    free (mine);
  if (err) {
    /* A group we could not read (or hold) would look empty: the
     * object cannot be trusted any more, and goes uncached.  Our pins
     * go: the caller holds none.
     */
    fsc_withdraw (o, err);
    pthread_mutex_lock (&o->lock);
    for (uint64_t gi = g0; gi <= g1; ++gi) {
      struct group *g = grp (o, gi);
      if (g && pinned[gi - g0])
        __atomic_sub_fetch (&g->pins, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock (&o->lock);
    errno = err;
    r = -1;
  }
  if (pinned != pinned_small)
    free (pinned);
  return r;
}

bool
fsc_groups_pin_resident (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    const struct group *g = grp (o, gi);
    if (g == NULL || g->loading)
      return false;
  }
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    struct group *g = grp (o, gi);
    if (g) {                    /* always, as just seen */
      __atomic_add_fetch (&g->pins, 1, __ATOMIC_RELAXED);
      g->touched = true;
    }
  }
  return true;
}

/* Without the lock, as hits drop their readers count: a pinned group
 * is not paged out, so its leaf (which counts it) stays, and grp finds
 * it; once the count is down, we touch it no more.
 */
void
fsc_groups_unpin (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    struct group *g = grp (o, gi);
    if (g)
      __atomic_sub_fetch (&g->pins, 1, __ATOMIC_RELEASE);
  }
}

/* May group G be paged out now?  Caller holds o->lock. */
static bool
idle (const struct group *g)
{
  return __atomic_load_n (&g->pins, __ATOMIC_ACQUIRE) == 0 &&
    !g->loading && g->fetching == 0 &&
    __atomic_load_n (&g->readers, __ATOMIC_ACQUIRE) == 0 &&
    g->writers == 0 && !g->dirty && !g->on_punch && g->evicted == 0;
}

/* Page group GI out.  Caller holds o->lock. */
static void
page_out (struct fsc_object *o, uint64_t gi, struct group *g)
{
  nonres_adjust (o, gi, g, +1);
  o->evict.nprobation -= MIN (o->evict.nprobation,
                        (uint64_t) __builtin_popcountll (g->probation));
  struct gmid *m = o->pager.gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
  struct gleaf **lp = &m->l[(gi >> GT_LEAF_SHIFT) & (GT_MID - 1)];
  (*lp)->g[gi & (GT_LEAF - 1)] = NULL;
  /* A few are kept for reuse rather than freed: groups come and go by
   * the thousand, allocated in whichever request's thread needed them,
   * and freeing each one into its thread's malloc arena fragments them
   * all.  (Whether this helps enough is not settled: resident memory
   * still grew by about 85 bytes per group paged through in a test of
   * 131072 against 262144 groups, 52 against 63 MiB.)
   */
  if (--(*lp)->n == 0) {
    if (o->pager.nlfree < FREE_LEAVES_MAX) {
      *(struct gleaf **) *lp = o->pager.lfree;
      o->pager.lfree = *lp;
      o->pager.nlfree++;
    }
    else
      free (*lp);
    *lp = NULL;
  }
  if (o->pager.ngfree < FREE_GROUPS_MAX) {
    *(struct group **) g = o->pager.gfree;
    o->pager.gfree = g;
    o->pager.ngfree++;
  }
  else
    free (g);
  o->pager.ngalloc--;
  o->pager.pager_events++;
}

void
fsc_groups_trim (struct fsc_object *o)
{
  if (o->committing)
    return;
  for (uint64_t visits = 2 * o->pager.ngalloc + 1;
       o->pager.ngalloc > o->pager.res_max && visits > 0; --visits) {
    uint64_t gi = fsc_grp_next (o, o->pager.phand < o->geom.ngroups
                                ? o->pager.phand : 0);
    if (gi >= o->geom.ngroups && (gi = fsc_grp_next (o, 0)) >= o->geom.ngroups)
      break;
    o->pager.phand = gi + 1;
    struct group *g = grp (o, gi);
    if (!idle (g))
      continue;
    if (g->touched) {
      g->touched = false;
      continue;
    }
    page_out (o, gi, g);
  }
}

int
fsc_groups_page_in (struct fsc_object *o, uint64_t *first, uint64_t *gi,
                    unsigned n)
{
  *first = 0;
  uint64_t from = *gi < o->geom.ngroups ? *gi : 0;
  /* The next group with a record: holes in the index have none. */
  off_t d = lseek (o->files.ifd, fsc_grec_offset (from, 0), SEEK_DATA);
  if (d == -1 && errno == ENXIO && from > 0) {
    from = 0;
    d = lseek (o->files.ifd, fsc_grec_offset (0, 0), SEEK_DATA);
  }
  if (d == -1) {
    if (errno == ENXIO) {
      *gi = 0;
      return 0;
    }
    if (errno != EINVAL)
      return -1;
    d = fsc_grec_offset (from, 0);    /* SEEK_DATA unsupported */
  }
  if ((uint64_t) d < FSC_GROUPS_OFFSET)
    d = FSC_GROUPS_OFFSET;
  uint64_t g0 = ((uint64_t) d - FSC_GROUPS_OFFSET) / (2 * FSC_GREC_SIZE);
  if (g0 >= o->geom.ngroups) {
    *gi = 0;
    return 0;
  }
  uint64_t g1 = MIN (g0 + n - 1, o->geom.ngroups - 1);
  int r = fsc_groups_pin (o, g0, g1);
  if (r == 0)
    fsc_groups_unpin (o, g0, g1);
  *first = g0;
  *gi = g1 + 1;
  return r;
}

#define CENSUS_CHUNK 512        /* groups per read: 1 MiB */

int
fsc_groups_census (struct fsc_object *o)
{
  const uint64_t gsize = 2 * FSC_GREC_SIZE;
  size_t cap;
  unsigned char *buf = fsc_buf_get (o->cache, CENSUS_CHUNK * gsize, &cap);
  uint64_t gi = 0, chunk = CENSUS_CHUNK;
  int r = 0;

  if (buf == NULL)
    return -1;
  for (;;) {
    pthread_mutex_lock (&o->lock);
    bool go = gi < o->geom.ngroups && o->state == FSC_OBJ_AVAILABLE &&
      !o->reclaim.stop;
    pthread_mutex_unlock (&o->lock);
    if (!go)
      break;
    /* Skip holes: groups never written have no record. */
    off_t d = lseek (o->files.ifd, fsc_grec_offset (gi, 0), SEEK_DATA);
    if (d == -1 && errno == ENXIO) {
      gi = o->geom.ngroups;
      break;
    }
    if (d == -1 && errno != EINVAL) {
      r = -1;
      break;
    }
    uint64_t next = d == -1 || (uint64_t) d < FSC_GROUPS_OFFSET ? gi
      : ((uint64_t) d - FSC_GROUPS_OFFSET) / gsize;
    if (next > gi) {
      pthread_mutex_lock (&o->lock);
      o->pager.census_next = MIN (next, o->geom.ngroups);
      pthread_mutex_unlock (&o->lock);
      gi = next;
      if (gi >= o->geom.ngroups)
        break;
    }
    uint64_t n = MIN (chunk, o->geom.ngroups - gi);
    pthread_mutex_lock (&o->lock);
    uint64_t events = o->pager.pager_events;
    pthread_mutex_unlock (&o->lock);
    if (read_records (o, gi, n, buf) == -1) {
      r = -1;
      break;
    }
    pthread_mutex_lock (&o->lock);
    if (o->pager.pager_events != events) {
      /* A group of the chunk may have been read in, changed and paged
       * out meanwhile: what we read may be older than its record.
       * Again, in smaller chunks, so that a busy pager cannot starve
       * us.
       */
      pthread_mutex_unlock (&o->lock);
      chunk = MAX (chunk / 8, (uint64_t) 1);
      continue;
    }
    for (uint64_t k = 0; k < n; ++k) {
      if (grp (o, gi + k))
        continue;               /* resident: counted live */
      struct fsc_grec rec;
      if (fsc_grec_pick (buf + k * gsize, gi + k, o->sb.incarnation,
                         &rec) < 0)
        continue;
      struct group tmp;
      memset (&tmp, 0, sizeof tmp);
      fsc_group_from_rec (o, &tmp, &rec, 0);
      uint64_t blocks, bytes;
      fsc_group_count (o, gi + k, &tmp, &blocks, &bytes);
      o->pager.nonres_blocks += blocks;
      o->pager.nonres_bytes += bytes;
    }
    gi += n;
    o->pager.census_next = gi;
    pthread_mutex_unlock (&o->lock);
    chunk = MIN (chunk * 2, (uint64_t) CENSUS_CHUNK);
  }
  if (r == 0 && gi >= o->geom.ngroups) {
    pthread_mutex_lock (&o->lock);
    o->pager.census_next = o->geom.ngroups;
    pthread_mutex_unlock (&o->lock);
  }
  fsc_buf_put (o->cache, buf, cap);
  return r;
}
