/* libfscache: objects and the operations on them.
 *
 * An object is the cached copy of one upstream export: a sparse data
 * file the size of the export (holes = not cached), a sums file with
 * the XXH3-64 hash of every 4 KiB sub-block of each cached block, and
 * an index (index.h) that records which blocks are present and, for
 * each, the XXH3-64 of its sub-block hashes.  A hit on a whole block
 * hashes what it read; a hit on part of a block reads that block's
 * sub-block hashes, checks them against the index, and then reads and
 * checks only the 4 KiB pieces it serves, so a 4 KiB read of a 64 KiB
 * block costs 4 KiB of reading and hashing, not 64.  In memory, blocks are grouped by 64 (struct
 * group, allocated on first use) with three bitmaps each:
 *
 *   present    block may be served from the data file now
 *   fetching   a thread has claimed the block to fill it; others that
 *              miss on it wait for that fetch instead of repeating it
 *   disk_max   block may be marked present in a record on disk (the
 *              newest durable one, or one being written)
 *
 * Ordering rules that make the cache crash safe:
 *  1. A fill writes the data, then marks the block present in memory
 *     and the group dirty.  A commit syncs the data file before it
 *     writes any record naming that data, then syncs the index.
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
 * An object held by another process is served uncached here; a write
 * through it leaves a mark (NAME.stale) beside the object's files, and
 * the holder withdraws its copy when it sees the mark: at open, at
 * close and every commit interval.
 *
 * Errors of the cache's own files withdraw the object (files unlinked
 * so that nothing stale survives, every request then goes upstream);
 * ENOSPC on a fill only stops fills for a while.  Upstream errors go
 * back to the caller.
 *
 * obj->lock guards all in-memory state and is never held across I/O.
 * Commits and superblock writes serialise on obj->committing.
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
#include <xxhash.h>

#include "internal.h"
#include "utils.h"

#define MAX_FETCH_BYTES (4u << 20)      /* one upstream read at most */
#define MAX_RUN_BLOCKS 1024             /* 4 MiB of 4K blocks */
#define MAX_RUN_GROUPS (MAX_RUN_BLOCKS / FSC_GROUP_BLOCKS + 2)
_Static_assert (MAX_RUN_GROUPS <= FSC_FILL_MAX_GROUPS,
                "a fill job must hold a whole run's epochs");
#define DIRTY_KICK 256                  /* dirty groups that wake the
                                         * committer early */
#define NOFILL_SECONDS 10               /* pause after ENOSPC */
#define SUB_SHIFT 12                    /* 4 KiB sub-blocks */
#define SUB_SIZE (UINT64_C (1) << SUB_SHIFT)
#define MAX_SUBS (FSC_MAX_BLOCK_SIZE >> SUB_SHIFT)

#define GROUP_OF(b) ((b) / FSC_GROUP_BLOCKS)
#define BIT_OF(b) (UINT64_C (1) << ((b) % FSC_GROUP_BLOCKS))
#define IDX_OF(b) ((b) % FSC_GROUP_BLOCKS)

static uint64_t
block_start (const struct fsc_object *o, uint64_t b)
{
  return b << o->bshift;
}

/* End (exclusive) of block B; the last block may be short. */
static uint64_t
block_end (const struct fsc_object *o, uint64_t b)
{
  return MIN ((b + 1) << o->bshift, o->size);
}

/* Sub-blocks per block, and the offset of block B's hashes in the
 * sums file.
 */
static unsigned
subs_per_block (const struct fsc_object *o)
{
  return o->block_size >> SUB_SHIFT;
}

static uint64_t
sums_offset (const struct fsc_object *o, uint64_t b)
{
  return b * subs_per_block (o) * 8;
}

/* Hash each 4 KiB sub-block of LEN bytes at P into OUT; returns how
 * many (the last may be short).
 */
static unsigned
sub_hashes (const unsigned char *p, uint64_t len, uint64_t *out)
{
  unsigned k = 0;
  for (uint64_t off = 0; off < len; off += SUB_SIZE)
    out[k++] = XXH3_64bits (p + off, MIN (SUB_SIZE, len - off));
  return k;
}

/* The checksum the index keeps for a block: XXH3-64 of its K sub-block
 * hashes as little-endian bytes.
 */
static uint64_t
sums_csum (const uint64_t *sums, unsigned k)
{
  unsigned char le[8 * MAX_SUBS];
  for (unsigned i = 0; i < k; ++i)
    put_le64 (le + 8 * i, sums[i]);
  return XXH3_64bits (le, 8 * k);
}

/* Index checksum of a whole block of LEN bytes at P. */
static uint64_t
block_csum (const unsigned char *p, uint64_t len)
{
  uint64_t sums[MAX_SUBS];
  return sums_csum (sums, sub_hashes (p, len, sums));
}

/* The group of block B, allocated if ALLOC.  Caller holds o->lock. */
static struct group *
group_of (struct fsc_object *o, uint64_t b, bool alloc)
{
  uint64_t gi = GROUP_OF (b);
  struct group *g = o->groups[gi];
  if (g == NULL && alloc) {
    g = calloc (1, sizeof *g);
    o->groups[gi] = g;
  }
  return g;
}

static bool
present (struct fsc_object *o, uint64_t b)
{
  struct group *g = o->groups[GROUP_OF (b)];
  return g && (g->present & BIT_OF (b));
}

/* Queue group GI for the next commit.  Caller holds o->lock. */
static int
mark_dirty (struct fsc_object *o, uint64_t gi, struct group *g)
{
  o->change_seq++;
  if (g->dirty)
    return 0;
  if (o->ndirty == o->dirty_cap) {
    size_t ncap = o->dirty_cap ? o->dirty_cap * 2 : 64;
    uint64_t *p = realloc (o->dirty, ncap * sizeof *p);
    if (p == NULL)
      return -1;
    o->dirty = p;
    o->dirty_cap = ncap;
  }
  o->dirty[o->ndirty++] = gi;
  g->dirty = true;
  return 0;
}

/* The name of the object's file with SUFFIX (".idx", ".data", ".sums",
 * ".stale") in its fan-out directory, in BUF.
 */
#define FILE_NAME_MAX (FSC_NAME_MAX + 8)
static const char *
file_name (const struct fsc_object *o, const char *suffix,
           char buf[FILE_NAME_MAX])
{
  snprintf (buf, FILE_NAME_MAX, "%s%s", o->name, suffix);
  return buf;
}

static void
unlink_file (const struct fsc_object *o, const char *suffix)
{
  char buf[FILE_NAME_MAX];
  unlinkat (o->fandirfd, file_name (o, suffix, buf), 0);
}

static void
withdraw (struct fsc_object *o, int err)
{

  pthread_mutex_lock (&o->lock);
  if (o->state == FSC_OBJ_WITHDRAWN) {
    pthread_mutex_unlock (&o->lock);
    return;
  }
  o->state = FSC_OBJ_WITHDRAWN;
  o->withdraw_err = err;
  o->notices |= FSC_NOTICE_WITHDRAWN;
  pthread_cond_broadcast (&o->cond);
  pthread_mutex_unlock (&o->lock);

  FSC_STAT_ADD (&o->cache->stats, withdrawals, 1);
  /* The index may name blocks whose upstream content will change while
   * we are not tracking writes any more: remove it so that nobody can
   * trust it later.  Best effort: if even unlink fails the disk is
   * gone, and the next open will validate whatever is left.
   */
  if (o->fandirfd >= 0) {
    unlink_file (o, ".idx");
    unlink_file (o, ".data");
    unlink_file (o, ".sums");
    unlink_file (o, ".stale");
  }
}

