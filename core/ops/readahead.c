/* libfscache: sequential readahead.  See readahead.h. */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "internal.h"
#include "readahead.h"
#include "utils.h"

#define QUEUE_MAX 64

struct range {
  uint64_t offset, count;
};

struct fsc_readahead {
  struct fsc_object *obj;
  struct fsc_upstream up;
  uint64_t window;
  uint64_t chunk;

  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct range queue[QUEUE_MAX];        /* ring */
  unsigned head, len;
  uint64_t front;                       /* the stream's front: the
                                         * furthest end of its reads */
  bool started;                         /* a read was seen */
  uint64_t queued_end;                  /* readahead queued up to here */
  unsigned sequential;                  /* reads in a row */
  bool stop;
  unsigned max_threads;
  unsigned nthreads;
  pthread_t threads[FSC_RA_THREADS_MAX];
};

/* Does the fill budget pause readahead?  Only for a local upstream
 * (reads under REMOTE_NS each: nbdkit null, a page-cached file, an NBD
 * server next door), whose bytes the client reads itself as fast as
 * the cache would give them, and whose fills would take the CPUs the
 * reads need.  Over a link (curl with 10 ms per request) readahead is
 * what keeps several requests in flight: paused, a stream fell to one
 * round trip per request, 136 MiB/s at pool 8 where running on (its
 * prefetches stored at the disk's speed) gave 260 and cached it all
 * (docs/benchmarks.md, issue 27).  Whatever the upstream, while the
 * measure of what fills cost the clients has them off (a verdict
 * "costly" or a probe: probe.c, fsc_fill_cost_off): there the clients
 * were measured faster without the fills, readahead's included.
 */
static bool
ra_budget_pause (struct fsc_cache *c)
{
  return (fsc_fill_budgeted (c) && !fsc_upstream_remote (c)) ||
    fsc_fill_cost_off (c);
}

static void *
worker (void *arg)
{
  struct fsc_readahead *ra = arg;
  fsc_thread_name ("fsc-readahead");

  for (;;) {
    pthread_mutex_lock (&ra->lock);
    while (!ra->stop && ra->len == 0)
      pthread_cond_wait (&ra->cond, &ra->lock);
    if (ra->stop) {
      pthread_mutex_unlock (&ra->lock);
      return NULL;
    }
    struct range r = ra->queue[ra->head];
    ra->head = (ra->head + 1) % QUEUE_MAX;
    ra->len--;
    /* What the stream's front has passed, the client asked for itself
     * (its reads in flight cover what lies behind the front): a
     * prefetch there only fetches it a second time.  Behind a client
     * whose misses bypass the cache (past the fill budget) nothing is
     * claimed to show that they did, and a stream of 1 MiB reads at
     * iodepth 8 from an NBD server next door outran a 4 MiB window at
     * once: 2.47 GB prefetched and stored of 4.29 GB read, all of it
     * read upstream twice (1.56 times the image, and the stream at
     * 0.7 of the proxy's speed).  So such a range is dropped, and one
     * the front has entered is cut to what lies ahead.
     */
    const uint64_t bs = ra->obj->geom.block_size;
    const uint64_t front = ROUND_DOWN (ra->front, bs);
    if (r.offset + r.count <= front) {
      pthread_mutex_unlock (&ra->lock);
      continue;
    }
    if (r.offset < front) {
      r.count -= front - r.offset;
      r.offset = front;
    }
    pthread_mutex_unlock (&ra->lock);

    /* Not while the cache disk is behind (the fill queue over half
     * full) or slower than the upstream (fill.c, fsc_fill_budgeted):
     * what readahead fetched would wait in the fill queue, or be
     * written inline by this thread while the stream's reads wait for
     * its claims, competing with the fills of the client's own misses.
     * The client reads these bytes itself soon enough, at the
     * upstream's speed.  Before the rates are known, it spends from
     * the budget's first bucket as the client's misses do (retrieve.c,
     * FSC_PREFETCH_SPECULATIVE).  Errors only mean the client's read
     * misses.
     */
    struct fsc_cache *c = ra->obj->cache;
    if (!fsc_fill_congested (c) && !ra_budget_pause (c))
      fsc_object_prefetch (ra->obj, r.offset, r.count, &ra->up,
                           FSC_PREFETCH_SPECULATIVE);
  }
}

