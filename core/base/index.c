/* libfscache: encoding and validation of index superblocks and group
 * records.  The layout is in index.h and docs/format.md.
 */
#include <config.h>

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "xxh.h"

#include "index.h"
#include "utils.h"

static const unsigned char sb_magic[8] = "NBDFSCIX";
#define GREC_MAGIC 0x47435346u  /* "FSCG" little-endian */

/* Superblock field offsets, saved on disk. */
enum {
  SB_MAGIC = 0, SB_VERSION = 8, SB_SBSIZE = 12, SB_SEQ = 16,
  SB_BLOCK_SIZE = 24, SB_FLAGS = 28, SB_SIZE_ = 32, SB_NBLOCKS = 40,
  SB_INCARNATION = 48, SB_KEYHASH_LO = 56, SB_KEYHASH_HI = 64,
  SB_KEY_LEN = 72, SB_VALIDATE = 76, SB_FINGERPRINT = 80, SB_CREATED = 88,
  SB_GROUP_BLOCKS = 96, SB_GREC_SIZE = 100, SB_GEN_LEN = 104,
  SB_KEY_PREFIX_LEN = 108, SB_GENERATION = 112,
  SB_KEY_PREFIX = SB_GENERATION + FSC_GEN_MAX + 1,
  SB_NCOUNTERS = SB_KEY_PREFIX + FSC_SB_KEY_PREFIX,    /* 3440 */
  SB_LABEL_LEN = SB_NCOUNTERS - 4,                      /* 3436 */
  SB_LAST_REASON = SB_NCOUNTERS + 4, SB_COUNTERS_TIME = SB_NCOUNTERS + 8,
  SB_COUNTERS = SB_NCOUNTERS + 16,                      /* 3456 */
  SB_CHECKSUM = FSC_SB_SIZE - 8,
};
_Static_assert (SB_COUNTERS + 8 * FSC_OSTATS_MAX <= SB_CHECKSUM,
                "object counters overlap the checksum");
_Static_assert (SB_KEY_PREFIX + FSC_SB_KEY_PREFIX <= SB_CHECKSUM,
                "superblock fields overlap the checksum");

/* Group record field offsets, saved on disk. */
enum {
  GR_MAGIC = 0, GR_GROUP = 8, GR_SEQ = 16, GR_INCARNATION = 24,
  GR_PRESENT = 32, GR_CSUM = 40, GR_PIECES = GR_CSUM + 8 * FSC_GROUP_BLOCKS,
  GR_ZERO = GR_PIECES + 2 * FSC_GROUP_BLOCKS,           /* 680 */
  GR_CHECKSUM = FSC_GREC_SIZE - 8,
};
_Static_assert (GR_ZERO == 680, "the zero bitmap moved");
_Static_assert (GR_ZERO + 8 <= GR_CHECKSUM,
                "group record fields overlap the checksum");

static const char *reason_names[FSC_REASONS] = {
  [FSC_OK] = "ok",
  [FSC_REJ_NEW] = "new",
  [FSC_REJ_SHORT] = "truncated-index",
  [FSC_REJ_MAGIC] = "bad-magic",
  [FSC_REJ_CHECKSUM] = "bad-checksum",
  [FSC_REJ_VERSION] = "unsupported-version",
  [FSC_REJ_GEOMETRY] = "bad-geometry",
  [FSC_REJ_KEY] = "key-mismatch",
  [FSC_REJ_BLOCK_SIZE] = "block-size-changed",
  [FSC_REJ_DATA_SIZE] = "data-file-size",
  [FSC_REJ_UPSTREAM_SIZE] = "upstream-size-changed",
  [FSC_REJ_GENERATION] = "generation-changed",
  [FSC_REJ_FINGERPRINT] = "upstream-content-changed",
  [FSC_REJ_FP_STALE] = "unclean-after-writes",
  [FSC_REJ_VALIDATE] = "validate-mode-changed",
  [FSC_REJ_IO] = "index-io-error",
  [FSC_REJ_FOREIGN] = "written-by-another-process",
  [FSC_REJ_INVALIDATED] = "invalidated",
};

const char *
fsc_reason_name (int reason)
{
  if (reason < 0 || reason >= FSC_REASONS || !reason_names[reason])
    return "unknown";
  return reason_names[reason];
}