/* Does the stale mark exist? */
static bool
stale_marked (struct fsc_object *o)
{
  char buf[FILE_NAME_MAX];
  return o->fandirfd >= 0 &&
    faccessat (o->fandirfd, file_name (o, ".stale", buf), F_OK,
               AT_SYMLINK_NOFOLLOW) == 0;
}

/* We write upstream while another process holds this object: tell it
 * its copy is stale.  Best effort (if we cannot, its fingerprint check
 * at the next open is what is left).
 */
static void
mark_stale (struct fsc_object *o)
{
  char buf[FILE_NAME_MAX];
  int fd = openat (o->fandirfd, file_name (o, ".stale", buf),
                   O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    fsync (fd);
    close (fd);
    fsync (o->fandirfd);
  }
}

bool
fsc_object_check_stale (struct fsc_object *o)
{
  if (fsc_object_state (o) != FSC_OBJ_AVAILABLE || !stale_marked (o))
    return false;
  withdraw (o, ESTALE);         /* also removes the mark */
  return true;
}

/* Handle a failed write to the data file. */
static void
fill_failed (struct fsc_object *o, int err)
{
  FSC_STAT_ADD (&o->cache->stats, fill_errors, 1);
  if (err == ENOSPC || err == EDQUOT) {
    FSC_STAT_ADD (&o->cache->stats, nofill_events, 1);
    pthread_mutex_lock (&o->lock);
    if (time (NULL) >= o->nofill_until)
      o->notices |= FSC_NOTICE_NOFILL;
    o->nofill_until = time (NULL) + NOFILL_SECONDS;
    pthread_mutex_unlock (&o->lock);
  }
  else
    withdraw (o, err);
}

/*----------------------------------------------------------------------
 * Commits.
 */

/* Wait for and take the right to write to the index.  Holds o->lock. */
static void
io_claim (struct fsc_object *o)
{
  while (o->committing)
    pthread_cond_wait (&o->cond, &o->lock);
  o->committing = true;
}

static void
io_release (struct fsc_object *o)
{
  o->committing = false;
  pthread_cond_broadcast (&o->cond);
}

/* Write o->sb (after EDIT changed it under the lock) into the other
 * slot and sync.  Returns 0 or -1 (object withdrawn).
 */
static int
write_sb (struct fsc_object *o, uint32_t set_flags, uint32_t clear_flags,
          const uint64_t *fingerprint)
{
  unsigned char buf[FSC_SB_SIZE];

  pthread_mutex_lock (&o->lock);
  if (o->state == FSC_OBJ_WITHDRAWN) {
    pthread_mutex_unlock (&o->lock);
    return -1;
  }
  io_claim (o);
  o->sb.flags = (o->sb.flags | set_flags) & ~clear_flags;
  if (fingerprint)
    o->sb.fingerprint = *fingerprint;
  o->sb.seq = ++o->seq;
  int slot = 1 - o->sb_slot;
  fsc_sb_encode (&o->sb, buf);
  pthread_mutex_unlock (&o->lock);

  int r = fsc_io_pwrite (&o->cache->io, FSC_FILE_INDEX, o->ifd, buf,
                         FSC_SB_SIZE, (uint64_t) slot * FSC_SB_SIZE);
  if (r == 0)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_INDEX, o->ifd);
  int e = errno;

  pthread_mutex_lock (&o->lock);
  if (r == 0)
    o->sb_slot = slot;
  io_release (o);
  pthread_mutex_unlock (&o->lock);
  if (r == -1) {
    FSC_STAT_ADD (&o->cache->stats, commit_errors, 1);
    withdraw (o, e);
  }
  return r;
}

/* Make every change up to TARGET durable: return at once if it is,
 * wait for a commit in progress and look again (group commit: it may
 * cover us), else commit everything changed so far.  Returns 0, or -1
 * if the object is (or became) withdrawn.
 */
static int
commit_upto (struct fsc_object *o, uint64_t target)
{
  struct fsc_stats *st = &o->cache->stats;

  pthread_mutex_lock (&o->lock);
  for (;;) {
    if (o->state != FSC_OBJ_AVAILABLE) {
      pthread_mutex_unlock (&o->lock);
      return -1;
    }
    if (o->durable_seq >= target) {
      pthread_mutex_unlock (&o->lock);
      return 0;
    }
    if (!o->committing)
      break;
    pthread_cond_wait (&o->cond, &o->lock);
  }
  o->committing = true;
  target = o->change_seq;

  size_t n = o->ndirty;
  uint64_t *gis = o->dirty;
  o->dirty = NULL;
  o->ndirty = o->dirty_cap = 0;
  unsigned char *recs = n ? malloc (n * FSC_GREC_SIZE) : NULL;
  uint8_t *slots = n ? malloc (n) : NULL;
  uint64_t *written = n ? malloc (n * sizeof *written) : NULL;
  if (n && (!recs || !slots || !written)) {
    io_release (o);
    pthread_mutex_unlock (&o->lock);
    free (gis); free (recs); free (slots); free (written);
    withdraw (o, ENOMEM);
    return -1;
  }
  for (size_t i = 0; i < n; ++i) {
    struct group *g = o->groups[gis[i]];
    struct fsc_grec rec = {
      .group = gis[i], .seq = ++o->seq,
      .incarnation = o->sb.incarnation, .present = g->present,
    };
    for (int j = 0; j < FSC_GROUP_BLOCKS; ++j)
      rec.csum[j] = (g->present >> j) & 1 ? g->csum[j] : 0;
    fsc_grec_encode (&rec, recs + i * FSC_GREC_SIZE);
    slots[i] = g->has_record ? 1 - g->slot : 0;
    written[i] = g->present;
    g->disk_max |= g->present;
    g->dirty = false;
  }
  bool dsync = o->data_dirty;
  o->data_dirty = false;
  pthread_mutex_unlock (&o->lock);

  /* Rule 1: data before the records that name it. */
  int r = 0;
  if (dsync)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_DATA, o->dfd);
  if (dsync && r == 0)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_SUMS, o->sfd);
  for (size_t i = 0; r == 0 && i < n; ++i)
    r = fsc_io_pwrite (&o->cache->io, FSC_FILE_INDEX, o->ifd,
                       recs + i * FSC_GREC_SIZE, FSC_GREC_SIZE,
                       fsc_grec_offset (gis[i], slots[i]));
  if (r == 0 && n > 0)
    r = fsc_io_sync (&o->cache->io, FSC_FILE_INDEX, o->ifd);
  int e = errno;

  pthread_mutex_lock (&o->lock);
  if (r == 0) {
    for (size_t i = 0; i < n; ++i) {
      struct group *g = o->groups[gis[i]];
      g->slot = slots[i];
      g->has_record = true;
      g->disk_max = written[i];
    }
    o->durable_seq = MAX (o->durable_seq, target);
  }
  io_release (o);
  pthread_mutex_unlock (&o->lock);
  free (gis); free (recs); free (slots); free (written);

  FSC_STAT_ADD (st, commits, 1);
  if (r == -1) {
    FSC_STAT_ADD (st, commit_errors, 1);
    withdraw (o, e);
    return -1;
  }
  return 0;
}

int
fsc_object_commit (struct fsc_object *o)
{
  pthread_mutex_lock (&o->lock);
  uint64_t now = o->change_seq;
  pthread_mutex_unlock (&o->lock);
  return commit_upto (o, now);
}

bool
fsc_object_has_dirty (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  return o->state == FSC_OBJ_AVAILABLE && o->durable_seq < o->change_seq;
}

