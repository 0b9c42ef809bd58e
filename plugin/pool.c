/* nbdkit-fscache-filter: a pool of upstream contexts for serial plugins
 * (fscache-upstream-connections=N).
 *
 * Why.  nbdkit 1.32's curl and ssh plugins are serialize_requests: one
 * call at a time per connection.  The filter used to read every miss
 * and prefetch of a client connection on that connection's one
 * context, so a cold read paid one round trip per request, whatever
 * the client's queue depth and whatever the link could carry (0.12x
 * of what a 10 ms link allows for 1 MiB reads at iodepth 8).
 *
 * What.  Per export, up to N contexts of the filter's own
 * (nbdkit_next_context_open, as the writeback writer opens its own),
 * each owned by one worker thread, which is the only caller on it: a
 * context still carries one call at a time.  A miss's read (a run of
 * blocks, up to a few MiB) is cut into chunks of at least CHUNK_MIN
 * bytes, spread over the workers and waited for; readahead runs up to
 * FSC_RA_THREADS prefetches at once, each spread the same way.  So a
 * sequential stream keeps enough requests in flight to cover the
 * round trip.  What the pool cannot change: nbdkit itself dispatches
 * one request at a time per client connection under
 * serialize_requests (a filter's thread model can only be stricter
 * than the plugin's), so small random misses of one connection stay
 * one at a time; several client connections (multi-conn) share the
 * pool.
 *
 * By default only under serialize_requests.  Under parallel, a
 * context carries many calls at once and the connection's own is
 * enough; under serialize_all_requests and serialize_connections one
 * call at a time is the whole server's rule, which a pool would break.
 *
 * Over a parallel plugin, when asked by name.  Because nbdkit
 * dispatches one request at a time per client connection under
 * serialize_requests, a client's queue depth never reaches a filter in
 * front of curl or ssh in the same process.  It does when the serial
 * plugin runs in a process of its own behind the parallel nbd plugin
 * (nbd socket=S, where "nbdkit -U S curl ..." serves each connection
 * on its own; not command=, which shares one connection): then the
 * front is parallel, and every context of the pool is a connection of
 * its own to the serial server, so random misses of one client
 * connection run as many at a time as the pool has contexts.  The
 * filter cannot see that the server behind nbd is serial, so the pool
 * is used there only when fscache-upstream-connections is given (the
 * man page, "A serial upstream at a client's queue depth";
 * docs/benchmarks.md: test-fscache-pool.sh part 3 breaks without it).
 *
 * (An upstream that can write and offers no multi-conn gives each
 * context a view of its own, and fills through several views can mix
 * a block's versions once clients write: issue 29, item 4, which the
 * pool does not make worse than each connection's own context did,
 * and does not solve either.  curl, the pool's main user, is such an
 * upstream, and most often read only.)
 *
 * Lifetime.  Workers start on demand, up to N; a worker opens its
 * context at its first job and closes it after IDLE_MS without one (the
 * thread then ends).  A failed read closes the context and is tried
 * once more on a fresh one before its caller hears of it: an upstream
 * that restarted, or dropped an idle connection, costs a reconnection,
 * not a client's EIO.
 *
 * Refusals (issue 40).  A context that cannot be opened (the upstream
 * refuses more connections, or is away for a moment: the filter cannot
 * tell which) lowers the pool's size to the workers that have one, said
 * once, for a back-off (BACKOFF_MIN_MS, doubling to BACKOFF_MAX_MS while
 * opens keep failing); after it the pool may grow to N again.  With no
 * context at all, reads go to the connection's own context meanwhile.
 * The size is read once per read (pool_pread), under the lock: a
 * worker lowers it at any time.
 *
 * A changed upstream.  Every context opened reports the upstream's
 * size; one that differs from the size the pool was made for (the
 * export's, at the connection's open) is not the image the cache
 * holds: its reads fail with ESTALE, and the connection withdraws its
 * object (connect.c), so that nothing of the new image is cached under
 * the old one's key.  Said once per pool.
 *
 * The pool of an export lives while a connection uses it; pools are
 * per export name and size.
 *
 * Locking: pool->lock guards the queue, the counts and the chunks'
 * completion; it is never held across an upstream call.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fscache.h"
#include "readahead.h"
#include "utils.h"

#include "blocksize.h"
#include "ownctx.h"
#include "params.h"
#include "pool.h"
#include "say.h"
#include "upstream.h"

/* A chunk is at least this.  Over a link the round trip is paid per
 * request, so cutting a read finer than this only makes more round
 * trips: the pool's gain is many reads in flight at once (readahead,
 * several clients), and a large read (a 4 MiB fill) cut in 1 MiB
 * pieces.  (Cut in 64 KiB pieces, a 1 MiB read took as long as whole,
 * and a stream's 4 prefetches took four round trips on 8 contexts.)
 */
