/* libfscache: read-only inspection of one object (inspect.h).
 *
 * The helpers of the core that compute block geometry and checksums
 * (internal.h, sums.c, data.c) take a struct fsc_object.  Rather than
 * write them again, an inspection carries a struct fsc_object of its
 * own with just the fields they read: the geometry from the
 * superblock, the data segments' and sums file's descriptors, and a
 * struct fsc_cache whose only used member is its I/O layer (io.c).
 * No lock, thread or group table of it is ever used.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inspect.h"
#include "internal.h"
#include "utils.h"

struct fsc_inspect {
  struct fsc_cache cache;       /* only .io */
  struct fsc_object o;          /* geometry and descriptors only */
  bool writable;
  struct fsc_inspect_info info;
  uint64_t max_seq;             /* highest sequence number seen */
  uint64_t *valid;              /* groups with a valid record, ascending */
  size_t nvalid, valid_cap;
  uint64_t *damaged;            /* groups with bytes but no valid record */
  size_t ndamaged, damaged_cap;
  unsigned char *buf;           /* one block */
};

static int
push (uint64_t **v, size_t *n, size_t *cap, uint64_t x)
{
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 64;
    uint64_t *nv = realloc (*v, ncap * sizeof *nv);
    if (nv == NULL)
      return -1;
    *v = nv;
    *cap = ncap;
  }
  (*v)[(*n)++] = x;
  return 0;
}

/* Open NAME+SUFFIX of the fan-out directory without creating it; only
 * our own regular file with one link, as the filter requires (a
 * symlink counts as not ours).
 */
static int
open_file (const struct fsc_inspect *ins, const char *suffix, bool writable)
{
  int fd = fsc_open_file_flags (&ins->o, suffix,
                                (writable ? O_RDWR : O_RDONLY) | O_NOCTTY);
  if (fd == -1 && errno == ELOOP)
    errno = EPERM;
  return fd;
}

/* Open the data segments and the sums file, checking their lengths as
 * the reload rules do (docs/format.md, "Data files").
 */
static int
open_data (struct fsc_inspect *ins)
{
  struct fsc_object *o = &ins->o;
  struct fsc_inspect_info *in = &ins->info;
  struct stat st;

  o->nseg = o->size ? DIV_ROUND_UP (o->size, FSC_SEG_SIZE) : 1;
  o->dfds = malloc (o->nseg * sizeof *o->dfds);
  if (o->dfds == NULL)
    return -1;
  in->nseg = o->nseg;
  for (uint64_t i = 0; i < o->nseg; ++i) {
    char suffix[FSC_SEG_SUFFIX_MAX];
    uint64_t len = o->size ? MIN (FSC_SEG_SIZE, o->size - i * FSC_SEG_SIZE)
                           : 0;
    if (i == 0)
      snprintf (suffix, sizeof suffix, ".data");
    else
      snprintf (suffix, sizeof suffix, ".data.%" PRIu64, i);
    o->dfds[i] = open_file (ins, suffix, ins->writable);
    if (o->dfds[i] == -1) {
      if (errno != ENOENT && errno != EPERM)
        return -1;
      in->bad_segments++;
      continue;
    }
    in->allocated += fd_allocated (o->dfds[i]);
    if (fstat (o->dfds[i], &st) == -1)
      return -1;
    if ((uint64_t) st.st_size != len)
      in->bad_segments++;
  }
  o->sfd = open_file (ins, ".sums", ins->writable);
  if (o->sfd == -1) {
    if (errno != ENOENT && errno != EPERM)
      return -1;
    return 0;
  }
  in->allocated += fd_allocated (o->sfd);
  if (fstat (o->sfd, &st) == -1)
    return -1;
  uint64_t want;
  if (MUL_OVERFLOW (o->nblocks, (uint64_t) subs_per_block (o) * 8, &want)) {
    errno = EOVERFLOW;
    return -1;
  }
  in->sums_ok = (uint64_t) st.st_size == want;
  return 0;
}

bool
fsc_inspect_block (const struct fsc_inspect *ins, const struct fsc_grec *rec,
                   unsigned i, unsigned *pieces, bool *zero, uint64_t *bytes)
{
  uint64_t b = rec->group * FSC_GROUP_BLOCKS + i;
  if (!(rec->present & (UINT64_C (1) << i)) || b >= ins->o.nblocks)
    return false;
  /* As the filter loads it (object.c): pieces it cannot have are
   * damage, all of its pieces read as whole; a zero block is whole,
   * with the checksum of zeroes, or damage.
   */
  unsigned p = rec->pieces[i], full = full_pieces (&ins->o, b);
  if (p & ~full)
    return false;
  *zero = rec->zero & (UINT64_C (1) << i);
  if (*zero && (p != 0 || rec->csum[i] != zero_csum (&ins->o, b)))
    return false;
  *pieces = p == full ? 0 : p;
  *bytes = *zero ? 0 : held_bytes (&ins->o, b, *pieces);
  return true;
}

