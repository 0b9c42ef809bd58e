/* libfscache: commits (commit.c), for the other files of core/:
 * superblocks, dirty groups, the not-clean mark, the committer's kick.
 * Included by internal.h, after the structures it names.
 */
#ifndef FSC_COMMIT_H
#define FSC_COMMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fsc_cache;
struct fsc_object;
struct fsc_files;
struct fsc_io;
struct group;

/* commit.c: write the superblock if a counter changed since the last
 * one was written.  Returns 0, or -1 (object withdrawn).
 */
extern int fsc_object_save_counters (struct fsc_object *obj);

/* commit.c: ask the committer (cache.c's thread) to run soon. */
extern void fsc_cache_kick (struct fsc_cache *cache);

/* commit.c: queue group GI for the next commit.  Caller holds
 * o->lock.  Returns 0, or -1 (ENOMEM).
 */
extern int fsc_mark_dirty (struct fsc_object *o, uint64_t gi,
                           struct group *g);

/* commit.c: write o->sb, with SET_FLAGS set, CLEAR_FLAGS cleared and
 * (if not NULL) *FINGERPRINT, into the other slot and sync.  Returns 0
 * or -1 (object withdrawn).  Takes o->lock.
 */
extern int fsc_write_sb (struct fsc_object *o, uint32_t set_flags,
                         uint32_t clear_flags, const uint64_t *fingerprint);

/* commit.c: before the first change to the object's files after a
 * clean open (a data or sums write or punch, an index record, the
 * sample mode's stale mark), make the superblock's not-clean mark
 * durable, once: see "Crash safety" in docs/design.md.  Returns 0 (at
 * once if it is, or if the object was not opened clean), or -1 (the
 * object withdrawn).  Takes o->lock; never call it holding the lock
 * or the index (o->committing).  data.c calls it before its writes and
 * punches, and commit.c calls data.c's sync: the one pair of core/
 * files that call each other (tools/layers.py), declared here, since
 * the mark must precede every change whoever makes it.
 */
extern int fsc_object_mark_in_use (struct fsc_object *o);

/* commit.c: make every change up to TARGET (a change_seq) durable.
 * Returns 0, or -1 if the object is (or became) withdrawn.  Takes
 * o->lock.
 */
extern int fsc_commit_upto (struct fsc_object *o, uint64_t target);

/* commit.c: make sure the index has room for the records of groups
 * G0..G1, so that no commit fails for want of space.  Returns 0 or -1.
 */
extern int fsc_reserve_groups (struct fsc_object *o, uint64_t g0,
                               uint64_t g1);

#endif /* FSC_COMMIT_H */
