/* libfscache: the group table and its paging (groups.c: the design).
 * Included by internal.h, after the structures it names.
 */
#ifndef FSC_GROUPS_H
#define FSC_GROUPS_H

#include <stdbool.h>
#include <stdint.h>

/* groups.c: set up and free O's group table; allocate group GI (and
 * its path) if absent, returning it or NULL (no memory); the first
 * allocated group at GI or after, or o->geom.ngroups.  Under o->lock once
 * the object is listed.
 */
extern int fsc_gtable_init (struct fsc_object *o);
extern void fsc_gtable_free (struct fsc_object *o);
extern struct group *fsc_grp_alloc (struct fsc_object *o, uint64_t gi);
extern uint64_t fsc_grp_next (const struct fsc_object *o, uint64_t gi);

/* groups.c: paging (see the top of groups.c).  Make groups G0..G1
 * resident, reading the records of those that are not, and pin them
 * (not paged out until unpinned).  Without o->lock.  Returns 0, or -1
 * with errno and no pins held if a record could not be read or a group
 * held (the object is withdrawn then).
 */
extern int fsc_groups_pin (struct fsc_object *o, uint64_t g0, uint64_t g1);
/* groups.c: pin G0..G1 if all are resident (not loading) and return
 * true; else pin nothing and return false.  Caller holds o->lock.
 */
extern bool fsc_groups_pin_resident (struct fsc_object *o, uint64_t g0,
                                     uint64_t g1);
/* groups.c: drop the pins of G0..G1 (taken by a successful
 * fsc_groups_pin).  Without o->lock.
 */
extern void fsc_groups_unpin (struct fsc_object *o, uint64_t g0,
                              uint64_t g1);
/* groups.c: page out unused groups until at most o->pager.res_max are
 * resident, or none more can go.  Caller holds o->lock.
 */
extern void fsc_groups_trim (struct fsc_object *o);
/* groups.c: read the records of up to N groups with records from
 * group *GI on (wrapping), so that the eviction policy sees them;
 * *FIRST is set to the first of them, *GI moves past them.  Without
 * o->lock.  Returns 0 or -1 with errno.
 */
extern int fsc_groups_page_in (struct fsc_object *o, uint64_t *first,
                               uint64_t *gi, unsigned n);
/* groups.c: fill G (of group REC->group, slot SLOT on disk) from the
 * record REC, dropping what damage could have made wrong.
 */
extern void fsc_group_from_rec (struct fsc_object *o, struct group *g,
                                const struct fsc_grec *rec, int slot);
/* groups.c: the present blocks of G (group GI) and their bytes. */
extern void fsc_group_count (const struct fsc_object *o, uint64_t gi,
                             const struct group *g, uint64_t *blocks,
                             uint64_t *bytes);
/* groups.c: the census (after a crash, or an index without gauges):
 * count every non-resident group's record into o->nonres_*.  Stops
 * early (returning 0) if the object is withdrawn.  Without o->lock.
 */
extern int fsc_groups_census (struct fsc_object *o);

#endif /* FSC_GROUPS_H */
