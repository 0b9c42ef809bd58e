/* nbdkit-fscache-filter: the fleet peers' health, for the whole
 * process (issue 41).
 *
 * One record per peer URI, shared by the links of every export to it
 * (peerlink.c): a peer found down by one export's read is set aside
 * for all of them at once, counted and said once, instead of once per
 * export after each export's own timeouts; and a peer found to be this
 * node (a self alias) is so for all.  A set-aside lasts BACKOFF_MIN
 * seconds, doubling to BACKOFF_MAX while the peer keeps failing; a
 * successful read resets it.
 *
 * A record outlives its links while it says something (set aside, or
 * this node): a peer found down by an export that then closed used to
 * be found down again by the next export's reads, each paying a
 * deadline and its retry.
 *
 * The prober.  A set-aside peer came back into use when its time was
 * up, and the first client reads to find it still down paid for that.
 * Shortly before a set-aside ends, a thread of its own dials the peer
 * (the NBD handshake, peerlink.c's peer_link_probe, under the peer
 * deadline) and, if it is still down, sets it aside again, doubling: a
 * peer down for good costs clients once.  One that answers keeps its
 * set-aside to the end: a handshake proves less than a read.  The
 * prober also frees the records kept for their set-asides alone, and
 * keeps the gauge peers_aside.
 *
 * Locks: health_lock guards the list, the references and the back-off
 * lengths; the back-off's end and the self flag are atomics, read
 * without it on every read's choice of a peer.  Never held across a
 * probe.
 */
#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "utils.h"

#include "peerhealth.h"

#define BACKOFF_MIN 5           /* seconds */
#define BACKOFF_MAX 60
#define PROBE_EVERY_MS 500
#define PROBE_AHEAD_MS 1000     /* probe this long before the end */
#define PROBE_MAX 64            /* peers probed in one round */

struct peer_health {
  struct peer_health *next;
  char *uri;
  unsigned refs;                /* under health_lock */
  int64_t backoff_until;        /* monotonic ms; atomic */
  unsigned backoff_s;           /* under health_lock */
  bool self;                    /* it reached this very node (atomic) */
};
static pthread_mutex_t health_lock = PTHREAD_MUTEX_INITIALIZER;
static struct peer_health *healths;

static bool
says_something (struct peer_health *h, int64_t now)
{
  return __atomic_load_n (&h->self, __ATOMIC_RELAXED) ||
    __atomic_load_n (&h->backoff_until, __ATOMIC_RELAXED) > now;
}

static void
unlink_locked (struct peer_health *h)
{
  for (struct peer_health **hp = &healths; *hp; hp = &(*hp)->next)
    if (*hp == h) {
      *hp = h->next;
      break;
    }
  free (h->uri);
  free (h);
}

struct peer_health *
peer_health_get (const char *uri)
{
  SCOPED_LOCK (&health_lock);
  for (struct peer_health *h = healths; h; h = h->next)
    if (strcmp (h->uri, uri) == 0) {
      h->refs++;
      return h;
    }
  struct peer_health *h = calloc (1, sizeof *h);
  if (h == NULL || (h->uri = strdup (uri)) == NULL) {
    free (h);
    return NULL;
  }
  h->refs = 1;
  h->next = healths;
  healths = h;
  return h;
}

void
peer_health_put (struct peer_health *h)
{
  SCOPED_LOCK (&health_lock);
  if (--h->refs > 0 || says_something (h, (int64_t) fsc_mono_ms ()))
    return;
  unlink_locked (h);
}

bool
peer_health_usable (struct peer_health *h, int64_t now)
{
  return !says_something (h, now);
}

bool
peer_health_mark_self (struct peer_health *h)
{
  return !__atomic_test_and_set (&h->self, __ATOMIC_RELAXED);
}

void
peer_health_ok (struct peer_health *h)
{
  SCOPED_LOCK (&health_lock);
  h->backoff_s = 0;
}

/* Under health_lock: set H aside from NOW, doubling. */
static unsigned
set_aside_locked (struct peer_health *h, int64_t now)
{
  h->backoff_s = h->backoff_s ? MIN (2 * h->backoff_s, BACKOFF_MAX)
    : BACKOFF_MIN;
  __atomic_store_n (&h->backoff_until, now + 1000 * (int64_t) h->backoff_s,
                    __ATOMIC_RELAXED);
  return h->backoff_s;
}

bool
peer_health_fail (struct peer_health *h, int64_t now, unsigned *seconds)
{
  SCOPED_LOCK (&health_lock);
  if (__atomic_load_n (&h->backoff_until, __ATOMIC_RELAXED) > now)
    return false;
  *seconds = set_aside_locked (h, now);
  return true;
}

