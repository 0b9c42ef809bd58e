/* libfscache: fetching miss runs (fetch.c), for the read path
 * (retrieve.c).
 */
#ifndef FSC_FETCH_H
#define FSC_FETCH_H

#include <stdint.h>

#include "internal.h"

/* Read LEN bytes at OFFSET upstream into DST, timed by the cache's
 * upstream meter (fill.c: is the cache disk the bottleneck?).
 */
extern int fsc_up_pread (struct fsc_object *o, const struct fsc_upstream *up,
                         void *dst, uint64_t len, uint64_t offset);

/* Fetch N claimed blocks from B upstream (EPOCHS: the claim epoch of
 * each group from B's), give the client its part of BUF, the window
 * [OFFSET, OFFSET + COUNT) (NULL: a prefetch), and fill the cache.
 * HELD_FIRST and HELD_LAST: the pieces the end blocks hold.  Adds the
 * bytes of BUF served from upstream to *MISSED.  0, or -1 (upstream
 * error).
 */
extern int fsc_fetch_run (struct fsc_object *o, uint64_t b, uint64_t n,
                          void *buf, uint64_t offset, uint32_t count,
                          const struct fsc_upstream *up,
                          const uint64_t *epochs, unsigned rflags,
                          unsigned held_first, unsigned held_last,
                          uint64_t *missed);

/* The pieces of block B a prefetch wants: all of them (WHOLE), or
 * those [LO, HI) covers (an exact prefetch's window).
 */
static inline unsigned
prefetch_want (const struct fsc_geom *g, uint64_t b, bool whole,
               uint64_t lo, uint64_t hi)
{
  return whole ? full_pieces (g, b)
    : pieces_of (g, b, MAX (block_start (g, b), lo),
                 MIN (block_end (g, b), hi));
}

/* A prefetch wanting pieces WANT of a block that holds pieces P (0: none;
 * not all it wants): its first gap is the pieces from *A, the first it
 * wants and the block lacks, up to *Z, the next it wants and the block
 * holds (FSC_PIECES if none).  Returns whether the block holds pieces
 * it wants beyond that gap: then the prefetch fetches that gap alone,
 * and comes back for the next (retrieve.c, fetch.c), where fetching
 * through them would fetch held pieces again.
 */
static inline bool
prefetch_gap (unsigned want, unsigned p, unsigned *a, unsigned *z)
{
  const unsigned lack = want & ~p;
  *a = lack ? (unsigned) __builtin_ctz (lack) : 0;
  const unsigned beyond = p & want & ~((2u << *a) - 1);
  *z = beyond ? (unsigned) __builtin_ctz (beyond) : FSC_PIECES;
  return p != 0 && lack != 0 && beyond != 0;
}

#endif /* FSC_FETCH_H */
