/* libfscache: the checksums of cached blocks.
 *
 * Every 4 KiB sub-block of a cached block has an XXH3-64 hash in the
 * sums file; the index keeps, for each block, the XXH3-64 of its
 * sub-block hashes as little-endian bytes.  A whole-block hit hashes
 * what it read; a partial hit checks the block's sub-block hashes
 * against the index, then only the sub-blocks it serves.  A block held
 * in pieces (internal.h) counts the hashes of its absent pieces as 0.
 * Written once here so that the read, fill and write paths hash the
 * same way.
 *
 * A partial hit would read the block's hashes (128 bytes for 64 KiB)
 * every time: a second system call beside the data's.  Once checked
 * against the index they are kept in memory (the object's scache,
 * direct-mapped by block number, at most SCACHE_MAX entries), keyed by
 * the checksum and pieces they were checked against: hashes kept for a
 * checksum are the ones that produce it, so an entry never needs
 * invalidating, only matching.  The data served is still hashed and
 * compared with them on every hit.
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
#include "utils.h"

/* Hash each 4 KiB sub-block of LEN bytes at P into OUT; returns how
 * many (the last may be short).
 */
unsigned
fsc_sub_hashes (const unsigned char *p, uint64_t len, uint64_t *out)
{
  unsigned k = 0;
  for (uint64_t off = 0; off < len; off += SUB_SIZE)
    out[k++] = XXH3_64bits (p + off, MIN (SUB_SIZE, len - off));
  return k;
}

/* The checksum the index keeps for a block: XXH3-64 of its K sub-block
 * hashes as little-endian bytes.
 */
uint64_t
fsc_sums_csum (const uint64_t *sums, unsigned k)
{
  unsigned char le[8 * MAX_SUBS];
  for (unsigned i = 0; i < k; ++i)
    put_le64 (le + 8 * i, sums[i]);
  return XXH3_64bits (le, 8 * k);
}

/* Index checksum of a whole block of LEN bytes at P. */
uint64_t
fsc_block_csum (const unsigned char *p, uint64_t len)
{
  uint64_t sums[MAX_SUBS];
  return fsc_sums_csum (sums, fsc_sub_hashes (p, len, sums));
}

/* The index checksum of an all-zero block of LEN bytes, computed from
 * the hash of one zero sub-block (and of the shorter last one).
 */
static uint64_t
zero_block_csum (uint64_t len)
{
  static const unsigned char zeroes[SUB_SIZE];
  uint64_t sums[MAX_SUBS];
  unsigned k = 0;
  uint64_t full = XXH3_64bits (zeroes, SUB_SIZE);
  for (uint64_t off = 0; off < len; off += SUB_SIZE)
    sums[k++] = len - off >= SUB_SIZE ? full
      : XXH3_64bits (zeroes, len - off);
  return fsc_sums_csum (sums, k);
}

void
fsc_zero_csums (struct fsc_geom *g)
{
  g->zcsum = zero_block_csum (g->block_size);
  g->zcsum_last = g->nblocks
    ? zero_block_csum (g->size - block_start (g, g->nblocks - 1))
    : g->zcsum;
}

/* Zero the hashes of the sub-blocks outside pieces P. */
void
fsc_sums_mask (const struct fsc_geom *g, uint64_t *sums, unsigned k,
               unsigned p)
{
  if (p == 0)
    return;
  const unsigned per = 1u << (g->pshift - SUB_SHIFT);
  for (unsigned i = 0; i < k; ++i)
    if (!(p & (1u << (i / per))))
      sums[i] = 0;
}

static struct scache_entry *
scache_slot (struct fsc_object *o, uint64_t b)
{
  return &o->scache[b & (o->nscache - 1)];
}

