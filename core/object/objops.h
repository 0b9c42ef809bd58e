/* libfscache: the object's operations table.
 *
 * An object is served in one of two ways, chosen when it is opened:
 * held here (the local object: retrieve.c, store.c, commit.c and
 * object.c, on this process's files), or joined, when another process
 * holds it (share-joiner.c: a shell whose requests go to the owner over
 * the link, its direct hits excepted).  The public entry points of
 * fscache.h dispatch through O->ops (objops.c) instead of each asking
 * "joined?" first, so that a change to one implementation is made in
 * one place and the core never needs to know which one holds an
 * object.  This is the seed's shape: FS-Cache reaches its backends
 * through an operations table (fscache_cache_ops), as libnbd's tools
 * reach a source or destination through rw_ops.
 *
 * o->ops is set with o->join, under the same conditions: fsc_local_ops
 * when the object is made (object.c, new_object) and again when the
 * join ends (share-joiner.c, fsc_share_leave); fsc_join_ops when it
 * joins (fsc_share_join).  A joined object that took the owner's copy
 * over stays a shell: its fsc_join_ops forward to the local object it
 * holds (j->local).
 */
#ifndef FSC_OBJOPS_H
#define FSC_OBJOPS_H

#include <stdbool.h>
#include <stdint.h>

#include "fscache.h"

struct fsc_object_ops {
  /* fsc_object_read, fsc_object_prefetch. */
  int (*read) (struct fsc_object *o, void *buf, uint32_t count,
               uint64_t offset, const struct fsc_upstream *up,
               unsigned flags);
  int (*prefetch) (struct fsc_object *o, uint64_t offset, uint64_t count,
                   const struct fsc_upstream *up, unsigned flags);
  /* fsc_object_write_begin_flags, fsc_object_write_end. */
  int (*write_begin) (struct fsc_object *o, uint64_t offset, uint64_t count,
                      unsigned flags, struct fsc_write *w);
  void (*write_end) (struct fsc_object *o, struct fsc_write *w,
                     const void *buf, bool upstream_ok);
  /* fsc_object_commit. */
  int (*commit) (struct fsc_object *o);
  /* The last reference is gone (object.c, close_object): let go of
   * what this implementation holds.  The caller then unlists and frees
   * the object.
   */
  void (*close) (struct fsc_object *o);
};

/* Held here: retrieve.c, store.c, commit.c, object.c. */
extern const struct fsc_object_ops fsc_local_ops;
/* Joined another process's object: share-joiner.c. */
extern const struct fsc_object_ops fsc_join_ops;

/* The local implementations, collected in fsc_local_ops (objops.c). */
extern int fsc_local_read (struct fsc_object *o, void *buf, uint32_t count,
                           uint64_t offset, const struct fsc_upstream *up,
                           unsigned flags);
extern int fsc_local_prefetch (struct fsc_object *o, uint64_t offset,
                               uint64_t count, const struct fsc_upstream *up,
                               unsigned flags);
extern int fsc_local_write_begin (struct fsc_object *o, uint64_t offset,
                                  uint64_t count, unsigned flags,
                                  struct fsc_write *w);
extern void fsc_local_write_end (struct fsc_object *o, struct fsc_write *w,
                                 const void *buf, bool upstream_ok);
extern int fsc_local_commit (struct fsc_object *o);
extern void fsc_local_close (struct fsc_object *o);

#endif /* FSC_OBJOPS_H */
