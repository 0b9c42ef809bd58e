/* libfscache: reclaiming space nobody names (evict.c keeps the budget
 * and the eviction policy).
 *
 * Space nobody names.  Blocks whose eviction was committed but not yet
 * punched when the process stopped, and fills written but never
 * committed (a crash), take space that no index names: nothing would
 * ever evict them, and a capped object could stay over its budget for
 * good.  A clean close punches what is queued (fsc_punch_pending);
 * after a crash (the index not marked clean), every allocated extent
 * of the data and sums files (SEEK_DATA) is compared with the present
 * blocks once the object is open, and what no present block covers is
 * punched (fsc_reclaim_unnamed), and so are the pieces a block held
 * in pieces does not hold.  The index is the truth: a block it does
 * not name holds nothing anybody may read.  (Only after a crash: a
 * clean close leaves nothing to find but the sums pages shared with
 * evicted blocks' neighbours, at most 0.2% of the export.)  The walk
 * costs a few hundred milliseconds per gigabyte cached in scattered
 * blocks, so it runs in a thread of its own (the reclaimer), beside
 * the requests, instead of before the first one: it claims each
 * group's blocks (fetching) while it punches them, like a fetch, so
 * that no fill writes there meanwhile, and looks again at the blocks
 * somebody else held once they are free.  Nor does the last user's
 * close wait for it: the object lingers until it ends (see the
 * reclaimer below); a clean stop of the process waits for it a second
 * at most (cache.c, stop_walks).  A kill -9 cuts it short, and so do
 * that stop and an open of the lingering object that cannot take it
 * back as it is (object.c, lingering_fits), and the next open walks
 * again.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "utils.h"

/* The file offset of block B's space in the data file, or in the sums
 * file if SUMS, and the block at file offset OFF.
 */
static uint64_t
space_of (const struct fsc_object *o, uint64_t b, bool sums)
{
  if (sums)
    return sums_offset (&o->geom, b);
  return b < o->geom.nblocks ? block_start (&o->geom, b) : o->geom.size;
}

static uint64_t
block_at (const struct fsc_object *o, uint64_t off, bool sums)
{
  return sums ? off / (subs_per_block (&o->geom) * 8) : off >> o->geom.bshift;
}

/* Punch the pieces of block B that P does not hold, within the extent
 * [S, E) of FD, a data segment holding the export's bytes from BASE on.
 */
static int
reclaim_pieces (struct fsc_object *o, int fd, uint64_t base, uint64_t s,
                uint64_t e, uint64_t b, unsigned p)
{
  const uint64_t bs = block_start (&o->geom, b), be = block_end (&o->geom, b);
  for (unsigned j = 0; bs + ((uint64_t) j << o->geom.pshift) < be; ++j) {
    if (p & (1u << j))
      continue;
    uint64_t ps = MAX (s, bs + ((uint64_t) j << o->geom.pshift));
    uint64_t pe = MIN (e, MIN (be,
                               bs + ((uint64_t) (j + 1) << o->geom.pshift)));
    if (pe > ps && punch_hole (fd, ps - base, pe - ps) == -1)
      return -1;
  }
  return 0;
}

/* Reclaim the blocks RANGE (a mask) of group GI inside the extent
 * [S, E) of FD (see reclaim_file).  While the object is in use: under
 * the lock, the blocks no present block names, and the present ones
 * held in pieces, that nobody has claimed are claimed (fetching), so
 * that no fill writes them meanwhile; their space is punched without
 * the lock; the claims are then released.  The blocks somebody else
 * claimed (a fetch, a punch) are left to a second look, in *SKIPPED.
 * Returns 0, or -1 with errno.
 */
