/* nbdkit-fscache-filter: connections to one fleet peer, as seen by one
 * export (peers.c says who owns which range and why).
 *
 * A link keeps up to LINK_MAX_CONNS libnbd handles to its peer, each
 * carrying one request at a time: libnbd's synchronous calls hold a
 * handle's lock for a whole request, so one handle per request in
 * flight is what lets several go at once.  They are opened lazily and
 * closed once idle for LINK_IDLE_MS (peer_link_reap, from peers.c's
 * reaper): a peer's connection asks upward in the range's tree, so
 * nodes hold links to each other, and links kept until the export
 * closes kept each other's exports open for good (a fleet never
 * stopped: nbdkit waits for its clients).  A caller finding all of
 * them busy waits for one, until the read's deadline.  A transport
 * failure closes the idle ones too: after a peer restarted they are
 * all dead, and the retry must dial, not take another dead one.
 *
 * Every call is bounded (invariant P3 of peers.c): the connect (in
 * libnbd's opt mode, so that the export name is ours, not the URI's)
 * and each read run asynchronously under one deadline, polled with
 * nbd_poll.  A failure is retried once on a fresh connection; a second
 * sets the link aside for BACKOFF_MIN seconds, doubling to BACKOFF_MAX
 * while it keeps failing, and a success resets it.  An error the peer
 * answers is no failure of the peer (its origin failed it): no retry,
 * no back-off (issue 41: an owner whose origin hiccuped was set aside
 * by every asker).  Failures are said
 * at most once a minute for the process, with the count since.
 *
 * Locks: each link's lock guards its idle list and counts;
 * health_lock the peers' health records (the back-off deadline is read
 * without it, atomic).  Never held across a connect or a read.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "utils.h"

#include "peerlink.h"
#include "say.h"

#define LINK_MAX_CONNS 8        /* connections to one peer, per export */
#define LINK_IDLE_MS 3000       /* an idle connection closes after */
#define BACKOFF_MIN 5           /* seconds */
#define BACKOFF_MAX 60
#define ERROR_LOG_SECONDS 60

struct peer_link {
  struct peer_link *next;       /* the owner's list */
  char *uri;
  pthread_mutex_t lock;
  pthread_cond_t freed;
  struct nbd_handle *idle[LINK_MAX_CONNS];
  int64_t idle_since[LINK_MAX_CONNS]; /* when each was given back */
  unsigned nidle, nopen;        /* under lock */
  struct health *health;        /* its peer's, shared by all exports */
  uint32_t token;               /* in its export names: tells it apart */
};

/* One health record per peer for the whole process (issue 41), shared
 * by the links of every export to it: a peer found down by one
 * export's read is set aside for all of them at once, counted and said
 * once, instead of once per export after each export's own timeouts;
 * and a peer found to be this node (a self alias) is so for all.
 * Found by URI in a list, with a count of the links using it.
 */
struct health {
  struct health *next;
  char *uri;
  unsigned refs;                /* under health_lock */
  int64_t backoff_until;        /* monotonic ms; atomic */
  unsigned backoff_s;           /* under health_lock */
  bool self;                    /* it reached this very node (atomic) */
};
static pthread_mutex_t health_lock = PTHREAD_MUTEX_INITIALIZER;
static struct health *healths;

static struct health *
health_get (const char *uri)
{
  SCOPED_LOCK (&health_lock);
  for (struct health *h = healths; h; h = h->next)
    if (strcmp (h->uri, uri) == 0) {
      h->refs++;
      return h;
    }
  struct health *h = calloc (1, sizeof *h);
  if (h == NULL || (h->uri = strdup (uri)) == NULL) {
    free (h);
    return NULL;
  }
  h->refs = 1;
  h->next = healths;
  healths = h;
  return h;
}

static void
health_put (struct health *h)
{
  SCOPED_LOCK (&health_lock);
  if (--h->refs > 0)
    return;
  for (struct health **hp = &healths; *hp; hp = &(*hp)->next)
    if (*hp == h) {
      *hp = h->next;
      break;
    }
  free (h->uri);
  free (h);
}