/* Make sure the index has room for the records of groups G0..G1 so
 * that a commit never fails for want of space.  Returns 0 or -1.
 */
static int
reserve_groups (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    pthread_mutex_lock (&o->lock);
    bool done = o->groups[gi] && o->groups[gi]->reserved;
    pthread_mutex_unlock (&o->lock);
    if (done)
      continue;
    int r = posix_fallocate (o->ifd, fsc_grec_offset (gi, 0),
                             2 * FSC_GREC_SIZE);
    if (r != 0 && r != EOPNOTSUPP && r != EINVAL) {
      errno = r;
      return -1;
    }
    pthread_mutex_lock (&o->lock);
    if (o->groups[gi])
      o->groups[gi]->reserved = true;
    pthread_mutex_unlock (&o->lock);
  }
  return 0;
}

/*----------------------------------------------------------------------
 * Reads.
 */

enum run_kind { RUN_HIT, RUN_MISS, RUN_UNCACHED };

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

/* Block BAD failed its checksum: drop it (if nobody changed it
 * meanwhile) so that the caller refetches it from upstream.
 */
static void
drop_bad (struct fsc_object *o, uint64_t bad, uint64_t csum)
{
  FSC_STAT_ADD (&o->cache->stats, verify_failures, 1);
  pthread_mutex_lock (&o->lock);
  struct group *g = group_of (o, bad, false);
  if (g && (g->present & BIT_OF (bad)) && g->csum[IDX_OF (bad)] == csum) {
    g->present &= ~BIT_OF (bad);
    if (mark_dirty (o, GROUP_OF (bad), g) == -1) {
      pthread_mutex_unlock (&o->lock);
      withdraw (o, ENOMEM);
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
  withdraw (o, r == -1 ? errno : EIO);
}

/* Serve the part [LO, HI) of present block BLK, which does not cover
 * all of it, into BUF (the client's window starts at OFFSET).  Returns
 * true if served.
 */
static bool
hit_partial (struct fsc_object *o, uint64_t blk, void *buf, uint64_t offset,
             uint64_t lo, uint64_t hi, uint64_t csum)
{
  struct fsc_io *io = &o->cache->io;
  unsigned char *out = (unsigned char *) buf + (lo - offset);
  const uint64_t bs = block_start (o, blk), be = block_end (o, blk);
  ssize_t r;

  if (!o->verify) {
    r = fsc_io_pread (io, FSC_FILE_DATA, o->dfd, out, hi - lo, lo);
    if (r != (ssize_t) (hi - lo)) {
      read_failed (o, r);
      return false;
    }
    return true;
  }

  /* The block's sub-block hashes, checked against the index. */
  const unsigned kb = DIV_ROUND_UP (be - bs, SUB_SIZE);
  unsigned char le[8 * MAX_SUBS];
  uint64_t sums[MAX_SUBS];
  r = fsc_io_pread (io, FSC_FILE_SUMS, o->sfd, le, 8 * kb,
                    sums_offset (o, blk));
  if (r == -1) {
    read_failed (o, r);
    return false;
  }
  memset (le + r, 0, 8 * kb - r);       /* short: fails the check */
  for (unsigned i = 0; i < kb; ++i)
    sums[i] = get_le64 (le + 8 * i);
  if (sums_csum (sums, kb) != csum) {
    drop_bad (o, blk, csum);
    return false;
  }

  /* Only the sub-blocks we serve. */
  const uint64_t s0 = (lo - bs) >> SUB_SHIFT, s1 = (hi - 1 - bs) >> SUB_SHIFT;
  const uint64_t ds = bs + (s0 << SUB_SHIFT);
  const uint64_t de = MIN (bs + ((s1 + 1) << SUB_SHIFT), be);
  unsigned char *tmp = fsc_scratch (o->cache, de - ds);
  if (tmp == NULL) {
    /* No memory for a bounce buffer: serve this object uncached
     * rather than spin on the same block.
     */
    withdraw (o, ENOMEM);
    return false;
  }
  r = fsc_io_pread (io, FSC_FILE_DATA, o->dfd, tmp, de - ds, ds);
  if (r != (ssize_t) (de - ds)) {
    read_failed (o, r);
    return false;
  }
  for (uint64_t i = s0; i <= s1; ++i) {
    uint64_t so = (i - s0) << SUB_SHIFT;
    if (XXH3_64bits (tmp + so, MIN (SUB_SIZE, de - ds - so)) != sums[i]) {
      drop_bad (o, blk, csum);
      return false;
    }
  }
  memcpy (out, tmp + (lo - ds), hi - lo);
  return true;
}

/* Serve N present blocks from B.  Returns how many were served; fewer
 * than N means block B+return failed its checksum or could not be read
 * and is no longer present (or the object was withdrawn).
 */
static uint64_t
hit_run (struct fsc_object *o, uint64_t b, uint64_t n, void *buf,
         uint64_t offset, uint32_t count, const uint64_t *csums)
{
  struct fsc_stats *st = &o->cache->stats;
  const uint64_t wend = offset + count;
  const uint64_t start = block_start (o, b), end = block_end (o, b + n - 1);

  if (start >= offset && end <= wend) {
    /* Whole blocks: one read straight into the client's buffer. */
    unsigned char *dst = (unsigned char *) buf + (start - offset);
    ssize_t r = fsc_io_pread (&o->cache->io, FSC_FILE_DATA, o->dfd, dst,
                              end - start, start);
    if (r != (ssize_t) (end - start)) {
      read_failed (o, r);
      return 0;
    }
    uint64_t good = n;
    for (uint64_t i = 0; o->verify && i < n; ++i) {
      uint64_t bs = block_start (o, b + i), be = block_end (o, b + i);
      if (block_csum (dst + (bs - start), be - bs) != csums[i]) {
        drop_bad (o, b + i, csums[i]);
        good = i;
        break;
      }
    }
    FSC_STAT_ADD (st, hit_bytes,
                  (good == n ? end : block_start (o, b + good)) - start);
    return good;
  }

  /* The window starts or ends inside the run: block by block. */
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t bs = block_start (o, b + i), be = block_end (o, b + i);
    uint64_t lo = MAX (bs, offset), hi = MIN (be, wend);
    if (lo == bs && hi == be) {
      if (hit_run (o, b + i, 1, buf, offset, count, &csums[i]) == 0)
        return i;
      continue;
    }
    if (!hit_partial (o, b + i, buf, offset, lo, hi, csums[i]))
      return i;
    FSC_STAT_ADD (st, hit_bytes, hi - lo);
  }
  return n;
}

/* Write NB blocks from BLK (their bytes at SRC) and their sub-block
 * hashes into the cache files, and compute their index checksums into
 * CSUMS.  Returns 0 or -1 with errno.
 */
static int
store_blocks (struct fsc_object *o, uint64_t blk, uint64_t nb,
              const unsigned char *src, uint64_t *csums)
{
  const unsigned k = subs_per_block (o);
  const uint64_t s = block_start (o, blk), e = block_end (o, blk + nb - 1);
  uint64_t sums[MAX_SUBS];
  CLEANUP_FREE unsigned char *le = calloc (nb * k, 8);

  if (le == NULL)
    return -1;
  for (uint64_t i = 0; i < nb; ++i) {
    uint64_t bs = block_start (o, blk + i), be = block_end (o, blk + i);
    unsigned kb = sub_hashes (src + (bs - s), be - bs, sums);
    for (unsigned j = 0; j < kb; ++j)
      put_le64 (le + 8 * (i * k + j), sums[j]);
    csums[i] = sums_csum (sums, kb);
  }
  if (fsc_io_pwrite (&o->cache->io, FSC_FILE_DATA, o->dfd, src, e - s, s)
      == -1 ||
      fsc_io_pwrite (&o->cache->io, FSC_FILE_SUMS, o->sfd, le, nb * k * 8,
                     sums_offset (o, blk)) == -1)
    return -1;
  FSC_STAT_ADD (&o->cache->stats, fill_bytes, e - s);
  return 0;
}

/* Store N claimed blocks from B (their bytes at DATA) in the cache and
 * publish them if nothing invalidated them since they were claimed
 * (EPOCHS, one per group from B's); release the claims either way.
 */
static void
fill_blocks (struct fsc_object *o, uint64_t b, uint64_t n,
             const unsigned char *data, const uint64_t *epochs)
{
  const uint64_t g0 = GROUP_OF (b), g1 = GROUP_OF (b + n - 1);
  uint64_t csums[MAX_RUN_BLOCKS];
  bool fill_ok = false;

  if (data != NULL) {
    if (reserve_groups (o, g0, g1) == -1 ||
        store_blocks (o, b, n, data, csums) == -1)
      fill_failed (o, errno);
    else
      fill_ok = true;
  }

  bool kick = false;
  pthread_mutex_lock (&o->lock);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t blk = b + i;
    struct group *g = group_of (o, blk, false);
    g->fetching &= ~BIT_OF (blk);
    if (fill_ok && o->state == FSC_OBJ_AVAILABLE &&
        g->epoch == epochs[GROUP_OF (blk) - g0]) {
      g->present |= BIT_OF (blk);
      g->csum[IDX_OF (blk)] = csums[i];
      o->data_dirty = true;
      if (mark_dirty (o, GROUP_OF (blk), g) == -1)
        fill_ok = false;
    }
  }
  kick = o->ndirty >= DIRTY_KICK;
  pthread_cond_broadcast (&o->cond);
  pthread_mutex_unlock (&o->lock);
  if (kick)
    fsc_cache_kick (o->cache);
}

