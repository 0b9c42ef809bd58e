/* libfscache, host sharing: the owner (share-int.h has the overview).
 *
 * The process that holds the object listens on its socket and serves
 * each joiner's socket with a thread of its own, running the joiner's
 * requests with the same code as its own clients' (serve).
 *
 * Misses of a joiner are fetched by the joiner, from its own upstream
 * (it may be the only one with a connection that allows it): the owner
 * claims the blocks, sends FETCH on the joiner's socket, the joiner
 * reads upstream and sends the bytes back, and the owner stores them
 * and releases the claim.  So a claim is never held by a process that
 * could die without the owner noticing: if the joiner dies, its socket
 * closes, the fetch fails, and the claim is released as any failed
 * fetch's.  A joiner that does not answer in time loses its link the
 * same way (fetch_from_joiner).
 *
 * Mismatched settings: a joiner is checked as an opener would be
 * (check_sb's reasons): another block size or validation mode is
 * refused (the process that asks gets an error, instead of discarding
 * the copy under the others); another size, generation or coherency
 * fingerprint (a different upstream) is served uncached.
 *
 * Every new owner bumps the object's epoch before it serves anything
 * (fsc_share_start), so that no map of an earlier owner serves a hit.
 */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "share-int.h"
#include "utils.h"

/* The reason to refuse joiner H (check_sb's, in its order), or FSC_OK. */
static int
check_joiner (struct fsc_object *o, const struct hello *h, const void *key,
              const char *gen)
{
  if (h->key_len != o->key_len || memcmp (key, o->key, o->key_len) != 0)
    return FSC_REJ_KEY;
  if (h->block_size != o->geom.block_size)
    return FSC_REJ_BLOCK_SIZE;
  if (h->size != o->geom.size)
    return FSC_REJ_UPSTREAM_SIZE;
  SCOPED_LOCK (&o->lock);
  if (h->gen_len != o->sb.gen_len ||
      memcmp (gen, o->sb.generation, h->gen_len) != 0)
    return FSC_REJ_GENERATION;
  if (h->validate != (int) o->sb.validate)
    return FSC_REJ_VALIDATE;
  /* After writes through the owner its recorded sample is old, and the
   * joiner's (taken since) rightly differs.
   */
  if (h->validate == FSC_VALIDATE_SAMPLE && !o->written &&
      h->fingerprint != o->sb.fingerprint)
    return FSC_REJ_FINGERPRINT;
  if (o->state != FSC_OBJ_AVAILABLE)
    return FSC_REJ_FOREIGN;
  return FSC_OK;
}

/* How long a joiner's fetch of COUNT bytes may take: a latency and a
 * time per MiB, each the floor or a few times the slowest that the
 * joiners' recent fetches took (their upstreams' observed latency and
 * throughput), whichever is longer.
 */
static uint64_t
fetch_deadline (struct share_server *srv, uint32_t count)
{
  SCOPED_LOCK (&srv->lock);
  uint64_t lat = MAX ((uint64_t) FETCH_FLOOR_MS,
                      FETCH_SLOW_FACTOR * srv->slow_ms);
  uint64_t per_mib = MAX ((uint64_t) FETCH_FLOOR_MS_PER_MIB,
                          FETCH_SLOW_FACTOR * srv->slow_ms_per_mib);
  return fsc_mono_ms () + lat + per_mib * count / (1024 * 1024);
}

/* A fetch of COUNT bytes took MS (the maxima decay by 1/8 a fetch), or
 * timed out (MS = UINT64_MAX: both double, up to a cap, so that an
 * upstream slower than the floors is soon given the time it needs).
 */