size_t
peer_health_format (char *buf, size_t size)
{
  size_t len = 0;
  int64_t now = (int64_t) fsc_mono_ms ();
  SCOPED_LOCK (&health_lock);
  for (struct peer_health *h = healths; h; h = h->next) {
    int64_t until = __atomic_load_n (&h->backoff_until, __ATOMIC_RELAXED);
    int n = 0;
    if (h->self)
      n = snprintf (buf + MIN (len, size), size - MIN (len, size),
                    "peer_self %s\n", h->uri);
    else if (until > now)
      n = snprintf (buf + MIN (len, size), size - MIN (len, size),
                    "peer_aside %s %" PRId64 "\n", h->uri,
                    (until - now + 999) / 1000);
    if (n > 0)
      len += (size_t) n;
  }
  return len;
}

/*----------------------------------------------------------------------
 * Self aliases (peerlink.c says why): the tokens of the last dials this
 * node refused as coming from itself.
 */

static uint32_t self_seen[8];                   /* atomic, a ring */
static unsigned self_seen_at;                   /* atomic */

void
peer_health_self_seen (uint32_t token)
{
  unsigned i = __atomic_fetch_add (&self_seen_at, 1, __ATOMIC_RELAXED);
  __atomic_store_n (&self_seen[i % 8], token, __ATOMIC_RELEASE);
}

bool
peer_health_was_self (uint32_t token)
{
  for (unsigned i = 0; i < 8; ++i)
    if (__atomic_load_n (&self_seen[i], __ATOMIC_ACQUIRE) == token)
      return true;
  return false;
}

/*----------------------------------------------------------------------
 * The prober.
 */

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool running, stopping;
  pthread_t thread;
  struct fsc_cache *cache;
  bool (*probe) (const char *uri);
} prober = { .lock = PTHREAD_MUTEX_INITIALIZER,
             .cond = PTHREAD_COND_INITIALIZER };

static void
probe_round (struct fsc_cache *cache, bool (*probe) (const char *))
{
  struct peer_health *due[PROBE_MAX];
  unsigned ndue = 0, aside = 0;
  int64_t now = (int64_t) fsc_mono_ms ();
  pthread_mutex_lock (&health_lock);
  for (struct peer_health *h = healths, *next; h; h = next) {
    next = h->next;
    if (h->refs == 0 && !says_something (h, now)) {
      unlink_locked (h);        /* kept for its set-aside only */
      continue;
    }
    int64_t until = __atomic_load_n (&h->backoff_until, __ATOMIC_RELAXED);
    if (h->self || until <= now)
      continue;
    aside++;
    if (until - now <= PROBE_AHEAD_MS && ndue < PROBE_MAX) {
      h->refs++;
      due[ndue++] = h;
    }
  }
  pthread_mutex_unlock (&health_lock);
  if (cache)
    fsc_cache_set_peers_aside (cache, aside);
  for (unsigned i = 0; i < ndue; ++i) {
    struct peer_health *h = due[i];
    bool up = probe (h->uri);
    if (cache)
      fsc_cache_count_peer (cache, FSC_PEER_PROBES, 1);
    if (!up) {
      pthread_mutex_lock (&health_lock);
      /* Unless a read found it up meanwhile (a success resets). */
      if (h->backoff_s)
        set_aside_locked (h, (int64_t) fsc_mono_ms ());
      pthread_mutex_unlock (&health_lock);
      if (cache)
        fsc_cache_count_peer (cache, FSC_PEER_PROBES_FAILED, 1);
      nbdkit_debug ("fscache: peer %s still down: set aside again", h->uri);
    }
    peer_health_put (h);
  }
}

static void *
probe_loop (void *arg)
{
  fsc_thread_name ("fsc-peer-probe");
  pthread_mutex_lock (&prober.lock);
  while (!prober.stopping) {
    struct timespec ts;
    deadline_ms (&ts, PROBE_EVERY_MS);
    pthread_cond_timedwait (&prober.cond, &prober.lock, &ts);
    if (prober.stopping)
      break;
    struct fsc_cache *cache = prober.cache;
    pthread_mutex_unlock (&prober.lock);
    probe_round (cache, prober.probe);
    pthread_mutex_lock (&prober.lock);
  }
  pthread_mutex_unlock (&prober.lock);
  return NULL;
}

void
peer_health_prober_start (struct fsc_cache *cache,
                          bool (*probe) (const char *uri))
{
  pthread_mutex_lock (&prober.lock);
  prober.cache = cache;
  prober.probe = probe;
  if (!prober.running && !prober.stopping &&
      pthread_create (&prober.thread, NULL, probe_loop, NULL) == 0)
    prober.running = true;
  pthread_mutex_unlock (&prober.lock);
}

void
peer_health_prober_stop (void)
{
  pthread_mutex_lock (&prober.lock);
  bool join = prober.running;
  prober.stopping = true;
  pthread_cond_signal (&prober.cond);
  pthread_mutex_unlock (&prober.lock);
  if (join)
    pthread_join (prober.thread, NULL);
  prober.cache = NULL;
  pthread_mutex_lock (&health_lock);
  for (struct peer_health *h = healths, *next; h; h = next) {
    next = h->next;
    if (h->refs == 0)
      unlink_locked (h);
  }
  pthread_mutex_unlock (&health_lock);
}