void
fsc_fill_run (struct fsc_fill *f)
{
  fill_blocks (f->obj, f->block, f->nblocks, f->data, f->epochs);
}

/* Fetch N claimed blocks from B upstream, give the client its part,
 * and fill the cache: in the background when the cache's fill thread
 * runs and has room, so that the reply does not wait for local writes
 * (others missing on these blocks wait for the fill as for a fetch);
 * else here.  EPOCHS holds the claim epoch of each group from B's.
 * Returns 0 or -1 (upstream error).
 */
static int
fetch_run (struct fsc_object *o, uint64_t b, uint64_t n, void *buf,
           uint64_t offset, uint32_t count, const struct fsc_upstream *up,
           const uint64_t *epochs)
{
  struct fsc_stats *st = &o->cache->stats;
  uint64_t start = block_start (o, b), end = block_end (o, b + n - 1);
  uint64_t len = end - start;
  bool direct = buf && start >= offset && end <= offset + count;
  /* The fill job owns its buffer: read straight into the client's
   * buffer only when the fill will not need it afterwards.
   */
  struct fsc_fill *f = fsc_fill_new (o->cache, len);
  unsigned char *dst = f ? f->data
    : direct ? (unsigned char *) buf + (start - offset) : malloc (len);
  int r = -1, e = ENOMEM;

  if (dst != NULL) {
    r = up->pread (up->opaque, dst, len, start);
    e = errno;
    FSC_STAT_ADD (st, upstream_reads, 1);
    if (r == 0)
      FSC_STAT_ADD (st, upstream_read_bytes, len);
  }
  if (r == 0) {
    if (buf) {
      if (dst != (unsigned char *) buf + (start - offset))
        copy_out (buf, offset, count, dst, start, end);
      FSC_STAT_ADD (st, miss_bytes, overlap (start, end, offset, count));
    }
    else
      FSC_STAT_ADD (st, prefetch_bytes, len);
  }

  if (f && r == 0) {
    f->block = b;
    f->nblocks = n;
    memcpy (f->epochs, epochs, (GROUP_OF (b + n - 1) - GROUP_OF (b) + 1)
            * sizeof *epochs);
    fsc_fill_submit (o->cache, o, f);       /* takes a reference on O */
  }
  else {
    fill_blocks (o, b, n, r == 0 ? dst : NULL, epochs);
    if (f)
      fsc_fill_free (o->cache, f);
    else if (!direct)
      free (dst);
  }
  if (r == -1)
    errno = e;
  return r;
}

/* The read path shared by reads (BUF != NULL) and prefetch. */
static int
do_read (struct fsc_object *o, void *buf, uint32_t count, uint64_t offset,
         const struct fsc_upstream *up)
{
  struct fsc_stats *st = &o->cache->stats;
  uint64_t end;

  if (count == 0)
    return 0;
  if (ADD_OVERFLOW (offset, (uint64_t) count, &end) || end > o->size) {
    errno = EINVAL;
    return -1;
  }

  const uint64_t last = (end - 1) >> o->bshift;
  const uint64_t max_run =
    MAX (1, MIN ((uint64_t) MAX_RUN_BLOCKS, MAX_FETCH_BYTES >> o->bshift));
  const uint64_t max_hit = MIN (max_run, (uint64_t) FSC_GROUP_BLOCKS);
  uint64_t b = offset >> o->bshift;

  while (b <= last) {
    uint64_t csums[FSC_GROUP_BLOCKS];
    uint64_t epochs[MAX_RUN_GROUPS];
    enum run_kind kind;
    uint64_t n = 1;

    pthread_mutex_lock (&o->lock);
    if (o->state != FSC_OBJ_AVAILABLE) {
      kind = RUN_UNCACHED;
      n = last - b + 1;
    }
    else if (present (o, b)) {
      kind = RUN_HIT;
      csums[0] = o->groups[GROUP_OF (b)]->csum[IDX_OF (b)];
      while (b + n <= last && n < max_hit && present (o, b + n)) {
        csums[n] = o->groups[GROUP_OF (b + n)]->csum[IDX_OF (b + n)];
        n++;
      }
    }
    else {
      struct group *g = group_of (o, b, true);
      if (g && (g->fetching & BIT_OF (b)) && buf == NULL) {
        /* Prefetch: somebody is already fetching it. */
        pthread_mutex_unlock (&o->lock);
        b++;
        continue;
      }
      if (g && (g->fetching & BIT_OF (b))) {
        /* Somebody is fetching it: wait for that, then look again. */
        FSC_STAT_ADD (st, dedup_waits, 1);
        while (o->state == FSC_OBJ_AVAILABLE && (g->fetching & BIT_OF (b)))
          pthread_cond_wait (&o->cond, &o->lock);
        pthread_mutex_unlock (&o->lock);
        continue;
      }
      if (g == NULL || time (NULL) < o->nofill_until) {
        kind = RUN_UNCACHED;
        while (b + n <= last && n < max_run && !present (o, b + n))
          n++;
      }
      else {
        kind = RUN_MISS;
        const uint64_t g0 = GROUP_OF (b);
        g->fetching |= BIT_OF (b);
        epochs[0] = claim_epoch (g);
        while (b + n <= last && n < max_run) {
          uint64_t nb = b + n;
          struct group *ng = group_of (o, nb, true);
          if (ng == NULL || (ng->present & BIT_OF (nb)) ||
              (ng->fetching & BIT_OF (nb)))
            break;
          ng->fetching |= BIT_OF (nb);
          epochs[GROUP_OF (nb) - g0] = claim_epoch (ng);
          n++;
        }
      }
    }
    pthread_mutex_unlock (&o->lock);

    switch (kind) {
    case RUN_HIT:
      if (buf)
        b += hit_run (o, b, n, buf, offset, count, csums);
      else
        b += n;
      break;

    case RUN_MISS:
      if (fetch_run (o, b, n, buf, offset, count, up, epochs) == -1)
        return -1;
      b += n;
      break;

    case RUN_UNCACHED:
      if (buf) {
        uint64_t lo = MAX (block_start (o, b), offset);
        uint64_t hi = MIN (block_end (o, b + n - 1), end);
        int r = up->pread (up->opaque, (unsigned char *) buf + (lo - offset),
                           hi - lo, lo);
        FSC_STAT_ADD (st, upstream_reads, 1);
        if (r == -1)
          return -1;
        FSC_STAT_ADD (st, upstream_read_bytes, hi - lo);
        FSC_STAT_ADD (st, miss_bytes, hi - lo);
      }
      b += n;
      break;
    }
  }
  return 0;
}