static void
note_fetch_time (struct share_server *srv, uint32_t count, uint64_t ms)
{
  SCOPED_LOCK (&srv->lock);
  if (ms == UINT64_MAX) {
    srv->slow_ms = MIN (MAX (2 * srv->slow_ms, (uint64_t) FETCH_FLOOR_MS),
                        (uint64_t) FETCH_SLOW_CAP_MS);
    srv->slow_ms_per_mib =
      MIN (MAX (2 * srv->slow_ms_per_mib, (uint64_t) FETCH_FLOOR_MS_PER_MIB),
           (uint64_t) FETCH_SLOW_CAP_MS);
    return;
  }
  if (count <= 1024 * 1024)
    srv->slow_ms = MAX (ms, srv->slow_ms - srv->slow_ms / 8);
  else
    srv->slow_ms_per_mib = MAX (ms * 1024 * 1024 / count,
                                srv->slow_ms_per_mib -
                                srv->slow_ms_per_mib / 8);
}

struct joiner_link {
  struct fsc_object *o;
  int fd;
};

/* A joiner's misses: FETCH on its socket, the bytes back.  The blocks
 * are claimed meanwhile, and every reader of them waits for us: a
 * joiner that does not answer by the deadline (stopped, frozen, its
 * upstream hung, or hostile) loses the link, so the fetch fails, the
 * claim is released as any failed fetch's, and each waiter fetches the
 * block itself.  What the joiner sends later finds the socket shut.
 */
static int
fetch_from_joiner (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  struct joiner_link *jl = opaque;
  struct share_server *srv = jl->o->share;
  const uint64_t t0 = fsc_mono_ms (), deadline = fetch_deadline (srv, count);
  struct msg m;
  if (sh_send_msg (jl->fd, MSG_FETCH, 0, count, 0, offset, NULL, 0) == -1 ||
      sh_recv_msg_until (jl->fd, &m, deadline) == -1)
    goto broken;
  if (m.type != MSG_FETCHED) {
    errno = EPROTO;
    goto broken;
  }
  if (m.err) {
    errno = m.err;
    return -1;
  }
  if (m.count != count) {
    errno = EPROTO;
    goto broken;
  }
  if (sh_recv_all_until (jl->fd, buf, count, deadline) == -1)
    goto broken;
  note_fetch_time (srv, count, fsc_mono_ms () - t0);
  return 0;
 broken:;
  int e = errno;
  if (e == ETIMEDOUT) {
    FSC_STAT_ADD (&jl->o->cache->stats, share_timeouts, 1);
    note_fetch_time (srv, count, UINT64_MAX);
  }
  shutdown (jl->fd, SHUT_RDWR);         /* serve's next call fails */
  errno = e;
  return -1;
}

/* The map of group GI into M: the epochs first, then what is present
 * (so that a write dropping blocks after the epochs were read makes
 * the map stale).
 */
static int
take_map (struct fsc_object *o, uint64_t gi, struct gmap *m)
{
  struct share_server *srv = o->share;
  memset (m, 0, sizeof *m);
  m->gi = gi;
  if (gi >= o->geom.ngroups || srv->ep == NULL) {
    errno = EINVAL;
    return -1;
  }
  m->epoch = __atomic_load_n (&srv->ep[0], __ATOMIC_SEQ_CST);
  m->gepoch = __atomic_load_n (&srv->ep[sh_slot_of (gi)], __ATOMIC_SEQ_CST);
  if (fsc_groups_pin (o, gi, gi) == -1)
    return -1;
  pthread_mutex_lock (&o->lock);
  const struct group *g = grp (o, gi);
  if (g && o->state == FSC_OBJ_AVAILABLE) {
    m->present = g->present & ~g->fetching;
    m->zero = g->zero & m->present;
    memcpy (m->csum, g->csum, sizeof m->csum);
    memcpy (m->pieces, g->pieces, sizeof m->pieces);
  }
  pthread_mutex_unlock (&o->lock);
  fsc_groups_unpin (o, gi, gi);
  return 0;
}

/* A joiner's hits, which it served from the files itself: they count
 * in the object's counters, and as references for the eviction policy
 * (evict.c), as the owner's own hits do.  V: requests, bytes, then N-2
 * block numbers.
 */
