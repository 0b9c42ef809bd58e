/* libfscache: the fleet's tree of askers for one range (issue 41).
 *
 * Every range of an object ranks the fleet's members by a rendezvous
 * score (highest random weight: a hash of the object's key, the range
 * and the member's URI), the same ranking on every node that lists the
 * same members.  A flat fleet sends every miss on a range to its first
 * member, which then serves N - 1 askers: at thousands of nodes an
 * image booted in lockstep keeps the few owners of the hot ranges busy
 * while the rest idle (the figures: 8.4 s for one owner to
 * serve one hot 1 MiB range 10,000 times at 10 Gbit/s).  Here the
 * ranking is read as a complete K-ary tree, as DADI and Dragonfly
 * build theirs: position 0 reads the origin, position p asks position
 * (p - 1) / K, so that each member serves at most K askers per range
 * and a range reaches the last node after ceil(log_K N) hops.  The
 * same ranking, so nothing more is agreed on than a flat fleet
 * agrees on, and with N <= K + 1 it is the flat fleet.
 *
 * Stripes (issue 41's "per-node fds and threads flat in N").  A tree
 * per range ranks the members afresh for every range, so over an
 * image a node's parent is, range after range, nearly every other
 * member: each node ends up holding a connection to, and serving one
 * from, most of the fleet (measured: 176, 201, 282 descriptors at 8,
 * 16 and 32 nodes).  So the ranges share S trees, as SplitStream's
 * stripes do: range r uses the ranking of stripe r mod S (the score is
 * taken of the stripe, not the range).  A node then has at most S
 * parents per object and, on average, S children, whatever N; the
 * ranges of one stripe are spread through the image, so each stripe's
 * root reads 1/S of it from the origin and the roots of successive
 * ranges differ.  The price is balance in small fleets: S stripes
 * over N > S / 4 members give some members more roots than others
 * (S 16 over 8 members: a member roots 2 on average, up to 5 or so).
 * S 0: a tree per range, as before.
 *
 * Invariants:
 *   T1  a node asks only a member whose score for the range is
 *       strictly above its own.  So no chain of asks loops, whatever
 *       the nodes' lists say (each hop raises the score), and the
 *       claims a serving node holds while it asks upward cannot wait
 *       on each other.  Broken by tests/unit/unit-peertree.c, "chains".
 *   T2  with every node's list the same, a chain from any node
 *       reaches position 0 within ceil(log_K N) hops, and each member
 *       is asked by at most K others per range.  Broken by
 *       tests/unit/unit-peertree.c, "depth" and "fan-in".
 *   T3  with S stripes, the members a node asks over all the ranges of
 *       an object (each range's parent) are at most S, whatever N: a
 *       node's links to peers, and the connections each peer serves,
 *       do not grow with the fleet.  Broken by
 *       tests/unit/unit-peertree.c, "neighbours" (with S 0 a node of
 *       600 asks hundreds).
 *
 * A member set aside (it failed) is left out of SCORES by the caller:
 * the positions below it move up one, so its children go to a member
 * above them, and every node that saw the failure agrees on where.
 */
#include <config.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "peertree.h"
#include "xxh.h"

uint64_t
fsc_peer_score (uint64_t lo, uint64_t hi, uint64_t r, uint64_t seed)
{
  uint64_t v[3] = { lo, hi, r };
  return XXH3_64bits_withSeed (v, sizeof v, seed);
}

long
fsc_peer_parent (const uint64_t *scores, size_t n, uint64_t self,
                 unsigned fanout)
{
  uint64_t p = 0;               /* members above us: our position */
  long top = -1;
  for (size_t i = 0; i < n; ++i)
    if (scores[i] > self) {
      p++;
      if (top == -1 || scores[i] > scores[top])
        top = (long) i;
    }
  if (p == 0)
    return -1;
  const uint64_t q = fanout == 0 ? 0 : (p - 1) / fanout;
  if (q == 0)
    return top;
  /* The member at position q (q < p, so above us: T1) is the one with
   * exactly q scores above it: the highest score S with q + 1 scores
   * at or above it, found by bisecting the scores' range (64 passes,
   * O(n) each, no copy, whatever q).
   */
  uint64_t lo = self, hi = scores[top];     /* S in (self, top] */
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2 + 1;
    uint64_t at_or_above = 0;
    for (size_t i = 0; i < n; ++i)
      at_or_above += scores[i] >= mid;
    if (at_or_above > q)
      lo = mid;
    else
      hi = mid - 1;
  }
  for (size_t i = 0; i < n; ++i)
    if (scores[i] == lo)
      return (long) i;
  return -1;                    /* not reached: lo is a score above us */
}

unsigned
fsc_peer_depth (uint64_t p, unsigned fanout)
{
  unsigned d = 0;
  while (p > 0) {
    p = fanout == 0 ? 0 : (p - 1) / fanout;
    d++;
  }
  return d;
}
