/* nbdkit-fscache-filter: a pool of upstream contexts per export, for
 * serial plugins (pool.c: why, and what it cannot do).
 */
#ifndef FSC_PLUGIN_POOL_H
#define FSC_PLUGIN_POOL_H

#include <stdbool.h>
#include <stdint.h>

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

struct pool;
struct upstream;

/* .after_fork: the backend the pool's contexts are opened from. */
extern void pool_set_backend (nbdkit_backend *backend);

/* The pool's size: fscache-upstream-connections, or its default for
 * this plugin (16 over curl, else 8).
 */
extern unsigned pool_size (void);

/* Should a connection whose own context is U read through a pool?
 * (fscache-upstream-connections > 0, and serialize_requests, or
 * parallel with fscache-upstream-connections given: pool.c.)
 */
extern bool pool_wanted (struct upstream *u);

/* The pool of EXPORTNAME of SIZE bytes, created if none, with a
 * reference; NULL if out of memory (then the connection reads on its
 * own context).  pool_put drops the reference; the last one stops the
 * workers.
 */
extern struct pool *pool_get (const char *exportname, uint64_t size);
extern void pool_put (struct pool *p);

/* Read [OFFSET, OFFSET + COUNT) through P's contexts, in parallel
 * chunks (P NULL, or no context: on OWN).  As upstream_pread: 0, or -1
 * with *ERR; ESTALE: a context reopened on the upstream found another
 * size (said), and the caller's object must be withdrawn.
 */
extern int pool_pread (struct pool *p, struct upstream *own, void *buf,
                       uint32_t count, uint64_t offset, int *err);

#endif /* FSC_PLUGIN_POOL_H */