static void
note_refs (struct fsc_object *o, const uint64_t *v, size_t n)
{
  /* Counts a joiner could have served (it reports by MAX_REF_REQUESTS
   * at most, each hit of at most SHARE_MAX_COUNT bytes), else none.
   */
  if (v[0] <= MAX_REF_REQUESTS && v[1] >= v[0] &&
      v[1] <= v[0] * SHARE_MAX_COUNT) {
    FSC_OSTAT_ADD (o, hit_requests, v[0]);
    FSC_OSTAT_ADD (o, hit_bytes, v[1]);
  }
  pthread_mutex_lock (&o->lock);
  for (size_t i = 2; i < n; ++i) {
    uint64_t b = v[i];
    if (b >= o->geom.nblocks)
      continue;
    struct group *g = grp (o, GROUP_OF (b));    /* resident ones only */
    uint64_t bit = UINT64_C (1) << IDX_OF (b);
    if (g && (g->present & bit)) {
      g->referenced |= bit & ~g->unread;
      g->unread &= ~bit;
      g->touched = true;
    }
  }
  pthread_mutex_unlock (&o->lock);
  fsc_note_use (o);
}

/* A connection is past its hello (or gave up before): it no longer
 * counts against MAX_PENDING.  Once per connection (*DONE; conn_thread
 * counts it if admit did not).
 */
static void
hello_done (struct fsc_object *o, bool *done)
{
  struct share_server *srv = o->share;
  if (*done)
    return;
  *done = true;
  SCOPED_LOCK (&srv->lock);
  srv->npending--;
}

/* Admit one joiner's socket: who it is, its hello in time, its
 * settings, then the welcome (with our refusal's reason, if any).
 * Returns true if its requests are to be served.
 */
static bool
admit (struct fsc_object *o, int fd, bool *hello_counted)
{
  struct fsc_stats *st = &o->cache->stats;
  struct msg m;

  /* Who it is: our user or root, else refused, and said (the plugin
   * logs the notice).
   */
  uid_t uid = 0;
  if (sh_check_peer (fd, &uid) == -1) {
    FSC_STAT_ADD (st, share_peers_refused, 1);
    if (errno == EACCES) {
      struct share_server *srv = o->share;
      pthread_mutex_lock (&srv->lock);
      srv->refused_uid = uid;
      pthread_mutex_unlock (&srv->lock);
      FSC_NOTICE (o, FSC_NOTICE_PEER);
    }
    return false;
  }

  /* The hello, in time: a connection that says nothing is closed. */
  struct hello h;
  const uint64_t hello_by = fsc_mono_ms () + HELLO_MS;
  if (sh_recv_msg_until (fd, &m, hello_by) == -1 || m.type != MSG_HELLO ||
      m.count < sizeof h ||
      sh_recv_all_until (fd, &h, sizeof h, hello_by) == -1 ||
      h.version != SHARE_VERSION || h.key_len > 65536 ||
      h.gen_len > FSC_GEN_MAX || m.count != sizeof h + h.key_len + h.gen_len) {
    FSC_STAT_ADD (st, share_peers_refused, 1);
    return false;
  }
  char *kg = malloc (h.key_len + h.gen_len + 1);
  if (kg == NULL ||
      sh_recv_all_until (fd, kg, h.key_len + h.gen_len, hello_by) == -1) {
    free (kg);
    FSC_STAT_ADD (st, share_peers_refused, 1);
    return false;
  }
  kg[h.key_len + h.gen_len] = '\0';
  int reason = check_joiner (o, &h, kg, kg + h.key_len);
  free (kg);
  hello_done (o, hello_counted);
  if (reason == FSC_OK)
    sh_ensure_epochs (o);
  struct welcome wel = {
    .pid = getpid (), .block_size = o->geom.block_size,
    .validate = o->sb.validate,
    .present_blocks = fsc_object_present_blocks (o),
  };
  if (sh_send_msg (fd, MSG_WELCOME, 0, sizeof wel, reason, 0, &wel,
                   sizeof wel) == -1 || reason != FSC_OK) {
    if (reason != FSC_OK)
      FSC_STAT_ADD (st, share_refused, 1);
    return false;
  }
  return true;
}

