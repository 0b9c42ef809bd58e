/* Unit test of core/base/mrc.c: the live miss-ratio curve.
 *
 *  memory   the curve's memory stays bounded whatever the export's
 *           size (issue 45): after it is made, the heap in use
 *           (mallinfo2) does not change while 2,000,000 reads land at
 *           random over 64 TiB of 4 KiB blocks (2^34 blocks), nor
 *           between 100,000 of them and 2,000,000.  A curve that kept
 *           an entry per block seen would grow by millions.
 *  loop     against the truth for LRU: a loop over W blocks read 40
 *           times hits nothing in a cache of fewer than W blocks and
 *           everything but the first round in one of W or more; the
 *           curve says so within 3 points, with W under the sample
 *           size (every block kept) and over it (sampled).
 *  empty    no reads: a hit ratio of 0, and refs 0.
 */
#include <config.h>

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mrc.h"
#include "unit.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t
rnd (void)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static size_t
heap (void)
{
  struct mallinfo2 mi = mallinfo2 ();
  return mi.uordblks + mi.hblkhd;
}

static void
test_memory (void)
{
  struct fsc_mrc *m = fsc_mrc_new ();
  CHECK (m != NULL);
  size_t h0 = heap (), h1 = 0;
  const uint64_t blocks = UINT64_C (1) << 34;     /* 64 TiB of 4 KiB */
  for (int i = 0; i < 2000000; ++i) {
    fsc_mrc_access (m, rnd () % blocks);
    if (i == 100000)
      h1 = heap ();
  }
  size_t h2 = heap ();
  uint64_t refs;
  (void) fsc_mrc_hit_ratio (m, 1024, &refs);
  printf ("memory: heap in use %zu after the curve was made, %zu after "
          "100,000 random reads over 64 TiB, %zu after 2,000,000 "
          "(refs %llu)\n", h0, h1, h2, (unsigned long long) refs);
  CHECK_EQ (h1, h0);
  CHECK_EQ (h2, h0);
  CHECK (refs > 1000000);
  fsc_mrc_free (m);
}

static void
loop (uint64_t w)
{
  struct fsc_mrc *m = fsc_mrc_new ();
  CHECK (m != NULL);
  for (int round = 0; round < 40; ++round)
    for (uint64_t b = 0; b < w; ++b)
      fsc_mrc_access (m, b * 7919);     /* spread out, not adjacent */
  double below = fsc_mrc_hit_ratio (m, w / 2, NULL);
  double at = fsc_mrc_hit_ratio (m, w + w / 8, NULL);
  double truth = 39.0 / 40.0;
  printf ("loop of %llu blocks: predicted hit ratio %.3f at %llu blocks "
          "(LRU: 0), %.3f at %llu (LRU: %.3f)\n", (unsigned long long) w,
          below, (unsigned long long) (w / 2), at,
          (unsigned long long) (w + w / 8), truth);
  CHECK (below < 0.03);
  CHECK (at > truth - 0.03 && at < truth + 0.03);
  fsc_mrc_free (m);
}

/* The kept blocks are those of the smallest hashes: after N distinct
 * blocks the threshold is about the 8,192nd smallest of N uniform
 * hashes, a rate of 8192 / N (the sample's size, mrc.c).  Evicting
 * another block than the largest (a heap that lost its order) leaves
 * the threshold elsewhere.
 */
static void
test_rate (void)
{
  struct fsc_mrc *m = fsc_mrc_new ();
  CHECK (m != NULL);
  CHECK (fsc_mrc_rate (m) == 1.0);
  const uint64_t n = 1000000;
  for (uint64_t b = 0; b < n; ++b)
    fsc_mrc_access (m, b);
  double r = fsc_mrc_rate (m), want = 8192.0 / (double) n;
  printf ("rate after %llu distinct blocks: %.6f (8192 / N = %.6f)\n",
          (unsigned long long) n, r, want);
  CHECK (r > want * 0.95 && r < want * 1.05);
  fsc_mrc_free (m);
}

int
main (void)
{
  struct fsc_mrc *m = fsc_mrc_new ();
  uint64_t refs = 1;
  CHECK (m != NULL);
  CHECK (fsc_mrc_hit_ratio (m, 100, &refs) == 0.0);
  CHECK_EQ (refs, 0);
  fsc_mrc_free (m);
  printf ("empty: ok\n");
  test_memory ();
  test_rate ();
  loop (2000);                  /* every block kept */
  loop (200000);                /* sampled */
  printf ("unit-mrc: ok\n");
  return 0;
}