void
fsc_inspect_block_range (const struct fsc_inspect *ins, uint64_t b,
                         uint64_t *off, uint64_t *len)
{
  *off = block_start (&ins->o, b);
  *len = block_end (&ins->o, b) - *off;
}

/* The last group's record may have bits past the export's end, and
 * zero bits of absent blocks: the filter ignores them, and so does
 * everybody here.
 */
static void
mask_tail (const struct fsc_inspect *ins, struct fsc_grec *rec)
{
  const struct fsc_object *o = &ins->o;
  if (rec->group == o->ngroups - 1 && o->nblocks % FSC_GROUP_BLOCKS)
    rec->present &= (UINT64_C (1) << (o->nblocks % FSC_GROUP_BLOCKS)) - 1;
  rec->zero &= rec->present;
}

static int
count_group (void *opaque, const struct fsc_grec *rec0, int slot)
{
  struct fsc_inspect *ins = opaque;
  struct fsc_grec rec = *rec0;
  (void) slot;
  mask_tail (ins, &rec);
  ins->info.records++;
  ins->max_seq = MAX (ins->max_seq, rec.seq);
  if (push (&ins->valid, &ins->nvalid, &ins->valid_cap, rec.group) == -1)
    return -1;
  for (unsigned i = 0; i < FSC_GROUP_BLOCKS; ++i) {
    unsigned p;
    bool z;
    uint64_t bytes;
    if (!(rec.present & (UINT64_C (1) << i)))
      continue;
    if (!fsc_inspect_block (ins, &rec, i, &p, &z, &bytes)) {
      ins->info.bad_pieces++;
      continue;
    }
    ins->info.present_blocks++;
    ins->info.zero_blocks += z;
    ins->info.cached_bytes += bytes;
  }
  return 0;
}

static int
u64_cmp (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? -1 : x > y;
}

/* Find the groups whose index bytes are not all zero (written at some
 * point) but that have no valid record: fsc_grec_scan passes over
 * them in silence, a check must not.  Only the allocated parts of the
 * index are read.
 */
static int
find_damaged (struct fsc_inspect *ins)
{
  const uint64_t gsize = 2 * FSC_GREC_SIZE;
  const uint64_t end = MIN (fsc_grec_offset (ins->o.ngroups, 0),
                            ins->info.idx_size);
  unsigned char buf[2 * FSC_GREC_SIZE];
  uint64_t pos = FSC_GROUPS_OFFSET;

  while (pos < end) {
    off_t d = lseek (ins->o.ifd, pos, SEEK_DATA);
    if (d == -1) {
      if (errno == ENXIO)
        break;
      if (errno != EINVAL)
        return -1;
      d = pos;
    }
    if ((uint64_t) d >= end)
      break;
    off_t h = lseek (ins->o.ifd, d, SEEK_HOLE);
    uint64_t stop = h > d ? MIN ((uint64_t) h, end) : end;
    pos = FSC_GROUPS_OFFSET +
      ROUND_DOWN ((uint64_t) d - FSC_GROUPS_OFFSET, gsize);
    for (; pos < stop; pos += gsize) {
      uint64_t group = (pos - FSC_GROUPS_OFFSET) / gsize;
      if (bsearch (&group, ins->valid, ins->nvalid, sizeof *ins->valid,
                   u64_cmp))
        continue;
      ssize_t n = fsc_io_pread (&ins->cache.io, FSC_FILE_INDEX, ins->o.ifd,
                                buf, sizeof buf, pos);
      if (n == -1)
        return -1;
      bool written = false;
      for (ssize_t i = 0; i < n && !written; ++i)
        written = buf[i] != 0;
      if (written) {
        ins->info.damaged_groups++;
        if (push (&ins->damaged, &ins->ndamaged, &ins->damaged_cap,
                  group) == -1)
          return -1;
      }
    }
  }
  return 0;
}

