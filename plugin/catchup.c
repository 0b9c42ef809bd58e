/* nbdkit-fscache-filter: the catch-up worker, which fills what the fill
 * budget skipped (core/base/catchup.c notes it) once clients are idle.
 *
 * One worker per export with something to make up, started by the
 * first read that leaves ranges pending.  It holds a reference on the
 * object, so that the object outlives its connections until the work
 * is done (a client that read and left is the usual case), and opens a
 * context of its own on the upstream (nbdkit_next_context_open, as the
 * writeback writer and the pool do), so that it never shares one with
 * a client: a serial upstream still sees one call at a time on each.
 *
 * Yielding to clients.  It works only while no client request is in
 * flight and none began or ended for IDLE_MS (any connection, any
 * export: they share the disk and, often, the link; a request that
 * waits long for an inline fill on a slow disk is not idleness), one
 * CHUNK at a time, and looks again
 * between chunks: a client request that arrives waits at most for the
 * chunk in flight (1 MiB: 10 ms over a 1 Gbit/s link, less from a
 * local upstream).  A chunk is filled with fsc_object_prefetch, so
 * blocks present or being fetched are skipped, and the size cap,
 * quotas, min-free and fscache.stop apply as to any fill.
 *
 * It stops when nothing is pending, on an upstream error (the ranges
 * taken are counted as dropped, the rest wait for the next read that
 * skips: no retry loop against a failing upstream), and at .cleanup.
 * Not in writeback mode: a fill through another context than the
 * writer's might not see what the writer wrote back (nor with
 * fscache-catchup=false).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fscache.h"
#include "utils.h"

#include "blocksize.h"
#include "catchup.h"
#include "ownctx.h"
#include "params.h"
#include "upstream.h"

#define IDLE_MS 100
#define CHUNK (1024 * 1024)

struct cu_worker {
  struct cu_worker *next;
  char *exportname;
  struct fsc_object *obj;       /* a reference */
  struct upstream u;
  bool have_u;
  pthread_t thread;
  bool done;                    /* the thread has ended (list_lock) */
};

static nbdkit_backend *backend;
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t list_cond = PTHREAD_COND_INITIALIZER;
static struct cu_worker *list;
static bool stopping;
static uint64_t last_request_ms;        /* atomic: last start or end
                                         * (fsc_mono_coarse_ms) */
static unsigned inflight;               /* atomic: client requests */

void
catchup_set_backend (nbdkit_backend *b)
{
  backend = b;
}

/* The time is stored only when it moved (once a tick at most): every
 * store takes the line from the other CPU's cache, and two a request
 * were among the hit path's costs (issue 44).
 */
static void
note_time (void)
{
  uint64_t now = fsc_mono_coarse_ms ();
  if (__atomic_load_n (&last_request_ms, __ATOMIC_RELAXED) != now)
    __atomic_store_n (&last_request_ms, now, __ATOMIC_RELAXED);
}

void
catchup_client_request (void)
{
  __atomic_add_fetch (&inflight, 1, __ATOMIC_RELAXED);
  note_time ();
}

void
catchup_client_done (void)
{
  note_time ();
  __atomic_sub_fetch (&inflight, 1, __ATOMIC_RELAXED);
}

static int
cu_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  struct cu_worker *w = opaque;
  int err = 0;
  if (bs_pread (&w->u, buf, count, offset, 0, &err) == -1) {
    errno = err ? err : EIO;
    return -1;
  }
  return 0;
}

/* Wait until clients have been idle IDLE_MS, or we are stopping.
 * Returns false if stopping.
 */
static bool
wait_idle (void)
{
  for (;;) {
    pthread_mutex_lock (&list_lock);
    bool stop = stopping;
    pthread_mutex_unlock (&list_lock);
    if (stop)
      return false;
    uint64_t last = __atomic_load_n (&last_request_ms, __ATOMIC_RELAXED);
    uint64_t now = fsc_mono_coarse_ms ();
    if (now - last >= IDLE_MS &&
        __atomic_load_n (&inflight, __ATOMIC_RELAXED) == 0)
      return true;
    if (now - last >= IDLE_MS)
      last = now;               /* a request is in flight: look again */
    struct timespec ts = { 0, (long) (IDLE_MS - (now - last)) * 1000000 };
    nanosleep (&ts, NULL);
  }
}

