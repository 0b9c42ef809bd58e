/* nbdkit-fscache-filter: one upstream context per export for the
 * peers' connections (peerhost.c says why).
 */
#ifndef FSC_PLUGIN_PEERHOST_H
#define FSC_PLUGIN_PEERHOST_H

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

struct upstream;

/* .after_fork: the backend the contexts are opened from. */
extern void peerhost_set_backend (nbdkit_backend *backend);

/* The export's context for peers' connections, opened (read-only) if
 * none, with a reference; NULL if it cannot be opened (the connection
 * then opens its own).  peerhost_put drops the reference; the last
 * one closes it.
 */
extern struct upstream *peerhost_get (const char *exportname);
extern void peerhost_put (struct upstream *u);

#endif /* FSC_PLUGIN_PEERHOST_H */