struct fsc_readahead *
fsc_readahead_new (struct fsc_object *obj, uint64_t window,
                   unsigned max_threads, const struct fsc_upstream *up)
{
  if (max_threads < 1 || max_threads > FSC_RA_THREADS_MAX) {
    errno = EINVAL;
    return NULL;
  }
  struct fsc_readahead *ra = calloc (1, sizeof *ra);
  if (ra == NULL)
    return NULL;
  ra->max_threads = max_threads;
  ra->obj = obj;
  ra->up = *up;
  ra->window = window;
  ra->chunk = MAX ((uint64_t) FSC_RA_CHUNK, (uint64_t) obj->geom.block_size);
  pthread_mutex_init (&ra->lock, NULL);
  pthread_cond_init (&ra->cond, NULL);
  return ra;
}

/* Start one more worker if every one is busy.  Holds ra->lock. */
static void
maybe_start_worker (struct fsc_readahead *ra)
{
  if (ra->nthreads < ra->max_threads && ra->len > 0 &&
      pthread_create (&ra->threads[ra->nthreads], NULL, worker, ra) == 0)
    ra->nthreads++;
}

/* A read starting within this of where the last one ended is near
 * it.  Two near reads in a row (a stream whose requests overtake each
 * other, a reader skipping a little), or an exactly sequential one,
 * get whole blocks (FSC_READ_NEAR); any other read only the pieces it
 * covers.  Random reads land near twice in a row with a chance of
 * about (2 * NEAR_BYTES / export size)^2: 0.1% over 16 MiB.
 */
#define NEAR_BYTES (256 * 1024)

unsigned
fsc_pattern_classify (struct fsc_pattern *p, uint64_t offset, uint32_t count)
{
  uint64_t prev = __atomic_exchange_n (&p->last_end, offset + count,
                                       __ATOMIC_RELAXED);
  unsigned flags = prev == offset && offset != 0 ? FSC_READ_SEQUENTIAL : 0;
  bool near = prev != 0 && offset <= prev + NEAR_BYTES &&
    offset + count + NEAR_BYTES >= prev;
  bool was_near = __atomic_exchange_n (&p->last_near, near, __ATOMIC_RELAXED);
  if (flags || (near && was_near))
    flags |= FSC_READ_NEAR;
  return flags;
}

/* How far from the stream's front a read of COUNT bytes may start and
 * still belong to the stream.  A client keeps several reads in flight
 * (fio's iodepth, qemu's and the kernel's queues), and the server's
 * threads hand them to the filter in whatever order they win the
 * race: 1 MiB reads at iodepth 8 arrive up to 7 MiB either side of the
 * front.  Taken as jumps, such reads dropped the queue and restarted
 * the stream every few requests.  Sixteen reads' worth, up to 16 MiB:
 * random 4 KiB reads land within 64 KiB of the last twice in a row
 * about never in an export of any size.
 */
static uint64_t
reorder_span (uint32_t count)
{
  return MIN ((uint64_t) count * 16, (uint64_t) 16 * 1024 * 1024);
}

