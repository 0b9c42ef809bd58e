/* libfscache, host sharing: a joiner's own hits (share-int.h has the
 * overview).
 *
 * A joiner serves a hit itself from the shared files, without a round
 * trip to the owner: checked against a map of the block's group that
 * the owner gave it (what was present, with the checksums) and the
 * epochs the owner bumps (share-epochs.c); sh_direct_read says why
 * that is safe without any lock the owner holds.  Blocks the map shows
 * absent, and any read the checks cannot vouch for, go to the owner.
 * The hits served here are reported to the owner in batches, for its
 * counters and its eviction policy (sh_report_hits).
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "share-int.h"
#include "xxh.h"
#include "utils.h"

/* Our own hits (sh_direct_read) need the epochs, room for maps, and the
 * data and sums files, read-only in spirit (we never write them).
 * Without any of them every read goes to the owner.
 */
void
sh_setup_direct (struct fsc_object *o, struct fsc_join *j)
{
  bool ok;
  if (!sh_file_ids (o, j->ids))
    return;
  j->ep = sh_map_epochs (o, false, false);
  j->maps = malloc (NMAPS * sizeof *j->maps);
  if (j->maps)
    for (size_t i = 0; i < NMAPS; ++i)
      j->maps[i].gi = UINT64_MAX;
  j->seen = calloc (EPOCH_SLOTS, sizeof *j->seen);
  if (j->ep && j->seen)
    for (size_t i = 0; i < EPOCH_SLOTS; ++i)
      j->seen[i] = __atomic_load_n (&j->ep[i], __ATOMIC_RELAXED);
  if (j->ep && j->maps && j->seen && fsc_data_open (o, &ok) == 0 && ok &&
      (o->files.sfd = fsc_open_file (&o->files, ".sums")) >= 0) {
    j->files = true;
    return;
  }
  if (j->ep)
    munmap ((void *) j->ep, EPOCH_SLOTS * sizeof (uint32_t));
  j->ep = NULL;
}

/* Fetch the map of group GI from the owner into our slot.  Returns 0
 * or -1.
 */
static int
fetch_map (struct fsc_object *o, uint64_t gi)
{
  struct fsc_join *j = o->join;
  struct fsc_object *l;
  struct gmap m;
  int fd = sh_get_conn (o, &l), err;
  if (fd < 0)
    return -1;
  if (sh_run (o, fd, MSG_MAP, 0, gi, sizeof m, NULL, 0, &m, NULL, &err,
              NULL) == -1) {
    sh_put_conn (o, fd, false);
    return -1;
  }
  sh_put_conn (o, fd, true);
  if (err || m.gi != gi)
    return -1;
  m.taken_ms = fsc_mono_ms ();
  SCOPED_LOCK (&j->lock);
  j->maps[gi % NMAPS] = m;
  return 0;
}

/* The epochs of the object (*E0) and of groups G0..G1 (at most two,
 * into EG).  They only grow (sh_map_epochs): a slot lower than we saw
 * it was rolled back (a damaged or tampered file), and a map tagged
 * with the lower value might show blocks written since.  Then -1, and
 * no more hits of our own from these files: the owner serves every
 * read.  Else the highest values seen are kept.  Loaded under j->lock,
 * so that two readers' loads are ordered and a slower one is no
 * rollback.
 */
static int
load_epochs (struct fsc_join *j, uint64_t g0, uint64_t g1, uint32_t *e0,
             uint32_t *eg)
{
  SCOPED_LOCK (&j->lock);
  const size_t slots[3] = { 0, sh_slot_of (g0), sh_slot_of (g1) };
  uint32_t vals[3];
  for (int i = 0; i < 3; ++i)
    vals[i] = __atomic_load_n (&j->ep[slots[i]], __ATOMIC_SEQ_CST);
  for (int i = 0; i < 3; ++i)
    if ((int32_t) (vals[i] - j->seen[slots[i]]) < 0) {
      j->direct_off = true;
      for (size_t k = 0; k < NMAPS; ++k)
        j->maps[k].gi = UINT64_MAX;
      return -1;
    }
  for (int i = 0; i < 3; ++i)
    j->seen[slots[i]] = vals[i];
  *e0 = vals[0];
  eg[0] = vals[1];
  eg[g1 - g0] = vals[2];
  return 0;
}

