/* libfscache, host sharing: the epochs file (share-int.h has the
 * overview).
 *
 * A joiner serves its own hits from maps of groups the owner gives it
 * (share-direct.c); what makes such a map stale is an epoch: one for
 * the object (slot 0), bumped by a withdrawal or a new owner, and one
 * per group (hashed into the other slots), bumped by every write after
 * it dropped the group's blocks and before it is acknowledged.  They
 * live in a file beside the object's (NAME.epochs) so that joiners can
 * read them without asking: mapped writable by the owner, read-only by
 * joiners.  An object nobody joins has none.
 */
#include <config.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "share-int.h"
#include "utils.h"

/* The epochs file (NAME.epochs, with the object's files, culled with
 * them), mapped: WRITABLE for the owner, read-only for joiners.  Never
 * truncated, so that the epochs only grow, whoever owns the object; a
 * joiner maps it anew whenever it joins a new owner (the file may have
 * been culled and made again meanwhile).
 */
uint32_t *
sh_map_epochs (struct fsc_object *o, bool writable, bool create)
{
  char name[FILE_NAME_MAX];
  fsc_file_name (&o->files, ".epochs", name);
  const size_t len = EPOCH_SLOTS * sizeof (uint32_t);
  int fd = openat (o->files.fandirfd, name,
                   (writable ? O_RDWR | (create ? O_CREAT : 0) : O_RDONLY) |
                   O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd == -1)
    return NULL;
  struct stat st;
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode) ||
      ((uint64_t) st.st_size < len &&
       (!writable || ftruncate (fd, len) == -1))) {
    close (fd);
    return NULL;
  }
  void *p = mmap (NULL, len, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                  MAP_SHARED, fd, 0);
  close (fd);
  return p == MAP_FAILED ? NULL : p;
}

/* Joiners serve hits themselves from maps of groups tagged with these
 * epochs (see sh_direct_read): a write must make every map that shows its
 * blocks' old contents stale before it is acknowledged.  Called after
 * the blocks are dropped (a map taken later shows them absent).
 */
void
fsc_share_bump (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  struct share_server *srv = o->share;
  uint32_t *ep = srv ? __atomic_load_n (&srv->ep, __ATOMIC_SEQ_CST) : NULL;
  if (ep == NULL)
    return;                     /* no joiner ever: no map to make stale */
  if (g1 - g0 >= EPOCH_SLOTS - 1) {
    __atomic_add_fetch (&ep[0], 1, __ATOMIC_SEQ_CST);
    return;
  }
  for (uint64_t gi = g0; gi <= g1; ++gi)
    __atomic_add_fetch (&ep[sh_slot_of (gi)], 1, __ATOMIC_SEQ_CST);
}

/* Every map stale: the object was withdrawn (or changed owner). */
void
fsc_share_bump_all (struct fsc_object *o)
{
  struct share_server *srv = o->share;
  uint32_t *ep = srv ? __atomic_load_n (&srv->ep, __ATOMIC_SEQ_CST) : NULL;
  if (ep)
    __atomic_add_fetch (&ep[0], 1, __ATOMIC_SEQ_CST);
}

/* The epochs file, made (or mapped) when the first joiner comes, so
 * that an object nobody joins has none.  Bumping the object's epoch
 * then makes every map a joiner kept of an earlier owner stale.
 * Without it joiners only lose their own hits: every read goes to us.
 */
void
sh_ensure_epochs (struct fsc_object *o)
{
  struct share_server *srv = o->share;
  SCOPED_LOCK (&srv->lock);
  if (srv->ep)
    return;
  uint32_t *ep = sh_map_epochs (o, true, true);
  if (ep) {
    __atomic_add_fetch (&ep[0], 1, __ATOMIC_SEQ_CST);
    __atomic_store_n (&srv->ep, ep, __ATOMIC_SEQ_CST);
  }
}