void
fsc_sb_encode (const struct fsc_sb *sb, unsigned char *buf)
{
  memset (buf, 0, FSC_SB_SIZE);
  memcpy (buf + SB_MAGIC, sb_magic, 8);
  put_le32 (buf + SB_VERSION, FSC_INDEX_VERSION);
  put_le32 (buf + SB_SBSIZE, FSC_SB_SIZE);
  put_le64 (buf + SB_SEQ, sb->seq);
  put_le32 (buf + SB_BLOCK_SIZE, sb->block_size);
  put_le32 (buf + SB_FLAGS, sb->flags);
  put_le64 (buf + SB_SIZE_, sb->size);
  put_le64 (buf + SB_NBLOCKS, sb->nblocks);
  put_le64 (buf + SB_INCARNATION, sb->incarnation);
  put_le64 (buf + SB_KEYHASH_LO, sb->key_hash_lo);
  put_le64 (buf + SB_KEYHASH_HI, sb->key_hash_hi);
  put_le32 (buf + SB_KEY_LEN, sb->key_len);
  put_le32 (buf + SB_VALIDATE, sb->validate);
  put_le64 (buf + SB_FINGERPRINT, sb->fingerprint);
  put_le64 (buf + SB_CREATED, sb->created);
  put_le32 (buf + SB_GROUP_BLOCKS, FSC_GROUP_BLOCKS);
  put_le32 (buf + SB_GREC_SIZE, FSC_GREC_SIZE);
  uint32_t gl = MIN (sb->gen_len, (uint32_t) FSC_GEN_MAX);
  put_le32 (buf + SB_GEN_LEN, gl);
  memcpy (buf + SB_GENERATION, sb->generation, gl);
  /* The label at the end of the key prefix's field, its length in the
   * field's last 4 bytes; the key prefix cut short to leave room.
   */
  uint32_t ll = (uint32_t) strnlen (sb->label, FSC_LABEL_MAX);
  uint32_t room = ll ? FSC_SB_KEY_PREFIX - 4 - ll : FSC_SB_KEY_PREFIX;
  uint32_t kl = MIN (sb->key_prefix_len, room);
  put_le32 (buf + SB_KEY_PREFIX_LEN, kl);
  memcpy (buf + SB_KEY_PREFIX, sb->key_prefix, kl);
  if (ll) {
    memcpy (buf + SB_LABEL_LEN - ll, sb->label, ll);
    put_le32 (buf + SB_LABEL_LEN, ll);
  }
  uint32_t nc = MIN (sb->ncounters, (uint32_t) FSC_OSTATS_MAX);
  put_le32 (buf + SB_NCOUNTERS, nc);
  put_le32 (buf + SB_LAST_REASON, sb->ostats.last_reason);
  put_le64 (buf + SB_COUNTERS_TIME, sb->counters_time);
  for (uint32_t i = 0; i < nc; ++i)
    put_le64 (buf + SB_COUNTERS + 8 * i, sb->ostats.v[i]);
  put_le64 (buf + SB_CHECKSUM, XXH3_64bits (buf, SB_CHECKSUM));
}

