/* nbdkit-fscache-filter: the catch-up worker (catchup.c), which fills
 * what the fill budget skipped once clients are idle.
 */
#ifndef FSC_PLUGIN_CATCHUP_H
#define FSC_PLUGIN_CATCHUP_H

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

struct fsc_object;

/* .after_fork: the backend its contexts are opened from. */
extern void catchup_set_backend (nbdkit_backend *backend);

/* A client request begins and ends: clients are idle only with none
 * in flight and none for a while.  CATCHUP_REQUEST () at the top of a
 * callback does both (the end when the scope is left).
 */
extern void catchup_client_request (void);
extern void catchup_client_done (void);
static inline void
catchup_request_end_ (int *unused)
{
  (void) unused;
  catchup_client_done ();
}
#define CATCHUP_REQUEST()                                               \
  catchup_client_request ();                                            \
  int catchup_req_ __attribute__ ((cleanup (catchup_request_end_),      \
                                   unused)) = 0

/* After a read of OBJ (export EXPORTNAME): start its worker if it has
 * skipped fills pending and none runs (and catch-up applies).
 */
extern void catchup_maybe_start (struct fsc_object *obj,
                                 const char *exportname);

/* .cleanup: stop every worker (each ends its chunk in flight). */
extern void catchup_stop_all (void);

#endif /* FSC_PLUGIN_CATCHUP_H */
