/* libfscache: the fleet's tree of askers for one range (peertree.c). */
#ifndef FSC_PEERTREE_H
#define FSC_PEERTREE_H

#include <stddef.h>
#include <stdint.h>

/* The rendezvous score of the member whose URI hashes to SEED, for
 * range R of the object whose key hashes to (LO, HI): every node
 * computes the same score for the same member, whatever else its list
 * holds.
 */
extern uint64_t fsc_peer_score (uint64_t lo, uint64_t hi, uint64_t r,
                                uint64_t seed);

/* The tree that range R uses, of STRIPES trees per object (invariant
 * T3 of peertree.c): R mod STRIPES, or R itself with STRIPES 0 (a tree
 * per range).  The score of a member for range R is its score for this
 * stripe.
 */
static inline uint64_t
fsc_peer_stripe (uint64_t r, unsigned stripes)
{
  return stripes ? r % stripes : r;
}

/* Whom a node asks for a range (invariants T1, T2 in peertree.c).
 *
 * SCORES[0..N) are the scores of the members this node may ask (not
 * itself, none set aside), SELF its own score.  The node's position is
 * the number of members scoring above SELF; position 0 reads the
 * origin (-1); position p asks position (p - 1) / FANOUT among all of
 * them and itself ranked by score (FANOUT 0: position 0, a flat
 * fleet).  Returns the index in SCORES of that member, or -1.  Only a
 * member scoring strictly above SELF is ever returned.  O(N), no
 * allocation.
 */
extern long fsc_peer_parent (const uint64_t *scores, size_t n, uint64_t self,
                             unsigned fanout);

/* The depth of position P in a tree of FANOUT (0: flat): hops from P
 * to position 0.
 */
extern unsigned fsc_peer_depth (uint64_t p, unsigned fanout);

#endif /* FSC_PEERTREE_H */