/* An admitted joiner's socket, between its requests. */
struct session {
  struct fsc_object *o;
  int fd;
  struct joiner_link jl;
  struct fsc_upstream up;       /* fetches through the joiner: jl */
  struct fsc_write w;
  bool in_write;
  unsigned char *buf;           /* payloads, both ways */
  size_t cap;
};

/* S's buffer of at least N bytes.  False if there is no memory. */
static bool
grow (struct session *s, size_t n)
{
  if (n > s->cap) {
    unsigned char *nb = realloc (s->buf, n);
    if (nb == NULL)
      return false;
    s->buf = nb;
    s->cap = n;
  }
  return true;
}

enum { REQ_OK, REQ_REFUSE, REQ_END };

/* What a joiner may ask: ranges inside the object, reads of at most
 * nbdkit's largest request, write spans of at most its largest zero or
 * trim (the 32-bit count), and hit reports of the size the joiner
 * sends.  Anything else ends the link (REQ_REFUSE, counted as a
 * refusal; REQ_END if there is no memory for its payload).
 */
static int
check_request (struct session *s, const struct msg *m)
{
  uint64_t end;
  switch (m->type) {
  case MSG_READ:
  case MSG_PREFETCH:
  case MSG_WBEGIN:
    if ((m->type != MSG_WBEGIN && m->count > SHARE_MAX_COUNT) ||
        ADD_OVERFLOW (m->offset, (uint64_t) m->count, &end) ||
        end > s->o->geom.size)
      return REQ_REFUSE;
    break;
  case MSG_REF:
    if (m->count > (MAX_REF_BLOCKS + 2) * 8)
      return REQ_REFUSE;
    break;
  }
  switch (m->type) {
  case MSG_READ:
  case MSG_WEND:
  case MSG_REF:
    if (m->count > SHARE_MAX_COUNT)
      return REQ_REFUSE;
    if (!grow (s, m->count))
      return REQ_END;
    break;
  }
  return REQ_OK;
}

/* Run request M (checked) and send its DONE.  Returns false if the
 * link is to end.
 */
static bool
answer (struct session *s, const struct msg *m)
{
  struct fsc_object *o = s->o;
  int r = 0;
  uint32_t out = 0;
  unsigned dflags = 0;
  switch (m->type) {
  case MSG_READ: {
    uint64_t missed = 0;
    r = fsc_read_counted (o, s->buf, m->count, m->offset, &s->up, m->flags,
                          &missed);
    out = r == 0 ? m->count : 0;
    if (r == 0 && missed == 0)
      dflags = DONE_HIT;
    break;
  }
  case MSG_PREFETCH:
    r = fsc_object_prefetch (o, m->offset, m->count, &s->up, m->flags);
    break;
  case MSG_WBEGIN:
    if (s->in_write) {
      errno = EPROTO;
      return false;
    }
    r = fsc_object_write_begin_flags (o, m->offset, m->count, m->flags,
                                      &s->w);
    s->in_write = true;         /* paired with an end, even if it failed */
    break;
  case MSG_WEND:
    if (!s->in_write || ((m->flags & WEND_DATA) && m->count != s->w.count) ||
        (!(m->flags & WEND_DATA) && m->count != 0) ||
        (m->count && sh_recv_all (s->fd, s->buf, m->count) == -1))
      return false;
    fsc_object_write_end (o, &s->w, (m->flags & WEND_DATA) ? s->buf : NULL,
                          m->flags & WEND_OK);
    s->in_write = false;
    break;
  case MSG_COMMIT:
    r = fsc_object_commit (o);
    break;
  case MSG_REF:
    if (m->count < 16 || m->count % 8 ||
        sh_recv_all (s->fd, s->buf, m->count) == -1)
      return false;
    note_refs (o, (const uint64_t *) s->buf, m->count / 8);
    break;
  case MSG_MAP:
    if (!grow (s, sizeof (struct gmap)))
      return false;
    r = take_map (o, m->offset, (struct gmap *) s->buf);
    out = r == 0 ? sizeof (struct gmap) : 0;
    break;
  default:
    return false;
  }
  return sh_send_msg (s->fd, MSG_DONE, dflags, out, r == -1 ? errno : 0, 0,
                      s->buf, out) == 0;
}

