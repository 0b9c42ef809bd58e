/* libfscache: read-only inspection of one object (inspect.h).
 *
 * The helpers of the core that compute block geometry and checksums
 * (internal.h, sums.c) take an object's geometry (struct fsc_geom),
 * and those that name, open, read and punch its files (files.c,
 * data.c's fsc_segs_*) its files (struct fsc_files): an inspection
 * carries those two, filled from the superblock and the files it
 * opens, and an I/O layer of its own (io.c).  No object is made: no
 * lock, thread, group table or not-clean mark of one is involved.
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
  struct fsc_io io;
  struct fsc_geom geom;         /* from the superblock */
  struct fsc_files files;       /* the object's files, opened here */
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
  int fd = fsc_open_file_flags (&ins->files, suffix,
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
  struct fsc_geom *g = &ins->geom;
  struct fsc_files *f = &ins->files;
  struct fsc_inspect_info *in = &ins->info;
  struct stat st;

  f->nseg = fsc_seg_count (g->size);
  f->dfds = malloc (f->nseg * sizeof *f->dfds);
  if (f->dfds == NULL)
    return -1;
  in->nseg = f->nseg;
  for (uint64_t i = 0; i < f->nseg; ++i) {
    char suffix[FSC_SEG_SUFFIX_MAX];
    uint64_t len = g->size ? MIN (FSC_SEG_SIZE, g->size - i * FSC_SEG_SIZE)
                           : 0;
    fsc_seg_suffix (i, suffix);
    f->dfds[i] = open_file (ins, suffix, ins->writable);
    if (f->dfds[i] == -1) {
      if (errno != ENOENT && errno != EPERM)
        return -1;
      in->bad_segments++;
      continue;
    }
    in->allocated += fd_allocated (f->dfds[i]);
    if (fstat (f->dfds[i], &st) == -1)
      return -1;
    if ((uint64_t) st.st_size != len)
      in->bad_segments++;
  }
  f->sfd = open_file (ins, ".sums", ins->writable);
  if (f->sfd == -1) {
    if (errno != ENOENT && errno != EPERM)
      return -1;
    return 0;
  }
  in->allocated += fd_allocated (f->sfd);
  if (fstat (f->sfd, &st) == -1)
    return -1;
  uint64_t want;
  if (MUL_OVERFLOW (g->nblocks, (uint64_t) subs_per_block (g) * 8, &want)) {
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
  if (!(rec->present & (UINT64_C (1) << i)) || b >= ins->geom.nblocks)
    return false;
  /* As the filter loads it (object.c): pieces it cannot have are
   * damage, all of its pieces read as whole; a zero block is whole,
   * with the checksum of zeroes, or damage.
   */
  unsigned p = rec->pieces[i], full = full_pieces (&ins->geom, b);
  if (p & ~full)
    return false;
  *zero = rec->zero & (UINT64_C (1) << i);
  if (*zero && (p != 0 || rec->csum[i] != zero_csum (&ins->geom, b)))
    return false;
  *pieces = p == full ? 0 : p;
  *bytes = *zero ? 0 : held_bytes (&ins->geom, b, *pieces);
  return true;
}

void
fsc_inspect_block_range (const struct fsc_inspect *ins, uint64_t b,
                         uint64_t *off, uint64_t *len)
{
  *off = block_start (&ins->geom, b);
  *len = block_end (&ins->geom, b) - *off;
}

/* The last group's record may have bits past the export's end, and
 * zero bits of absent blocks: the filter ignores them, and so does
 * everybody here.
 */
static void
mask_tail (const struct fsc_inspect *ins, struct fsc_grec *rec)
{
  const struct fsc_geom *g = &ins->geom;
  if (rec->group == g->ngroups - 1 && g->nblocks % FSC_GROUP_BLOCKS)
    rec->present &= (UINT64_C (1) << (g->nblocks % FSC_GROUP_BLOCKS)) - 1;
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
  const uint64_t end = MIN (fsc_grec_offset (ins->geom.ngroups, 0),
                            ins->info.idx_size);
  unsigned char buf[2 * FSC_GREC_SIZE];
  uint64_t pos = FSC_GROUPS_OFFSET;

  while (pos < end) {
    off_t d = lseek (ins->files.ifd, pos, SEEK_DATA);
    if (d == -1) {
      if (errno == ENXIO)
        break;
      if (errno != EINVAL)
        return -1;
      d = pos;
    }
    if ((uint64_t) d >= end)
      break;
    off_t h = lseek (ins->files.ifd, d, SEEK_HOLE);
    uint64_t stop = h > d ? MIN ((uint64_t) h, end) : end;
    pos = FSC_GROUPS_OFFSET +
      ROUND_DOWN ((uint64_t) d - FSC_GROUPS_OFFSET, gsize);
    for (; pos < stop; pos += gsize) {
      uint64_t group = (pos - FSC_GROUPS_OFFSET) / gsize;
      if (bsearch (&group, ins->valid, ins->nvalid, sizeof *ins->valid,
                   u64_cmp))
        continue;
      ssize_t n = fsc_io_pread (&ins->io, FSC_FILE_INDEX, ins->files.ifd,
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
  struct fsc_geom *g = &ins->geom;
  struct fsc_files *f = &ins->files;
  unsigned char sbuf[2 * FSC_SB_SIZE];
  struct stat st;

  if (fstat (f->ifd, &st) == -1)
    return -1;
  in->idx_size = st.st_size;
  in->allocated = fd_allocated (f->ifd);
  in->stale = fsc_stale_marked (f);

  /* Each slot's own verdict, for the report; the winner as the filter
   * picks it.
   */
  ssize_t n = fsc_io_pread (&ins->io, FSC_FILE_INDEX, f->ifd, sbuf,
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
    : fsc_sb_load (&ins->io, f->ifd, &in->sb, &in->sb_slot);
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
  g->block_size = in->sb.block_size;
  g->bshift = __builtin_ctz (g->block_size);
  g->pshift = PIECE_SHIFT_OF (g->bshift);
  g->size = in->sb.size;
  g->nblocks = in->sb.nblocks;
  g->ngroups = DIV_ROUND_UP (g->nblocks, FSC_GROUP_BLOCKS);
  fsc_zero_csums (g);
  in->ngroups = g->ngroups;
  ins->buf = malloc (g->block_size);
  if (ins->buf == NULL)
    return -1;
  if (fsc_grec_scan (&ins->io, f->ifd, g->ngroups, in->sb.incarnation,
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
  fsc_io_init (&ins->io, NULL);
  ins->files.fandirfd = fandirfd;
  ins->files.ifd = ins->files.sfd = -1;
  ins->writable = writable;
  snprintf (ins->files.name, sizeof ins->files.name, "%s", name);
  ins->files.ifd = open_file (ins, ".idx", writable);
  if (ins->files.ifd == -1 || load (ins) == -1) {
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
  for (uint64_t i = 0; ins->files.dfds && i < ins->files.nseg; ++i)
    if (ins->files.dfds[i] >= 0)
      close (ins->files.dfds[i]);
  free (ins->files.dfds);
  if (ins->files.sfd >= 0)
    close (ins->files.sfd);
  if (ins->files.ifd >= 0)
    close (ins->files.ifd);
  free (ins->valid);
  free (ins->damaged);
  free (ins->buf);
  free (ins);
}

int
fsc_inspect_lock (struct fsc_inspect *ins)
{
  return flock (ins->files.ifd, LOCK_EX | LOCK_NB);
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
  return fsc_grec_scan (&ins->io, ins->files.ifd, ins->geom.ngroups,
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
  struct fsc_geom *g = &ins->geom;
  struct fsc_files *f = &ins->files;
  uint64_t start = block_start (g, b), len = block_end (g, b) - start;
  unsigned k = DIV_ROUND_UP (len, SUB_SIZE);
  uint64_t hashes[MAX_SUBS], sums[MAX_SUBS];
  int bad = 0;

  /* A zero block: what a hit checks, without reading anything. */
  if (zero)
    return csum == zero_csum (g, b) ? 0 : FSC_INSPECT_BAD_DATA;

  /* The data: bytes outside the pieces are read too (holes, most
   * often) and their hashes masked out, as the checksum counts them.
   */
  ssize_t n = fsc_segs_pread (&ins->io, f, ins->buf, len, start);
  if (n == -1)
    return -1;
  memset (ins->buf + n, 0, len - n);
  fsc_sub_hashes (ins->buf, len, hashes);
  fsc_sums_mask (g, hashes, k, pieces);
  if (fsc_sums_csum (hashes, k) != csum)
    bad |= FSC_INSPECT_BAD_DATA;

  /* The sums file: what a partial hit trusts. */
  memset (sums, 0, k * sizeof *sums);
  if (f->sfd >= 0 && fsc_sums_read (&ins->io, f, g, b, k, sums) == -1)
    return -1;
  fsc_sums_mask (g, sums, k, pieces);
  if (fsc_sums_csum (sums, k) != csum)
    bad |= FSC_INSPECT_BAD_SUMS;
  return bad;
}

int
fsc_inspect_drop (struct fsc_inspect *ins, const struct fsc_grec *rec,
                  int slot, uint64_t group, uint64_t bits)
{
  struct fsc_geom *g = &ins->geom;
  struct fsc_files *f = &ins->files;
  struct fsc_grec nrec;
  unsigned char buf[FSC_GREC_SIZE];

  if (!ins->writable || ins->info.reason != FSC_OK || group >= g->ngroups) {
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
  if (fsc_io_pwrite (&ins->io, FSC_FILE_INDEX, f->ifd, buf, sizeof buf,
                     fsc_grec_offset (group, nslot)) == -1 ||
      fsc_io_sync (&ins->io, FSC_FILE_INDEX, f->ifd) == -1)
    return -1;

  /* Only now that no durable record names them: their space.  A
   * failure leaves garbage the next unclean open reclaims, no harm.
   */
  for (uint64_t t = bits; t; t &= t - 1) {
    uint64_t b = group * FSC_GROUP_BLOCKS + __builtin_ctzll (t);
    if (b >= g->nblocks)
      break;
    uint64_t start = block_start (g, b);
    fsc_segs_punch (f, start, block_end (g, b) - start);
    if (f->sfd >= 0)
      punch_hole (f->sfd, sums_offset (g, b), subs_per_block (g) * 8);
  }
  return 0;
}
