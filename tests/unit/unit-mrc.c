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
 *  threads  accesses are applied a thread's batch at a time (mrc.c):
 *           4 threads each loop 50,000 times over 1,000 blocks of
 *           their own, then flush.  Every access counts (refs 200,000
 *           exactly: every block is kept, weight 1), a thread's order
 *           is kept (no distance under its own 1,000 blocks: nothing
 *           hits in 500), and no distance exceeds the 4,000 blocks in
 *           all (everything but the first accesses hits in 5,000).  A
 *           batch applied twice, lost, or out of its thread's order
 *           breaks one of the three.
 *  exact    every access kept (1,500 blocks), the curve at sizes 2^k
 *           against LRU computed by brute force: a reuse distance D
 *           (distinct blocks since, plus one) falls in the bucket of D,
 *           so the curve at 2^k is exactly LRU's hit ratio at 2^k - 1
 *           blocks.  60,000 reads of a skewed random trace, so that the
 *           clock is renumbered (every 32,768 accesses) and the marks'
 *           counts cross every word and stretch boundary; a distance
 *           off by one anywhere moves a ratio.
 *  switch   a thread that turns to another curve drops its batch for
 *           the last (at most 31 accesses), which may have been freed;
 *           the new curve's counts are its own.
 */
#include <config.h>

#include <malloc.h>
#include <pthread.h>
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

/* Brute force: LRU stack distances, a list of the blocks most recent
 * first.  hits[d] counts accesses at distance d (1-based position).
 */
#define EX_BLOCKS 1500
#define EX_READS 60000
static void
test_exact (void)
{
  static uint64_t stack[EX_BLOCKS];
  static uint64_t hits[EX_BLOCKS + 1];
  unsigned depth = 0;
  uint64_t firsts = 0;
  struct fsc_mrc *m = fsc_mrc_new ();
  CHECK (m != NULL);
  for (int i = 0; i < EX_READS; ++i) {
    /* Skewed: half the reads over a tenth of the blocks. */
    uint64_t b = rnd () % 2 ? rnd () % (EX_BLOCKS / 10) : rnd () % EX_BLOCKS;
    fsc_mrc_access (m, b);
    unsigned j = 0;
    while (j < depth && stack[j] != b)
      j++;
    if (j == depth) {
      firsts++;
      depth++;
    }
    else
      hits[j + 1]++;
    for (; j > 0; --j)
      stack[j] = stack[j - 1];
    stack[0] = b;
  }
  fsc_mrc_flush (m);
  for (unsigned k = 1; (1u << k) <= EX_BLOCKS; ++k) {
    uint64_t lru = 0;
    for (unsigned d = 1; d < (1u << k); ++d)
      lru += hits[d];
    uint64_t refs;
    double got = fsc_mrc_hit_ratio (m, (uint64_t) 1 << k, &refs);
    double want = (double) lru / EX_READS;
    printf ("exact: size %u: curve %.6f, LRU of %u blocks %.6f\n",
            1u << k, got, (1u << k) - 1, want);
    CHECK_EQ (refs, EX_READS);
    CHECK (got > want - 1e-9 && got < want + 1e-9);
  }
  CHECK_EQ (firsts + 0, (uint64_t) depth);
  fsc_mrc_free (m);
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

#define T_THREADS 4
#define T_BLOCKS 1000
#define T_ROUNDS 50

static void *
looper (void *arg)
{
  struct fsc_mrc *m = *(struct fsc_mrc **) arg;
  uint64_t base = (uint64_t) ((struct fsc_mrc **) arg)[1];
  for (int r = 0; r < T_ROUNDS; ++r)
    for (uint64_t b = 0; b < T_BLOCKS; ++b)
      fsc_mrc_access (m, (base + b) * 7919);
  fsc_mrc_flush (m);
  return NULL;
}

static void
test_threads (void)
{
  struct fsc_mrc *m = fsc_mrc_new ();
  CHECK (m != NULL);
  pthread_t th[T_THREADS];
  void *args[T_THREADS][2];
  for (int t = 0; t < T_THREADS; ++t) {
    args[t][0] = m;
    args[t][1] = (void *) (uintptr_t) (t * T_BLOCKS);
    CHECK (pthread_create (&th[t], NULL, looper, args[t]) == 0);
  }
  for (int t = 0; t < T_THREADS; ++t)
    pthread_join (th[t], NULL);
  uint64_t refs;
  const uint64_t all = T_THREADS * T_BLOCKS;
  double small = fsc_mrc_hit_ratio (m, T_BLOCKS / 2, &refs);
  double big = fsc_mrc_hit_ratio (m, all + all / 4, NULL);
  double want = 1.0 - (double) all / (double) refs;
  printf ("threads: refs %llu, hit ratio %.4f at %d blocks (want 0), "
          "%.4f at %llu (want %.4f)\n", (unsigned long long) refs, small,
          T_BLOCKS / 2, big, (unsigned long long) (all + all / 4), want);
  CHECK_EQ (refs, (uint64_t) T_THREADS * T_BLOCKS * T_ROUNDS);
  CHECK (small == 0.0);
  CHECK (big > want - 1e-9 && big < want + 1e-9);
  fsc_mrc_free (m);
}

static void
test_switch (void)
{
  struct fsc_mrc *a = fsc_mrc_new (), *b = fsc_mrc_new ();
  CHECK (a != NULL && b != NULL);
  uint64_t ra, rb;
  for (uint64_t i = 0; i < 10; ++i)
    fsc_mrc_access (a, i);              /* pending: under a batch */
  fsc_mrc_free (a);                     /* freed with them pending */
  for (uint64_t i = 0; i < 40; ++i)
    fsc_mrc_access (b, i);
  (void) fsc_mrc_hit_ratio (b, 100, &rb);
  CHECK_EQ (rb, 40);                    /* none of a's */
  a = fsc_mrc_new ();
  for (uint64_t i = 0; i < 5; ++i)
    fsc_mrc_access (a, i);
  for (uint64_t i = 0; i < 3; ++i)
    fsc_mrc_access (b, i);              /* a's 5 dropped */
  (void) fsc_mrc_hit_ratio (a, 100, &ra);
  (void) fsc_mrc_hit_ratio (b, 100, &rb);
  CHECK_EQ (ra, 0);
  CHECK_EQ (rb, 43);
  printf ("switch: ok\n");
  fsc_mrc_free (a);
  fsc_mrc_free (b);
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
  test_exact ();
  loop (2000);                  /* every block kept */
  loop (200000);                /* sampled */
  test_threads ();
  test_switch ();
  printf ("unit-mrc: ok\n");
  return 0;
}
