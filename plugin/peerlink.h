/* nbdkit-fscache-filter: connections to one fleet peer (peerlink.c:
 * deadlines, the retry and the back-off; peers.c: who owns what).
 */
#ifndef FSC_PLUGIN_PEERLINK_H
#define FSC_PLUGIN_PEERLINK_H

#include <stdbool.h>
#include <stdint.h>

struct fsc_object;
struct peer_link;

/* Once, before any link: each connect and read may take TIMEOUT_MS;
 * with PSK_FILE (or NULL), connections use TLS with its key, presenting
 * PSK_USER; with CERT_DIR (or NULL), TLS with this node's certificate,
 * the peer's verified; SELF_URI is fscache-peer-self, for messages.  Draws this
 * node's random id.  The strings must outlive the links.
 */
extern void peer_link_configure (int timeout_ms, const char *psk_file,
                                 const char *psk_user, const char *cert_dir,
                                 const char *self_uri);

/* This node's random id, which askers put in peer export names. */
extern uint64_t peer_node_id (void);


/* A monotonic clock in milliseconds. */
extern int64_t peer_now_ms (void);

/* A link to the peer URI, in front of NEXT on its owner's list; NULL if
 * out of memory.  peer_link_free closes its idle connections (no read
 * may be in flight).
 */
extern struct peer_link *peer_link_new (const char *uri,
                                        struct peer_link *next);
extern void peer_link_free (struct peer_link *l);
extern struct peer_link *peer_link_next (const struct peer_link *l);
extern const char *peer_link_uri (const struct peer_link *l);

/* Close L's connections idle for a while at NOW. */
extern void peer_link_reap (struct peer_link *l, int64_t now);

/* L's peer sent data that failed the manifest: never asked again by
 * L's export.  True the first time (to be said once).
 */
extern bool peer_link_mark_bad (struct peer_link *l);

/* Not set aside at NOW (peer_now_ms), nor marked bad? */
extern bool peer_link_usable (struct peer_link *l, int64_t now);

/* Read [OFFSET, OFFSET + COUNT) of EXPORTNAME from L's peer, dialling
 * DIAL_URI, asking for the peer export name IDENT (prefix and
 * identity), our node id and L's token, EXPORTNAME: one try, one more
 * on a fresh connection, then L is set aside (BACKOFF_MIN s, doubling)
 * and the failure said at most once a minute; an error the peer
 * answers is not retried nor set aside; a link found to be this node
 * itself is never used again.  Counted on OBJ.  0 or -1.
 */
extern int peer_link_pread (struct peer_link *l, const char *ident,
                            const char *exportname, const char *dial_uri,
                            struct fsc_object *obj, void *buf,
                            uint32_t count, uint64_t offset);

/* Does URI's NBD server get as far as the options, within the peer
 * deadline?  (The prober's look at a set-aside peer: peerhealth.c.)
 */
extern bool peer_link_probe (const char *uri);

#endif /* FSC_PLUGIN_PEERLINK_H */
