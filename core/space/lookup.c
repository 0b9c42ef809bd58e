/* libfscache: finding an object on disk (the seed's lookup_object):
 * its files opened and locked (one process per object: the index's
 * flock), the superblock checked against the coherency data (check_sb,
 * in the order of the seed's check_aux: identity, then coherency), and
 * the index either reused (its gauges and counters taken up) or started
 * cold (the object's counters kept, the discard counted).  object.c
 * calls it from fsc_object_open and owns everything after.
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
#include "lookup.h"
#include "safeopen.h"
#include "utils.h"

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
int
fsc_check_sb (const struct fsc_object *o, const struct fsc_sb *sb,
          const struct fsc_object_params *p, bool data_ok,
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
  if (!data_ok || sums_size != sums_offset (&o->geom, o->geom.nblocks))
    return FSC_REJ_DATA_SIZE;
  return FSC_OK;
}

/* Start the object cold: drop old contents, write a new superblock. */
/* SB's label: LABEL's first FSC_LABEL_MAX bytes, control characters
 * as '?' (it is for people, and read back only as text).
 */
static void
set_label (struct fsc_sb *sb, const char *label)
{
  size_t n = label ? strnlen (label, FSC_LABEL_MAX) : 0;
  for (size_t i = 0; i < n; ++i)
    sb->label[i] = (unsigned char) label[i] < 0x20 || label[i] == 0x7f
      ? '?' : label[i];
  sb->label[n] = '\0';
}

static int
create_cold (struct fsc_object *o, const struct fsc_object_params *p)
{
  if (ftruncate (o->files.ifd, 0) == -1 || fsync (o->files.ifd) == -1 ||
      fsc_data_reset (o) == -1 ||
      ftruncate (o->files.sfd, 0) == -1 ||
      ftruncate (o->files.sfd, sums_offset (&o->geom, o->geom.nblocks)) == -1 ||
      fsync (o->files.sfd) == -1)
    return -1;

  struct fsc_sb *sb = &o->sb;
  memset (sb, 0, sizeof *sb);
  sb->version = FSC_INDEX_VERSION;
  sb->block_size = o->geom.block_size;
  sb->size = o->geom.size;
  sb->nblocks = o->geom.nblocks;
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
  set_label (sb, p->label);
  o->seq = 0;
  o->sb_slot = 1;               /* so the first write goes to slot 0 */
  return 0;
}

/* lookup's first phase: the object's files, opened and locked.  Sets
 * *DATA_OK (the data files are there) and *SUMS_SIZE.  0 or -1.
 */
static int
lookup_files (struct fsc_object *o, const struct fsc_object_params *p,
              struct fsc_open_info *info, bool *data_ok, off_t *sums_size)
{
  struct fsc_cache *c = o->cache;
  fsc_key_encode (p->key, p->key_len, o->files.name, o->files.fan);
  /* Ours alone, or someone else could plant files, the share socket
   * or the epochs beside ours (safeopen.c rule 1).
   */
  o->files.fandirfd = fsc_own_subdir (c->objdirfd, o->files.fan, true,
                                      o->files.fan, NULL, 0);
  if (o->files.fandirfd == -1)
    return -1;
  o->files.ifd = fsc_open_file (&o->files, ".idx");
  if (o->files.ifd == -1)
    return -1;
  /* One user per object across processes: never two writers of one
   * index.  The lock goes with the descriptor, so a crash releases it.
   */
  if (flock (o->files.ifd, LOCK_EX | LOCK_NB) == -1) {
    if (errno == EWOULDBLOCK) {
      info->busy = true;
      o->busy = true;           /* counted if not joined (below) */
    }
    return -1;
  }
  if (fsc_data_open (o, data_ok) == -1)
    return -1;
  struct stat sst;
  o->files.sfd = fsc_open_file (&o->files, ".sums");
  if (o->files.sfd == -1 || fstat (o->files.sfd, &sst) == -1)
    return -1;
  *sums_size = sst.st_size;
  return 0;

}

