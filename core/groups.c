/* libfscache: an object's group table.
 *
 * An object's in-memory state lives in groups of FSC_GROUP_BLOCKS
 * blocks (struct group, internal.h), allocated only for groups with
 * something cached or in flight.  The table that finds them is three
 * levels deep (top, mid nodes of GT_MID leaves, leaves of GT_LEAF
 * group pointers), so that its memory follows what is cached, not the
 * export's size: a flat array of one pointer per group would be
 * 128 MiB for a 64 TiB export of 64 KiB blocks before anything is
 * cached; here it is the top level, 512 pointers, plus one mid node
 * and one leaf per region actually touched (4 KiB and 512 bytes).
 *
 * Lookups (grp, internal.h) are three dependent loads and take no
 * lock of their own: the table changes only under o->lock, like the
 * groups themselves.  Nothing is ever freed before the object is.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "utils.h"

int
fsc_gtable_init (struct fsc_object *o)
{
  o->ntop = DIV_ROUND_UP (o->ngroups, (uint64_t) GT_LEAF * GT_MID);
  if (o->ntop == 0)
    o->ntop = 1;
  o->gtop = calloc (o->ntop, sizeof *o->gtop);
  o->ngalloc = 0;
  return o->gtop ? 0 : -1;
}

struct group *
fsc_grp_alloc (struct fsc_object *o, uint64_t gi)
{
  struct gmid **mp = &o->gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
  if (*mp == NULL && (*mp = calloc (1, sizeof **mp)) == NULL)
    return NULL;
  struct gleaf **lp = &(*mp)->l[(gi >> GT_LEAF_SHIFT) & (GT_MID - 1)];
  if (*lp == NULL && (*lp = calloc (1, sizeof **lp)) == NULL)
    return NULL;
  struct group **gp = &(*lp)->g[gi & (GT_LEAF - 1)];
  if (*gp == NULL) {
    if ((*gp = calloc (1, sizeof **gp)) == NULL)
      return NULL;
    o->ngalloc++;
  }
  return *gp;
}

uint64_t
fsc_grp_next (const struct fsc_object *o, uint64_t gi)
{
  while (gi < o->ngroups) {
    const struct gmid *m = o->gtop[gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)];
    if (m == NULL) {
      gi = ((gi >> (GT_LEAF_SHIFT + GT_MID_SHIFT)) + 1)
        << (GT_LEAF_SHIFT + GT_MID_SHIFT);
      continue;
    }
    const struct gleaf *l = m->l[(gi >> GT_LEAF_SHIFT) & (GT_MID - 1)];
    if (l == NULL) {
      gi = ((gi >> GT_LEAF_SHIFT) + 1) << GT_LEAF_SHIFT;
      continue;
    }
    if (l->g[gi & (GT_LEAF - 1)])
      return gi;
    gi++;
  }
  return o->ngroups;
}

void
fsc_gtable_free (struct fsc_object *o)
{
  if (o->gtop == NULL)
    return;
  for (uint64_t t = 0; t < o->ntop; ++t) {
    struct gmid *m = o->gtop[t];
    if (m == NULL)
      continue;
    for (unsigned i = 0; i < GT_MID; ++i) {
      struct gleaf *l = m->l[i];
      if (l == NULL)
        continue;
      for (unsigned j = 0; j < GT_LEAF; ++j)
        free (l->g[j]);
      free (l);
    }
    free (m);
  }
  free (o->gtop);
  o->gtop = NULL;
  o->ngalloc = 0;
}