static int
reclaim_group (struct fsc_object *o, int fd, uint64_t base, bool sums,
               uint64_t s, uint64_t e, uint64_t gi, uint64_t range,
               uint64_t *skipped)
{
  uint16_t pieces[FSC_GROUP_BLOCKS];

  *skipped = 0;
  /* Resident for what it names on disk: a group not read in would
   * look empty, and its blocks' space unnamed.
   */
  if (fsc_groups_pin (o, gi, gi) == -1)
    return 0;                   /* withdrawn: nothing more to do */
  pthread_mutex_lock (&o->lock);
  struct group *g = grp (o, gi);
  if (g == NULL || o->state != FSC_OBJ_AVAILABLE) {
    pthread_mutex_unlock (&o->lock);
    fsc_groups_unpin (o, gi, gi);
    return 0;
  }
  /* A write in flight (store.c, rule 3): the blocks it dropped are
   * unnamed until its end stores them, which claims them only if
   * nobody else has.  Claimed here meanwhile, they stayed uncached: a
   * writethrough zero request's blocks were read upstream right after
   * it (test-fscache-zero-blocks.sh, about one run in ten beside four
   * CPU hogs: every open of a cached object walks its sums file).
   * The group waits for the second look, once the write has ended.
   */
  if (g->writers > 0) {
    *skipped = range;
    pthread_mutex_unlock (&o->lock);
    fsc_groups_unpin (o, gi, gi);
    return 0;
  }
  const uint64_t named = g->present & ~g->zero;
  const uint64_t unnamed = range & ~named & ~g->fetching;
  uint64_t inpieces = 0;
  if (!sums)
    for (uint64_t t = range & named & ~g->fetching; t; t &= t - 1) {
      unsigned i = __builtin_ctzll (t);
      if (g->pieces[i]) {
        inpieces |= UINT64_C (1) << i;
        pieces[i] = g->pieces[i];
      }
    }
  const uint64_t claimed = unnamed | inpieces;
  *skipped = range & g->fetching;
  g->fetching |= claimed;
  pthread_mutex_unlock (&o->lock);

  int r = 0;
  for (uint64_t t = unnamed; t && r == 0; ) {
    /* One run of consecutive unnamed blocks at a time. */
    unsigned j0 = __builtin_ctzll (t), j1 = j0;
    while (j1 + 1 < FSC_GROUP_BLOCKS && (t >> (j1 + 1)) & 1)
      j1++;
    uint64_t b0 = gi * FSC_GROUP_BLOCKS + j0, b1 = gi * FSC_GROUP_BLOCKS + j1;
    uint64_t ps = MAX (s, space_of (o, b0, sums));
    uint64_t pe = MIN (e, space_of (o, b1 + 1, sums));
    if (pe > ps && punch_hole (fd, ps - base, pe - ps) == -1)
      r = -1;
    t &= j1 == 63 ? 0 : ~UINT64_C (0) << (j1 + 1);
  }
  for (uint64_t t = inpieces; t && r == 0; t &= t - 1) {
    unsigned i = __builtin_ctzll (t);
    r = reclaim_pieces (o, fd, base, s, e, gi * FSC_GROUP_BLOCKS + i,
                        pieces[i]);
  }
  int err = errno;

  pthread_mutex_lock (&o->lock);
  g->fetching &= ~claimed;
  pthread_cond_broadcast (&o->cond);
  fsc_claim_wake (o, gi * FSC_GROUP_BLOCKS,
                  (gi + 1) * FSC_GROUP_BLOCKS - 1);
  pthread_mutex_unlock (&o->lock);
  fsc_groups_unpin (o, gi, gi);
  errno = err;
  return r;
}

/* Blocks the walk met claimed by somebody else, to look at again once
 * the claim is gone: a fetch whose fill fails (or is skipped) leaves
 * its block's old space behind, and a clean close would then keep it
 * for good.
 */
struct reclaim_later {
  struct { int fd; uint64_t base; bool sums; uint64_t gi, mask; } *v;
  size_t n, cap;
};

static bool
stopping (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  return o->state != FSC_OBJ_AVAILABLE || o->reclaim.stop;
}

/* Punch what no present block with data covers in FD: a data segment
 * holding the export's bytes from BASE on, or the sums file if SUMS
 * (BASE 0), one group at a time (reclaim_group), stopping early if the
 * object is being closed.  Returns 0, or -1 with errno.
 */
static int
reclaim_file (struct fsc_object *o, int fd, uint64_t base, bool sums,
              struct reclaim_later *later)
{
  off_t off = 0;

  for (;;) {
    if (stopping (o))
      return 0;
    off_t fs = lseek (fd, off, SEEK_DATA);
    if (fs == -1)
      return errno == ENXIO ? 0 : -1;
    off_t fe = lseek (fd, fs, SEEK_HOLE);
    if (fe == -1)
      return -1;
    uint64_t s = base + (uint64_t) fs, e = base + (uint64_t) fe;
    uint64_t b = block_at (o, s, sums);
    uint64_t bend = MIN (block_at (o, e - 1, sums) + 1, o->geom.nblocks);
    while (b < bend) {
      uint64_t gi = GROUP_OF (b);
      uint64_t gend = MIN (bend, (gi + 1) * FSC_GROUP_BLOCKS);
      uint64_t range = group_span_bits (gi, b, gend - 1);
      uint64_t skipped;
      if (reclaim_group (o, fd, base, sums, s, e, gi, range, &skipped) == -1)
        return -1;
      if (o->reclaim.test_walk_delay_ms)
        poll (NULL, 0, o->reclaim.test_walk_delay_ms);
      if (skipped) {
        if (later->n == later->cap) {
          size_t ncap = later->cap ? 2 * later->cap : 16;
          void *v = realloc (later->v, ncap * sizeof *later->v);
          if (v == NULL)
            return -1;
          later->v = v;
          later->cap = ncap;
        }
        later->v[later->n].fd = fd;
        later->v[later->n].base = base;
        later->v[later->n].sums = sums;
        later->v[later->n].gi = gi;
        later->v[later->n].mask = skipped;
        later->n++;
      }
      b = gend;
    }
    off = fe;
  }
}