/* An index found good: take up superblock SB (of SLOT), its gauges
 * and counters.
 */
static void
lookup_reuse (struct fsc_object *o, const struct fsc_sb *sb, int slot,
              struct fsc_open_info *info)
{
  struct fsc_stats *st = &o->cache->stats;
  o->sb = *sb;
  o->sb_slot = slot;
  o->seq = sb->seq;
  info->unclean = !(sb->flags & FSC_SB_CLEAN);
  /* An older format read as it is: the superblock written before
   * the first change (and at close) is in the current one.
   */
  if (sb->version < FSC_INDEX_VERSION) {
    info->old_version = sb->version;
    FSC_STAT_ADD (st, objects_upgraded, 1);
  }
  /* The groups are read when first needed (groups.c).  Their
   * gauges: exact in the superblock of a clean close; otherwise
   * counted by the census, in the background.
   */
  /* Only plausible ones: a superblock whose checksum holds can
   * still carry gauges no object of this size can have (a bug, a
   * tool, a crafted file), and the cap's and the tools' arithmetic
   * trust them; those are counted again instead.
   */
  const uint64_t pb = sb->ostats.v[FSC_OSTAT_present_blocks];
  const uint64_t cb = sb->ostats.v[FSC_OSTAT_cached_bytes];
  if (!info->unclean &&
      sb->ncounters > (uint32_t) FSC_OSTAT_cached_bytes &&
      pb <= o->geom.nblocks && cb <= o->geom.size &&
      cb <= pb * (uint64_t) o->geom.block_size) {
    o->pager.nonres_blocks = pb;
    o->pager.nonres_bytes = cb;
    o->pager.census_next = o->geom.ngroups;
  }
  o->ostats = sb->ostats;
  /* After a crash the superblock's counters are those of the last
   * commit; NAME.stats may be a few rounds newer.
   */
  struct fsc_ostats live;
  uint64_t inc, upd;
  if (info->unclean &&
      fsc_live_load (o, &live, &inc, &upd) == 0 &&
      inc == sb->incarnation && upd > sb->counters_time)
    o->ostats = live;
  FSC_STAT_ADD (st, objects_reused, 1);
  if (info->unclean)
    FSC_STAT_ADD (st, unclean_opens, 1);
  /* After a crash, space no index names (fills never committed,
   * evictions not yet punched) is reclaimed, in the background once
   * the object is open (fsc_object_open), so that the first read
   * does not wait for the walk; a clean close leaves none but sums
   * pages (reclaim.c).
   */
  o->reclaim.unclean = info->unclean;
  o->reclaim.wanted = true;
}

/* No index, or one discarded for REASON: start cold, keeping the
 * object's counters (from SB if SB_OURS).  0 or -1.
 */
static int
lookup_cold (struct fsc_object *o, const struct fsc_object_params *p,
             int reason, const struct fsc_sb *sb, bool sb_ours)
{
  struct fsc_stats *st = &o->cache->stats;
  o->pager.census_next = o->geom.ngroups;        /* cold: nothing to count */
  o->state = FSC_OBJ_CREATING;
  if (reason != FSC_REJ_NEW)
    FSC_STAT_ADD (st, objects_discarded, 1);
  FSC_STAT_ADD (st, objects_created, 1);
  if (create_cold (o, p) == -1)
    return -1;
  fsc_unlink_file (&o->files, ".stale");
  /* The object's history outlives its data: its counters go on from
   * the old superblock, or else from the last NAME.stats, and the
   * discard counts as an invalidation (docs/format.md, "Object
   * counters").
   */
  if (reason != FSC_REJ_NEW) {
    if (sb_ours)
      o->ostats = sb->ostats;
    else
      (void) fsc_live_load (o, &o->ostats, NULL, NULL);
    FSC_OSTAT_ADD (o, invalidations, 1);
    FSC_OSTAT_SET (o, last_invalidation, (uint64_t) time (NULL));
    o->ostats.last_reason = reason;
  }
  else {
    /* No index, but maybe its history: a withdrawal unlinks the
     * index and leaves NAME.stats; so does nbd-fscache invalidate,
     * which counts its invalidation there.
     */
    (void) fsc_live_load (o, &o->ostats, NULL, NULL);
  }
  return 0;
}

