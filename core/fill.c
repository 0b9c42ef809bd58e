/* libfscache: the fill thread, which writes what misses fetched into
 * the cache files, so that a miss is answered as soon as the upstream
 * answers.
 *
 * A fill job (struct fsc_fill, internal.h) holds claimed blocks of one
 * object, their bytes and the epochs of their claim, and a reference on
 * the object.  Jobs wait in a FIFO under cache->fill_lock, at most
 * FILL_MAX_BYTES of them; past that, or without the thread (unit
 * tests), fsc_fill_new says no and the miss fills inline.  Others that
 * miss on those blocks wait for the fill as for a fetch, since the
 * blocks stay claimed until it is done.  The thread runs from
 * fsc_fill_start to fsc_fill_stop, which finishes every queued job.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "utils.h"

#define FILL_MAX_BYTES (16u << 20)      /* queued background fills */

struct fsc_fill *
fsc_fill_new (struct fsc_cache *c, size_t len)
{
  pthread_mutex_lock (&c->fill_lock);
  bool ok = c->filler_running && !c->fill_stopping &&
    c->fill_bytes + len <= FILL_MAX_BYTES;
  if (ok)
    c->fill_bytes += len;
  pthread_mutex_unlock (&c->fill_lock);
  if (!ok)
    return NULL;
  struct fsc_fill *f = malloc (sizeof *f + len);
  if (f == NULL) {
    pthread_mutex_lock (&c->fill_lock);
    c->fill_bytes -= len;
    pthread_mutex_unlock (&c->fill_lock);
    return NULL;
  }
  f->next = NULL;
  f->obj = NULL;
  f->len = len;
  return f;
}

void
fsc_fill_free (struct fsc_cache *c, struct fsc_fill *f)
{
  pthread_mutex_lock (&c->fill_lock);
  c->fill_bytes -= f->len;
  pthread_mutex_unlock (&c->fill_lock);
  free (f);
}

void
fsc_fill_submit (struct fsc_cache *c, struct fsc_object *obj,
                 struct fsc_fill *f)
{
  pthread_mutex_lock (&c->lock);
  obj->refs++;
  pthread_mutex_unlock (&c->lock);
  pthread_mutex_lock (&obj->lock);
  obj->pending_fills++;
  pthread_mutex_unlock (&obj->lock);
  f->obj = obj;
  pthread_mutex_lock (&c->fill_lock);
  f->next = NULL;
  *c->fill_tail = f;
  c->fill_tail = &f->next;
  pthread_cond_signal (&c->fill_cond);
  pthread_mutex_unlock (&c->fill_lock);
}

static void *
filler (void *arg)
{
  struct fsc_cache *c = arg;

  for (;;) {
    pthread_mutex_lock (&c->fill_lock);
    while (c->fill_head == NULL && !c->fill_stopping)
      pthread_cond_wait (&c->fill_cond, &c->fill_lock);
    struct fsc_fill *f = c->fill_head;
    if (f) {
      c->fill_head = f->next;
      if (c->fill_head == NULL)
        c->fill_tail = &c->fill_head;
    }
    pthread_mutex_unlock (&c->fill_lock);
    if (f == NULL)              /* stopping, and the queue is empty */
      return NULL;

    struct fsc_object *o = f->obj;
    fsc_fill_blocks (o, f->block, f->nblocks, f->data, f->start, f->len,
                     f->epochs, f->flags);
    pthread_mutex_lock (&o->lock);
    o->pending_fills--;
    pthread_cond_broadcast (&o->cond);
    pthread_mutex_unlock (&o->lock);
    fsc_object_close (o);
    fsc_fill_free (c, f);
  }
}

int
fsc_fill_start (struct fsc_cache *c)
{
  SCOPED_LOCK (&c->fill_lock);
  if (c->filler_running)
    return 0;
  int e = pthread_create (&c->filler, NULL, filler, c);
  if (e != 0) {
    errno = e;
    return -1;
  }
  c->filler_running = true;
  return 0;
}

void
fsc_fill_stop (struct fsc_cache *c)
{
  pthread_mutex_lock (&c->fill_lock);
  c->fill_stopping = true;
  pthread_cond_broadcast (&c->fill_cond);
  bool filling = c->filler_running;
  pthread_mutex_unlock (&c->fill_lock);
  if (filling)
    pthread_join (c->filler, NULL);
}
