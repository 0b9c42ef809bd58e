/* nbdkit-fscache-filter: every call the filter makes to its upstream
 * (the plugin and the filters below it) goes through here, so that no
 * call ever overlaps another one that the upstream's thread model
 * forbids.
 *
 * nbdkit serialises only the requests it dispatches itself.  The
 * filter also calls upstream from its own threads (readahead) and from
 * client requests that arrive on other connections, so it must keep
 * the upstream's promise itself.  nbdkit 1.32 tells a filter the
 * server's final thread model in .get_ready (the most serial of all
 * layers' models, so it is never less strict than the plugin's):
 *
 *   parallel                no gate: any call at any time.
 *   serialize_requests      one gate per connection (its nbdkit_next):
 *                           one call at a time on that connection,
 *                           connections run in parallel.
 *   serialize_all_requests  one gate for the whole server.
 *   serialize_connections   the same (only one connection exists at a
 *                           time anyway).
 *
 * A gate is a mutex held across exactly one upstream call and nothing
 * else, so it never nests, is never held while waiting for anything of
 * the cache (a fetch in flight, a commit), and a thread that holds it
 * only waits for the upstream.  Hits take no gate.
 *
 * Lifetime: an upstream is bound to one connection's nbdkit_next, from
 * .prepare to .finalize; background users (readahead) are stopped
 * before .finalize lets it go, so a closed connection is never used.
 */
#ifndef FSC_PLUGIN_UPSTREAM_H
#define FSC_PLUGIN_UPSTREAM_H

#include <pthread.h>
#include <stdint.h>

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

struct upstream {
  nbdkit_next *next;
  pthread_mutex_t *gate;        /* NULL (parallel), &own or the global */
  pthread_mutex_t own;          /* this connection's gate */
};

/* Record the server's final thread model (from .get_ready). */
extern void upstream_set_thread_model (int thread_model);

/* The thread model's name, for messages. */
extern const char *upstream_thread_model_name (void);

/* How many threads of one connection may usefully wait on upstream at
 * once: several when parallel, else 1 (more would only queue on the
 * gate).
 */
extern unsigned upstream_max_background (void);

/* Set U up for a new connection, choosing its gate (.open);
 * upstream_fini undoes it (.close).
 */
extern void upstream_init (struct upstream *u);
extern void upstream_fini (struct upstream *u);

/* The connection's nbdkit_next, valid from .prepare to .finalize. */
extern void upstream_bind (struct upstream *u, nbdkit_next *next);

/* The data calls, gated.  Same contracts as nbdkit_next's. */
extern int upstream_pread (struct upstream *u, void *buf, uint32_t count,
                           uint64_t offset, uint32_t flags, int *err);
extern int upstream_pwrite (struct upstream *u, const void *buf,
                            uint32_t count, uint64_t offset, uint32_t flags,
                            int *err);
extern int upstream_zero (struct upstream *u, uint32_t count, uint64_t offset,
                          uint32_t flags, int *err);
extern int upstream_trim (struct upstream *u, uint32_t count, uint64_t offset,
                          uint32_t flags, int *err);
extern int upstream_flush (struct upstream *u, uint32_t flags, int *err);
extern int upstream_extents (struct upstream *u, uint32_t count,
                             uint64_t offset, uint32_t flags,
                             struct nbdkit_extents *extents, int *err);
extern int64_t upstream_get_size (struct upstream *u);

/* For libfscache (struct fsc_upstream): OPAQUE is a struct upstream. */
extern int upstream_fsc_pread (void *opaque, void *buf, uint32_t count,
                               uint64_t offset);

#endif /* FSC_PLUGIN_UPSTREAM_H */