int
fsc_sb_decode (const unsigned char *buf, struct fsc_sb *sb)
{
  if (memcmp (buf + SB_MAGIC, sb_magic, 8) != 0)
    return FSC_REJ_MAGIC;
  /* A newer format may move anything, the checksum included.  Version
   * 1 differs only in group records without pieces (all zero there),
   * which read as whole blocks, and version 2 in records without zero
   * blocks (zero there too).
   */
  uint32_t version = get_le32 (buf + SB_VERSION);
  if (version < FSC_INDEX_VERSION_MIN || version > FSC_INDEX_VERSION)
    return FSC_REJ_VERSION;
  if (get_le64 (buf + SB_CHECKSUM) != XXH3_64bits (buf, SB_CHECKSUM))
    return FSC_REJ_CHECKSUM;

  memset (sb, 0, sizeof *sb);
  sb->version = version;
  sb->seq = get_le64 (buf + SB_SEQ);
  sb->block_size = get_le32 (buf + SB_BLOCK_SIZE);
  sb->flags = get_le32 (buf + SB_FLAGS);
  sb->size = get_le64 (buf + SB_SIZE_);
  sb->nblocks = get_le64 (buf + SB_NBLOCKS);
  sb->incarnation = get_le64 (buf + SB_INCARNATION);
  sb->key_hash_lo = get_le64 (buf + SB_KEYHASH_LO);
  sb->key_hash_hi = get_le64 (buf + SB_KEYHASH_HI);
  sb->key_len = get_le32 (buf + SB_KEY_LEN);
  sb->validate = get_le32 (buf + SB_VALIDATE);
  sb->fingerprint = get_le64 (buf + SB_FINGERPRINT);
  sb->created = get_le64 (buf + SB_CREATED);
  sb->gen_len = get_le32 (buf + SB_GEN_LEN);
  sb->key_prefix_len = get_le32 (buf + SB_KEY_PREFIX_LEN);

  /* Bounds: everything later code relies on is checked here. */
  if (get_le32 (buf + SB_SBSIZE) != FSC_SB_SIZE ||
      get_le32 (buf + SB_GROUP_BLOCKS) != FSC_GROUP_BLOCKS ||
      get_le32 (buf + SB_GREC_SIZE) != FSC_GREC_SIZE ||
      !is_power_of_2 (sb->block_size) ||
      sb->block_size < 512 || sb->block_size > FSC_INDEX_BLOCK_MAX ||
      sb->nblocks != DIV_ROUND_UP (sb->size, (uint64_t) sb->block_size) ||
      sb->nblocks > (UINT64_C (1) << 40) ||
      sb->gen_len > FSC_GEN_MAX ||
      sb->key_prefix_len > FSC_SB_KEY_PREFIX ||
      sb->key_prefix_len > sb->key_len ||
      sb->validate > FSC_VALIDATE_SAMPLE ||
      sb->seq >= FSC_SEQ_MAX ||
      (sb->flags & ~(FSC_SB_CLEAN | FSC_SB_FP_STALE | FSC_SB_WRITTEN)) != 0)
    return FSC_REJ_GEOMETRY;
  memcpy (sb->generation, buf + SB_GENERATION, sb->gen_len);
  sb->generation[sb->gen_len] = '\0';
  memcpy (sb->key_prefix, buf + SB_KEY_PREFIX, sb->key_prefix_len);
  /* The label, if one fits beside the key prefix and reads as text
   * (an older build's long key may reach into its field: no label).
   */
  uint32_t ll = get_le32 (buf + SB_LABEL_LEN);
  if (ll > 0 && ll <= FSC_LABEL_MAX &&
      sb->key_prefix_len + ll <= FSC_SB_KEY_PREFIX - 4) {
    const unsigned char *l = buf + SB_LABEL_LEN - ll;
    bool text = true;
    for (uint32_t i = 0; i < ll && text; ++i)
      text = l[i] >= 0x20 && l[i] != 0x7f;
    if (text) {
      memcpy (sb->label, l, ll);
      sb->label[ll] = '\0';
    }
  }
  /* Counters are statistics, but a superblock whose checksum holds
   * and which claims more of them than fit was not written by us.
   */
  uint32_t nc = get_le32 (buf + SB_NCOUNTERS);
  if (nc > FSC_OSTATS_MAX)
    return FSC_REJ_GEOMETRY;
  sb->ncounters = nc;
  sb->ostats.last_reason = get_le32 (buf + SB_LAST_REASON);
  sb->counters_time = get_le64 (buf + SB_COUNTERS_TIME);
  for (uint32_t i = 0; i < nc; ++i)
    sb->ostats.v[i] = get_le64 (buf + SB_COUNTERS + 8 * i);
  return FSC_OK;
}

int
fsc_sb_load (struct fsc_io *io, int fd, struct fsc_sb *sb, int *slot)
{
  unsigned char buf[2 * FSC_SB_SIZE];
  struct fsc_sb cand[2];
  int r[2];

  ssize_t n = fsc_io_pread (io, FSC_FILE_INDEX, fd, buf, sizeof buf, 0);
  if (n == -1)
    return FSC_REJ_IO;
  if (n < FSC_SB_SIZE)
    return FSC_REJ_SHORT;
  for (int i = 0; i < 2; ++i)
    r[i] = (i + 1) * FSC_SB_SIZE <= n
      ? fsc_sb_decode (buf + i * FSC_SB_SIZE, &cand[i]) : FSC_REJ_SHORT;

  int best = -1;
  for (int i = 0; i < 2; ++i)
    if (r[i] == FSC_OK && (best == -1 || cand[i].seq > cand[best].seq))
      best = i;
  if (best == -1) {
    /* Report the more telling reason: a version or geometry problem
     * says more than a blank or torn slot.
     */
    if (r[0] == FSC_REJ_VERSION || r[1] == FSC_REJ_VERSION)
      return FSC_REJ_VERSION;
    if (r[0] == FSC_REJ_GEOMETRY || r[1] == FSC_REJ_GEOMETRY)
      return FSC_REJ_GEOMETRY;
    if (r[0] == FSC_REJ_CHECKSUM || r[1] == FSC_REJ_CHECKSUM)
      return FSC_REJ_CHECKSUM;
    return r[0];
  }
  *sb = cand[best];
  *slot = best;
  return FSC_OK;
}

void
fsc_grec_encode (const struct fsc_grec *g, unsigned char *buf)
{
  memset (buf, 0, FSC_GREC_SIZE);
  put_le32 (buf + GR_MAGIC, GREC_MAGIC);
  put_le64 (buf + GR_GROUP, g->group);
  put_le64 (buf + GR_SEQ, g->seq);
  put_le64 (buf + GR_INCARNATION, g->incarnation);
  put_le64 (buf + GR_PRESENT, g->present);
  for (int i = 0; i < FSC_GROUP_BLOCKS; ++i)
    put_le64 (buf + GR_CSUM + 8 * i, g->csum[i]);
  for (int i = 0; i < FSC_GROUP_BLOCKS; ++i)
    put_le16 (buf + GR_PIECES + 2 * i, g->pieces[i]);
  put_le64 (buf + GR_ZERO, g->zero);
  put_le64 (buf + GR_CHECKSUM, XXH3_64bits (buf, GR_CHECKSUM));
}