/* Serve one joiner's socket until it closes, the hello is refused or
 * the link breaks.
 */
static void
serve (struct fsc_object *o, int fd, bool *hello_counted)
{
  struct fsc_stats *st = &o->cache->stats;
  if (!admit (o, fd, hello_counted))
    return;

  struct session s = { .o = o, .fd = fd, .jl = { .o = o, .fd = fd } };
  s.up = (struct fsc_upstream) { .pread = fetch_from_joiner,
                                 .opaque = &s.jl };
  struct msg m;
  while (sh_recv_msg (fd, &m) == 0) {
    FSC_STAT_ADD (st, share_served, 1);
    int c = check_request (&s, &m);
    if (c == REQ_REFUSE)
      FSC_STAT_ADD (st, share_peers_refused, 1);
    if (c != REQ_OK || !answer (&s, &m))
      break;
  }
  /* A joiner gone between the two halves of a write: its blocks stay
   * dropped, as after a failed upstream write.
   */
  if (s.in_write)
    fsc_object_write_end (o, &s.w, NULL, false);
  free (s.buf);
}

struct conn_arg {
  struct fsc_object *o;
  struct share_conn *c;
};

static void *
conn_thread (void *arg)
{
  struct conn_arg *a = arg;
  fsc_thread_name ("fsc-share-conn");
  struct fsc_object *o = a->o;
  struct share_server *srv = o->share;
  struct share_conn *c = a->c;
  free (a);

  bool hello_counted = false;
  serve (o, c->fd, &hello_counted);
  hello_done (o, &hello_counted);

  pthread_mutex_lock (&srv->lock);
  for (struct share_conn **pp = &srv->conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  close (c->fd);
  free (c);
  bool stopping = srv->stopping;
  srv->nconns--;
  pthread_cond_broadcast (&srv->cond);
  pthread_mutex_unlock (&srv->lock);
  /* Our reference kept the object open for the joiner; when the owner
   * is closing it (fsc_share_stop) that reference is the closer's.
   */
  if (!stopping)
    fsc_object_close (o);
  return NULL;
}

static void *
listener (void *arg)
{
  struct fsc_object *o = arg;
  fsc_thread_name ("fsc-share");
  struct share_server *srv = o->share;

  for (;;) {
    int fd = accept4 (srv->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd == -1) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      pthread_mutex_lock (&srv->lock);
      bool stop = srv->stopping;
      pthread_mutex_unlock (&srv->lock);
      if (stop)
        return NULL;
      /* Out of descriptors or memory: let others' requests finish. */
      poll (NULL, 0, 100);
      continue;
    }
    sh_set_send_timeout (fd);
    struct share_conn *c = calloc (1, sizeof *c);
    struct conn_arg *a = malloc (sizeof *a);
    pthread_mutex_lock (&srv->lock);
    /* At most MAX_CONNS: more are closed at once (a joiner whose
     * socket is refused serves that request uncached).
     */
    bool full = srv->nconns >= MAX_CONNS || srv->npending >= MAX_PENDING;
    bool ok = c && a && !srv->stopping && !full && fsc_object_tryref (o);
    if (!srv->stopping && full)
      FSC_STAT_ADD (&o->cache->stats, share_peers_refused, 1);
    bool reffed = ok;
    if (ok) {
      c->fd = fd;
      c->next = srv->conns;
      srv->conns = c;
      srv->nconns++;
      srv->npending++;
      a->o = o;
      a->c = c;
      pthread_t t;
      pthread_attr_t attr;
      pthread_attr_init (&attr);
      pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
      if (pthread_create (&t, &attr, conn_thread, a) != 0) {
        srv->conns = c->next;
        srv->nconns--;
        srv->npending--;
        ok = false;
      }
      pthread_attr_destroy (&attr);
    }
    pthread_mutex_unlock (&srv->lock);
    if (!ok) {
      if (reffed)
        fsc_object_close (o);
      close (fd);
      free (c);
      free (a);
    }
  }
}

