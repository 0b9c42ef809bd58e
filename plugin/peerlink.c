/* nbdkit-fscache-filter: the connection to one fleet peer, as seen by
 * one export (peers.c says who owns which range and why).
 *
 * A link keeps one libnbd connection to its peer and carries every
 * read in flight over it (issue 41): it kept up to 8, one per read in
 * flight, because libnbd's synchronous calls hold the handle's lock for
 * a whole request; and a peer served 8 connections, with nbdkit's
 * threads for each, per asker and export.  (Not under an nbdkit that
 * breaks when a client hangs up with replies queued, Debian 12's: see
 * depth below; there it keeps up to 8, one read on each.)  So nobody
 * calls nbd_poll
 * here (it too holds the lock, while in poll): the reads are submitted
 * with nbd_aio_pread into a buffer of their own, and the callers
 * waiting on one connection take turns to drive it (leader and
 * followers): one polls its descriptor, beside an eventfd that a new
 * submission writes to (it may need to wait for the socket to be
 * writable), while the others wait on the link's condition; whoever
 * finishes hands the turn on.  Each read's buffer is its own (freed by
 * libnbd's .free), so that a caller whose deadline passed returns at
 * once: the late answer lands in memory nobody reads.
 *
 * A connection is dialled lazily, by one caller at a time (the others
 * wait for that dial and share its outcome: 30 readers of a stopped
 * peer used to dial it one after another), and closed once idle for
 * LINK_IDLE_MS (peer_link_reap, from peers.c's reaper): a peer's
 * connection asks upward in the range's tree, so nodes hold links to
 * each other, and links kept until the export closes kept each other's
 * exports open for good (nbdkit waits for its clients).  A connection
 * that failed (a transport error, a deadline, a "busy" answer) is
 * broken: no new read goes on it, the next one dials, and it closes
 * when its last user leaves.
 *
 * Every call is bounded (invariant P3 of peers.c): the connect (in
 * peerdial.c: libnbd's opt mode, the export name ours)
 * and each read run under one deadline.  A failure is retried once on
 * a fresh connection; a second sets the peer aside for BACKOFF_MIN
 * seconds, doubling to BACKOFF_MAX while it keeps failing, and a
 * success resets it.  An error the peer answers is no failure of the
 * peer (its origin failed it): no retry, no back-off (issue 41: an
 * owner whose origin hiccuped was set aside by every asker).  Failures
 * are said at most once a minute for the process, with the count since.
 *
 * Locks: each link's lock guards its connections, their counts and
 * flags and the reads' completion (the peers' health records are
 * peerhealth.c's).
 * Lock order: libnbd's handle lock, then the link's (the completion
 * callback takes it): no nbd_* call is made under the link's lock.
 * Neither is held across a connect, a poll or a read.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "utils.h"

#include "peerdial.h"
#include "peerhealth.h"
#include "peerlink.h"
#include "say.h"

#define LINK_MAX_CONNS 8        /* connections to one peer, per export */
#define LINK_DEPTH 64           /* reads in flight on one, at most */
#define LINK_IDLE_MS 3000       /* an idle connection closes after */
#define ERROR_LOG_SECONDS 60

struct peer_link;

/* One connection, and its users: the link while it is the link's
 * current one, and each caller reading over it.  Closed by the last to
 * let go (conn_put), never while one polls it.
 */
struct conn {
  struct peer_link *link;
  struct nbd_handle *nbd;
  int wakefd;                   /* an eventfd: "a read was submitted" */
  unsigned refs;                /* under the link's lock */
  unsigned inflight;            /* reads submitted, not yet answered */
  bool polling;                 /* a caller drives it now */
  bool broken;                  /* no new reads; see the top */
  int64_t idle_since;           /* when the last read was answered */
};