static int
load (struct fsc_inspect *ins)
{
  struct fsc_inspect_info *in = &ins->info;
  struct fsc_object *o = &ins->o;
  unsigned char sbuf[2 * FSC_SB_SIZE];
  struct stat st;

  if (fstat (o->ifd, &st) == -1)
    return -1;
  in->idx_size = st.st_size;
  in->allocated = fd_allocated (o->ifd);
  in->stale = faccessat (o->fandirfd, fsc_file_name (o, ".stale",
                                                     (char [FILE_NAME_MAX]) {0}),
                         F_OK, AT_SYMLINK_NOFOLLOW) == 0;

  /* Each slot's own verdict, for the report; the winner as the filter
   * picks it.
   */
  ssize_t n = fsc_io_pread (&ins->cache.io, FSC_FILE_INDEX, o->ifd, sbuf,
                            sizeof sbuf, 0);
  if (n == -1)
    return -1;
  for (int s = 0; s < 2; ++s) {
    struct fsc_sb tmp;
    in->slot_reason[s] = (s + 1) * FSC_SB_SIZE <= n
      ? fsc_sb_decode (sbuf + s * FSC_SB_SIZE, &tmp) : FSC_REJ_SHORT;
    if (in->slot_reason[s] == FSC_OK)
      ins->max_seq = MAX (ins->max_seq, tmp.seq);
  }
  in->reason = in->idx_size == 0 ? FSC_REJ_NEW
    : fsc_sb_load (&ins->cache.io, o->ifd, &in->sb, &in->sb_slot);
  if (in->reason != FSC_OK)
    return 0;
  /* The core's buffers hold blocks up to FSC_MAX_BLOCK_SIZE, and no
   * filter uses blocks below one sub-block: such an index is never
   * reused (block-size-changed).
   */
  if (in->sb.block_size < SUB_SIZE || in->sb.block_size > FSC_MAX_BLOCK_SIZE) {
    in->reason = FSC_REJ_BLOCK_SIZE;
    return 0;
  }
  o->block_size = in->sb.block_size;
  o->bshift = __builtin_ctz (o->block_size);
  o->pshift = PIECE_SHIFT_OF (o->bshift);
  o->size = in->sb.size;
  o->nblocks = in->sb.nblocks;
  o->ngroups = DIV_ROUND_UP (o->nblocks, FSC_GROUP_BLOCKS);
  fsc_zero_csums (o);
  in->ngroups = o->ngroups;
  ins->buf = malloc (o->block_size);
  if (ins->buf == NULL)
    return -1;
  if (fsc_grec_scan (&ins->cache.io, o->ifd, o->ngroups, in->sb.incarnation,
                     count_group, ins) == -1 ||
      find_damaged (ins) == -1)
    return -1;
  return open_data (ins);
}

int
fsc_inspect_open (int fandirfd, const char *name, bool writable,
                  struct fsc_inspect **insp, struct fsc_inspect_info *info)
{
  struct fsc_inspect *ins = calloc (1, sizeof *ins);
  if (ins == NULL)
    return -1;
  if (strlen (name) > FSC_NAME_MAX) {
    free (ins);
    errno = ENAMETOOLONG;
    return -1;
  }
  fsc_io_init (&ins->cache.io, NULL);
  ins->o.cache = &ins->cache;
  ins->o.fandirfd = fandirfd;
  ins->o.ifd = ins->o.sfd = -1;
  ins->writable = writable;
  snprintf (ins->o.name, sizeof ins->o.name, "%s", name);
  ins->o.ifd = open_file (ins, ".idx", writable);
  if (ins->o.ifd == -1 || load (ins) == -1) {
    int e = errno;
    fsc_inspect_close (ins);
    errno = e;
    return -1;
  }
  *info = ins->info;
  *insp = ins;
  return 0;
}

void
fsc_inspect_close (struct fsc_inspect *ins)
{
  if (ins == NULL)
    return;
  for (uint64_t i = 0; ins->o.dfds && i < ins->o.nseg; ++i)
    if (ins->o.dfds[i] >= 0)
      close (ins->o.dfds[i]);
  free (ins->o.dfds);
  if (ins->o.sfd >= 0)
    close (ins->o.sfd);
  if (ins->o.ifd >= 0)
    close (ins->o.ifd);
  free (ins->valid);
  free (ins->damaged);
  free (ins->buf);
  free (ins);
}

int
fsc_inspect_lock (struct fsc_inspect *ins)
{
  return flock (ins->o.ifd, LOCK_EX | LOCK_NB);
}

struct groups_ctx {
  struct fsc_inspect *ins;
  fsc_inspect_group_fn fn;
  void *opaque;
};

static int
each_group (void *opaque, const struct fsc_grec *rec0, int slot)
{
  struct groups_ctx *c = opaque;
  struct fsc_grec rec = *rec0;
  mask_tail (c->ins, &rec);
  return c->fn (c->opaque, &rec, slot);
}