#define CHUNK_MIN (1024 * 1024)

/* A worker without a job this long closes its context and ends. */
#define IDLE_MS 10000

/* After a refused open, the pool stays at the contexts it has for
 * this long, doubling while opens keep failing.
 */
#define BACKOFF_MIN_MS 1000
#define BACKOFF_MAX_MS 30000

struct job {
  unsigned char *buf;
  uint32_t count;
  uint64_t offset;
  int err;                      /* 0, an errno, or -1: no context */
  bool done;
  pthread_cond_t *wake;         /* its caller's: a job done, or the
                                 * last worker gone */
  struct job *next;
};

struct pool {
  struct pool *next;            /* in the process's list */
  char *exportname;
  uint64_t size;                /* the export's, when the pool was made */
  unsigned refs;                /* connections using it */
  pthread_mutex_t lock;
  pthread_cond_t work;          /* a job queued, or stopping */
  pthread_cond_t done;          /* a worker ended (pool_put) */
  struct job *head, **tail;
  unsigned max;                 /* workers at most: N, or fewer once
                                 * the upstream refused one */
  unsigned workers;             /* running */
  unsigned idle;                /* waiting for a job, not yet woken */
  unsigned wakes;               /* woken by a job's signal, not yet
                                 * returned from the wait: so that the
                                 * next caller does not count them idle
                                 * (each returning waiter takes one of
                                 * these, or else one off idle) */
  unsigned with_ctx;            /* holding an open context */
  uint64_t regrow_ms;           /* after a refusal: when max may go
                                 * back to N (fsc_mono_ms) */
  unsigned backoff_ms;          /* the next refusal's back-off */
  bool refused_said;
  bool changed_said;
  bool stopping;
};

static nbdkit_backend *backend;
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool *list;

void
pool_set_backend (nbdkit_backend *b)
{
  backend = b;
}

/* Open U for P's export.  Returns 0, or -1 with *CHANGED set if the
 * upstream now has another size (then the context is closed too).
 */
static int
open_ctx (struct pool *p, struct upstream *u, bool *changed)
{
  int64_t size;
  *changed = false;
  if (upstream_open_own (u, backend, 1, p->exportname, p->size, &size) == 0)
    return 0;
  if (size == -1)
    return -1;                  /* refused, or failed */
  *changed = true;
  pthread_mutex_lock (&p->lock);
  bool say = !p->changed_said;
  p->changed_said = true;
  pthread_mutex_unlock (&p->lock);
  if (say)
    nbdkit_error ("fscache: export \"%s\": a new connection to the "
                  "upstream reports %" PRId64 " bytes, not the %" PRIu64
                  " cached: the upstream was replaced under the cache; "
                  "withdrawing its cache object (nothing of the new "
                  "image is cached under the old one's identity), and "
                  "this connection's reads fail: reconnect",
                  p->exportname, size, p->size);
  return -1;
}

/* A refused open (P locked): the pool is as large as the contexts it
 * has, until the back-off ends.
 */
static void
refused_locked (struct pool *p)
{
  p->max = p->with_ctx;
  if (p->backoff_ms == 0)
    p->backoff_ms = BACKOFF_MIN_MS;
  p->regrow_ms = fsc_mono_ms () + p->backoff_ms;
  p->backoff_ms = MIN (p->backoff_ms * 2, BACKOFF_MAX_MS);
  if (!p->refused_said) {
    p->refused_said = true;
    say_warning ("export \"%s\": the upstream refused another connection; "
                 "the pool goes on with %u for now "
                 "(fscache-upstream-connections=%u), and tries again later",
                 p->exportname, p->with_ctx, pool_size ());
  }
}

/* Read J on U, whose context is open (*HAVE), else opened first; a
 * failed read is tried once more on a fresh context.  Returns 0, an
 * errno (ESTALE: the upstream changed), or -1 if a context could not
 * be opened (the job then goes to another worker, or back to its
 * caller).  Called without P's lock.
 */
static int
run_job (struct pool *p, struct upstream *u, bool *have, struct job *j)
{
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!*have) {
      bool changed;
      if (open_ctx (p, u, &changed) == -1) {
        if (changed)
          return ESTALE;
        pthread_mutex_lock (&p->lock);
        refused_locked (p);
        pthread_mutex_unlock (&p->lock);
        return -1;
      }
      *have = true;
      pthread_mutex_lock (&p->lock);
      p->with_ctx++;
      p->backoff_ms = 0;
      pthread_mutex_unlock (&p->lock);
    }
    int err = 0;
    if (bs_pread (u, j->buf, j->count, j->offset, 0, &err) == 0)
      return 0;
    upstream_close (u);
    *have = false;
    pthread_mutex_lock (&p->lock);
    p->with_ctx--;
    pthread_mutex_unlock (&p->lock);
    if (attempt == 1)
      return err ? err : EIO;
    nbdkit_debug ("fscache: export \"%s\": pool: a read at %" PRIu64
                  " failed (%s); trying it once more on a new connection",
                  p->exportname, j->offset, strerror (err ? err : EIO));
  }
  return EIO;
}

