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
 *
 * Big buffers (fsc_buf_get): a job's bytes, an inline fill's, a
 * commit's records are mapped on their own, not taken from malloc.
 * Request threads allocate them and the fill thread frees them, by the
 * thousand a second; in glibc's per-thread arenas they were carved up
 * by the small long-lived allocations around them (groups, leaves) and
 * the arenas kept growing: after a 1 GiB fill in 64 KiB blocks the
 * process stayed at about 100 MiB resident with nothing of ours left
 * alive.  A buffer given back is kept for reuse, by size class (powers
 * of two from 64 KiB to 8 MiB), up to BUF_POOL_MAX bytes in all, so
 * that a steady fill maps and faults in nothing; bigger ones, and those
 * past the bound, are unmapped.  Nor does a buffer given back raise
 * glibc's dynamic mmap threshold, which made every later allocation up
 * to that size come from (and stay in) the arenas.  (A job's own
 * fields are malloced: a few hundred bytes, so that its bytes fill
 * their size class exactly.)
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"
#include "utils.h"

#define FILL_MAX_BYTES (16u << 20)      /* queued background fills */
#define BUF_CLASS_MIN 16                /* 64 KiB */
#define BUF_POOL_MAX (4u << 20)         /* big buffers kept for reuse */

/* The size class of SIZE bytes (BUF_CLASSES: none, too big), and its
 * capacity.
 */
static unsigned
buf_class (size_t size)
{
  unsigned k = 0;
  while (k < BUF_CLASSES && ((size_t) 1 << (BUF_CLASS_MIN + k)) < size)
    k++;
  return k;
}

void *
fsc_buf_get (struct fsc_cache *c, size_t size, size_t *cap)
{
  unsigned k = buf_class (size);
  if (k < BUF_CLASSES) {
    pthread_mutex_lock (&c->fill_lock);
    void *p = c->buf_pool[k];
    if (p) {
      c->buf_pool[k] = *(void **) p;
      c->buf_pool_bytes -= (size_t) 1 << (BUF_CLASS_MIN + k);
    }
    pthread_mutex_unlock (&c->fill_lock);
    *cap = (size_t) 1 << (BUF_CLASS_MIN + k);
    if (p)
      return p;
  }
  else
    *cap = ROUND_UP (size, (size_t) 4096);
  void *p = mmap (NULL, *cap, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void
fsc_buf_put (struct fsc_cache *c, void *p, size_t cap)
{
  if (p == NULL)
    return;
  unsigned k = buf_class (cap);
  if (k < BUF_CLASSES && cap == (size_t) 1 << (BUF_CLASS_MIN + k)) {
    pthread_mutex_lock (&c->fill_lock);
    bool keep = c->buf_pool_bytes + cap <= BUF_POOL_MAX;
    if (keep) {
      *(void **) p = c->buf_pool[k];
      c->buf_pool[k] = p;
      c->buf_pool_bytes += cap;
    }
    pthread_mutex_unlock (&c->fill_lock);
    if (keep)
      return;
  }
  munmap (p, cap);
}

void
fsc_buf_pool_free (struct fsc_cache *c)
{
  for (unsigned k = 0; k < BUF_CLASSES; ++k)
    while (c->buf_pool[k]) {
      void *p = c->buf_pool[k];
      c->buf_pool[k] = *(void **) p;
      munmap (p, (size_t) 1 << (BUF_CLASS_MIN + k));
    }
  c->buf_pool_bytes = 0;
}

size_t
fsc_fill_room (struct fsc_cache *c)
{
  SCOPED_LOCK (&c->fill_lock);
  if (!c->filler_running || c->fill_stopping)
    return 0;
  return FILL_MAX_BYTES - c->fill_bytes;
}

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
  size_t cap = 0;
  struct fsc_fill *f = malloc (sizeof *f);
  if (f)
    f->data = fsc_buf_get (c, len, &cap);
  if (f == NULL || f->data == NULL) {
    free (f);
    pthread_mutex_lock (&c->fill_lock);
    c->fill_bytes -= len;
    pthread_mutex_unlock (&c->fill_lock);
    return NULL;
  }
  f->next = NULL;
  f->obj = NULL;
  f->len = len;
  f->cap = cap;
  return f;
}

void
fsc_fill_free (struct fsc_cache *c, struct fsc_fill *f)
{
  pthread_mutex_lock (&c->fill_lock);
  c->fill_bytes -= f->len;
  pthread_mutex_unlock (&c->fill_lock);
  fsc_buf_put (c, f->data, f->cap);
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