/* Self aliases.  Each node has a random id, which an asker puts in
 * the export name with its link's token; a node that receives its own
 * id is being asked by itself, through a member line that is this node
 * under another spelling than fscache-peer-self (another path to the
 * socket, a host name for an address).  It refuses at once and notes
 * the token, so that the asking link, in the same process, learns why
 * its dial was refused, stops asking and says so once: it used to wait
 * for its own claim on the range for the whole peer timeout, twice,
 * and with the tree a serving connection would ask itself again.
 */
static uint64_t node_id;
static uint32_t next_token;                     /* atomic */
static uint32_t self_seen[8];                   /* atomic, a ring */
static unsigned self_seen_at;                   /* atomic */

static const char *cfg_self_uri = "";    /* fscache-peer-self, for messages */

static struct {
  int timeout_ms;
  const char *psk_file, *psk_user;
  pthread_mutex_t lock;         /* err_said, err_unsaid */
  time_t err_said;
  unsigned err_unsaid;
} cfg = { .timeout_ms = 10000, .lock = PTHREAD_MUTEX_INITIALIZER };

void
peer_link_configure (int timeout_ms, const char *psk_file,
                     const char *psk_user, const char *self_uri)
{
  cfg_self_uri = self_uri;
  cfg.timeout_ms = timeout_ms;
  cfg.psk_file = psk_file;
  cfg.psk_user = psk_user;
  while (node_id == 0)
    if (getrandom (&node_id, sizeof node_id, 0) != sizeof node_id)
      node_id = ((uint64_t) getpid () << 32) ^ (uint64_t) time (NULL);
}

uint64_t
peer_node_id (void)
{
  return node_id;
}

void
peer_link_self_seen (uint32_t token)
{
  unsigned i = __atomic_fetch_add (&self_seen_at, 1, __ATOMIC_RELAXED);
  __atomic_store_n (&self_seen[i % 8], token, __ATOMIC_RELEASE);
}

static bool
was_self (uint32_t token)
{
  for (unsigned i = 0; i < 8; ++i)
    if (__atomic_load_n (&self_seen[i], __ATOMIC_ACQUIRE) == token)
      return true;
  return false;
}

int64_t
peer_now_ms (void)
{
  return (int64_t) fsc_mono_ms ();
}

struct peer_link *
peer_link_new (const char *uri, struct peer_link *next)
{
  struct peer_link *l = calloc (1, sizeof *l);
  if (l == NULL || (l->uri = strdup (uri)) == NULL ||
      (l->health = health_get (uri)) == NULL) {
    if (l)
      free (l->uri);
    free (l);
    return NULL;
  }
  pthread_mutex_init (&l->lock, NULL);
  pthread_cond_init (&l->freed, NULL);
  l->next = next;
  /* Never 0: the ring's empty slots. */
  do
    l->token = __atomic_add_fetch (&next_token, 1, __ATOMIC_RELAXED);
  while (l->token == 0);
  return l;
}

void
peer_link_free (struct peer_link *l)
{
  for (unsigned i = 0; i < l->nidle; ++i)
    nbd_close (l->idle[i]);
  pthread_mutex_destroy (&l->lock);
  pthread_cond_destroy (&l->freed);
  health_put (l->health);
  free (l->uri);
  free (l);
}

struct peer_link *
peer_link_next (const struct peer_link *l)
{
  return l->next;
}

const char *
peer_link_uri (const struct peer_link *l)
{
  return l->uri;
}

bool
peer_link_usable (struct peer_link *l, int64_t now)
{
  return !__atomic_load_n (&l->health->self, __ATOMIC_RELAXED) &&
    __atomic_load_n (&l->health->backoff_until, __ATOMIC_RELAXED) <= now;
}