struct peer_link {
  struct peer_link *next;       /* the owner's list */
  char *uri;
  pthread_mutex_t lock;
  pthread_cond_t changed;       /* a read answered, a turn to poll
                                 * given up, a dial done */
  struct conn *conns[LINK_MAX_CONNS]; /* the ones new reads go on */
  unsigned nconns, ndialing;
  unsigned dials;               /* dials done, so that a waiter knows */
  int dial_err;                 /* the last dial's errno, or 0 */
  struct peer_health *health;   /* its peer's, shared by all exports */
  uint32_t token;               /* in its export names: tells it apart */
  bool bad;                     /* sent data that failed the manifest
                                 * (atomic) */
};

/* Self aliases.  Each node has a random id, which an asker puts in
 * the export name with its link's token; a node that receives its own
 * id is being asked by itself, through a member line that is this node
 * under another spelling than fscache-peer-self (another path to the
 * socket, a host name for an address).  It refuses at once and notes
 * the token, so that the asking link, in the same process, learns why
 * its dial was refused, stops asking and says so once: it used to wait
 * for its own claim on the range for the whole peer timeout, twice,
 * and with the tree a serving connection would ask itself again.  (The
 * tokens so refused: peerhealth.c's ring.)
 */
static uint64_t node_id;
static uint32_t next_token;                     /* atomic */

static const char *cfg_self_uri = "";    /* fscache-peer-self, for messages */

static struct {
  int timeout_ms;
  pthread_mutex_t lock;         /* err_said, err_unsaid */
  time_t err_said;
  unsigned err_unsaid;
} cfg = { .timeout_ms = 10000, .lock = PTHREAD_MUTEX_INITIALIZER };

/* Reads in flight on one connection, and connections per link: many
 * on one, unless the server this filter runs in (so, the fleet's, one
 * package) is an nbdkit that breaks when a client hangs up with two
 * replies to send: from 1.32.4 and 1.33.3 (daef505e) to 1.33.10
 * (9d82aa4f, "server: Don't assert on send if client hangs up early"),
 * Debian 12's 1.32.5 among them.  Over plain sockets it aborts in
 * raw_send_socket (seen: a killed node took its parent in the tree with
 * it, and that one its own); over TLS it did too, in nettle's
 * chacha_poly1305_encrypt, two workers sending on a session the
 * client had dropped (seen once in CI, peers-tree part 8).  An asker
 * killed with reads in flight on a connection, or giving up on a slow
 * one at its deadline, would bring down its peer: there, one read per
 * connection, up to LINK_MAX_CONNS of them, as before issue 41.  The
 * test knob NBD_FSCACHE_TEST_PEER_DEPTH=N forces N reads on one
 * connection, for the tests and benchmarks of the multiplexed links
 * in which no asker dies.
 */
static unsigned depth = 1, max_conns = LINK_MAX_CONNS;

static bool
server_aborts_on_hangup (void)
{
#define V(a, b, c) ((a) * 1000000 + (b) * 1000 + (c))
  int v = V (NBDKIT_VERSION_MAJOR, NBDKIT_VERSION_MINOR, NBDKIT_VERSION_MICRO);
  return (v >= V (1, 32, 4) && v < V (1, 33, 0)) ||
    (v >= V (1, 33, 3) && v < V (1, 33, 10));
#undef V
}

void
peer_link_configure (int timeout_ms, const char *psk_file,
                     const char *psk_user, const char *cert_dir,
                     const char *self_uri)
{
  const char *t = getenv ("NBD_FSCACHE_TEST_PEER_DEPTH");
  if (!server_aborts_on_hangup () || (t && atoi (t) > 1)) {
    depth = t && atoi (t) > 1 ? (unsigned) atoi (t) : LINK_DEPTH;
    max_conns = 1;
  }
  nbdkit_debug ("fscache: peer links: %u connection(s) per peer and export, "
                "%u read(s) in flight on each", max_conns, depth);
  cfg_self_uri = self_uri;
  cfg.timeout_ms = timeout_ms;
  peer_dial_configure (psk_file, psk_user, cert_dir);
  while (node_id == 0)
    if (getrandom (&node_id, sizeof node_id, 0) != sizeof node_id)
      node_id = ((uint64_t) getpid () << 32) ^ (uint64_t) time (NULL);
}

