/* nbdkit-fscache-filter: the peer tier, fscache-peers (peers.c: the
 * design, and docs/design.md, "The peer tier").
 */
#ifndef FSC_PLUGIN_PEERS_H
#define FSC_PLUGIN_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fsc_cache;
struct fsc_object;
struct peer_export;

/* The export names of peer connections: PEER_EXPORT_PREFIX, the
 * asker's identity of the object in 16 hex digits, ':', the asker's
 * node id (16 hex digits) and its link's token (8), ':', the export.
 */
#define PEER_EXPORT_PREFIX "fscache-peer:2:"

/* .config_complete, before the cache is created: read fscache-peers
 * (refusing to start if it cannot be read) and the PSK file's user
 * name.  Returns 0 or -1 (said).  A no-op without fscache-peers.
 * peers_bind, once the cache is open: its counters get peers_known.
 */
extern int peers_start (void);
extern void peers_bind (struct fsc_cache *cache);

/* .cleanup: drop the membership. */
extern void peers_stop (void);

/* Is there a fleet (fscache-peers)? */
extern bool peers_enabled (void);

/* Is EXPORTNAME a peer connection's?  1: yes, with *REAL pointing into
 * it at the export, *IDENTITY the asker's, *SELF true if the asker is
 * this very node (listed in fscache-peers under another spelling than
 * fscache-peer-self: the asker's link is then told, peerlink.c); 0: an
 * ordinary export name; -1: the prefix with a malformed rest.
 */
extern int peers_parse_export (const char *exportname, const char **real,
                               uint64_t *identity, bool *self);

/* The identity peers compare: the object key, the export's size, the
 * fscache-generation (or NULL) and the sampled fingerprint.  Never 0.
 */
extern uint64_t peers_identity (const void *key, size_t klen, uint64_t size,
                                const char *generation, uint64_t fingerprint);

/* The fleet's view of one export, shared by the process's connections
 * to it: NULL if out of memory (then no peers).  peers_export_put
 * drops the reference; the last one closes its peer connections.
 */
extern struct peer_export *peers_export_get (const char *exportname,
                                             const void *key, size_t klen,
                                             uint64_t identity);
extern void peers_export_put (struct peer_export *pe);

/* A client of this node wrote the export: from now on its misses go to
 * the origin, so that the node reads its own writes (an owner may hold
 * the range as it was).
 */
extern void peers_export_written (struct peer_export *pe);

/* Where the misses of [OFFSET, OFFSET + COUNT) go that no peer serves. */
typedef int peers_origin_fn (void *opaque, void *buf, uint32_t count,
                             uint64_t offset, int *err);

/* Read [OFFSET, OFFSET + COUNT) for OBJ's fills: each range owned by a
 * live peer from it, the rest (ours, or a peer's that failed) through
 * ORIGIN.  0, or -1 with *ERR (only ORIGIN's errors reach the caller).
 */
extern int peers_pread (struct peer_export *pe, struct fsc_object *obj,
                        void *buf, uint32_t count, uint64_t offset,
                        peers_origin_fn *origin, void *opaque, int *err);

#endif /* FSC_PLUGIN_PEERS_H */
