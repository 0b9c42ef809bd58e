/* libfscache: an object's state, and withdrawal, its one way down.
 *
 * Withdrawal (fsc_withdraw) is the one answer to a failure of the
 * cache's own files: the object becomes WITHDRAWN (uncached, every
 * request goes upstream), its files are unlinked so that nothing stale
 * survives, and the joiners of other processes stop serving hits from
 * those files (share-hooks.h, bump_all).  Every layer that touches the
 * files may withdraw (groups, commits, hits, stores, eviction), so
 * this calls only what lies below all of them: the file names
 * (files.c) and the sharing layer's table.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>

#include "internal.h"
#include "share-hooks.h"
#include "utils.h"

void
fsc_withdraw (struct fsc_object *o, int err)
{
  pthread_mutex_lock (&o->lock);
  if (o->state == FSC_OBJ_WITHDRAWN) {
    pthread_mutex_unlock (&o->lock);
    return;
  }
  o->state = FSC_OBJ_WITHDRAWN;
  o->withdraw_err = err;
  FSC_NOTICE (o, FSC_NOTICE_WITHDRAWN);
  pthread_cond_broadcast (&o->cond);
  fsc_claim_wake (o, 0, UINT64_MAX);
  pthread_mutex_unlock (&o->lock);

  FSC_STAT_ADD (&o->cache->stats, withdrawals, 1);
  FSC_OSTAT_ADD (o, withdrawals, 1);
  /* Joiners stop serving hits from the files themselves (share-direct.c). */
  fsc_hook_share_bump_all (o);
  /* The index may name blocks whose upstream content will change while
   * we are not tracking writes any more: remove it so that nobody can
   * trust it later.  Best effort: if even unlink fails the disk is
   * gone, and the next open will validate whatever is left.
   */
  if (o->files.fandirfd >= 0) {
    fsc_unlink_file (&o->files, ".idx");
    fsc_data_unlink (o);
    fsc_unlink_file (&o->files, ".sums");
    fsc_unlink_file (&o->files, ".stale");
  }
}

void
fsc_object_withdraw (struct fsc_object *o, int err)
{
  fsc_withdraw (o, err);
}

uint64_t
fsc_object_size (struct fsc_object *o)
{
  return o->geom.size;          /* fixed from the object's open */
}

bool
fsc_object_check_stale (struct fsc_object *o)
{
  if (fsc_object_state (o) != FSC_OBJ_AVAILABLE
      || !fsc_stale_marked (&o->files))
    return false;
  fsc_withdraw (o, ESTALE);         /* also removes the mark */
  return true;
}

int
fsc_object_state (struct fsc_object *o)
{
  SCOPED_LOCK (&o->lock);
  return o->state;
}