uint64_t
peer_node_id (void)
{
  return node_id;
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
      (l->health = peer_health_get (uri)) == NULL) {
    if (l)
      free (l->uri);
    free (l);
    return NULL;
  }
  pthread_mutex_init (&l->lock, NULL);
  pthread_cond_init (&l->changed, NULL);
  l->next = next;
  /* Never 0: the ring's empty slots. */
  do
    l->token = __atomic_add_fetch (&next_token, 1, __ATOMIC_RELAXED);
  while (l->token == 0);
  return l;
}

static void conn_close (struct conn *c);

void
peer_link_free (struct peer_link *l)
{
  /* No read is in flight: the current connection is the link's alone,
   * and the broken ones were closed by their last users.
   */
  for (unsigned i = 0; i < l->nconns; ++i)
    conn_close (l->conns[i]);
  pthread_mutex_destroy (&l->lock);
  pthread_cond_destroy (&l->changed);
  peer_health_put (l->health);
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
  return !__atomic_load_n (&l->bad, __ATOMIC_RELAXED) &&
    peer_health_usable (l->health, now);
}

bool
peer_link_mark_bad (struct peer_link *l)
{
  return !__atomic_test_and_set (&l->bad, __ATOMIC_RELAXED);
}


/* A connection of L with room for one more read, reserved, and a
 * reference the caller gives back with conn_put: the least busy open
 * one, or one this caller dials if fewer than max_conns are open or
 * being dialled, else wait for room until DEADLINE (NULL, ETIMEDOUT).
 * A caller that waited while every connection was being dialled shares
 * the dial's failure (30 readers of a stopped peer used to dial it one
 * after another).  NULL with errno if the dial failed.
 */
static struct conn *
conn_get (struct peer_link *l, const char *ident, const char *exportname,
          const char *dial_uri, int64_t deadline)
{
  pthread_mutex_lock (&l->lock);
  unsigned seen = l->dials;
  for (;;) {
    struct conn *best = NULL;
    for (unsigned i = 0; i < l->nconns; ++i) {
      struct conn *c = l->conns[i];
      if (c->inflight < depth && (best == NULL ||
                                  c->inflight < best->inflight))
        best = c;
    }
    if (best) {
      best->refs++;
      best->inflight++;
      pthread_mutex_unlock (&l->lock);
      return best;
    }
    if (l->nconns + l->ndialing < max_conns)
      break;
    if (l->dials != seen && l->dial_err && l->nconns == 0) {
      int e = l->dial_err;
      pthread_mutex_unlock (&l->lock);
      errno = e;
      return NULL;
    }
    struct timespec ts;
    int64_t left = deadline - peer_now_ms ();
    if (left <= 0) {
      pthread_mutex_unlock (&l->lock);
      errno = ETIMEDOUT;
      return NULL;
    }
    deadline_ms (&ts, left);
    pthread_cond_timedwait (&l->changed, &l->lock, &ts);
  }
  l->ndialing++;
  pthread_mutex_unlock (&l->lock);

  struct conn *c = calloc (1, sizeof *c);
  char *name = NULL;
  int e = 0;
  if (c == NULL ||
      asprintf (&name, "%s:%016" PRIx64 "%08" PRIx32 ":%s", ident, node_id,
                l->token, exportname) == -1)
    e = ENOMEM;
  else if ((c->wakefd = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK)) == -1)
    e = errno;
  else if ((c->nbd = peer_dial (name, dial_uri, deadline)) == NULL) {
    e = errno;
    close (c->wakefd);
  }
  free (name);
  if (e) {
    free (c);
    c = NULL;
  }
  else {
    c->link = l;
    c->refs = 2;                /* the link's and ours */
    c->inflight = 1;            /* ours, reserved */
    c->idle_since = peer_now_ms ();
  }
  pthread_mutex_lock (&l->lock);
  l->ndialing--;
  l->dials++;
  l->dial_err = e;
  if (c)
    l->conns[l->nconns++] = c;
  pthread_cond_broadcast (&l->changed);
  pthread_mutex_unlock (&l->lock);
  errno = e;
  return c;
}