int
fsc_inspect_groups (struct fsc_inspect *ins, fsc_inspect_group_fn fn,
                    void *opaque)
{
  struct groups_ctx c = { ins, fn, opaque };
  if (ins->info.reason != FSC_OK) {
    errno = EINVAL;
    return -1;
  }
  return fsc_grec_scan (&ins->cache.io, ins->o.ifd, ins->o.ngroups,
                        ins->info.sb.incarnation, each_group, &c);
}

uint64_t
fsc_inspect_damaged (const struct fsc_inspect *ins, uint64_t *groups,
                     uint64_t n)
{
  uint64_t k = MIN (n, (uint64_t) ins->ndamaged);
  memcpy (groups, ins->damaged, k * sizeof *groups);
  return k;
}

int
fsc_inspect_verify (struct fsc_inspect *ins, uint64_t b, uint64_t csum,
                    unsigned pieces, bool zero)
{
  struct fsc_object *o = &ins->o;
  uint64_t start = block_start (o, b), len = block_end (o, b) - start;
  unsigned k = DIV_ROUND_UP (len, SUB_SIZE);
  uint64_t hashes[MAX_SUBS], sums[MAX_SUBS];
  unsigned char le[8 * MAX_SUBS];
  int bad = 0;

  /* A zero block: what a hit checks, without reading anything. */
  if (zero)
    return csum == zero_csum (o, b) ? 0 : FSC_INSPECT_BAD_DATA;

  /* The data: bytes outside the pieces are read too (holes, most
   * often) and their hashes masked out, as the checksum counts them.
   */
  ssize_t n = fsc_data_pread (o, ins->buf, len, start);
  if (n == -1)
    return -1;
  memset (ins->buf + n, 0, len - n);
  fsc_sub_hashes (ins->buf, len, hashes);
  fsc_sums_mask (o, hashes, k, pieces);
  if (fsc_sums_csum (hashes, k) != csum)
    bad |= FSC_INSPECT_BAD_DATA;

  /* The sums file: what a partial hit trusts. */
  memset (le, 0, 8 * k);
  if (o->sfd >= 0) {
    n = fsc_io_pread (&ins->cache.io, FSC_FILE_SUMS, o->sfd, le, 8 * k,
                      sums_offset (o, b));
    if (n == -1)
      return -1;
  }
  for (unsigned i = 0; i < k; ++i)
    sums[i] = get_le64 (le + 8 * i);
  fsc_sums_mask (o, sums, k, pieces);
  if (fsc_sums_csum (sums, k) != csum)
    bad |= FSC_INSPECT_BAD_SUMS;
  return bad;
}

int
fsc_inspect_drop (struct fsc_inspect *ins, const struct fsc_grec *rec,
                  int slot, uint64_t group, uint64_t bits)
{
  struct fsc_object *o = &ins->o;
  struct fsc_grec nrec;
  unsigned char buf[FSC_GREC_SIZE];

  if (!ins->writable || ins->info.reason != FSC_OK || group >= o->ngroups) {
    errno = EINVAL;
    return -1;
  }
  if (rec) {
    nrec = *rec;
    nrec.present &= ~bits;
    nrec.zero &= nrec.present;
    for (unsigned i = 0; i < FSC_GROUP_BLOCKS; ++i)
      if (!(nrec.present & (UINT64_C (1) << i)))
        nrec.csum[i] = nrec.pieces[i] = 0;
  }
  else {
    memset (&nrec, 0, sizeof nrec);
    nrec.group = group;
    nrec.incarnation = ins->info.sb.incarnation;
  }
  if (ins->max_seq + 1 >= FSC_SEQ_MAX) {
    errno = EOVERFLOW;
    return -1;
  }
  nrec.seq = ++ins->max_seq;
  fsc_grec_encode (&nrec, buf);
  /* The other slot keeps the old record until the new one is durable. */
  int nslot = rec && slot >= 0 ? 1 - slot : 0;
  if (fsc_io_pwrite (&ins->cache.io, FSC_FILE_INDEX, o->ifd, buf, sizeof buf,
                     fsc_grec_offset (group, nslot)) == -1 ||
      fsc_io_sync (&ins->cache.io, FSC_FILE_INDEX, o->ifd) == -1)
    return -1;

  /* Only now that no durable record names them: their space.  A
   * failure leaves garbage the next unclean open reclaims, no harm.
   */
  for (uint64_t t = bits; t; t &= t - 1) {
    uint64_t b = group * FSC_GROUP_BLOCKS + __builtin_ctzll (t);
    if (b >= o->nblocks)
      break;
    uint64_t start = block_start (o, b);
    fsc_data_punch (o, start, block_end (o, b) - start);
    if (o->sfd >= 0)
      punch_hole (o->sfd, sums_offset (o, b), subs_per_block (o) * 8);
  }
  return 0;
}