/* The checksums (CSUM) and zero bits (ZERO) of blocks B0..B1 from our
 * maps of their groups, which must be tagged with the epochs E0 and EG
 * (load_epochs).  A map missing or stale is taken again, once.
 * Returns DIRECT_SERVED if the maps show every block present (it may
 * be read here), else what sh_direct_read returns.
 */
static enum direct
map_blocks (struct fsc_object *o, uint64_t b0, uint64_t b1, uint32_t e0,
            const uint32_t *eg, uint64_t *csum, bool *zero)
{
  struct fsc_join *j = o->join;
  const uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  for (int attempt = 0; ; ++attempt) {
    bool stale = false, absent = false;
    pthread_mutex_lock (&j->lock);
    if (j->local || j->broken || j->direct_off || j->watch < 0) {
      pthread_mutex_unlock (&j->lock);
      return DIRECT_NO;
    }
    for (uint64_t gi = g0; gi <= g1 && !stale; ++gi) {
      const struct gmap *m = &j->maps[gi % NMAPS];
      if (m->gi != gi || m->epoch != e0 || m->gepoch != eg[gi - g0]) {
        stale = true;
        break;
      }
      for (uint64_t b = MAX (b0, gi * FSC_GROUP_BLOCKS);
           b <= MIN (b1, gi * FSC_GROUP_BLOCKS + FSC_GROUP_BLOCKS - 1); ++b) {
        uint64_t bit = UINT64_C (1) << IDX_OF (b);
        if (!(m->present & bit) || m->pieces[IDX_OF (b)] != 0) {
          /* The owner serves it (and may fill it): a map older than
           * MAP_FRESH_MS is taken again next time, so that blocks
           * filled since are served here.
           */
          absent = true;
          if (fsc_mono_ms () - m->taken_ms > MAP_FRESH_MS)
            j->maps[gi % NMAPS].gi = UINT64_MAX;
        }
        csum[b - b0] = m->csum[IDX_OF (b)];
        zero[b - b0] = m->zero & bit;
      }
    }
    pthread_mutex_unlock (&j->lock);
    if (!stale) {
      if (absent)
        return DIRECT_ABSENT;
      return DIRECT_SERVED;
    }
    if (attempt > 0)
      return DIRECT_NO;
    for (uint64_t gi = g0; gi <= g1; ++gi)
      if (fetch_map (o, gi) == -1)
        return DIRECT_NO;
  }
}

/* Read [OFFSET, OFFSET+COUNT), blocks B0..B1, from the files into BUF,
 * checked with the maps' CSUM and ZERO (map_blocks).  Returns
 * DIRECT_SERVED if every check passed, else DIRECT_NO.
 */
