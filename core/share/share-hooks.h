/* libfscache: the narrow calls by which the object core reaches the
 * sharing layer above it.
 *
 * Sharing (share-*.c: one object for the whole host) is built on the
 * local object: an owner serves other processes' requests with the
 * object's public operations, a joiner is a shell whose operations go
 * to the owner (objops.h).  It sits above object.c, store.c and
 * withdrawal, and calls down into them.  Those need it at six points
 * only, each a moment of the object's life that other processes must
 * hear of: a local object starts serving joiners (start) and stops
 * (stop); an open finds the object held elsewhere and joins it (join),
 * and the join ends (leave); blocks are invalidated, so that joiners
 * stop serving them from the files themselves (bump, store.c), or all
 * of them are (bump_all, withdrawal).  These go through this table,
 * set on the cache when it opens (cache.c), so that the layers below
 * sharing never name it: no circle of files calling each other
 * (tools/layers.py), and a change to sharing stays in share-*.c.
 *
 * Without a table (a cache opened by a tool, inspect.c, that never
 * shares) the calls do nothing, and a join fails with ENOTSUP.
 */
#ifndef FSC_SHARE_HOOKS_H
#define FSC_SHARE_HOOKS_H

#include <errno.h>
#include <stdint.h>

#include "internal.h"

struct fsc_share_hooks {
  int (*start) (struct fsc_object *o);
  void (*stop) (struct fsc_object *o);
  int (*join) (struct fsc_object *o, const struct fsc_object_params *p,
               struct fsc_open_info *info);
  void (*leave) (struct fsc_object *o);
  void (*bump) (struct fsc_object *o, uint64_t g0, uint64_t g1);
  void (*bump_all) (struct fsc_object *o);
};

/* share-hooks.c: the sharing layer's table. */
extern const struct fsc_share_hooks fsc_share_hooks;

static inline const struct fsc_share_hooks *
share_hooks (const struct fsc_object *o)
{
  return o->cache ? o->cache->share : NULL;
}

static inline int
fsc_hook_share_start (struct fsc_object *o)
{
  const struct fsc_share_hooks *h = share_hooks (o);
  return h ? h->start (o) : 0;
}

static inline void
fsc_hook_share_stop (struct fsc_object *o)
{
  const struct fsc_share_hooks *h = share_hooks (o);
  if (h)
    h->stop (o);
}

static inline int
fsc_hook_share_join (struct fsc_object *o, const struct fsc_object_params *p,
                     struct fsc_open_info *info)
{
  const struct fsc_share_hooks *h = share_hooks (o);
  if (h == NULL) {
    errno = ENOTSUP;
    return -1;
  }
  return h->join (o, p, info);
}

static inline void
fsc_hook_share_leave (struct fsc_object *o)
{
  const struct fsc_share_hooks *h = share_hooks (o);
  if (h)
    h->leave (o);
}

static inline void
fsc_hook_share_bump (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  const struct fsc_share_hooks *h = share_hooks (o);
  if (h)
    h->bump (o, g0, g1);
}

static inline void
fsc_hook_share_bump_all (struct fsc_object *o)
{
  const struct fsc_share_hooks *h = share_hooks (o);
  if (h)
    h->bump_all (o);
}

#endif /* FSC_SHARE_HOOKS_H */
