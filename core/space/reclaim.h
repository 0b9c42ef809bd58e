/* libfscache: the reclaimer thread (reclaim.c), for the other files of
 * core/: the walk for space nobody names after a crash, and objects
 * that linger for it.  Included by internal.h, after the structures it
 * names.
 */
#ifndef FSC_RECLAIM_H
#define FSC_RECLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fsc_cache;
struct fsc_object;
struct fsc_files;
struct fsc_io;
struct group;

/* reclaim.c: punch the space of the data and sums files that no present
 * block covers (see "Space nobody names" in evict.c), claiming what it
 * punches so that it may run beside requests.  Returns 0, 1 if the
 * object began to close while a block it must look at again was still
 * claimed (not finished), or -1 with errno (EOPNOTSUPP where holes
 * cannot be punched).
 */
extern int fsc_reclaim_unnamed (struct fsc_object *o);

/* reclaim.c: start the reclaimer thread of an object just opened: the
 * census if the gauges are not known (groups.c), then after a crash
 * (UNCLEAN) fsc_reclaim_unnamed, else that only if the data files hold
 * clearly more than the blocks do.  Returns 0 or -1 with errno.
 * fsc_reclaim_finish waits for it to end (it ends early only if the
 * object is withdrawn) and tells whether it finished its work (true if
 * it never started).  Without o->lock.  ENDED is called by the
 * reclaimer thread as it ends: a declared callback up into object.c
 * (fsc_object_linger_done), which closes an object that lingered for
 * the walk, so that reclaim.c, below the object's life, never names
 * it.
 */
extern int fsc_reclaim_start (struct fsc_object *o, bool unclean,
                              fsc_reclaim_ended_fn *ended);
extern bool fsc_reclaim_finish (struct fsc_object *o);

/* reclaim.c: may O linger when its last reference goes (stay open,
 * unreferenced, o->lingering, while its walk runs on; the reclaimer
 * thread closes it when done)?  Only while the walk runs, not if the
 * cache is closing, nor for a shell or a withdrawn object.  Caller
 * holds cache->lock.
 */
extern bool fsc_reclaim_may_linger (struct fsc_object *o);

/* reclaim.c: stop O's walk (and census) at the next group, if it runs:
 * it ends unfinished, and the index stays unclean.  Takes o->lock.
 */
extern void fsc_reclaim_stop (struct fsc_object *o);

/* reclaim.c: somebody wants lingering O: mark it closing and stop its
 * walk at the next group, so that its thread closes it soon (the
 * waiter then opens it anew: a lookup, with its checks).  Caller holds
 * cache->lock.
 */
extern void fsc_reclaim_unlinger (struct fsc_object *o);

#endif /* FSC_RECLAIM_H */