/* A 4 KiB hit of a random block finds its entry out of the CPU's
 * caches (4,096 entries of 152 bytes for a 256 MiB export, beside the
 * data the hits copy): two thirds of fsc_scache_get_locked's samples
 * were that first load, 0.2 µs a hit (perf annotate, issue 44).  The
 * read asks for it as it starts, before the miss-ratio curve's and
 * the index's work, so that the load overlaps them.  The table is set
 * once (fsc_scache_put) and freed with the object, and a prefetch of
 * any address is harmless, so no lock is needed.
 */
void
fsc_scache_prefetch (const struct fsc_object *o, uint64_t b)
{
  const struct scache_entry *t = __atomic_load_n (&o->scache,
                                                  __ATOMIC_ACQUIRE);
  if (t == NULL)
    return;
  const size_t n = __atomic_load_n (&o->nscache, __ATOMIC_RELAXED);
  const struct scache_entry *e = &t[b & (n - 1)];
  for (size_t off = 0; off < sizeof *e; off += 64)
    __builtin_prefetch ((const char *) e + off);
}

bool
fsc_scache_get (struct fsc_object *o, uint64_t b, uint64_t csum,
                unsigned pieces, uint64_t *sums, unsigned k)
{
  SCOPED_LOCK (&o->lock);
  return fsc_scache_get_locked (o, b, csum, pieces, sums, k);
}

bool
fsc_scache_get_locked (struct fsc_object *o, uint64_t b, uint64_t csum,
                       unsigned pieces, uint64_t *sums, unsigned k)
{
  if (k > SCACHE_SUBS || o->nscache == 0)
    return false;
  const struct scache_entry *e = scache_slot (o, b);
  if (e->block != b || e->csum != csum || e->pieces != pieces)
    return false;
  memcpy (sums, e->sums, k * sizeof *sums);
  return true;
}

void
fsc_scache_put (struct fsc_object *o, uint64_t b, uint64_t csum,
                unsigned pieces, const uint64_t *sums, unsigned k)
{
  if (k > SCACHE_SUBS)
    return;
  SCOPED_LOCK (&o->lock);
  if (o->nscache == 0) {
    /* Room for every block of a small export, SCACHE_MAX at most. */
    size_t n = 1;
    while (n < SCACHE_MAX && n < o->geom.nblocks)
      n *= 2;
    struct scache_entry *t = malloc (n * sizeof *t);
    if (t == NULL)
      return;                   /* no memory: read them each time */
    for (size_t i = 0; i < n; ++i)
      t[i].block = UINT64_MAX;
    /* nscache before the table: fsc_scache_prefetch reads them
     * without the lock.
     */
    __atomic_store_n (&o->nscache, n, __ATOMIC_RELAXED);
    __atomic_store_n (&o->scache, t, __ATOMIC_RELEASE);
  }
  struct scache_entry *e = scache_slot (o, b);
  e->block = b;
  e->csum = csum;
  e->pieces = pieces;
  memcpy (e->sums, sums, k * sizeof *sums);
}

ssize_t
fsc_sums_read (struct fsc_io *io, const struct fsc_files *f,
               const struct fsc_geom *g, uint64_t b, unsigned k,
               uint64_t *sums)
{
  unsigned char le[8 * MAX_SUBS];
  if (k > MAX_SUBS) {
    errno = EINVAL;
    return -1;
  }
  ssize_t r = fsc_io_pread (io, FSC_FILE_SUMS, f->sfd, le, 8 * k,
                            sums_offset (g, b));
  if (r == -1)
    return -1;
  memset (le + r, 0, 8 * k - r);
  for (unsigned i = 0; i < k; ++i)
    sums[i] = get_le64 (le + 8 * i);
  return r;
}

bool
fsc_sums_check_subs (const uint64_t *sums, unsigned s0,
                     const unsigned char *data, uint64_t len)
{
  for (uint64_t off = 0; off < len; off += SUB_SIZE)
    if (XXH3_64bits (data + off, MIN ((uint64_t) SUB_SIZE, len - off)) !=
        sums[s0 + (off >> SUB_SHIFT)])
      return false;
  return true;
}
