/* nbdkit-fscache-filter: one health record per fleet peer for the
 * whole process, and the background prober (peerhealth.c).
 */
#ifndef FSC_PLUGIN_PEERHEALTH_H
#define FSC_PLUGIN_PEERHEALTH_H

#include <stdbool.h>
#include <stdint.h>

struct fsc_cache;
struct peer_health;

/* URI's record, with a reference (NULL if out of memory). */
extern struct peer_health *peer_health_get (const char *uri);
extern void peer_health_put (struct peer_health *h);

/* Neither this node itself nor set aside at NOW (monotonic ms). */
extern bool peer_health_usable (struct peer_health *h, int64_t now);

/* It is this node itself: true the first time (to be said once). */
extern bool peer_health_mark_self (struct peer_health *h);

/* A read succeeded: the next set-aside starts short again. */
extern void peer_health_ok (struct peer_health *h);

/* It failed: set it aside unless it is already (reads in flight when
 * it was found down).  True if this call did, with its seconds in
 * *SECONDS.
 */
extern bool peer_health_fail (struct peer_health *h, int64_t now,
                              unsigned *seconds);

/* A peer connection came from this very node, by the link whose token
 * is TOKEN (a self alias, refused); and was TOKEN's dial so refused?
 * The link is told at its refused dial (peerlink.c).  A ring of the
 * last 8, in atomics.
 */
extern void peer_health_self_seen (uint32_t token);
extern bool peer_health_was_self (uint32_t token);

/* The peers set aside now, as stats-file lines
 * "peer_aside URI SECONDS_LEFT" (or "peer_self URI" for a self alias),
 * into BUF of SIZE; the bytes it would take (as snprintf).
 */
#include <stddef.h>
extern size_t peer_health_format (char *buf, size_t size);

/* The prober: PROBE (the NBD handshake to a URI, under a deadline)
 * called from a thread of its own for set-aside peers shortly before
 * their time is up; counted on CACHE, which gets the gauge
 * peers_aside.  Started after nbdkit forked; stopped at unload, which
 * frees the records kept for their set-asides alone.
 */
extern void peer_health_prober_start (struct fsc_cache *cache,
                                      bool (*probe) (const char *uri));
extern void peer_health_prober_stop (void);

#endif /* FSC_PLUGIN_PEERHEALTH_H */
