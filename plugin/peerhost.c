/* nbdkit-fscache-filter: one upstream context per export for the
 * peers' connections (issue 41).
 *
 * Every connection nbdkit accepts gets a context on the upstream of
 * its own from the filter's .open: for a peer's connection that was
 * one more origin connection (an HTTP HEAD with curl, a new NBD
 * connection with the nbd plugin) per peer connection, per node, so
 * the origin's connections grew with the square of the fleet (152 at
 * 8 nodes, 885 at 24, tools/bench/fleet.sh).  A peer's connection only
 * reads, and its misses go to the pool, its parent in the tree, or
 * this context: so the peers' connections of an export share one
 * context of the filter's own, read-only, opened by the first and
 * closed with the last.  Its gate is the thread model's (upstream.c),
 * shared by them all: under serialize_requests they take turns on it,
 * which the pool (pool.c) avoids for the reads that matter.
 *
 * Only where the filter may open contexts of its own (ownctx.c) and
 * the thread model allows one (not serialize_connections); elsewhere a
 * peer's connection opens its own context as before.
 *
 * Locking: list_lock guards the list and the counts; a context is
 * opened under it (only the first peer connection of an export waits,
 * as in view.c), closed outside it.
 */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "utils.h"

#include "peerhost.h"
#include "upstream.h"

struct host {
  struct host *next;
  char *exportname;
  unsigned refs;
  struct upstream u;
};

static nbdkit_backend *backend;
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host *list;

void
peerhost_set_backend (nbdkit_backend *b)
{
  backend = b;
}

struct upstream *
peerhost_get (const char *exportname)
{
  if (backend == NULL)
    return NULL;
  SCOPED_LOCK (&list_lock);
  for (struct host *h = list; h; h = h->next)
    if (strcmp (h->exportname, exportname) == 0) {
      h->refs++;
      return &h->u;
    }
  struct host *h = calloc (1, sizeof *h);
  if (h == NULL || (h->exportname = strdup (exportname)) == NULL) {
    free (h);
    return NULL;
  }
  if (upstream_open_shared (&h->u, backend, 1, exportname) == -1 ||
      upstream_prepare (&h->u) == -1) {
    upstream_close (&h->u);
    free (h->exportname);
    free (h);
    return NULL;
  }
  h->refs = 1;
  h->next = list;
  list = h;
  return &h->u;
}

void
peerhost_put (struct upstream *u)
{
  struct host *h = NULL;
  pthread_mutex_lock (&list_lock);
  for (struct host **hp = &list; *hp; hp = &(*hp)->next)
    if (&(*hp)->u == u) {
      if (--(*hp)->refs == 0) {
        h = *hp;
        *hp = h->next;
      }
      break;
    }
  pthread_mutex_unlock (&list_lock);
  if (h) {
    upstream_close (&h->u);
    free (h->exportname);
    free (h);
  }
}