static void *
worker (void *arg)
{
  struct cu_worker *w = arg;
  fsc_thread_name ("fsc-catchup");
  struct fsc_upstream up = { .pread = cu_pread, .opaque = w };
  uint64_t off, len;

  while (wait_idle () && fsc_catchup_take (w->obj, CHUNK, &off, &len)) {
    if (!w->have_u) {
      int64_t size;
      int r = upstream_open_own (&w->u, backend, 1, w->exportname,
                                 fsc_object_size (w->obj), &size);
      if (r == -1 && size == -1) {
        nbdkit_debug ("fscache: export \"%s\": catch-up: cannot open the "
                      "upstream; what is pending waits", w->exportname);
        fsc_catchup_done (w->obj, len, false);  /* the chunk taken */
        break;
      }
      if (r == -1) {
        /* Not the image cached: fill nothing from it (as pool.c). */
        nbdkit_error ("fscache: export \"%s\": catch-up: the upstream now "
                      "reports %" PRId64 " bytes, not the %" PRIu64
                      " cached: it was replaced under the cache; "
                      "withdrawing its cache object", w->exportname, size,
                      fsc_object_size (w->obj));
        fsc_object_withdraw (w->obj, ESTALE);
        fsc_catchup_done (w->obj, len, false);
        break;
      }
      w->have_u = true;
    }
    if (fsc_object_prefetch (w->obj, off, len, &up, 0) == -1) {
      nbdkit_debug ("fscache: export \"%s\": catch-up: upstream read at "
                    "%" PRIu64 "+%" PRIu64 " failed: %m; stopping",
                    w->exportname, off, len);
      fsc_catchup_done (w->obj, len, false);
      break;
    }
    fsc_catchup_done (w->obj, len, true);
  }
  pthread_mutex_lock (&list_lock);
  w->done = true;
  pthread_cond_broadcast (&list_cond);
  pthread_mutex_unlock (&list_lock);
  return NULL;
}

/* Free the workers that have ended.  Holds list_lock; drops it while
 * joining and closing (a close is an upstream call).
 */
static void
reap_locked (void)
{
  for (struct cu_worker **wp = &list; *wp;) {
    struct cu_worker *w = *wp;
    if (!w->done) {
      wp = &w->next;
      continue;
    }
    *wp = w->next;
    pthread_mutex_unlock (&list_lock);
    pthread_join (w->thread, NULL);
    if (w->have_u)
      upstream_close (&w->u);
    fsc_object_close (w->obj);
    free (w->exportname);
    free (w);
    pthread_mutex_lock (&list_lock);
    wp = &list;
  }
}

void
catchup_maybe_start (struct fsc_object *obj, const char *exportname)
{
  if (!params.catchup || params.mode == MODE_WRITEBACK || backend == NULL ||
      fsc_catchup_pending (obj) == 0 ||
      !ownctx_allowed (exportname))
    return;
  SCOPED_LOCK (&list_lock);
  reap_locked ();
  if (stopping)
    return;
  for (struct cu_worker *w = list; w; w = w->next)
    if (w->obj == obj && !w->done)
      return;
  struct cu_worker *w = calloc (1, sizeof *w);
  if (w == NULL || (w->exportname = strdup (exportname)) == NULL) {
    free (w);
    return;
  }
  w->obj = fsc_object_ref (obj);
  if (pthread_create (&w->thread, NULL, worker, w) != 0) {
    fsc_object_close (w->obj);
    free (w->exportname);
    free (w);
    return;
  }
  w->next = list;
  list = w;
}

void
catchup_stop_all (void)
{
  pthread_mutex_lock (&list_lock);
  stopping = true;
  for (struct cu_worker *w = list; w; w = w->next)
    while (!w->done)
      pthread_cond_wait (&list_cond, &list_lock);
  reap_locked ();
  pthread_mutex_unlock (&list_lock);
}