int
fsc_object_read (struct fsc_object *o, void *buf, uint32_t count,
                 uint64_t offset, const struct fsc_upstream *up)
{
  FSC_STAT_ADD (&o->cache->stats, read_requests, 1);
  return do_read (o, buf, count, offset, up);
}

int
fsc_object_prefetch (struct fsc_object *o, uint64_t offset, uint64_t count,
                     const struct fsc_upstream *up)
{
  if (offset > o->size) {
    errno = EINVAL;
    return -1;
  }
  count = MIN (count, o->size - offset);
  while (count > 0) {
    uint32_t n = MIN (count, (uint64_t) MAX_FETCH_BYTES);
    if (do_read (o, NULL, n, offset, up) == -1)
      return -1;
    offset += n;
    count -= n;
  }
  return 0;
}

/*----------------------------------------------------------------------
 * Writes.
 */

/* Read present block BLK into DST and verify it; false if unusable. */
static bool
read_block (struct fsc_object *o, uint64_t blk, unsigned char *dst,
            uint64_t csum)
{
  uint64_t s = block_start (o, blk), len = block_end (o, blk) - s;
  ssize_t r = fsc_io_pread (&o->cache->io, FSC_FILE_DATA, o->dfd, dst, len,
                            s);
  if (r != (ssize_t) len)
    return false;
  return block_csum (dst, len) == csum;
}

int
fsc_object_write_begin (struct fsc_object *o, uint64_t offset,
                        uint64_t count, bool keep, struct fsc_write *w)
{
  struct fsc_stats *st = &o->cache->stats;

  memset (w, 0, sizeof *w);
  w->offset = offset;
  w->count = count;
  if (count == 0 || offset >= o->size)
    return 0;
  count = MIN (count, o->size - offset);

  const uint64_t b0 = offset >> o->bshift;
  const uint64_t b1 = (offset + count - 1) >> o->bshift;
  const uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  const bool head_partial = block_start (o, b0) < offset ||
    (b0 == b1 && block_end (o, b1) > offset + count);
  const bool tail_partial = b1 != b0 && block_end (o, b1) > offset + count;

  pthread_mutex_lock (&o->lock);
  if (o->state != FSC_OBJ_AVAILABLE) {
    bool mark = o->busy && !o->marked;
    o->marked = true;
    pthread_mutex_unlock (&o->lock);
    if (mark)
      mark_stale (o);
    return 0;
  }
  bool first_write = !o->written;
  o->written = true;
  bool fp_stale = first_write && o->sb.validate == FSC_VALIDATE_SAMPLE &&
    !(o->sb.flags & FSC_SB_FP_STALE);

  /* Partial end blocks that are present: keep their old bytes so the
   * new block can be stored whole afterwards (read-modify-write).
   */
  uint64_t hcsum = 0, tcsum = 0;
  uint32_t hepoch = 0, tepoch = 0;
  bool want_head = false, want_tail = false;
  if (keep && head_partial && present (o, b0)) {
    want_head = true;
    hcsum = o->groups[GROUP_OF (b0)]->csum[IDX_OF (b0)];
    hepoch = o->groups[GROUP_OF (b0)]->epoch;
  }
  if (keep && tail_partial && present (o, b1)) {
    want_tail = true;
    tcsum = o->groups[GROUP_OF (b1)]->csum[IDX_OF (b1)];
    tepoch = o->groups[GROUP_OF (b1)]->epoch;
  }
  pthread_mutex_unlock (&o->lock);

  if (fp_stale)
    write_sb (o, FSC_SB_FP_STALE, 0, NULL);

  if (keep) {
    w->epochs = malloc ((g1 - g0 + 1) * sizeof *w->epochs);
    if (w->epochs == NULL)
      keep = false;
  }
  if (keep && want_head) {
    w->head = malloc (o->block_size);
    if (w->head && !read_block (o, b0, w->head, hcsum)) {
      free (w->head);
      w->head = NULL;
    }
  }
  if (keep && want_tail) {
    w->tail = malloc (o->block_size);
    if (w->tail && !read_block (o, b1, w->tail, tcsum)) {
      free (w->tail);
      w->tail = NULL;
    }
  }

  /* Invalidate: clear the bits, bump the epochs, and note whether a
   * record on disk may still name any of the blocks.
   */
  bool need_sync = false;
  pthread_mutex_lock (&o->lock);
  if (w->head && o->groups[GROUP_OF (b0)]->epoch != hepoch) {
    free (w->head);
    w->head = NULL;
  }
  if (w->tail && o->groups[GROUP_OF (b1)]->epoch != tepoch) {
    free (w->tail);
    w->tail = NULL;
  }
  /* Every group must exist to count the write in flight: without the
   * count a fill could store what upstream held before this write.
   */
  for (uint64_t gi = g0; gi <= g1; ++gi)
    if (o->groups[gi] == NULL &&
        (o->groups[gi] = calloc (1, sizeof (struct group))) == NULL) {
      pthread_mutex_unlock (&o->lock);
      free (w->head);
      free (w->tail);
      free (w->epochs);
      w->head = w->tail = NULL;
      w->epochs = NULL;
      withdraw (o, ENOMEM);
      return 0;
    }
  if (o->state != FSC_OBJ_AVAILABLE)
    keep = false;
  for (uint64_t gi = g0; gi <= g1; ++gi) {
    uint64_t lo = gi == g0 ? IDX_OF (b0) : 0;
    uint64_t hi = gi == g1 ? IDX_OF (b1) : FSC_GROUP_BLOCKS - 1;
    uint64_t mask = (hi - lo == 63) ? ~UINT64_C (0)
      : ((UINT64_C (1) << (hi - lo + 1)) - 1) << lo;
    struct group *g = o->groups[gi];
    if (g->writers > 0)
      keep = false;             /* overlapping writes: order unknown */
    g->writers++;
    g->epoch++;
    if (w->epochs)
      w->epochs[gi - g0] = g->epoch;
    uint64_t dropped = g->present & mask;
    if (dropped) {
      g->present &= ~mask;
      FSC_STAT_ADD (st, invalidated_blocks, __builtin_popcountll (dropped));
    }
    if (g->disk_max & mask) {
      need_sync = true;
      if (mark_dirty (o, gi, g) == -1) {
        pthread_mutex_unlock (&o->lock);
        withdraw (o, ENOMEM);
        pthread_mutex_lock (&o->lock);
      }
    }
  }
  uint64_t c = o->change_seq;
  pthread_mutex_unlock (&o->lock);

  w->keep = keep;
  w->counted = true;
  w->first_group = g0;
  w->ngroups = g1 - g0 + 1;
  if (need_sync)
    commit_upto (o, c);   /* on failure the object is withdrawn */
  return 0;
}

