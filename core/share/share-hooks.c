/* libfscache: the sharing layer's entry points for the layers below it
 * (share-hooks.h says why they go through a table).
 */
#include <config.h>

#include "share-hooks.h"

const struct fsc_share_hooks fsc_share_hooks = {
  .start = fsc_share_start,
  .stop = fsc_share_stop,
  .join = fsc_share_join,
  .leave = fsc_share_leave,
  .bump = fsc_share_bump,
  .bump_all = fsc_share_bump_all,
};