bool
fsc_grec_decode (const unsigned char *buf, struct fsc_grec *g)
{
  if (get_le32 (buf + GR_MAGIC) != GREC_MAGIC ||
      get_le32 (buf + GR_MAGIC + 4) != 0 ||
      get_le64 (buf + GR_CHECKSUM) != XXH3_64bits (buf, GR_CHECKSUM))
    return false;
  g->group = get_le64 (buf + GR_GROUP);
  g->seq = get_le64 (buf + GR_SEQ);
  /* A sequence number no writer reaches: forged, and it would win
   * against everything written after it.
   */
  if (g->seq >= FSC_SEQ_MAX)
    return false;
  g->incarnation = get_le64 (buf + GR_INCARNATION);
  g->present = get_le64 (buf + GR_PRESENT);
  for (int i = 0; i < FSC_GROUP_BLOCKS; ++i)
    g->csum[i] = get_le64 (buf + GR_CSUM + 8 * i);
  /* Whether the pieces fit the block is the object's to check. */
  for (int i = 0; i < FSC_GROUP_BLOCKS; ++i)
    g->pieces[i] = get_le16 (buf + GR_PIECES + 2 * i);
  /* Zero in records of versions 1 and 2 (they wrote zeroes there);
   * whether its bits fit the blocks is the object's to check too.
   */
  g->zero = get_le64 (buf + GR_ZERO);
  return true;
}

int
fsc_grec_pick (const unsigned char *buf, uint64_t group,
               uint64_t incarnation, struct fsc_grec *g)
{
  struct fsc_grec rec[2];
  bool ok[2];
  for (int s = 0; s < 2; ++s)
    ok[s] = fsc_grec_decode (buf + s * FSC_GREC_SIZE, &rec[s]) &&
      rec[s].group == group && rec[s].incarnation == incarnation;
  int best = -1;
  for (int s = 0; s < 2; ++s)
    if (ok[s] && (best == -1 || rec[s].seq > rec[best].seq))
      best = s;
  if (best >= 0)
    *g = rec[best];
  return best;
}

#define SCAN_CHUNK (512 * 2 * FSC_GREC_SIZE)    /* 1 MiB: 512 groups */

int
fsc_grec_scan (struct fsc_io *io, int fd, uint64_t ngroups,
               uint64_t incarnation, fsc_grec_fn fn, void *opaque)
{
  CLEANUP_FREE unsigned char *buf = malloc (SCAN_CHUNK);
  const uint64_t gsize = 2 * FSC_GREC_SIZE;
  const uint64_t end = fsc_grec_offset (ngroups, 0);
  uint64_t pos = FSC_GROUPS_OFFSET;

  if (buf == NULL)
    return -1;
  while (pos < end) {
    /* Skip holes: groups never written cost nothing to load. */
    off_t d = lseek (fd, pos, SEEK_DATA);
    if (d == -1) {
      if (errno == ENXIO)
        break;
      if (errno != EINVAL)      /* SEEK_DATA unsupported: read all */
        return -1;
      d = pos;
    }
    if ((uint64_t) d >= end)
      break;
    pos = FSC_GROUPS_OFFSET +
      ROUND_DOWN ((uint64_t) d - FSC_GROUPS_OFFSET, gsize);
    /* Read only up to the next hole: a big, sparsely cached export
     * has its records scattered, and reading the holes between them
     * would cost as much as a full index.
     */
    uint64_t len = MIN ((uint64_t) SCAN_CHUNK, end - pos);
    off_t h = lseek (fd, d, SEEK_HOLE);
    if (h > d && (uint64_t) h < pos + len)
      len = MIN (len, ROUND_UP ((uint64_t) h - pos, gsize));
    ssize_t n = fsc_io_pread (io, FSC_FILE_INDEX, fd, buf, len, pos);
    if (n == -1)
      return -1;
    if (n == 0)
      break;
    /* The file may end inside the last group (slot 1 never written):
     * what is missing reads as zeroes, which no record matches.
     */
    uint64_t got = ROUND_UP ((uint64_t) n, gsize);
    memset (buf + n, 0, got - n);
    for (uint64_t o = 0; o + gsize <= got; o += gsize) {
      uint64_t group = (pos + o - FSC_GROUPS_OFFSET) / gsize;
      struct fsc_grec rec;
      int best = fsc_grec_pick (buf + o, group, incarnation, &rec);
      if (best >= 0 && fn (opaque, &rec, best) == -1)
        return -1;
    }
    /* A short read ends the file. */
    if ((uint64_t) n < len)
      break;
    pos += len;
  }
  return 0;
}