static void *
worker (void *arg)
{
  struct pool *p = arg;
  fsc_thread_name ("fsc-pool");
  struct upstream u;
  bool have = false;

  pthread_mutex_lock (&p->lock);
  for (;;) {
    while (p->head == NULL && !p->stopping) {
      struct timespec ts;
      deadline_ms (&ts, IDLE_MS);
      p->idle++;
      int r = pthread_cond_timedwait (&p->work, &p->lock, &ts);
      if (p->wakes > 0)
        p->wakes--;
      else
        p->idle--;
      if (r == ETIMEDOUT && p->head == NULL)
        goto out;
    }
    if (p->head == NULL)        /* stopping */
      goto out;
    struct job *j = p->head;
    p->head = j->next;
    if (p->head == NULL)
      p->tail = &p->head;

    pthread_mutex_unlock (&p->lock);
    int r = run_job (p, &u, &have, j);
    pthread_mutex_lock (&p->lock);
    if (r == -1 && p->with_ctx > 0) {
      /* Refused, and others have contexts: the job goes back for
       * them, and this worker ends (the pool is smaller now).
       */
      j->next = p->head;
      p->head = j;
      if (j->next == NULL)
        p->tail = &j->next;
      pthread_cond_signal (&p->work);
      goto out;
    }
    /* -1 with no context anywhere: the caller reads on its own. */
    j->err = r;
    j->done = true;
    pthread_cond_signal (j->wake);
    if (r == -1)
      goto out;
  }
 out:
  if (have)
    p->with_ctx--;
  /* The context is closed while this worker still counts: pool_put
   * waits for the count, and once it is 0 nothing may run here any
   * more.  Closed after the count, as first written, the last
   * connection's close went on (and at exit nbdkit unloaded this
   * filter and the plugin) while a worker was still closing its
   * context: nbdkit died of SIGSEGV at exit, in code no longer
   * mapped (cores of test-fscache-crash.sh's read-back proxies).
   * Unlocked: no lock is held across an upstream call.
   */
  if (have) {
    pthread_mutex_unlock (&p->lock);
    upstream_close (&u);
    pthread_mutex_lock (&p->lock);
  }
  p->workers--;
  /* The last worker gone with jobs queued (refused, or none could
   * start): their callers take them back (pool_pread).
   */
  if (p->workers == 0)
    for (struct job *q = p->head; q; q = q->next)
      pthread_cond_signal (q->wake);
  pthread_cond_broadcast (&p->done);
  pthread_mutex_unlock (&p->lock);
  return NULL;
}

/* The pool's size: fscache-upstream-connections if given, else what
 * the measurements say for the plugin (docs/benchmarks.md): 16 over
 * curl (sequential cold reads at 10 ms: 749 MiB/s against 589 with 8,
 * stop 39; at 50 ms 1.63x against 0.89x of the link, stop 41), 8
 * otherwise (over ssh 16 gained nothing, and 8 stays under OpenSSH's
 * default MaxStartups of 10).
 */
unsigned
pool_size (void)
{
  if (params.upstream_connections_given)
    return params.upstream_connections;
  return strcmp (ownctx_plugin_name (), "curl") == 0 ? 16
    : params.upstream_connections;
}

bool
pool_wanted (struct upstream *u)
{
  if (params.upstream_connections == 0)
    return false;
  return upstream_serial_requests () ||
    (params.upstream_connections_given && upstream_parallel (u));
}

struct pool *
pool_get (const char *exportname, uint64_t size)
{
  SCOPED_LOCK (&list_lock);
  for (struct pool *p = list; p; p = p->next)
    if (strcmp (p->exportname, exportname) == 0 && p->size == size) {
      p->refs++;
      return p;
    }
  struct pool *p = calloc (1, sizeof *p);
  if (p == NULL || (p->exportname = strdup (exportname)) == NULL) {
    free (p);
    return NULL;
  }
  p->refs = 1;
  p->size = size;
  p->max = pool_size ();
  p->tail = &p->head;
  pthread_mutex_init (&p->lock, NULL);
  pthread_cond_init (&p->work, NULL);
  pthread_cond_init (&p->done, NULL);
  p->next = list;
  list = p;
  return p;
}

