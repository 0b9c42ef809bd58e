/* libfscache: the fill thread, which writes what misses fetched into
 * the cache files, so that a miss is answered as soon as the upstream
 * answers.
 *
 * A fill job (struct fsc_fill, internal.h) holds claimed blocks of one
 * object, their bytes and the epochs of their claim, and a reference on
 * the object.  A miss takes its job before it reads upstream (the read
 * lands in the job's buffer) and offers it to the queue once the data
 * is there (fsc_fill_submit).  Jobs wait in a FIFO under
 * cache->fill_lock, at most FILL_MAX_BYTES of them.  That bound is the
 * cache disk's backlog, bytes fetched and not yet written, so it is
 * checked when the data has arrived, not when the fetch starts: a slow
 * link with many large reads in flight has much being fetched and
 * nothing behind.  Others that miss on those blocks wait for the fill
 * as for a fetch, since the blocks stay claimed until it is done.  The
 * thread runs from fsc_fill_start to fsc_fill_stop, which finishes
 * every queued job.
 *
 * A full queue means the cache disk is slower than the upstream, and
 * the caller decides what to do (retrieve.c): a client's read or a
 * readahead skips its fill rather than wait for the disk, an
 * NBD_CMD_CACHE fills inline.  Past half full the cache is congested
 * (fsc_fill_congested): client reads then bypass the cache altogether,
 * and readahead pauses.  Without the thread (unit tests) every fill is
 * inline.
 *
 * A read that finds a block claimed waits for the claim, as for a fetch
 * (dedup), unless the claim is a fill waiting here or being written:
 * then the bytes are in memory, and fsc_fill_copy serves them from the
 * job rather than make the reader wait for the disk (a readahead that
 * ran ahead of a stream would otherwise pace the stream at the disk's
 * speed).  A job being read is freed by the last of its readers.
 *
 * Jobs are kept for reuse (fsc_fill_free), up to FILL_MAX_BYTES of
 * room, in power-of-two classes from 4 KiB to 4 MiB: every 4 KiB of a
 * fresh buffer costs a page fault when the fetch first writes it, a
 * reused one none.  (On the 2-CPU VM of docs/benchmarks.md, the faults
 * of fresh buffers cost as much CPU as the fills' copies into the page
 * cache.)  Their data is page aligned, as O_DIRECT would want.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "utils.h"

#define FILL_MAX_BYTES (16u << 20)      /* queued background fills, and
                                         * the room of the jobs kept */
#define POOL_MIN ((size_t) 4096)        /* the smallest class */

/* The pool class of a job with room for LEN bytes, or
 * FSC_FILL_POOL_CLASSES if it is too large to pool.
 */
static unsigned
pool_class (size_t len)
{
  unsigned k = 0;
  while (k < FSC_FILL_POOL_CLASSES && (POOL_MIN << k) < len)
    k++;
  return k;
}

struct fsc_fill *
fsc_fill_new (struct fsc_cache *c, size_t len)
{
  const unsigned k = pool_class (len);
  struct fsc_fill *f = NULL;

  pthread_mutex_lock (&c->fill_lock);
  bool ok = c->filler_running && !c->fill_stopping;
  if (ok && k < FSC_FILL_POOL_CLASSES && (f = c->fill_pool[k]) != NULL) {
    c->fill_pool[k] = f->next;
    c->fill_pooled -= f->cap;
  }
  pthread_mutex_unlock (&c->fill_lock);
  if (!ok) {
    errno = ENOTSUP;
    return NULL;
  }
  if (f == NULL) {
    f = malloc (sizeof *f);
    if (f == NULL)
      return NULL;
    f->cap = k < FSC_FILL_POOL_CLASSES ? POOL_MIN << k : len;
    void *p;
    int e = posix_memalign (&p, POOL_MIN, f->cap);
    if (e != 0) {
      free (f);
      errno = e;
      return NULL;
    }
    f->data = p;
  }
  f->next = NULL;
  f->obj = NULL;
  f->len = len;
  f->readers = 0;
  f->done = false;
  return f;
}

void
fsc_fill_free (struct fsc_cache *c, struct fsc_fill *f)
{
  const unsigned k = pool_class (f->cap);
  pthread_mutex_lock (&c->fill_lock);
  bool keep = k < FSC_FILL_POOL_CLASSES && !c->fill_stopping &&
    c->fill_pooled + f->cap <= FILL_MAX_BYTES;
  if (keep) {
    f->next = c->fill_pool[k];
    c->fill_pool[k] = f;
    c->fill_pooled += f->cap;
  }
  pthread_mutex_unlock (&c->fill_lock);
  if (!keep) {
    free (f->data);
    free (f);
  }
}