/* lookup's last phase: room for the superblocks, and the first one of
 * a cold index.  0 or -1.
 */
static int
lookup_finish (struct fsc_object *o, int reason, bool unclean)
{
  /* Room for both superblock slots, so that no later superblock write
   * (the clean mark at close, above all) can fail for want of space.
   */
  int e = posix_fallocate (o->files.ifd, 0, FSC_GROUPS_OFFSET);
  if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    errno = e;
    return -1;
  }
  /* In use: not clean.  A new or discarded index gets its first
   * superblock now.  A reused one already says so after a crash; after
   * a clean close the mark is made durable before the first change
   * instead (fsc_object_mark_in_use), so that an open syncs nothing
   * and a session of hits writes nothing until its close.
   */
  if (reason != FSC_OK) {
    if (fsc_write_sb (o, 0, FSC_SB_CLEAN, NULL) == -1) {
      errno = EIO;
      return -1;
    }
  }
  else if (!unclean)
    o->unclean_due = true;
  return 0;
}

/* Set the object up on disk.  Returns 0 (AVAILABLE) or -1 with errno
 * (the caller makes it uncached).
 */
int
fsc_lookup (struct fsc_object *o, const struct fsc_object_params *p,
            struct fsc_open_info *info)
{
  struct fsc_cache *c = o->cache;

  /* Too large to cache: served uncached, as any object whose lookup
   * fails, and nothing is created on disk.
   */
  if (p->size > FSC_OBJECT_SIZE_MAX) {
    errno = EFBIG;
    return -1;
  }
  bool data_ok;
  off_t sums_size;
  if (lookup_files (o, p, info, &data_ok, &sums_size) == -1)
    return -1;

  struct fsc_sb sb;
  int slot = 0;
  struct stat ist;
  int reason;
  bool sb_ours = false;         /* a readable superblock of this key */
  if (fstat (o->files.ifd, &ist) == -1)
    return -1;
  if (ist.st_size == 0)
    reason = FSC_REJ_NEW;
  else {
    reason = fsc_sb_load (&c->io, o->files.ifd, &sb, &slot);
    if (reason == FSC_OK) {
      reason = fsc_check_sb (o, &sb, p, data_ok, sums_size);
      sb_ours = reason != FSC_REJ_KEY;
    }
  }

  if (reason == FSC_OK && fsc_stale_marked (&o->files))
    reason = FSC_REJ_FOREIGN;
  if (reason != FSC_OK && p->offline) {
    /* Never create or discard without the upstream: keep the files
     * for the day it is back, and serve nothing from them.
     */
    info->reason = reason;
    errno = ESTALE;
    return -1;
  }
  info->reason = reason;
  if (reason == FSC_OK) {
    lookup_reuse (o, &sb, slot, info);
    /* An object made before labels (or by another build) gets its
     * label now, written with its next superblock.
     */
    if (o->sb.label[0] == '\0')
      set_label (&o->sb, p->label);
  }
  else if (lookup_cold (o, p, reason, &sb, sb_ours) == -1)
    return -1;
  FSC_OSTAT_ADD (o, opens, 1);
  if (lookup_finish (o, reason, info->unclean) == -1)
    return -1;
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
  int dirfd = fsc_own_subdir (c->objdirfd, fan, false, fan, NULL, 0);
  if (dirfd == -1)
    return -1;
  int fd = fsc_open_regular (dirfd, file, O_RDONLY, 0);
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