void
pool_put (struct pool *p)
{
  if (p == NULL)
    return;
  pthread_mutex_lock (&list_lock);
  if (--p->refs > 0) {
    pthread_mutex_unlock (&list_lock);
    return;
  }
  for (struct pool **pp = &list; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  pthread_mutex_unlock (&list_lock);

  /* No connection uses it: no job can be queued any more. */
  pthread_mutex_lock (&p->lock);
  p->stopping = true;
  pthread_cond_broadcast (&p->work);
  while (p->workers > 0)
    pthread_cond_wait (&p->done, &p->lock);
  pthread_mutex_unlock (&p->lock);
  pthread_mutex_destroy (&p->lock);
  pthread_cond_destroy (&p->work);
  pthread_cond_destroy (&p->done);
  free (p->exportname);
  free (p);
}

int
pool_pread (struct pool *p, struct upstream *own, void *buf, uint32_t count,
            uint64_t offset, int *err)
{
  if (p == NULL)
    return bs_pread (own, buf, count, offset, 0, err);

  /* The size, once (a worker lowers it at any time), grown back to N
   * once a refusal's back-off is over.
   */
  pthread_mutex_lock (&p->lock);
  if (p->max < params.upstream_connections && fsc_mono_ms () >= p->regrow_ms)
    p->max = pool_size ();
  unsigned max = p->max;
  pthread_mutex_unlock (&p->lock);
  if (max == 0)
    return bs_pread (own, buf, count, offset, 0, err);

  /* The chunks: as many as the pool has workers, none under CHUNK_MIN,
   * cut at multiples of it.
   */
  unsigned n = DIV_ROUND_UP (count, CHUNK_MIN);
  if (n > max)
    n = max;
  uint32_t per = ROUND_UP (DIV_ROUND_UP (count, n), (uint32_t) CHUNK_MIN);
  n = DIV_ROUND_UP (count, per);
  struct job small[16];
  struct job *jobs = n <= 16 ? small : calloc (n, sizeof *jobs);
  if (jobs == NULL) {
    *err = ENOMEM;
    return -1;
  }
  /* Our own condition, signalled for our jobs only: with one for the
   * whole pool, every chunk done woke every caller waiting (up to 16
   * readahead threads and the clients' misses), to find theirs not
   * done and sleep again.
   */
  pthread_cond_t wake;
  pthread_cond_init (&wake, NULL);
  for (unsigned i = 0; i < n; ++i) {
    uint32_t off = i * per;
    jobs[i] = (struct job) {
      .buf = (unsigned char *) buf + off, .offset = offset + off,
      .count = MIN (per, count - off), .wake = &wake,
    };
  }

  pthread_mutex_lock (&p->lock);
  for (unsigned i = 0; i < n; ++i) {
    *p->tail = &jobs[i];
    p->tail = &jobs[i].next;
  }
  /* Workers for what the idle ones cannot take, up to the size. */
  unsigned want = n > p->idle ? n - p->idle : 0;
  while (want > 0 && p->workers < p->max) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init (&attr);
    pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create (&t, &attr, worker, p);
    pthread_attr_destroy (&attr);
    if (e)
      break;
    p->workers++;
    want--;
  }
  /* One idle worker per job, not all of them. */
  unsigned k = MIN (n, p->idle);
  p->idle -= k;
  p->wakes += k;
  for (unsigned i = 0; i < k; ++i)
    pthread_cond_signal (&p->work);
  for (;;) {
    bool all = true;
    for (unsigned i = 0; i < n; ++i)
      all &= jobs[i].done;
    if (all)
      break;
    /* No worker left to run what is queued (all refused, or none could
     * start): take the queued ones back.
     */
    if (p->workers == 0) {
      struct job **jp = &p->head;
      while (*jp) {
        if (*jp >= jobs && *jp < jobs + n) {
          (*jp)->err = -1;
          (*jp)->done = true;
          *jp = (*jp)->next;
        }
        else
          jp = &(*jp)->next;
      }
      p->tail = &p->head;
      while (*p->tail)
        p->tail = &(*p->tail)->next;
      continue;
    }
    pthread_cond_wait (&wake, &p->lock);
  }
  pthread_mutex_unlock (&p->lock);
  pthread_cond_destroy (&wake);

  int r = 0;
  for (unsigned i = 0; i < n && r == 0; ++i) {
    if (jobs[i].err == -1)      /* no context in the pool: our own */
      r = bs_pread (own, jobs[i].buf, jobs[i].count, jobs[i].offset, 0, err);
    else if (jobs[i].err) {
      *err = jobs[i].err;
      r = -1;
    }
  }
  if (jobs != small)
    free (jobs);
  return r;
}
