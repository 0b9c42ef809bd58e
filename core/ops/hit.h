/* libfscache: serving hit runs (hit.c), for the read path (retrieve.c).
 */
#ifndef FSC_HIT_H
#define FSC_HIT_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

/* The sub-block hashes of a hit's partly read end blocks, taken from
 * the hash cache (sums.c) in the read's first critical section, so
 * that a hit takes the object's lock once, not twice.
 */
struct end_sums {
  uint64_t blk[2];
  bool have[2];
  uint64_t sums[2][SCACHE_SUBS];
};

/* Serve N present zero blocks from B (CSUMS their index checksums), or
 * N present blocks with data (PIECES, and ES the end blocks' hashes),
 * into BUF, the client's window [OFFSET, OFFSET + COUNT).  Return the
 * blocks served: fewer if one failed (dropped, or the object
 * withdrawn), and the caller goes on from there.
 */
extern uint64_t fsc_hit_zero (struct fsc_object *o, uint64_t b, uint64_t n,
                              void *buf, uint64_t offset, uint32_t count,
                              const uint64_t *csums);
extern uint64_t fsc_hit_run (struct fsc_object *o, uint64_t b, uint64_t n,
                             void *buf, uint64_t offset, uint32_t count,
                             const uint64_t *csums, const uint16_t *pieces,
                             const struct end_sums *es);

#endif /* FSC_HIT_H */