static void
conn_close (struct conn *c)
{
  nbd_close (c->nbd);           /* frees the reads still in flight */
  close (c->wakefd);
  free (c);
}

/* Under L's lock: C takes no new reads; the link lets go of it.  True
 * if that was the last reference.
 */
static bool
conn_break_locked (struct peer_link *l, struct conn *c)
{
  if (c->broken)
    return false;
  c->broken = true;
  for (unsigned i = 0; i < l->nconns; ++i)
    if (l->conns[i] == c) {
      l->conns[i] = l->conns[--l->nconns];
      break;
    }
  return --c->refs == 0;
}

enum put { KEEP, BREAK, BREAK_IDLE };

/* Give back the caller's reference to C: broken first if BREAK; with
 * BREAK_IDLE (a transport failure), the link's idle connections too:
 * after a peer restarted they are all dead, and the retry must dial,
 * not take another dead one.
 */
static void
conn_put (struct conn *c, enum put how)
{
  struct peer_link *l = c->link;
  struct conn *old[LINK_MAX_CONNS + 1];
  unsigned nold = 0;
  pthread_mutex_lock (&l->lock);
  if (how != KEEP)
    conn_break_locked (l, c);   /* never the last: we hold one */
  if (--c->refs == 0)
    old[nold++] = c;
  if (how == BREAK_IDLE)
    for (unsigned i = l->nconns; i-- > 0; ) {
      struct conn *o = l->conns[i];
      if (o->inflight == 0 && o->refs == 1 && conn_break_locked (l, o))
        old[nold++] = o;
    }
  pthread_cond_broadcast (&l->changed);
  pthread_mutex_unlock (&l->lock);
  for (unsigned i = 0; i < nold; ++i)
    conn_close (old[i]);
}

/* One read in flight: its own buffer, so that a caller gone at its
 * deadline leaves nothing libnbd could still write to.  Two references:
 * the caller's and libnbd's (given back by .free, after the completion
 * callback or at nbd_close).
 */
struct read {
  struct conn *conn;
  unsigned refs;                /* atomic */
  bool done;                    /* under the link's lock */
  int err;
  char data[];
};

static void
read_put (void *opaque)
{
  struct read *r = opaque;
  if (__atomic_sub_fetch (&r->refs, 1, __ATOMIC_ACQ_REL) == 0)
    free (r);
}

/* libnbd's completion callback, with the handle's lock held. */
static int
read_answered (void *opaque, int *error)
{
  struct read *r = opaque;
  struct peer_link *l = r->conn->link;
  pthread_mutex_lock (&l->lock);
  r->done = true;
  r->err = *error;
  /* ENOTCONN is no server's error: libnbd aborts the reads in flight
   * with it when the connection dies.  Out of the link before the
   * reservation is given back, or another read takes the dead one and
   * fails (EINVAL), a restarted peer's second failure (peers-tree 5).
   */
  if (*error == ENOTCONN)
    conn_break_locked (l, r->conn);
  r->conn->inflight--;
  r->conn->idle_since = peer_now_ms ();
  pthread_cond_broadcast (&l->changed);
  pthread_mutex_unlock (&l->lock);
  return 1;                     /* retired */
}

/* Drive C once: poll its descriptor (in the direction libnbd wants)
 * and its wake eventfd, for at most MS; tell libnbd what is ready.  -1
 * if the connection failed.
 */