/* Free the pool (fsc_fill_stop, when nothing uses it any more). */
static void
pool_free (struct fsc_cache *c)
{
  for (unsigned k = 0; k < FSC_FILL_POOL_CLASSES; ++k)
    while (c->fill_pool[k]) {
      struct fsc_fill *f = c->fill_pool[k];
      c->fill_pool[k] = f->next;
      free (f->data);
      free (f);
    }
  c->fill_pooled = 0;
}

/* Does job F hold the bytes [LO, HI) of block B of O, claimed at
 * EPOCH?  Caller holds c->fill_lock.
 */
static bool
job_holds (const struct fsc_fill *f, const struct fsc_object *o, uint64_t b,
           uint64_t epoch, uint64_t lo, uint64_t hi)
{
  return f->obj == o && b >= f->block && b < f->block + f->nblocks &&
    lo >= f->start && hi <= f->start + f->len &&
    f->epochs[GROUP_OF (b) - GROUP_OF (f->block)] == epoch;
}

bool
fsc_fill_copy (struct fsc_cache *c, struct fsc_object *o, uint64_t b,
               uint64_t epoch, uint64_t lo, uint64_t hi, void *dst)
{
  pthread_mutex_lock (&c->fill_lock);
  struct fsc_fill *f = c->fill_current;
  if (f == NULL || !job_holds (f, o, b, epoch, lo, hi))
    for (f = c->fill_head; f && !job_holds (f, o, b, epoch, lo, hi);
         f = f->next)
      ;
  if (f)
    f->readers++;
  pthread_mutex_unlock (&c->fill_lock);
  if (f == NULL)
    return false;

  memcpy (dst, f->data + (lo - f->start), hi - lo);
  pthread_mutex_lock (&c->fill_lock);
  bool last = --f->readers == 0 && f->done;
  pthread_mutex_unlock (&c->fill_lock);
  if (last)
    fsc_fill_free (c, f);
  return true;
}

bool
fsc_fill_congested (struct fsc_cache *c)
{
  return __atomic_load_n (&c->fill_bytes, __ATOMIC_RELAXED) >
    FILL_MAX_BYTES / 2;
}

int
fsc_fill_submit (struct fsc_cache *c, struct fsc_object *obj,
                 struct fsc_fill *f)
{
  /* An empty queue takes any job, so that a job larger than the bound
   * (there are none today: a fetch is at most 4 MiB) would not be
   * refused forever.
   */
  pthread_mutex_lock (&c->fill_lock);
  const size_t queued = c->fill_bytes;
  bool ok = !c->fill_stopping &&
    (queued == 0 || queued + f->len <= FILL_MAX_BYTES);
  if (ok)
    __atomic_store_n (&c->fill_bytes, queued + f->len, __ATOMIC_RELAXED);
  pthread_mutex_unlock (&c->fill_lock);
  if (!ok) {
    errno = EAGAIN;
    return -1;
  }

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
  /* Reads waiting for these blocks' claim can take them from here. */
  pthread_mutex_lock (&obj->lock);
  pthread_cond_broadcast (&obj->cond);
  pthread_mutex_unlock (&obj->lock);
  return 0;
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
      c->fill_current = f;
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
    pthread_mutex_lock (&c->fill_lock);
    c->fill_current = NULL;
    if (c->fill_head == NULL)
      pthread_cond_broadcast (&c->fill_idle_cond);
    __atomic_store_n (&c->fill_bytes, c->fill_bytes - f->len,
                      __ATOMIC_RELAXED);
    f->done = true;
    bool last = f->readers == 0;
    pthread_mutex_unlock (&c->fill_lock);
    /* The object's reference last: its close may free it, and a
     * reader's job_holds compares the pointer.
     */
    fsc_object_close (o);
    if (last)
      fsc_fill_free (c, f);
  }
}

void
fsc_cache_drain (struct fsc_cache *c)
{
  SCOPED_LOCK (&c->fill_lock);
  while (c->filler_running && (c->fill_head || c->fill_current))
    pthread_cond_wait (&c->fill_idle_cond, &c->fill_lock);
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
  pool_free (c);
}
