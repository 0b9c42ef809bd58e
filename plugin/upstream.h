/* nbdkit-fscache-filter: the filter's only way to its upstream (the
 * plugin and the filters below it).  Two jobs:
 *
 * 1. No upstream call ever overlaps another one that the upstream's
 *    thread model forbids.  nbdkit serialises only the requests it
 *    dispatches itself; the filter also calls upstream from its own
 *    threads (readahead) and while other connections' threads do, so
 *    it must keep the upstream's promise itself.  nbdkit 1.32 tells a
 *    filter the server's final thread model in .get_ready (the most
 *    serial of all layers' models, never less strict than the
 *    plugin's), and each model gets its gate:
 *
 *      parallel                no gate: any call at any time.
 *      serialize_requests      one gate per connection: one call at a
 *                              time on it, connections in parallel.
 *      serialize_all_requests  one gate for the whole server.
 *      serialize_connections   the same (one connection at a time
 *                              exists anyway).
 *
 *    Every call goes through a gate: the plugin's open, prepare,
 *    finalize and close, the size and can_* queries, every data call,
 *    and (for the server-wide models) list_exports, default_export and
 *    preconnect.  So that open and close can be gated too, the filter
 *    manages the upstream context itself (nbdkit_next_context_open,
 *    not the next_open of .open), which nbdkit 1.32 allows.
 *
 *    A gate is a mutex held across exactly one upstream call and
 *    nothing else: it never nests, is never held while waiting for the
 *    cache (a fetch in flight, a commit), and a thread holding it waits
 *    only for the upstream.  Hits take no gate.
 *
 * 2. A connection may have no upstream at all: its open failed (an
 *    outage) and fscache-offline lets it be served from the cache.
 *    Then every query has a fixed read-only answer and every data call
 *    fails with EIO.
 *
 * Lifetime: an upstream belongs to one connection, from .open to
 * .close.  Background users (readahead) are stopped in .finalize,
 * before the upstream is finalized, so a closed connection is never
 * used.
 */
#ifndef FSC_PLUGIN_UPSTREAM_H
#define FSC_PLUGIN_UPSTREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

struct upstream {
  nbdkit_next *next;            /* NULL: none (offline, or closed) */
  bool prepared;                /* next->prepare done, not finalized */
  bool offline_said;            /* the first offline miss was logged */
  pthread_mutex_t *gate;        /* NULL (parallel), &own or the server's */
  pthread_mutex_t own;          /* this connection's gate */
  uint32_t bs_min, bs_max;      /* its block-size constraints, 0 until
                                 * asked (blocksize.c) */
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

/* .open: set U up and open the upstream context for EXPORTNAME through
 * CONTEXT's backend.  Returns 0, or -1 if the upstream's open failed
 * (it logged why); U is usable (without upstream) either way and must
 * be released with upstream_close.
 */
extern int upstream_open (struct upstream *u, nbdkit_context *context,
                          int readonly, const char *exportname);

/* Outside any connection (the pool, the catch-up worker, the view and
 * the writeback writer, from .after_fork's BACKEND): open a shared
 * context for EXPORTNAME, gated as one more connection; READONLY for
 * the users that only read (under -r the plugin may not open a
 * read-only image for writing: the ssh plugin opens O_RDWR unless
 * told).  Only where ownctx_allowed (ownctx.c).  Same contract as
 * upstream_open.
 */
extern int upstream_open_shared (struct upstream *u, nbdkit_backend *backend,
                                 int readonly, const char *exportname);

/* upstream_open_shared, then the context prepared and its size asked:
 * the pool's, catch-up's and view's contexts, which must be the image
 * of SIZE bytes the cache holds (an upstream replaced under a running
 * proxy is not).  Returns 0; or -1 with the context closed, *FOUND
 * the size read if it differs from SIZE, else -1 (the open, prepare or
 * size failed).
 */
extern int upstream_open_own (struct upstream *u, nbdkit_backend *backend,
                              int readonly, const char *exportname,
                              uint64_t size, int64_t *found);

/* True under serialize_requests: one call at a time per connection,
 * connections in parallel (where a pool of contexts helps, pool.c).
 */
extern bool upstream_serial_requests (void);

/* False under serialize_connections, where a context of our own beside
 * the client's would be a second connection the upstream forbids.
 */
extern bool upstream_model_allows_shared (void);

/* .prepare and .finalize of the upstream context (no-ops without one). */
extern int upstream_prepare (struct upstream *u);
extern int upstream_finalize (struct upstream *u);

/* .close: finalize if needed, close the context, free U's gate. */
extern void upstream_close (struct upstream *u);

/* True if U has an upstream. */
static inline bool
upstream_available (const struct upstream *u)
{
  return u->next != NULL;
}

/* True if calls on U may overlap (no gate): several at once from the
 * caller's own threads cost one round trip, not several.
 */
static inline bool
upstream_parallel (const struct upstream *u)
{
  return u->gate == NULL;
}

/* The data calls, gated.  Same contracts as nbdkit_next's; without an
 * upstream they fail with EIO.
 */
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

/* The queries, gated.  Without an upstream: get_size fails (-1,
 * ENOTCONN), export_description is NULL, block_size has no
 * constraints, and the can_* say read-only, nothing else supported.
 */
extern int64_t upstream_get_size (struct upstream *u);
extern const char *upstream_export_description (struct upstream *u);
extern int upstream_block_size (struct upstream *u, uint32_t *minimum,
                                uint32_t *preferred, uint32_t *maximum);
extern int upstream_can_write (struct upstream *u);
extern int upstream_can_flush (struct upstream *u);
extern int upstream_is_rotational (struct upstream *u);
extern int upstream_can_trim (struct upstream *u);
extern int upstream_can_zero (struct upstream *u);
extern int upstream_can_fast_zero (struct upstream *u);
extern int upstream_can_extents (struct upstream *u);
extern int upstream_can_fua (struct upstream *u);
extern int upstream_can_multi_conn (struct upstream *u);

/* The server-wide callbacks, gated for the server-wide models. */
extern int upstream_preconnect (nbdkit_next_preconnect *next,
                                nbdkit_backend *nxdata, int readonly);
extern int upstream_list_exports (nbdkit_next_list_exports *next,
                                  nbdkit_backend *nxdata, int readonly,
                                  struct nbdkit_exports *exports);
extern const char *upstream_default_export (nbdkit_next_default_export *next,
                                            nbdkit_backend *nxdata,
                                            int readonly);

#endif /* FSC_PLUGIN_UPSTREAM_H */