static int
conn_poll (struct conn *c, int ms)
{
  int fd = nbd_aio_get_fd (c->nbd);
  unsigned dir = nbd_aio_get_direction (c->nbd);
  if (fd == -1 || nbd_aio_is_dead (c->nbd) || nbd_aio_is_closed (c->nbd))
    return -1;
  struct pollfd fds[2] = {
    { .fd = fd, .events = ((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
                          ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0) },
    { .fd = c->wakefd, .events = POLLIN },
  };
  int n = poll (fds, 2, ms);
  if (n == -1)
    return errno == EINTR ? 0 : -1;
  if (fds[1].revents & POLLIN) {
    uint64_t v;
    if (read (c->wakefd, &v, sizeof v) == -1 && errno != EAGAIN)
      return -1;
  }
  int r = 0;
  if (fds[0].revents & (POLLIN | POLLHUP | POLLERR))
    r = (dir & LIBNBD_AIO_DIRECTION_READ) ? nbd_aio_notify_read (c->nbd)
      : (fds[0].revents & POLLOUT) ? nbd_aio_notify_write (c->nbd) : -1;
  else if (fds[0].revents & POLLOUT)
    r = nbd_aio_notify_write (c->nbd);
  else if (fds[0].revents & POLLNVAL)
    r = -1;
  if (r == -1 || nbd_aio_is_dead (c->nbd) || nbd_aio_is_closed (c->nbd))
    return -1;
  return 0;
}

/* Read [OFFSET, OFFSET + COUNT) over C into BUF by DEADLINE.  0, or -1
 * with errno: the peer's own answer (*ANSWERED set), a transport error
 * or ETIMEDOUT (the connection is then broken).
 */
static int
conn_pread (struct conn *c, void *buf, uint32_t count, uint64_t offset,
            int64_t deadline, bool *answered)
{
  struct peer_link *l = c->link;
  struct read *r = malloc (sizeof *r + count);
  if (r == NULL) {
    pthread_mutex_lock (&l->lock);
    c->inflight--;              /* conn_get's reservation */
    pthread_cond_broadcast (&l->changed);
    pthread_mutex_unlock (&l->lock);
    return -1;
  }
  *r = (struct read) { .conn = c, .refs = 2 };
  int64_t cookie =
    nbd_aio_pread (c->nbd, r->data, count, offset,
                   (nbd_completion_callback) { .callback = read_answered,
                                               .user_data = r,
                                               .free = read_put }, 0);
  if (cookie == -1) {
    int e = nbd_get_errno () ? nbd_get_errno () : EIO;
    pthread_mutex_lock (&l->lock);
    c->inflight--;
    conn_break_locked (l, c);   /* never the last: we hold one */
    pthread_mutex_unlock (&l->lock);
    read_put (r);               /* libnbd called .free already */
    errno = e;
    return -1;
  }
  /* Whoever polls now may have asked libnbd for the direction before
   * this submission, which may wait for the socket to be writable:
   * wake it, always (one syscall; checking for a poller would race).
   */
  uint64_t one = 1;
  if (write (c->wakefd, &one, sizeof one) == -1) {
    /* Full only after 2^64 - 1 wakes; the poller wakes within 1 s. */
  }

  int err = 0;
  pthread_mutex_lock (&l->lock);
  while (!r->done) {
    int64_t left = deadline - peer_now_ms ();
    if (left <= 0) {
      err = ETIMEDOUT;
      break;
    }
    if (!c->polling) {
      c->polling = true;
      pthread_mutex_unlock (&l->lock);
      int p = conn_poll (c, left > 1000 ? 1000 : (int) left);
      pthread_mutex_lock (&l->lock);
      c->polling = false;
      pthread_cond_broadcast (&l->changed);   /* the turn is free */
      if (p == -1) {
        conn_break_locked (l, c);   /* never the last: we hold one */
        if (!r->done) {
          err = nbd_get_errno () ? nbd_get_errno () : ECONNRESET;
          break;
        }
      }
    }
    else {
      struct timespec ts;
      deadline_ms (&ts, left);
      pthread_cond_timedwait (&l->changed, &l->lock, &ts);
    }
  }
  bool done = r->done;
  if (done)
    err = r->err;
  pthread_mutex_unlock (&l->lock);
  /* A dead connection answers every read in flight with an error of
   * its own: that is no answer of the peer's.
   */
  *answered = done && err != 0 &&
    !nbd_aio_is_dead (c->nbd) && !nbd_aio_is_closed (c->nbd);
  if (err == 0)
    memcpy (buf, r->data, count);
  read_put (r);
  errno = err;
  return err ? -1 : 0;
}

void
peer_link_reap (struct peer_link *l, int64_t now)
{
  struct conn *old[LINK_MAX_CONNS];
  unsigned nold = 0;
  pthread_mutex_lock (&l->lock);
  for (unsigned i = l->nconns; i-- > 0; ) {
    struct conn *c = l->conns[i];
    if (c->refs == 1 && c->inflight == 0 &&
        now - c->idle_since >= LINK_IDLE_MS && conn_break_locked (l, c))
      old[nold++] = c;
  }
  pthread_mutex_unlock (&l->lock);
  for (unsigned i = 0; i < nold; ++i)
    conn_close (old[i]);
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
    struct conn *c = conn_get (l, ident, exportname, dial_uri, deadline);
    if (c == NULL && peer_health_was_self (l->token)) {
      if (peer_health_mark_self (l->health))
        say_warning ("fscache-peers: %s is this node itself (its own node "
                     "id came back): fscache-peers lists it under another "
                     "spelling than fscache-peer-self=%s; not asking it",
                     l->uri, cfg_self_uri);
      errno = EACCES;
      return -1;
    }
    if (c == NULL)
      err = errno;
    else {
      bool answered = false;
      int r = conn_pread (c, buf, count, offset, deadline, &answered);
      err = errno;
      if (r == 0) {
        conn_put (c, KEEP);
        fsc_object_count_peer (obj, FSC_PEER_READS, 1);
        fsc_object_count_peer (obj, FSC_PEER_READ_BYTES, count);
        peer_health_ok (l->health);
        return 0;
      }
      if (answered && err == ESHUTDOWN) {
        /* Busy (fscache-peer-max-inbound at the peer): this range goes
         * to a member above or the origin; the connection is closed
         * (once its other reads are answered) so that it frees the
         * peer's slot; no back-off.
         */
        conn_put (c, BREAK);
        fsc_object_count_peer (obj, FSC_PEER_BUSY, 1);
        errno = ESHUTDOWN;
        return -1;
      }
      if (answered) {
        /* The peer answered, with an error: its own origin failed it
         * (or its cache).  The peer is alive and the connection good:
         * no retry, no back-off; the range goes on up the tree or to
         * our origin (peers.c).
         */
        conn_put (c, KEEP);
        fsc_object_count_peer (obj, FSC_PEER_ERRORS, 1);
        nbdkit_debug ("fscache: peer %s answered a read at %" PRIu64
                      " with an error: %s", l->uri, offset, strerror (err));
        errno = err;
        return -1;
      }
      /* A transport error, or the deadline (no sign of the others). */
      conn_put (c, err == ETIMEDOUT ? BREAK : BREAK_IDLE);
    }
    fsc_object_count_peer (obj, FSC_PEER_ERRORS, 1);
  }
  /* Set aside, for every export: once, by the first of the reads that
   * found it down (the others, in flight meanwhile, find it set aside
   * already and count nothing more).
   */
  unsigned s;
  if (peer_health_fail (l->health, peer_now_ms (), &s)) {
    fsc_object_count_peer (obj, FSC_PEER_BACKOFFS, 1);
    say_error (l->uri, err ? err : EIO, s);
  }
  return -1;
}

/* The prober's look (peerlink.h). */
bool
peer_link_probe (const char *uri)
{
  return peer_dial_probe (uri, peer_now_ms () + cfg.timeout_ms);
}