void
fsc_object_write_end (struct fsc_object *o, struct fsc_write *w,
                      const void *buf, bool upstream_ok)
{
  struct fsc_stats *st = &o->cache->stats;
  uint8_t *claimed = NULL;

  if (w->counted) {
    pthread_mutex_lock (&o->lock);
    for (uint64_t gi = w->first_group; gi < w->first_group + w->ngroups; ++gi)
      o->groups[gi]->writers--;
    pthread_mutex_unlock (&o->lock);
    w->counted = false;
  }
  if (!w->keep || !upstream_ok || buf == NULL || w->count == 0 ||
      w->offset >= o->size)
    goto out;

  const uint64_t offset = w->offset;
  const uint64_t count = MIN (w->count, o->size - offset);
  const uint64_t wend = offset + count;
  const uint64_t b0 = offset >> o->bshift;
  const uint64_t b1 = (wend - 1) >> o->bshift;
  const uint64_t nb = b1 - b0 + 1;

  /* Build whole partial blocks from the old bytes and the new ones. */
  if (w->head) {
    uint64_t s = block_start (o, b0);
    uint64_t e = MIN (block_end (o, b0), wend);
    memcpy ((unsigned char *) w->head + (offset - s), buf, e - offset);
  }
  if (w->tail) {
    uint64_t s = block_start (o, b1);
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
    bool whole = block_start (o, blk) >= offset && block_end (o, blk) <= wend;
    const void *data = whole ? (const void *) 1
      : blk == b0 && w->head ? w->head
      : blk == b1 && w->tail ? w->tail : NULL;
    struct group *g = o->groups[GROUP_OF (blk)];
    if (data == NULL || g == NULL ||
        g->epoch != w->epochs[GROUP_OF (blk) - w->first_group] ||
        (g->present | g->fetching) & BIT_OF (blk))
      continue;
    g->fetching |= BIT_OF (blk);
    claimed[i] = 1;
  }
  pthread_mutex_unlock (&o->lock);

  if (reserve_groups (o, GROUP_OF (b0), GROUP_OF (b1)) == -1) {
    fill_failed (o, errno);
    memset (claimed, 2, nb);    /* release without storing */
  }

  /* Write the claimed blocks, whole runs at a time. */
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
      src = (const unsigned char *) buf + (block_start (o, blk) - offset);
      while (j < nb && claimed[j] == 1 && !(b0 + j == b1 && w->tail))
        j++;
    }
    uint64_t *csums = malloc ((j - i) * sizeof *csums);
    if (csums == NULL || store_blocks (o, blk, j - i, src, csums) == -1) {
      fill_failed (o, errno);
      free (csums);
      for (; i < nb; ++i)
        if (claimed[i] == 1)
          claimed[i] = 2;
      break;
    }
    for (uint64_t k = i; k < j; ++k) {
      uint64_t bk = b0 + k;
      uint64_t csum = csums[k - i];
      pthread_mutex_lock (&o->lock);
      struct group *g = o->groups[GROUP_OF (bk)];
      g->fetching &= ~BIT_OF (bk);
      if (o->state == FSC_OBJ_AVAILABLE &&
          g->epoch == w->epochs[GROUP_OF (bk) - w->first_group]) {
        g->present |= BIT_OF (bk);
        g->csum[IDX_OF (bk)] = csum;
        o->data_dirty = true;
        mark_dirty (o, GROUP_OF (bk), g);
        FSC_STAT_ADD (st, stored_blocks, 1);
      }
      pthread_cond_broadcast (&o->cond);
      pthread_mutex_unlock (&o->lock);
      claimed[k] = 0;
    }
    free (csums);
    i = j;
  }

  /* Release whatever is still claimed (errors). */
  pthread_mutex_lock (&o->lock);
  for (uint64_t i = 0; i < nb; ++i)
    if (claimed[i]) {
      struct group *g = o->groups[GROUP_OF (b0 + i)];
      g->fetching &= ~BIT_OF (b0 + i);
    }
  pthread_cond_broadcast (&o->cond);
  pthread_mutex_unlock (&o->lock);

 out:
  free (claimed);
  free (w->epochs);
  free (w->head);
  free (w->tail);
  w->epochs = NULL;
  w->head = w->tail = NULL;
}

/*----------------------------------------------------------------------
 * Lookup, creation, close.
 */

static int
load_group (void *opaque, const struct fsc_grec *rec, int slot)
{
  struct fsc_object *o = opaque;
  uint64_t mask = ~UINT64_C (0);
  if (rec->group == o->ngroups - 1 && o->nblocks % FSC_GROUP_BLOCKS)
    mask = (UINT64_C (1) << (o->nblocks % FSC_GROUP_BLOCKS)) - 1;
  struct group *g = calloc (1, sizeof *g);
  if (g == NULL)
    return -1;
  g->present = rec->present & mask;
  g->disk_max = rec->present;
  g->slot = slot;
  g->has_record = true;
  memcpy (g->csum, rec->csum, sizeof g->csum);
  o->groups[rec->group] = g;
  o->seq = MAX (o->seq, rec->seq);
  return 0;
}

/* Open (creating if needed) one of the object's files, refusing
 * symlinks and anything that is not our own regular file.
 */