/* Are blocks MASK of G claimed, or is a write in flight in G (see
 * reclaim_group)?  Caller holds o->lock.
 */
static bool
held (const struct group *g, uint64_t mask)
{
  return (g->fetching & mask) || g->writers > 0;
}

/* The second look at the blocks in LATER: wait for each claim to go,
 * then reclaim the blocks' whole space (a punch over a hole is
 * harmless).  Returns 0, or -1 with errno; stops early like the walk.
 */
static int
reclaim_later (struct fsc_object *o, struct reclaim_later *later)
{
  for (size_t i = 0; i < later->n; ++i) {
    uint64_t gi = later->v[i].gi, mask = later->v[i].mask;
    bool sums = later->v[i].sums;
    pthread_mutex_lock (&o->lock);
    /* The group looked up afresh after each wait: once its claims and
     * writes are gone it may be paged out meanwhile (groups.c, idle).
     */
    struct group *g;
    while ((g = grp (o, gi)) != NULL && held (g, mask) &&
           o->state == FSC_OBJ_AVAILABLE &&
           !o->reclaim.closing && !o->reclaim.stop)
      pthread_cond_wait (&o->cond, &o->lock);
    /* The object is closing and a claim is still held (a fetch from a
     * stalled upstream, say): not waited for; the walk did not finish,
     * and the next open walks again.
     */
    bool abandon = g && held (g, mask) && o->reclaim.closing;
    pthread_mutex_unlock (&o->lock);
    if (abandon)
      return 1;
    if (stopping (o))
      return 0;
    uint64_t b0 = gi * FSC_GROUP_BLOCKS;
    uint64_t b1 = MIN (b0 + FSC_GROUP_BLOCKS, o->geom.nblocks);
    uint64_t s = space_of (o, b0, sums), e = space_of (o, b1, sums);
    uint64_t base = later->v[i].base;
    if (!sums) {
      /* Within this data segment. */
      s = MAX (s, base);
      e = MIN (e, base + FSC_SEG_SIZE);
    }
    uint64_t skipped;
    if (reclaim_group (o, later->v[i].fd, base, sums, s, e, gi, mask,
                       &skipped) == -1)
      return -1;
    if (skipped) {
      /* Claimed again meanwhile: look once more. */
      later->v[i].mask = skipped;
      i--;
    }
  }
  return 0;
}

/* Counted as du counts: a punch inside one filesystem block frees
 * nothing.
 */
int
fsc_reclaim_unnamed (struct fsc_object *o)
{
  /* It punches the files directly: after a clean open (leaked ()) the
   * not-clean mark goes first.
   */
  if (fsc_object_mark_in_use (o) == -1)
    return -1;
  uint64_t before = fsc_object_allocated (o);
  struct reclaim_later later = { 0 };
  int r = 0;
  for (uint64_t i = 0; r == 0 && i < o->files.nseg; ++i)
    r = reclaim_file (o, o->files.dfds[i], i * FSC_SEG_SIZE, false, &later);
  if (r == 0)
    r = reclaim_file (o, o->files.sfd, 0, true, &later);
  if (r == 0)
    r = reclaim_later (o, &later);      /* 1: unfinished, no error */
  int e = errno;
  free (later.v);
  errno = e;
  uint64_t after = fsc_object_allocated (o);
  if (after < before)
    FSC_STAT_ADD (&o->cache->stats, reclaimed_bytes, before - after);
  return r;
}

/* After a clean close: is there clearly more data space than the
 * blocks hold (space an older build leaked, or a punch that failed)?
 * Such space would count against a cap forever and be freed by no
 * eviction.  The walk costs a seek per extent, so it runs only then.
 */
static bool
leaked (struct fsc_object *o)
{
  struct fsc_ostats ost;
  fsc_ostats_snapshot (o, &ost);        /* its gauges: what blocks hold */
  uint64_t held = ost.v[FSC_OSTAT_cached_bytes];
  uint64_t alloc = fsc_data_allocated (o);
  uint64_t margin = MAX (held / 16, 16 * (uint64_t) o->geom.block_size);
  return alloc > held && alloc - held > margin;
}

