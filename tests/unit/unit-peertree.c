/* Unit test of core/base/peertree.c: the fleet's tree of askers per range.
 *
 *  chains   (T1) random members, each node with its own random subset
 *           of them (the nodes' lists disagree): from every node, the
 *           chain of asks (each hop computed from the asked node's own
 *           list) raises the score at every hop and ends at the origin
 *           within N hops: no loop.
 *  depth    (T2) every node with the same list: every chain reaches
 *           position 0 within ceil(log_K N) hops.
 *  fan-in   (T2) the same: each member is asked by at most K others
 *           per range, and by exactly min(K, ...) as the tree fills.
 *  flat     fanout 0, and N <= K + 1: every node asks the top member.
 *  neighbours (T3) 600 members, fanout 8: over 4,096 ranges each node
 *           asks at most S distinct members with S stripes (16, 4),
 *           and with S 0 (a tree per range) the busiest asks many more:
 *           the control, the growth T3 removes.
 *  parent   against a sort: the returned member is the one at
 *           position (p - 1) / K of the ranking, for positions deep in
 *           a large fleet too (the bisection's path).
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "peertree.h"
#include "unit.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t
rnd (void)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

#define NMAX 600

/* The scores, for one range, of members M[0..N) as seen by node SELF:
 * OUT[k] for the k-th member of its list LIST (not itself).
 */
static size_t
scores_of (const uint64_t *seeds, const bool *list, size_t n, size_t self,
           uint64_t r, uint64_t *out, size_t *idx)
{
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (i != self && list[i]) {
      out[k] = fsc_peer_score (1, 2, r, seeds[i]);
      idx[k++] = i;
    }
  return k;
}

static unsigned
ceil_log (size_t n, unsigned k)
{
  unsigned d = 0;
  size_t reach = 1, width = 1;  /* nodes within d hops, at depth d */
  while (reach < n) {
    width *= k;
    reach += width;
    d++;
  }
  return d;
}

static uint64_t seeds[NMAX];
static bool lists[NMAX][NMAX];
static uint64_t sc[NMAX];
static size_t idx[NMAX];
static unsigned asked[NMAX];
static long parent[NMAX];

static void
test_chains (void)
{
  for (int round = 0; round < 30; ++round) {
    size_t n = 2 + rnd () % 120;
    unsigned k = rnd () % 5;            /* 0: flat */
    for (size_t i = 0; i < n; ++i) {
      seeds[i] = rnd ();
      for (size_t j = 0; j < n; ++j)
        lists[i][j] = rnd () % 3 != 0;  /* each sees 2/3 of the others */
    }
    for (uint64_t r = 0; r < 8; ++r)
      for (size_t start = 0; start < n; ++start) {
        size_t at = start;
        unsigned hops = 0;
        for (;;) {
          uint64_t self = fsc_peer_score (1, 2, r, seeds[at]);
          size_t m = scores_of (seeds, lists[at], n, at, r, sc, idx);
          long p = fsc_peer_parent (sc, m, self, k);
          if (p < 0)
            break;
          CHECK (sc[p] > self);           /* T1: strictly up */
          at = idx[p];
          hops++;
          CHECK (hops < n);               /* no loop */
        }
      }
  }
  printf ("chains: ok\n");
}

static void
test_tree (void)
{
  static const size_t sizes[] = { 1, 2, 4, 5, 9, 10, 20, 64, 100, 333, 600 };
  static const unsigned fanouts[] = { 1, 2, 3, 8, 16 };
  for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; ++a)
    for (size_t b = 0; b < sizeof fanouts / sizeof fanouts[0]; ++b) {
      size_t n = sizes[a];
      unsigned k = fanouts[b];
      for (size_t i = 0; i < n; ++i) {
        seeds[i] = rnd ();
        for (size_t j = 0; j < n; ++j)
          lists[i][j] = true;
      }
      unsigned worst = 0;
      for (uint64_t r = 0; r < 8; ++r) {
        /* Everyone's list is the same: each node's parent once. */
        for (size_t i = 0; i < n; ++i) {
          uint64_t self = fsc_peer_score (1, 2, r, seeds[i]);
          size_t m = scores_of (seeds, lists[i], n, i, r, sc, idx);
          long p = fsc_peer_parent (sc, m, self, k);
          parent[i] = p < 0 ? -1 : (long) idx[p];
          asked[i] = 0;
        }
        for (size_t i = 0; i < n; ++i)
          if (parent[i] >= 0)
            asked[parent[i]]++;
        for (size_t start = 0; start < n; ++start) {
          unsigned hops = 0;
          for (long at = parent[start]; at >= 0; at = parent[at])
            hops++;
          if (hops > worst)
            worst = hops;
          CHECK (hops <= ceil_log (n, k));        /* T2: depth */
        }
        size_t full = 0;
        for (size_t i = 0; i < n; ++i) {
          CHECK (asked[i] <= k);                  /* T2: fan-in */
          full += asked[i] == k;
        }
        /* A complete tree: all but the last interior node are full. */
        if (n > 1)
          CHECK (full == (n - 1) / k);
      }
      if (n == 600 && k == 3)
        printf ("depth: 600 members, fanout 3: %u hops at most (bound %u)\n",
                worst, ceil_log (n, k));
    }
  printf ("depth, fan-in: ok\n");
}