/* Wait on NBD until DONE says 1 (0) or -1 (-1), or the deadline
 * (-1, ETIMEDOUT).  DONE says 0 to go on waiting.
 */
static int
wait_for (struct nbd_handle *nbd, int64_t deadline,
          int (*done) (struct nbd_handle *, int64_t), int64_t arg)
{
  for (;;) {
    int d = done (nbd, arg);
    if (d)
      return d > 0 ? 0 : -1;
    if (nbd_aio_is_dead (nbd) || nbd_aio_is_closed (nbd)) {
      errno = ECONNRESET;
      return -1;
    }
    int64_t left = deadline - peer_now_ms ();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    if (nbd_poll (nbd, left > 1000 ? 1000 : (int) left) == -1) {
      errno = nbd_get_errno () ? nbd_get_errno () : EIO;
      return -1;
    }
  }
}

static int
negotiating (struct nbd_handle *nbd, int64_t unused)
{
  return nbd_aio_is_negotiating (nbd) || nbd_aio_is_ready (nbd);
}

static int
go_done (struct nbd_handle *nbd, int64_t unused)
{
  if (nbd_aio_is_ready (nbd))
    return 1;
  if (nbd_aio_is_negotiating (nbd)) {
    errno = EACCES;             /* the peer refused the export */
    return -1;
  }
  return 0;
}

static int
read_done (struct nbd_handle *nbd, int64_t cookie)
{
  int r = nbd_aio_command_completed (nbd, cookie);
  if (r == -1)
    errno = nbd_get_errno () ? nbd_get_errno () : EIO;
  return r;
}

/* A new connection to URI for the export EXPORT_NAME, ready, or NULL
 * with errno.
 */
static struct nbd_handle *
dial (const char *export_name, const char *uri)
{
  int64_t deadline = peer_now_ms () + cfg.timeout_ms;
  struct nbd_handle *nbd = nbd_create ();
  if (nbd == NULL) {
    errno = nbd_get_errno () ? nbd_get_errno () : ENOMEM;
    return NULL;
  }
  if (nbd_set_opt_mode (nbd, true) == -1 ||
      (cfg.psk_file &&
       (nbd_set_tls (nbd, LIBNBD_TLS_REQUIRE) == -1 ||
        nbd_set_tls_psk_file (nbd, cfg.psk_file) == -1 ||
        nbd_set_tls_username (nbd, cfg.psk_user) == -1)) ||
      nbd_aio_connect_uri (nbd, uri) == -1 ||
      wait_for (nbd, deadline, negotiating, 0) == -1)
    goto fail;
  if (nbd_aio_is_negotiating (nbd) &&
      (nbd_set_export_name (nbd, export_name) == -1 ||
       nbd_aio_opt_go (nbd, NBD_NULL_COMPLETION) == -1 ||
       wait_for (nbd, deadline, go_done, 0) == -1))
    goto fail;
  if (cfg.psk_file && nbd_get_tls_negotiated (nbd) != 1) {
    errno = EPROTO;
    goto fail;
  }
  return nbd;
 fail:;
  int e = errno ? errno : EIO;
  nbdkit_debug ("fscache: peer %s: %s", uri, nbd_get_error ()
                ? nbd_get_error () : strerror (e));
  nbd_close (nbd);
  errno = e;
  return NULL;
}

/* A connection of L: an idle one, or a new one if fewer than
 * LINK_MAX_CONNS are open, else wait for one to come back, until
 * DEADLINE (NULL, ETIMEDOUT).
 */