static enum direct
read_blocks (struct fsc_object *o, void *buf, uint32_t count,
             uint64_t offset, uint64_t b0, uint64_t b1, const uint64_t *csum,
             const bool *zero)
{
  const uint64_t end = offset + count;
  /* Block by block: whole ones straight into BUF, checked with the
   * index checksum; partial ends by sub-blocks, checked with their
   * hashes, which are checked with the index checksum.
   */
  for (uint64_t b = b0; b <= b1; ++b) {
    const uint64_t bs = block_start (&o->geom, b), be = block_end (&o->geom, b);
    const uint64_t lo = MAX (bs, offset), hi = MIN (be, end);
    unsigned char *out = (unsigned char *) buf + (lo - offset);
    if (zero[b - b0]) {
      if (csum[b - b0] != zero_csum (&o->geom, b))
        goto stale;
      memset (out, 0, hi - lo);
      continue;
    }
    if (lo == bs && hi == be) {
      if (fsc_data_pread (o, out, be - bs, bs) != (ssize_t) (be - bs) ||
          fsc_block_csum (out, be - bs) != csum[b - b0])
        goto stale;
      continue;
    }
    if (((lo - bs) & (SUB_SIZE - 1)) ||
        ((hi - bs) & (SUB_SIZE - 1) && hi != be))
      return DIRECT_NO;
    /* The owner's partial-hit check (hit.c): the hashes through
     * io.c, checked with the index checksum, then the sub-blocks
     * served with them.
     */
    const unsigned kb = DIV_ROUND_UP (be - bs, SUB_SIZE);
    uint64_t sums[MAX_SUBS];
    if (fsc_sums_read (&o->cache->io, &o->files, &o->geom, b, kb, sums) !=
        (ssize_t) (8 * kb) ||
        fsc_sums_csum (sums, kb) != csum[b - b0] ||
        fsc_data_pread (o, out, hi - lo, lo) != (ssize_t) (hi - lo) ||
        !fsc_sums_check_subs (sums, (lo - bs) >> SUB_SHIFT, out, hi - lo))
      goto stale;
  }
  return DIRECT_SERVED;

 stale:
  /* A check failed: the block was evicted or is being refilled since
   * the map was taken (or a read failed).  Take the maps again next
   * time, so that a block gone stays with the owner.
   */
  sh_forget_maps (o, offset, count);
  return DIRECT_NO;
}

/* Nothing changed meanwhile (the epochs of the object, E0, and of
 * groups G0..G1, EG), and the owner that gave the maps is still there
 * (else the owner, or its successor, serves it).  Once is enough, at
 * the end: a watch that has not ended now had not ended when the read
 * began either.
 */
static bool
unchanged (struct fsc_join *j, uint64_t g0, uint64_t g1, uint32_t e0,
           const uint32_t *eg)
{
  if (__atomic_load_n (&j->ep[0], __ATOMIC_SEQ_CST) != e0)
    return false;
  for (uint64_t gi = g0; gi <= g1; ++gi)
    if (__atomic_load_n (&j->ep[sh_slot_of (gi)], __ATOMIC_SEQ_CST) !=
        eg[gi - g0])
      return false;
  pthread_mutex_lock (&j->lock);
  bool alive = sh_owner_alive_locked (j);
  pthread_mutex_unlock (&j->lock);
  return alive;
}

/* A hit of COUNT bytes, blocks B0..B1, served here: counted, and kept
 * for the owner's counters and policy (sh_report_hits).
 */
static void
note_hit (struct fsc_object *o, uint64_t b0, uint64_t b1, uint32_t count,
          unsigned flags)
{
  struct fsc_join *j = o->join;
  FSC_STAT_ADD (&o->cache->stats, share_direct_bytes, count);
  FSC_STAT_ADD (&o->cache->stats, hit_bytes, count);
  /* For the owner's counters and policy: a stream's hits are no
   * references there either.
   */
  bool full;
  pthread_mutex_lock (&j->lock);
  j->hit_requests++;
  j->hit_bytes += count;
  for (uint64_t b = b0; b <= b1 && !(flags & FSC_READ_SEQUENTIAL) &&
         j->nrefs < REF_BATCH; ++b)
    j->refs[j->nrefs++] = b;
  full = j->nrefs >= REF_BATCH || j->hit_requests >= MAX_REF_REQUESTS;
  pthread_mutex_unlock (&j->lock);
  if (full)
    sh_report_hits (o, false);
}

/* Serve a read from the shared files ourselves, without asking the
 * owner: the hit path of a joiner.  Safe without any lock the owner
 * holds because
 *  - what we serve is checked against the checksums of the group's
 *    map (the owner's index checksums, and for a block read in part
 *    its sub-block hashes from the sums file): a block evicted since
 *    (a hole) or being refilled fails the check;
 *  - a write changes a block's contents: the owner drops the block and
 *    then bumps its group's epoch before the write goes upstream
 *    (fsc_share_bump), so a map showing the old contents is stale
 *    before the write can be acknowledged; the epochs are read before
 *    and after our read, as a seqlock's readers do;
 *  - a withdrawal or a new owner bumps the object's epoch.
 * Returns DIRECT_SERVED; or (and nothing is known of BUF) if the owner
 * must serve it, DIRECT_ABSENT (a block not present or held in pieces
 * in our map) or DIRECT_NO (a read not aligned to sub-blocks at a
 * partial end, a check failing, a map we could not get).
 */
