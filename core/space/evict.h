/* libfscache: the size cap (evict.c), for the other files of core/:
 * room for new blocks, the probation queue, punching evicted space,
 * budgets.  Included by internal.h, after the structures it names.
 */
#ifndef FSC_EVICT_H
#define FSC_EVICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fsc_cache;
struct fsc_object;
struct fsc_files;
struct fsc_io;
struct group;

/* evict.c: before writing LEN bytes of new blocks into O's files,
 * make sure they fit in its budget (the smaller of fscache-max-size
 * and its quota), evicting blocks if needed (their removal is durable
 * before this returns), and that the cache's filesystem is above its
 * free space floor.  With SCAN (a prefetch's or a sequential stream's
 * blocks), no referenced block is evicted for them.  Returns 0 (LEN
 * bytes reserved: call fsc_room_done after writing), or -1 with errno
 * EAGAIN (do not store: nothing could be evicted, or space is low) or
 * another error (withdraw).
 */
extern int fsc_make_room (struct fsc_object *o, uint64_t len, bool scan);
extern void fsc_room_done (struct fsc_object *o, uint64_t len);

/* evict.c: is the cache's filesystem below its free space floor, or
 * DIR/fscache.stop present (looked at every SPACE_CHECK_MS at most):
 * then nothing new is stored.
 */
extern bool fsc_space_low (struct fsc_cache *c);

/* evict.c: drop blocks that were invalidated and punch their space
 * when O has a budget (called with the groups' bits already cleared).
 * Caller holds o->lock.
 */
extern void fsc_note_dropped (struct fsc_object *o, uint64_t gi,
                              uint64_t bits);

/* evict.c: block B became present after a fill: on probation until
 * hit again.  Holds o->lock.
 */
extern void fsc_note_filled (struct fsc_object *o, uint64_t b,
                             bool prefetched);

/* evict.c: punch the space of blocks evicted (and committed) or
 * dropped by writes that is still queued; failures are ignored (the
 * space stays until the next unclean open reclaims it).
 */
extern void fsc_punch_pending (struct fsc_object *o);

/* trim.c: after evict.c punched the blocks PUNCHED of group GI, punch
 * the pages of hashes and records left holding nothing (T1, T2 of
 * trim.c), so that a cap holds data, not empty metadata.  Without
 * o->lock.
 */
extern void fsc_trim_meta (struct fsc_object *o, uint64_t gi,
                           uint64_t punched);

/* evict.c: the committer's look at O: take up a changed quota record
 * and shrink O to its budget.
 */
extern void fsc_object_check_budget (struct fsc_object *o);

/* evict.c: O's allocated bytes (its three files, as du counts them). */
extern uint64_t fsc_object_allocated (struct fsc_object *o);

#endif /* FSC_EVICT_H */