static struct nbd_handle *
link_take (struct peer_link *l, const char *ident, const char *exportname,
           const char *dial_uri, int64_t deadline)
{
  pthread_mutex_lock (&l->lock);
  while (l->nidle == 0 && l->nopen >= LINK_MAX_CONNS) {
    struct timespec ts;
    int64_t left = deadline - peer_now_ms ();
    if (left <= 0) {
      pthread_mutex_unlock (&l->lock);
      errno = ETIMEDOUT;
      return NULL;
    }
    deadline_ms (&ts, left);
    pthread_cond_timedwait (&l->freed, &l->lock, &ts);
  }
  if (l->nidle) {
    struct nbd_handle *nbd = l->idle[--l->nidle];
    pthread_mutex_unlock (&l->lock);
    return nbd;
  }
  l->nopen++;
  pthread_mutex_unlock (&l->lock);
  char *name = NULL;
  struct nbd_handle *nbd = NULL;
  if (asprintf (&name, "%s:%016" PRIx64 "%08" PRIx32 ":%s", ident, node_id,
                l->token, exportname) == -1)
    errno = ENOMEM;
  else
    nbd = dial (name, dial_uri);
  int e = errno;
  free (name);
  if (nbd == NULL) {
    pthread_mutex_lock (&l->lock);
    l->nopen--;
    pthread_cond_signal (&l->freed);
    pthread_mutex_unlock (&l->lock);
    errno = e;
  }
  return nbd;
}

/* Give NBD back to L: idle if GOOD, else closed, with every idle one
 * (a transport failure: they are likely dead too).
 */
static void
link_give (struct peer_link *l, struct nbd_handle *nbd, bool good)
{
  struct nbd_handle *dead[LINK_MAX_CONNS];
  unsigned ndead = 0;
  pthread_mutex_lock (&l->lock);
  if (good) {
    l->idle_since[l->nidle] = peer_now_ms ();
    l->idle[l->nidle++] = nbd;
  }
  else {
    l->nopen--;
    while (l->nidle) {
      dead[ndead++] = l->idle[--l->nidle];
      l->nopen--;
    }
  }
  pthread_cond_broadcast (&l->freed);
  pthread_mutex_unlock (&l->lock);
  if (!good)
    nbd_close (nbd);
  for (unsigned i = 0; i < ndead; ++i)
    nbd_close (dead[i]);
}

/* Close NBD, one of L's, leaving L's idle ones alone (a busy answer:
 * the connection is good, the peer wants it gone).
 */
static void
link_give_closed (struct peer_link *l, struct nbd_handle *nbd)
{
  pthread_mutex_lock (&l->lock);
  l->nopen--;
  pthread_cond_broadcast (&l->freed);
  pthread_mutex_unlock (&l->lock);
  nbd_close (nbd);
}

void
peer_link_reap (struct peer_link *l, int64_t now)
{
  struct nbd_handle *old[LINK_MAX_CONNS];
  unsigned nold = 0, keep = 0;
  pthread_mutex_lock (&l->lock);
  for (unsigned i = 0; i < l->nidle; ++i) {
    if (now - l->idle_since[i] >= LINK_IDLE_MS)
      old[nold++] = l->idle[i];
    else {
      l->idle[keep] = l->idle[i];
      l->idle_since[keep++] = l->idle_since[i];
    }
  }
  l->nidle = keep;
  l->nopen -= nold;
  if (nold)
    pthread_cond_broadcast (&l->freed);
  pthread_mutex_unlock (&l->lock);
  for (unsigned i = 0; i < nold; ++i)
    nbd_close (old[i]);
}

/* Say a peer failure: at once the first time, then at most once a
 * minute, with the count since.
 */
static void
say_error (const char *uri, int err, unsigned backoff_s)
{
  time_t now = time (NULL);
  pthread_mutex_lock (&cfg.lock);
  if (cfg.err_said && now - cfg.err_said < ERROR_LOG_SECONDS) {
    cfg.err_unsaid++;
    pthread_mutex_unlock (&cfg.lock);
    return;
  }
  unsigned unsaid = cfg.err_unsaid;
  cfg.err_unsaid = 0;
  cfg.err_said = now;
  pthread_mutex_unlock (&cfg.lock);
  char more[80] = "";
  if (unsaid)
    snprintf (more, sizeof more, " (and %u more peer errors since the last "
              "message)", unsaid);
  nbdkit_error ("fscache: peer %s: %s; its ranges go to the next owner or "
                "the origin for %u s%s", uri, strerror (err), backoff_s, more);
}