enum direct
sh_direct_read (struct fsc_object *o, void *buf, uint32_t count,
                uint64_t offset, unsigned flags)
{
  struct fsc_join *j = o->join;
  uint64_t end;
  if (j->ep == NULL || count == 0 ||
      ADD_OVERFLOW (offset, (uint64_t) count, &end) || end > o->geom.size)
    return DIRECT_NO;
  const uint64_t b0 = offset >> o->geom.bshift,
    b1 = (end - 1) >> o->geom.bshift;
  const uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  if (b1 - b0 >= FSC_GROUP_BLOCKS)
    return DIRECT_NO;                       /* spans at most two groups */

  uint32_t e0, eg[2];
  if (load_epochs (j, g0, g1, &e0, eg) == -1)
    return DIRECT_NO;

  uint64_t csum[FSC_GROUP_BLOCKS];
  bool zero[FSC_GROUP_BLOCKS];
  enum direct d = map_blocks (o, b0, b1, e0, eg, csum, zero);
  if (d != DIRECT_SERVED)
    return d;
  if (read_blocks (o, buf, count, offset, b0, b1, csum, zero) !=
      DIRECT_SERVED || !unchanged (j, g0, g1, e0, eg))
    return DIRECT_NO;
  note_hit (o, b0, b1, count, flags);
  return DIRECT_SERVED;
}

/* Send the hits served here to the owner (note_refs): when REF_BATCH
 * blocks are waiting, or with FORCE (closing).  Best effort: lost
 * reports cost only counts and second chances.
 */
void
sh_report_hits (struct fsc_object *o, bool force)
{
  struct fsc_join *j = o->join;
  uint64_t v[REF_BATCH + 2];
  pthread_mutex_lock (&j->lock);
  /* Closing, only on a socket already open: a report is not worth
   * connecting to, nor taking over, an owner.
   */
  if (j->hit_requests == 0 ||
      (!force && j->nrefs < REF_BATCH && j->hit_requests < MAX_REF_REQUESTS) ||
      j->local || j->broken || (force && j->nidle == 0)) {
    pthread_mutex_unlock (&j->lock);
    return;
  }
  v[0] = j->hit_requests;
  v[1] = j->hit_bytes;
  memcpy (&v[2], j->refs, j->nrefs * sizeof *v);
  size_t n = 2 + j->nrefs;
  j->hit_requests = j->hit_bytes = 0;
  j->nrefs = 0;
  pthread_mutex_unlock (&j->lock);

  struct fsc_object *l;
  int fd = sh_get_conn (o, &l), err;
  if (fd < 0)
    return;
  sh_put_conn (o, fd, sh_run (o, fd, MSG_REF, 0, 0, n * 8, v, n * 8, NULL,
                              NULL, &err, NULL) == 0);
}

/* The owner served [OFFSET, OFFSET+COUNT) from its cache: our maps of
 * those groups are out of date (they did not show it all present), and
 * are taken again at the next read.
 */
void
sh_forget_maps (struct fsc_object *o, uint64_t offset, uint32_t count)
{
  struct fsc_join *j = o->join;
  if (j->maps == NULL || count == 0)
    return;
  uint64_t g0 = GROUP_OF (offset >> o->geom.bshift);
  uint64_t g1 = GROUP_OF ((offset + count - 1) >> o->geom.bshift);
  SCOPED_LOCK (&j->lock);
  for (uint64_t gi = g0; gi <= g1 && gi - g0 < NMAPS; ++gi)
    if (j->maps[gi % NMAPS].gi == gi)
      j->maps[gi % NMAPS].gi = UINT64_MAX;
}