/* The distinct members node SELF asks over R ranges, with STRIPES. */
static size_t
neighbours (size_t n, size_t self, unsigned k, unsigned stripes, uint64_t nr)
{
  static bool seen[NMAX];
  size_t distinct = 0;
  for (size_t i = 0; i < n; ++i)
    seen[i] = false;
  for (uint64_t r = 0; r < nr; ++r) {
    uint64_t st = fsc_peer_stripe (r, stripes);
    uint64_t me = fsc_peer_score (1, 2, st, seeds[self]);
    size_t m = scores_of (seeds, lists[self], n, self, st, sc, idx);
    long p = fsc_peer_parent (sc, m, me, k);
    if (p >= 0 && !seen[idx[p]]) {
      seen[idx[p]] = true;
      distinct++;
    }
  }
  return distinct;
}

static void
test_neighbours (void)
{
  const size_t n = 600;
  for (size_t i = 0; i < n; ++i) {
    seeds[i] = rnd ();
    for (size_t j = 0; j < n; ++j)
      lists[i][j] = true;
  }
  size_t most16 = 0, most4 = 0, most0 = 0;
  for (size_t self = 0; self < n; self += 37) {
    size_t a = neighbours (n, self, 8, 16, 4096);
    size_t b = neighbours (n, self, 8, 4, 4096);
    size_t c = neighbours (n, self, 8, 0, 4096);
    CHECK (a <= 16);                              /* T3 */
    CHECK (b <= 4);
    most16 = a > most16 ? a : most16;
    most4 = b > most4 ? b : most4;
    most0 = c > most0 ? c : most0;
  }
  CHECK (most0 > 64);           /* the control: a tree per range */
  printf ("neighbours: 600 members, fanout 8, 4096 ranges: at most %zu "
          "parents with 16 stripes, %zu with 4, %zu with a tree per "
          "range: ok\n", most16, most4, most0);
}

static int
cmp_desc (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? 1 : x > y ? -1 : 0;
}

static void
test_parent_against_sort (void)
{
  static uint64_t sorted[NMAX];
  for (int round = 0; round < 200; ++round) {
    size_t n = 1 + rnd () % NMAX;
    unsigned k = 1 + rnd () % 4;
    for (size_t i = 0; i < n; ++i)
      sorted[i] = sc[i] = rnd ();
    qsort (sorted, n, sizeof sorted[0], cmp_desc);
    /* Self at every position, between two members' scores. */
    for (size_t pos = 0; pos <= n; pos += 1 + pos / 8) {
      /* Exactly POS members above: SELF at the score of the next one
       * (which is not above it), or below all.
       */
      uint64_t self = pos == n ? 0 : sorted[pos];
      if ((pos < n && pos > 0 && sorted[pos - 1] == self) || sorted[n - 1] == 0)
        continue;                       /* ties: not this position */
      long p = fsc_peer_parent (sc, n, self, k);
      if (pos == 0) {
        CHECK (p == -1);
        continue;
      }
      CHECK (p >= 0);
      CHECK_EQ (sc[p], sorted[(pos - 1) / k]);
      CHECK_EQ (fsc_peer_parent (sc, n, self, 0) >= 0 ?
                sc[fsc_peer_parent (sc, n, self, 0)] : 0, sorted[0]);
    }
  }
  /* Flat: N <= K + 1 asks the top whatever K. */
  for (size_t i = 0; i < 4; ++i)
    sc[i] = 100 + 10 * i;
  CHECK_EQ (fsc_peer_parent (sc, 4, 5, 4), 3);
  CHECK_EQ (fsc_peer_parent (sc, 4, 5, 8), 3);
  CHECK_EQ (fsc_peer_parent (sc, 4, 5, 3), 2);    /* position 4 asks 1: 120 */
  CHECK_EQ (fsc_peer_parent (sc, 4, 200, 3), (unsigned long long) -1);
  CHECK_EQ (fsc_peer_depth (0, 3), 0);
  CHECK_EQ (fsc_peer_depth (4, 3), 2);
  CHECK_EQ (fsc_peer_depth (4, 0), 1);
  printf ("parent, flat: ok\n");
}

int
main (void)
{
  test_chains ();
  test_tree ();
  test_parent_against_sort ();
  test_neighbours ();
  return 0;
}
