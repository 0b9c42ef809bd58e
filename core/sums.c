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

/* Zero the hashes of the sub-blocks outside pieces P. */
void
fsc_sums_mask (const struct fsc_object *o, uint64_t *sums, unsigned k,
               unsigned p)
{
  if (p == 0)
    return;
  const unsigned per = 1u << (o->pshift - SUB_SHIFT);
  for (unsigned i = 0; i < k; ++i)
    if (!(p & (1u << (i / per))))
      sums[i] = 0;
}