static int
open_file (struct fsc_object *o, const char *suffix)
{
  char buf[FILE_NAME_MAX];
  struct stat st;

  int fd = openat (o->fandirfd, file_name (o, suffix, buf),
                   O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd == -1)
    return -1;
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode) ||
      st.st_uid != geteuid () || st.st_nlink != 1) {
    close (fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

static uint64_t
random_u64 (void)
{
  uuid_t u;
  uint64_t v;
  uuid_generate_random (u);
  memcpy (&v, u, sizeof v);
  return v;
}

/* Check a loaded superblock against the parameters; the reason to
 * discard it, or FSC_OK.  The order follows check_aux in the seed:
 * identity first, then coherency.
 */
static int
check_sb (const struct fsc_object *o, const struct fsc_sb *sb,
          const struct fsc_object_params *p, uint64_t data_size,
          uint64_t sums_size)
{
  uint64_t lo, hi;
  fsc_key_hash (p->key, p->key_len, &lo, &hi);
  if (sb->key_hash_lo != lo || sb->key_hash_hi != hi ||
      sb->key_len != p->key_len)
    return FSC_REJ_KEY;
  if (sb->block_size != p->block_size)
    return FSC_REJ_BLOCK_SIZE;
  if (p->validate != FSC_VALIDATE_NONE && sb->size != p->size)
    return FSC_REJ_UPSTREAM_SIZE;
  if (sb->size != p->size)      /* validate=none: still never misindex */
    return FSC_REJ_UPSTREAM_SIZE;
  const char *gen = p->generation ? p->generation : "";
  if (sb->gen_len != strlen (gen) || memcmp (sb->generation, gen, sb->gen_len))
    return FSC_REJ_GENERATION;
  if ((int) sb->validate != p->validate)
    return FSC_REJ_VALIDATE;
  if (p->validate == FSC_VALIDATE_SAMPLE) {
    if (sb->flags & FSC_SB_FP_STALE)
      return FSC_REJ_FP_STALE;
    /* Offline there is no upstream to sample: the recorded copy is
     * served as it was last validated (the caller's choice).
     */
    if (!p->offline && sb->fingerprint != p->fingerprint)
      return FSC_REJ_FINGERPRINT;
  }
  if (data_size != sb->size || sums_size != sums_offset (o, o->nblocks))
    return FSC_REJ_DATA_SIZE;
  return FSC_OK;
}

/* Start the object cold: drop old contents, write a new superblock. */
static int
create_cold (struct fsc_object *o, const struct fsc_object_params *p)
{
  if (ftruncate (o->ifd, 0) == -1 || fsync (o->ifd) == -1 ||
      ftruncate (o->dfd, 0) == -1 || ftruncate (o->dfd, o->size) == -1 ||
      fsync (o->dfd) == -1 ||
      ftruncate (o->sfd, 0) == -1 ||
      ftruncate (o->sfd, sums_offset (o, o->nblocks)) == -1 ||
      fsync (o->sfd) == -1)
    return -1;

  struct fsc_sb *sb = &o->sb;
  memset (sb, 0, sizeof *sb);
  sb->version = FSC_INDEX_VERSION;
  sb->block_size = o->block_size;
  sb->size = o->size;
  sb->nblocks = o->nblocks;
  sb->incarnation = random_u64 ();
  fsc_key_hash (p->key, p->key_len, &sb->key_hash_lo, &sb->key_hash_hi);
  sb->key_len = p->key_len;
  sb->created = (uint64_t) time (NULL);
  sb->validate = p->validate;
  sb->fingerprint = p->fingerprint;
  if (p->generation) {
    sb->gen_len = strlen (p->generation);
    memcpy (sb->generation, p->generation, sb->gen_len);
  }
  sb->key_prefix_len = MIN (p->key_len, (size_t) FSC_SB_KEY_PREFIX);
  memcpy (sb->key_prefix, p->key, sb->key_prefix_len);
  o->seq = 0;
  o->sb_slot = 1;               /* so the first write goes to slot 0 */
  return 0;
}

static void
free_object (struct fsc_object *o)
{
  if (o->groups)
    for (uint64_t i = 0; i < o->ngroups; ++i)
      free (o->groups[i]);
  free (o->groups);
  free (o->dirty);
  free (o->key);
  if (o->dfd >= 0) close (o->dfd);
  if (o->sfd >= 0) close (o->sfd);
  if (o->ifd >= 0) close (o->ifd);
  if (o->fandirfd >= 0) close (o->fandirfd);
  pthread_mutex_destroy (&o->lock);
  pthread_cond_destroy (&o->cond);
  free (o);
}

/* Set the object up on disk.  Returns 0 (AVAILABLE) or -1 with errno
 * (the caller makes it uncached).
 */
static int
lookup (struct fsc_object *o, const struct fsc_object_params *p,
        struct fsc_open_info *info)
{
  struct fsc_cache *c = o->cache;
  struct fsc_stats *st = &c->stats;
  struct stat dst;

  fsc_key_encode (p->key, p->key_len, o->name, o->fan);
  if (mkdirat (c->objdirfd, o->fan, 0700) == -1 && errno != EEXIST)
    return -1;
  o->fandirfd = openat (c->objdirfd, o->fan,
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (o->fandirfd == -1)
    return -1;
  o->ifd = open_file (o, ".idx");
  if (o->ifd == -1)
    return -1;
  /* One user per object across processes: never two writers of one
   * index.  The lock goes with the descriptor, so a crash releases it.
   */
  if (flock (o->ifd, LOCK_EX | LOCK_NB) == -1) {
    if (errno == EWOULDBLOCK) {
      info->busy = true;
      o->busy = true;
      FSC_STAT_ADD (st, objects_busy, 1);
    }
    return -1;
  }
  o->dfd = open_file (o, ".data");
  if (o->dfd == -1 || fstat (o->dfd, &dst) == -1)
    return -1;
  struct stat sst;
  o->sfd = open_file (o, ".sums");
  if (o->sfd == -1 || fstat (o->sfd, &sst) == -1)
    return -1;

  struct fsc_sb sb;
  int slot = 0;
  struct stat ist;
  int reason;
  if (fstat (o->ifd, &ist) == -1)
    return -1;
  if (ist.st_size == 0)
    reason = FSC_REJ_NEW;
  else {
    reason = fsc_sb_load (&c->io, o->ifd, &sb, &slot);
    if (reason == FSC_OK)
      reason = check_sb (o, &sb, p, dst.st_size, sst.st_size);
  }

  if (reason == FSC_OK && stale_marked (o))
    reason = FSC_REJ_FOREIGN;
  if (reason != FSC_OK && p->offline) {
    /* Never create or discard without the upstream: keep the files
     * for the day it is back, and serve nothing from them.
     */
    info->reason = reason;
    errno = ESTALE;
    return -1;
  }
  if (reason == FSC_OK) {
    o->sb = sb;
    o->sb_slot = slot;
    o->seq = sb.seq;
    info->unclean = !(sb.flags & FSC_SB_CLEAN);
    if (fsc_grec_scan (&c->io, o->ifd, o->ngroups, sb.incarnation,
                       load_group, o) == -1) {
      /* Unreadable index: start cold rather than trust part of it. */
      for (uint64_t i = 0; i < o->ngroups; ++i) {
        free (o->groups[i]);
        o->groups[i] = NULL;
      }
      reason = FSC_REJ_IO;
    }
  }
  info->reason = reason;

  if (reason == FSC_OK) {
    FSC_STAT_ADD (st, objects_reused, 1);
    if (info->unclean)
      FSC_STAT_ADD (st, unclean_opens, 1);
  }
  else {
    o->state = FSC_OBJ_CREATING;
    if (reason != FSC_REJ_NEW)
      FSC_STAT_ADD (st, objects_discarded, 1);
    FSC_STAT_ADD (st, objects_created, 1);
    if (create_cold (o, p) == -1)
      return -1;
    unlink_file (o, ".stale");
  }
  /* Room for both superblock slots, so that no later superblock write
   * (the clean mark at close, above all) can fail for want of space.
   */
  int e = posix_fallocate (o->ifd, 0, FSC_GROUPS_OFFSET);
  if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    errno = e;
    return -1;
  }
  /* Mark it in use (not clean) before anything can change. */
  if (write_sb (o, 0, FSC_SB_CLEAN, NULL) == -1) {
    errno = EIO;
    return -1;
  }
  o->state = FSC_OBJ_AVAILABLE;
  return 0;
}

int
fsc_object_peek_size (struct fsc_cache *c, const void *key, size_t key_len,
                      uint32_t block_size, uint64_t *size)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  char file[FSC_NAME_MAX + 8];
  struct fsc_sb sb;
  int slot;
  uint64_t lo, hi;

  if (key_len == 0) {
    errno = EINVAL;
    return -1;
  }
  fsc_key_encode (key, key_len, name, fan);
  snprintf (file, sizeof file, "%s.idx", name);
  int dirfd = openat (c->objdirfd, fan,
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dirfd == -1)
    return -1;
  int fd = openat (dirfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  int e = errno;
  close (dirfd);
  if (fd == -1) {
    errno = e;
    return -1;
  }
  int reason = fsc_sb_load (&c->io, fd, &sb, &slot);
  close (fd);
  fsc_key_hash (key, key_len, &lo, &hi);
  if (reason != FSC_OK || sb.key_hash_lo != lo || sb.key_hash_hi != hi ||
      sb.key_len != key_len || sb.block_size != block_size) {
    errno = ENOENT;
    return -1;
  }
  *size = sb.size;
  return 0;
}

static struct fsc_object *find_locked (struct fsc_cache *c,
                                       const struct fsc_object_params *p);

int
fsc_object_open (struct fsc_cache *c, const struct fsc_object_params *p,
                 struct fsc_object **objp, struct fsc_open_info *info)
{
  memset (info, 0, sizeof *info);
  if (p->key_len == 0 || !is_power_of_2 (p->block_size) ||
      p->block_size < SUB_SIZE || p->block_size > FSC_MAX_BLOCK_SIZE ||
      p->validate < FSC_VALIDATE_NONE || p->validate > FSC_VALIDATE_SAMPLE ||
      (p->generation && strlen (p->generation) > FSC_GEN_MAX) ||
      p->size > (UINT64_C (1) << 60)) {
    errno = EINVAL;
    return -1;
  }
  FSC_STAT_ADD (&c->stats, objects_opened, 1);

  struct fsc_object *o = calloc (1, sizeof *o);
  if (o == NULL)
    return -1;
  o->cache = c;
  o->refs = 1;
  o->fandirfd = o->ifd = o->dfd = o->sfd = -1;
  o->verify = p->verify;
  o->block_size = p->block_size;
  o->bshift = __builtin_ctz (p->block_size);
  o->size = p->size;
  o->nblocks = DIV_ROUND_UP (p->size, (uint64_t) p->block_size);
  o->ngroups = DIV_ROUND_UP (o->nblocks, (uint64_t) FSC_GROUP_BLOCKS);
  o->state = FSC_OBJ_LOOKING_UP;
  pthread_mutex_init (&o->lock, NULL);
  pthread_cond_init (&o->cond, NULL);
  o->key = malloc (p->key_len);
  o->groups = calloc (o->ngroups ?: 1, sizeof *o->groups);
  if (o->key == NULL || o->groups == NULL) {
    free_object (o);
    errno = ENOMEM;
    return -1;
  }
  memcpy (o->key, p->key, p->key_len);
  o->key_len = p->key_len;

  /* Already open, or being looked up, in this process: share it.
   * Otherwise list ours before looking it up, so that concurrent opens
   * of one key wait for one lookup instead of racing for the lock.
   */
  pthread_mutex_lock (&c->lock);
  struct fsc_object *shared = find_locked (c, p);
  if (shared == NULL) {
    o->next = c->objects;
    c->objects = o;
    o->listed = true;
  }
  pthread_mutex_unlock (&c->lock);
  if (shared) {
    free_object (o);
    *objp = shared;
    info->shared = true;
    info->state = fsc_object_state (shared);
    info->present_blocks = fsc_object_present_blocks (shared);
    return 0;
  }

  if (lookup (o, p, info) == -1) {
    /* Uncached: nothing on disk is used or kept open.  It stays
     * listed, so other connections share the verdict until the last
     * one closes it (as a withdrawn cookie in FS-Cache).
     */
    info->err = errno;
    pthread_mutex_lock (&o->lock);
    o->state = FSC_OBJ_WITHDRAWN;
    pthread_mutex_unlock (&o->lock);
    if (o->dfd >= 0) { close (o->dfd); o->dfd = -1; }
    if (o->sfd >= 0) { close (o->sfd); o->sfd = -1; }
    if (o->ifd >= 0) { close (o->ifd); o->ifd = -1; }
    /* A busy object keeps its directory, to mark the holder's copy
     * stale if it writes.
     */
    if (o->fandirfd >= 0 && !o->busy) {
      close (o->fandirfd);
      o->fandirfd = -1;
    }
  }
  pthread_mutex_lock (&c->lock);
  o->ready = true;
  pthread_cond_broadcast (&c->ready_cond);
  pthread_mutex_unlock (&c->lock);

  info->state = fsc_object_state (o);
  info->present_blocks = fsc_object_present_blocks (o);
  *objp = o;
  return 0;
}

/* Find a listed object for P and take a reference, waiting for its
 * lookup to finish.  Caller holds c->lock.
 */
static struct fsc_object *
find_locked (struct fsc_cache *c, const struct fsc_object_params *p)
{
 again:
  for (struct fsc_object *o = c->objects; o; o = o->next) {
    if (o->key_len == p->key_len && memcmp (o->key, p->key, p->key_len) == 0) {
      if (o->closing) {
        /* Its last user is committing and closing it, and still holds
         * the index lock: wait until it is gone, then look it up anew
         * (else we would find the index locked and go uncached).
         */
        pthread_cond_wait (&c->ready_cond, &c->lock);
        goto again;
      }
      if (o->block_size != p->block_size || o->size != p->size)
        continue;
      o->refs++;
      while (!o->ready)
        pthread_cond_wait (&c->ready_cond, &c->lock);
      return o;
    }
  }
  return NULL;
}

struct fsc_object *
fsc_object_get (struct fsc_cache *c, const struct fsc_object_params *p)
{
  SCOPED_LOCK (&c->lock);
  return find_locked (c, p);
}

void
fsc_object_close (struct fsc_object *o)
{
  struct fsc_cache *c = o->cache;

  pthread_mutex_lock (&c->lock);
  if (--o->refs > 0) {
    pthread_mutex_unlock (&c->lock);
    return;
  }
  /* Stay listed, marked closing, until the files are closed: an open
   * of the same key meanwhile waits for us instead of finding the
   * index locked.
   */
  o->closing = true;
  pthread_mutex_unlock (&c->lock);

  if (!fsc_object_check_stale (o) &&
      fsc_object_state (o) == FSC_OBJ_AVAILABLE &&
      fsc_object_commit (o) == 0)
    write_sb (o, FSC_SB_CLEAN, 0, NULL);
  if (o->dfd >= 0) { close (o->dfd); o->dfd = -1; }
  if (o->sfd >= 0) { close (o->sfd); o->sfd = -1; }
  if (o->ifd >= 0) { close (o->ifd); o->ifd = -1; }   /* drops the flock */

  pthread_mutex_lock (&c->lock);
  if (o->listed) {
    for (struct fsc_object **pp = &c->objects; *pp; pp = &(*pp)->next)
      if (*pp == o) {
        *pp = o->next;
        break;
      }
  }
  pthread_cond_broadcast (&c->ready_cond);
  pthread_mutex_unlock (&c->lock);
  free_object (o);
}

void
fsc_object_drain (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  while (o->pending_fills > 0)
    pthread_cond_wait (&o->cond, &o->lock);
}

bool
fsc_object_needs_fingerprint (struct fsc_object *o)
{
  /* Queued fills hold references; let them finish first. */
  fsc_object_drain (o);
  SCOPED_LOCK (&o->cache->lock);
  return o->refs == 1 && o->written && o->state == FSC_OBJ_AVAILABLE &&
    o->sb.validate == FSC_VALIDATE_SAMPLE;
}

void
fsc_object_set_fingerprint (struct fsc_object *o, uint64_t fp)
{
  if (fsc_object_commit (o) == 0)
    write_sb (o, 0, FSC_SB_FP_STALE, &fp);
}

unsigned
fsc_object_take_notices (struct fsc_object *o, int *err)
{
  SCOPED_LOCK (&o->lock);
  unsigned n = o->notices;
  o->notices = 0;
  *err = o->withdraw_err;
  return n;
}

int
fsc_object_state (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  return o->state;
}

uint64_t
fsc_object_present_blocks (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  uint64_t n = 0;
  if (o->state == FSC_OBJ_WITHDRAWN)
    return 0;
  for (uint64_t i = 0; i < o->ngroups; ++i)
    if (o->groups[i])
      n += __builtin_popcountll (o->groups[i]->present);
  return n;
}

bool
fsc_object_block_present (struct fsc_object *o, uint64_t blk)
{
  SCOPED_LOCK (&o->lock);
  return blk < o->nblocks && o->state == FSC_OBJ_AVAILABLE && present (o, blk);
}