/* The reclaimer thread: the walk runs after the object is open, beside
 * the requests (reclaim_group), so that the first read after a crash
 * does not wait for it.  Nor does the close of its last user: the
 * object lingers (fsc_reclaim_may_linger), unreferenced, until the walk
 * ends, and this thread closes it then (marking it clean).  An open of
 * it meanwhile takes it back as it is if a lookup would accept it
 * (object.c, lingering_fits: the walk goes on); else it stops the walk,
 * waits for the close and looks it up anew (fsc_reclaim_unlinger): the
 * walk starts over, as after any unclean open.  So a short connection
 * after a crash is not kept waiting at its disconnect for a walk that
 * grows with the cached amount (seconds per GiB of scattered blocks);
 * nor is a clean stop of the process, for more than a second (cache.c,
 * stop_walks: the walk is stopped, the index left unclean, and the
 * next open walks again).
 */
static void *
reclaimer (void *arg)
{
  struct fsc_object *o = arg;
  fsc_thread_name ("fsc-reclaim");
  int r = 0;
  /* Test knob: with NBD_FSCACHE_TEST_RECLAIM_GATE=FILE the walk (and
   * the census) waits until FILE exists, so that a test can count the
   * index reads of an open alone (tests/unit/unit-object.c, paging).
   */
  const char *gate = getenv ("NBD_FSCACHE_TEST_RECLAIM_GATE");
  while (gate && *gate && access (gate, F_OK) == -1 && !stopping (o))
    poll (NULL, 0, 10);
  /* The gauges first: leaked () needs them. */
  if (o->pager.census_next < o->geom.ngroups)
    r = fsc_groups_census (o);
  if (r == 0 && !stopping (o) && (o->reclaim.unclean || leaked (o)))
    r = fsc_reclaim_unnamed (o);    /* 1: not finished */
  pthread_mutex_lock (&o->lock);
  o->reclaim.done = r == 0 && o->state == FSC_OBJ_AVAILABLE &&
    !o->reclaim.stop && o->pager.census_next >= o->geom.ngroups;
  o->reclaim.running = false;
  pthread_cond_broadcast (&o->cond);
  pthread_mutex_unlock (&o->lock);
  o->reclaim.ended (o);             /* may free O */
  return NULL;
}

bool
fsc_reclaim_may_linger (struct fsc_object *o)
{
  /* Not a shell, nor an object that never listens for other
   * processes (writeback's, whose write log is the caller's state, or
   * an offline one).
   */
  if (!o->reclaim.joinable || o->cache->stopping || o->join ||
      o->share == NULL)
    return false;
  SCOPED_LOCK (&o->lock);
  return o->reclaim.running && !o->reclaim.stop &&
    o->state == FSC_OBJ_AVAILABLE;
}

void
fsc_reclaim_stop (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  if (o->reclaim.running) {
    o->reclaim.stop = true;
    pthread_cond_broadcast (&o->cond);
  }
}

void
fsc_reclaim_unlinger (struct fsc_object *o)
{
  o->closing = true;
  fsc_reclaim_stop (o);         /* a lingering object's walk runs */
}

int
fsc_reclaim_start (struct fsc_object *o, bool unclean,
                   fsc_reclaim_ended_fn *ended)
{
  o->reclaim.ended = ended;
  const char *d = getenv ("NBD_FSCACHE_TEST_WALK_DELAY_MS");
  o->reclaim.test_walk_delay_ms = d ? (unsigned) atoi (d) : 0;
  o->reclaim.unclean = unclean;
  o->reclaim.done = false;
  o->reclaim.running = true;
  int e = pthread_create (&o->reclaim.thread, NULL, reclaimer, o);
  if (e != 0) {
    o->reclaim.running = false;
    errno = e;
    return -1;
  }
  o->reclaim.joinable = true;
  return 0;
}

bool
fsc_reclaim_finish (struct fsc_object *o)
{
  if (!o->reclaim.joinable)
    return o->reclaim.done;
  pthread_mutex_lock (&o->lock);
  o->reclaim.closing = true;            /* reclaim_later waits no more */
  pthread_cond_broadcast (&o->cond);
  pthread_mutex_unlock (&o->lock);
  pthread_join (o->reclaim.thread, NULL);
  o->reclaim.joinable = false;
  return o->reclaim.done;
}

void
fsc_object_wait_reclaim (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  while (o->reclaim.running)
    pthread_cond_wait (&o->cond, &o->lock);
}

