/* libfscache: big buffers and the per-thread scratch buffer.  The
 * ground floor: nothing here calls another file of libfscache.
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

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"
#include "utils.h"

#define BUF_CLASS_MIN 16                /* 64 KiB */
/* Big buffers kept for reuse.  It covers what a steady cold stream has
 * out at once: 16 MiB of fills waiting for the disk (the queue's
 * least bound, fill.c; it grows only to ride out a stall) and as much
 * again being fetched (a pool of 16 contexts with 1 MiB chunks, the
 * client's own misses).  At 4 MiB, a sequential 1M read over a pool of
 * 16 mapped and faulted in nearly every buffer: 86,000 page faults in
 * 2 s, a tenth of the proxy's CPU (recv into fresh pages, clearing
 * them, munmap); at 32 MiB, 4,000 (docs/benchmarks.md, stop 37).
 */
#define BUF_POOL_MAX (32u << 20)

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

void *
fsc_scratch (struct fsc_cache *cache, size_t size)
{
  size_t *p = pthread_getspecific (cache->scratch_key);
  if (p == NULL || p[0] < size) {
    free (p);
    p = malloc (sizeof (size_t) * 2 + size);
    pthread_setspecific (cache->scratch_key, p);
    if (p == NULL)
      return NULL;
    p[0] = size;
  }
  return p + 2;
}