int
peer_link_pread (struct peer_link *l, const char *ident,
                 const char *exportname, const char *dial_uri,
                 struct fsc_object *obj, void *buf, uint32_t count,
                 uint64_t offset)
{
  int err = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int64_t deadline = peer_now_ms () + cfg.timeout_ms;
    struct nbd_handle *nbd = link_take (l, ident, exportname, dial_uri,
                                        deadline);
    if (nbd == NULL && was_self (l->token)) {
      if (!__atomic_test_and_set (&l->health->self, __ATOMIC_RELAXED))
        say_warning ("fscache-peers: %s is this node itself (its own node "
                     "id came back): fscache-peers lists it under another "
                     "spelling than fscache-peer-self=%s; not asking it",
                     l->uri, cfg_self_uri);
      errno = EACCES;
      return -1;
    }
    if (nbd) {
      int64_t cookie = nbd_aio_pread (nbd, buf, count, offset,
                                      NBD_NULL_COMPLETION, 0);
      if (cookie != -1 && wait_for (nbd, deadline, read_done, cookie) == 0) {
        link_give (l, nbd, true);
        fsc_object_count_peer (obj, FSC_PEER_READS, 1);
        fsc_object_count_peer (obj, FSC_PEER_READ_BYTES, count);
        pthread_mutex_lock (&health_lock);
        l->health->backoff_s = 0;
        pthread_mutex_unlock (&health_lock);
        return 0;
      }
      if (cookie == -1)
        errno = nbd_get_errno () ? nbd_get_errno () : EIO;
      err = errno;
      if (cookie != -1 && err == ESHUTDOWN && !nbd_aio_is_dead (nbd) &&
          !nbd_aio_is_closed (nbd)) {
        /* Busy (fscache-peer-max-inbound at the peer): this range goes
         * to a member above or the origin; the connection is closed so
         * that it frees the peer's slot; no back-off.
         */
        link_give_closed (l, nbd);
        fsc_object_count_peer (obj, FSC_PEER_BUSY, 1);
        errno = ESHUTDOWN;
        return -1;
      }
      if (cookie != -1 && err != ETIMEDOUT && !nbd_aio_is_dead (nbd) &&
          !nbd_aio_is_closed (nbd)) {
        /* The peer answered, with an error: its own origin failed it
         * (or its cache).  The peer is alive and the connection good:
         * no retry, no back-off; the range goes on up the tree or to
         * our origin (peers.c).
         */
        link_give (l, nbd, true);
        fsc_object_count_peer (obj, FSC_PEER_ERRORS, 1);
        nbdkit_debug ("fscache: peer %s answered a read at %" PRIu64
                      " with an error: %s", l->uri, offset, strerror (err));
        errno = err;
        return -1;
      }
      link_give (l, nbd, false);
    }
    else
      err = errno;
    fsc_object_count_peer (obj, FSC_PEER_ERRORS, 1);
  }
  /* Set aside, for every export: once, by the first of the reads that
   * found it down (the others, in flight meanwhile, find it set aside
   * already and count nothing more).
   */
  struct health *h = l->health;
  int64_t now = peer_now_ms ();
  pthread_mutex_lock (&health_lock);
  bool already = __atomic_load_n (&h->backoff_until, __ATOMIC_RELAXED) > now;
  unsigned s = h->backoff_s;
  if (!already) {
    s = h->backoff_s = h->backoff_s ? MIN (2 * h->backoff_s, BACKOFF_MAX)
      : BACKOFF_MIN;
    __atomic_store_n (&h->backoff_until, now + 1000 * (int64_t) s,
                      __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock (&health_lock);
  if (!already) {
    fsc_object_count_peer (obj, FSC_PEER_BACKOFFS, 1);
    say_error (l->uri, err ? err : EIO, s);
  }
  return -1;
}