int
fsc_share_start (struct fsc_object *o)
{
  struct sockaddr_un sa;
  char name[64];
  if (o->share || sh_sock_addr (o, &sa, name, sizeof name) == -1)
    return -1;
  struct share_server *srv = calloc (1, sizeof *srv);
  if (srv == NULL)
    return -1;
  srv->lfd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (srv->lfd == -1) {
    free (srv);
    return -1;
  }
  /* We hold the index's lock: a socket there is a dead owner's. */
  unlinkat (o->files.fandirfd, name, 0);
  if (bind (srv->lfd, (struct sockaddr *) &sa, sizeof sa) == -1 ||
      listen (srv->lfd, 64) == -1) {
    int e = errno;
    close (srv->lfd);
    free (srv);
    errno = e;
    return -1;
  }
  /* A new owner: every map a joiner took of an earlier owner's object
   * is stale before we serve anything (the joiners also see the
   * earlier owner's sockets end: owner_alive).  The file is left alone
   * if nobody ever joined.
   */
  srv->refused_uid = -1;
  srv->ep = sh_map_epochs (o, true, false);
  if (srv->ep)
    __atomic_add_fetch (&srv->ep[0], 1, __ATOMIC_SEQ_CST);
  pthread_mutex_init (&srv->lock, NULL);
  pthread_cond_init (&srv->cond, NULL);
  o->share = srv;
  int e = pthread_create (&srv->listener, NULL, listener, o);
  if (e != 0) {
    o->share = NULL;
    unlinkat (o->files.fandirfd, name, 0);
    if (srv->ep)
      munmap (srv->ep, EPOCH_SLOTS * sizeof (uint32_t));
    close (srv->lfd);
    pthread_mutex_destroy (&srv->lock);
    pthread_cond_destroy (&srv->cond);
    free (srv);
    errno = e;
    return -1;
  }
  return 0;
}

void
fsc_share_stop (struct fsc_object *o)
{
  struct share_server *srv = o->share;
  if (srv == NULL)
    return;
  struct sockaddr_un sa;
  char name[64];
  if (sh_sock_addr (o, &sa, name, sizeof name) == 0)
    unlinkat (o->files.fandirfd, name, 0);

  fsc_share_bump_all (o);              /* no map outlives its owner */
  pthread_mutex_lock (&srv->lock);
  srv->stopping = true;
  shutdown (srv->lfd, SHUT_RDWR);       /* wakes accept */
  for (struct share_conn *c = srv->conns; c; c = c->next)
    shutdown (c->fd, SHUT_RDWR);        /* fails their requests */
  pthread_mutex_unlock (&srv->lock);
  pthread_join (srv->listener, NULL);
  pthread_mutex_lock (&srv->lock);
  while (srv->nconns > 0)
    pthread_cond_wait (&srv->cond, &srv->lock);
  pthread_mutex_unlock (&srv->lock);
  close (srv->lfd);
  if (srv->ep)
    munmap (srv->ep, EPOCH_SLOTS * sizeof (uint32_t));
  pthread_mutex_destroy (&srv->lock);
  pthread_cond_destroy (&srv->cond);
  free (srv);
  o->share = NULL;
}

long
fsc_share_refused_uid (struct fsc_object *o)
{
  struct share_server *srv = o->share;
  if (srv == NULL)
    return -1;
  SCOPED_LOCK (&srv->lock);
  return srv->refused_uid;
}
