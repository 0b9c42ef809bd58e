/* nbdkit-fscache-filter: one view of an upstream without multi-conn
 * (issue 29, item 4).
 *
 * An upstream that can write and does not offer multi-conn promises
 * nothing about what one connection sees of another's writes, even
 * after flushes (nbdkit's multi-conn test plugin keeps a cache per
 * connection, published to the others only by a flush, and a
 * connection sees others' flushed writes only once it flushes
 * itself).  The cache is shared by all client connections, so a block
 * filled through one connection's view and a write merged through
 * another's mixed versions: after every connection had flushed, a new
 * one read "Initiaworld." where the plugin alone and nbdkit's cache
 * filter read "Hello world." (tests/filter/test-transparent.sh, part 4).
 *
 * The rule: for such an upstream, once a client of the process has
 * written to an export, every fill and every client write, zero, trim,
 * flush and extents query of it goes through ONE context of the
 * filter's own (opened as the writeback writer's is, at the first
 * write), shared by all connections of the process.  Until then no
 * view differs from another (nobody wrote through any), so reads may
 * use the pool's contexts, and a read-only use of such an upstream
 * (curl's, most often) keeps the pool.  One connection sees its
 * own writes, so what every client reads is what that one connection
 * shows, which the plugin alone could show a client (NBD promises a
 * connection of such a server nothing more about the others' writes).
 * The cost, once written: under serialize_requests all of them take
 * turns on that one context (the pool is no longer used); a parallel
 * upstream takes them at once.  The connection's own context keeps the rest (the sample,
 * size and capability queries).  Not in writeback mode, whose writer
 * has its own context (a fill may still see the upstream without what
 * the writer wrote back; reads of what is logged come from the log).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "utils.h"

#include "upstream.h"
#include "view.h"

struct view {
  struct view *next;
  char *exportname;
  unsigned refs;
  struct upstream u;
};

static nbdkit_backend *backend;
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct view *list;

void
view_set_backend (nbdkit_backend *b)
{
  backend = b;
}

bool
view_wanted (struct upstream *u)
{
  return upstream_model_allows_shared () && upstream_can_write (u) == 1 &&
    upstream_can_multi_conn (u) == 0;
}

/* Open V's context and ask what nbdkit wants asked before data calls
 * on it.  Returns 0, or -1 (ESTALE: the upstream no longer has SIZE
 * bytes, so it is not the export the connection opened).
 */
static int
open_view (struct view *v, uint64_t size)
{
  struct upstream *u = &v->u;
  int64_t found;
  if (upstream_open_own (u, backend, 0, v->exportname, size, &found) == -1) {
    if (found != -1)
      errno = ESTALE;
    return -1;
  }
  if (upstream_can_write (u) == -1 || upstream_can_flush (u) == -1 ||
      upstream_can_trim (u) == -1 || upstream_can_zero (u) == -1 ||
      upstream_can_fast_zero (u) == -1 || upstream_can_fua (u) == -1 ||
      upstream_can_extents (u) == -1) {
    upstream_close (u);
    return -1;
  }
  return 0;
}

struct view *
view_get (const char *exportname, uint64_t size)
{
  SCOPED_LOCK (&list_lock);
  for (struct view *v = list; v; v = v->next)
    if (strcmp (v->exportname, exportname) == 0) {
      v->refs++;
      return v;
    }
  struct view *v = calloc (1, sizeof *v);
  if (v == NULL || (v->exportname = strdup (exportname)) == NULL) {
    free (v);
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  /* Opened under the list's lock: a second connection of the export
   * waits for it rather than opening another view.  (An open is an
   * upstream call; only first connections of an export wait here.)
   */
  if (open_view (v, size) == -1) {
    if (errno == ESTALE)
      nbdkit_error ("fscache: export \"%s\": the upstream no longer has "
                    "the %" PRIu64 " bytes this connection opened (it was "
                    "replaced): not writing to it", exportname, size);
    else
      nbdkit_error ("fscache: export \"%s\": opening the shared view of "
                    "an upstream without multi-conn: %m", exportname);
    free (v->exportname);
    free (v);
    return NULL;
  }
  v->refs = 1;
  v->next = list;
  list = v;
  return v;
}

struct view *
view_find (const char *exportname)
{
  SCOPED_LOCK (&list_lock);
  for (struct view *v = list; v; v = v->next)
    if (strcmp (v->exportname, exportname) == 0) {
      v->refs++;
      return v;
    }
  return NULL;
}

struct upstream *
view_upstream (struct view *v)
{
  return &v->u;
}

/* A view stays open when its last connection closes: the next one
 * must see what was written through it, not a fresh view that may
 * predate the writes (a connection opened later, in the multi-conn
 * plugin, snapshots the image only at its first access).  Views close
 * at .cleanup (view_close_all).
 */
void
view_put (struct view *v)
{
  if (v == NULL)
    return;
  SCOPED_LOCK (&list_lock);
  v->refs--;
}

void
view_close_all (void)
{
  pthread_mutex_lock (&list_lock);
  struct view *all = list;
  list = NULL;
  pthread_mutex_unlock (&list_lock);
  while (all) {
    struct view *v = all;
    all = v->next;
    upstream_close (&v->u);
    free (v->exportname);
    free (v);
  }
}
