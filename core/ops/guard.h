/* libfscache: the latency guard (guard.c): hits routed around a
 * saturated cache disk.
 */
#ifndef FSC_GUARD_H
#define FSC_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

/* Reads of at most this many bytes are timed and may be rerouted: the
 * guard compares one small read's latency on each path.  A big read is
 * bandwidth, which the fill budget (fill.c) arbitrates.
 */
#define FSC_GUARD_MAX_BYTES (256 * 1024)

/* Is the guard on for O's cache (fsc_cache_set_guard)?  Off, nothing
 * is timed on the hit path.
 */
static inline bool
fsc_guard_enabled (const struct fsc_object *o)
{
  return o->cache->guard.enabled;
}

/* Should a hit of BYTES on O be read upstream instead of from the
 * cache disk?  Counts it (hits_rerouted) if so.
 */
extern bool fsc_guard_reroute (struct fsc_object *o, uint64_t bytes);

/* A hit of BYTES on O took NS; an upstream read of BYTES took NS. */
extern void fsc_guard_hit_time (struct fsc_object *o, uint64_t bytes,
                                uint64_t ns);
extern void fsc_guard_up_time (struct fsc_object *o, uint64_t bytes,
                               uint64_t ns);

#endif /* FSC_GUARD_H */
