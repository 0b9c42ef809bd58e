/* libfscache: the object's public operations, each a dispatch through
 * its operations table (objops.h has why): the local object or a
 * joined one, chosen at open.
 */
#include <config.h>

#include "internal.h"

int
fsc_object_read (struct fsc_object *o, void *buf, uint32_t count,
                 uint64_t offset, const struct fsc_upstream *up,
                 unsigned flags)
{
  return o->ops->read (o, buf, count, offset, up, flags);
}

int
fsc_object_prefetch (struct fsc_object *o, uint64_t offset, uint64_t count,
                     const struct fsc_upstream *up, unsigned flags)
{
  return o->ops->prefetch (o, offset, count, up, flags);
}

int
fsc_object_write_begin_flags (struct fsc_object *o, uint64_t offset,
                              uint64_t count, unsigned flags,
                              struct fsc_write *w)
{
  return o->ops->write_begin (o, offset, count, flags, w);
}

void
fsc_object_write_end (struct fsc_object *o, struct fsc_write *w,
                      const void *buf, bool upstream_ok)
{
  o->ops->write_end (o, w, buf, upstream_ok);
}

int
fsc_object_commit (struct fsc_object *o)
{
  return o->ops->commit (o);
}

/* The object held here: its operations live in the files of their
 * concern (retrieve.c, store.c, commit.c, object.c).
 */
const struct fsc_object_ops fsc_local_ops = {
  .read = fsc_local_read,
  .prefetch = fsc_local_prefetch,
  .write_begin = fsc_local_write_begin,
  .write_end = fsc_local_write_end,
  .commit = fsc_local_commit,
  .close = fsc_local_close,
};