void
fsc_readahead_observe (struct fsc_readahead *ra, uint64_t offset,
                       uint32_t count)
{
  if (ra == NULL || ra->window == 0)
    return;

  const uint64_t size = ra->obj->geom.size;
  const uint64_t end = offset + count;
  const uint64_t span = reorder_span (count);
  SCOPED_LOCK (&ra->lock);
  bool in_stream = ra->started ? offset <= ra->front + span &&
    end + span >= ra->front : offset == 0;
  ra->started = true;
  if (!in_stream) {
    /* The stream jumped: what is queued is useless now. */
    ra->sequential = 0;
    ra->len = 0;
    ra->queued_end = 0;
    ra->front = end;
    return;
  }
  /* Reads that push the front on count; one that arrives late, behind
   * it, neither counts nor breaks the stream.
   */
  if (end > ra->front) {
    ra->sequential++;
    ra->front = end;
  }
  if (ra->sequential < 3)
    return;
  /* Paused (see worker): queue nothing and wake nobody.  A stream from
   * a fast upstream is read past the budget for its whole length, and
   * waking the workers for each request only for them to drop what
   * they found cost it three context switches a request.
   */
  struct fsc_cache *c = ra->obj->cache;
  if (fsc_fill_congested (c) || ra_budget_pause (c))
    return;

  /* Never further ahead than an eighth of a capped object's budget:
   * more would evict what was prefetched before it is read.
   */
  uint64_t window = MIN (ra->window, fsc_budget_of (ra->obj) / 8);
  /* Earned: a chunk after three reads in a row, doubling with each read
   * that pushes the front on, up to the window.  A mixed reader (a VM
   * or database seeking, with short runs of two or three reads)
   * otherwise had a whole window fetched at every short run and
   * dropped at the next seek: on a bandwidth-bound link those bytes
   * were the client's own (compare.sh cold-mixed, 1.12 to 1.03 of no
   * cache, once readahead ran at each read's arrival).  A true stream
   * reaches the window within a few reads.
   */
  window = MIN (window, ra->chunk << MIN (ra->sequential - 3, 20u));
  /* From the front, not from this read: the client's own reads in
   * flight already cover what lies behind it.  (Counted from the read
   * last served, the window lay inside what an iodepth-8 client had
   * asked for already, and its prefetches only raced the client's
   * misses.)  A window of whole chunks has its target rounded up to a
   * whole chunk, so that after the first, every chunk queued is whole:
   * one full-sized upstream read each, not a whole one and a sliver per
   * top-up.  (A smaller one, fscache-readahead under 1 MiB or a capped
   * object's eighth, is kept to: more could evict what it prefetched.)
   */
  uint64_t target = ra->front + window;
  if (window >= ra->chunk)
    target = ROUND_UP (target, ra->chunk);
  target = MIN (size, target);
  if (ra->queued_end < ra->front)
    ra->queued_end = ra->front;
  /* Top up only when less than half the window is left, so that the
   * queue gets whole chunks (one upstream read each), not a sliver per
   * client read.
   */
  if (ra->queued_end - ra->front >= window / 2 &&
      ra->queued_end < size)
    return;
  unsigned added = 0;
  while (ra->queued_end < target && ra->len < QUEUE_MAX) {
    /* Chunks aligned to the chunk size, so that concurrent streams
     * and the workers split the export the same way.
     */
    uint64_t cend = MIN (ROUND_DOWN (ra->queued_end, ra->chunk) + ra->chunk,
                         target);
    struct range *r = &ra->queue[(ra->head + ra->len) % QUEUE_MAX];
    r->offset = ra->queued_end;
    r->count = cend - ra->queued_end;
    ra->len++;
    ra->queued_end = cend;
    added++;
  }
  /* A worker per chunk added, not all of them for each (a broadcast
   * woke every idle worker for the one chunk a 1 MiB read adds).
   */
  if (added) {
    maybe_start_worker (ra);
    if (added == 1)
      pthread_cond_signal (&ra->cond);
    else
      pthread_cond_broadcast (&ra->cond);
  }
}

void
fsc_readahead_free (struct fsc_readahead *ra)
{
  if (ra == NULL)
    return;
  pthread_mutex_lock (&ra->lock);
  ra->stop = true;
  pthread_cond_broadcast (&ra->cond);
  pthread_mutex_unlock (&ra->lock);
  for (unsigned i = 0; i < ra->nthreads; ++i)
    pthread_join (ra->threads[i], NULL);
  pthread_mutex_destroy (&ra->lock);
  pthread_cond_destroy (&ra->cond);
  free (ra);
}
