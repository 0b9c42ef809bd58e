/* libfscache, host sharing: a joiner's link to its owner (share-int.h
 * has the overview).
 *
 * A joiner keeps a pool of sockets to its owner, one per request in
 * flight (at most JOIN_MAX_CONNS), and one more that carries no
 * request, the watch: it ends when the owner does.  Hits served from
 * the owner's maps are served only while that owner is alive, which
 * the watch tells (sh_owner_alive_locked): a new owner's writes would
 * otherwise go unseen by a joiner that never used its socket since.
 *
 * If the owner dies (kill -9) or closes, a joiner's request in flight
 * fails on the socket; the joiner then serves it uncached from its own
 * upstream (never wrong data: the upstream is the truth), and tries to
 * take the object over (sh_get_conn): it opens the object itself
 * (flock, and the crash recovery of an unclean index), and from then
 * on its shell forwards to that local object, which serves the others
 * in turn.  A joiner that loses the race joins the winner.
 *
 * One request runs on one socket (sh_run): the joiner answers the
 * owner's FETCHes of its misses from its own upstream until the owner
 * says DONE, and waits for each message at most REPLY_MS.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "share-int.h"
#include "utils.h"

/* The owner went away (a request's link broke, or the watch ended):
 * every socket to it is dropped, and so is every map it gave us.
 * Called with j->lock held.
 */
static void
owner_gone_locked (struct fsc_join *j)
{
  for (size_t i = 0; i < j->nidle; ++i)
    close (j->idle[i]);
  j->nidle = 0;
  if (j->watch >= 0)
    close (j->watch);
  j->watch = -1;
  pthread_cond_broadcast (&j->freed);
  if (j->maps)
    for (size_t i = 0; i < NMAPS; ++i)
      j->maps[i].gi = UINT64_MAX;
  j->broken = true;
  j->retry_at = 0;
}

/* Is the owner that gave us our maps still there?  Its watch socket
 * carries no request, so anything on it (the end of the stream, an
 * error, or bytes it should never send) means it is gone, and a map
 * of it must not serve a hit: a new owner may have acknowledged a
 * write since, which only its own epochs (or none, if it never mapped
 * the file) record.  A poll that does not wait, so under j->lock (the
 * descriptor cannot be closed and reused under it).
 */
bool
sh_owner_alive_locked (struct fsc_join *j)
{
  if (j->watch < 0)
    return false;
  struct pollfd pfd = { .fd = j->watch, .events = POLLIN | POLLRDHUP };
  int r;
  do
    r = poll (&pfd, 1, 0);
  while (r == -1 && errno == EINTR);
  if (r == 0)
    return true;
  owner_gone_locked (j);
  return false;
}

/* Connect to the owner and say hello.  Returns the socket, or -1 with
 * errno: EPERM if refused (*REASON, *WEL say why), else the link's.
 */
int
sh_join_connect (struct fsc_object *o, const struct fsc_object_params *p,
                 int *reason, struct welcome *wel)
{
  struct sockaddr_un sa;
  char name[64];
  *reason = FSC_OK;
  if (sh_sock_addr (o, &sa, name, sizeof name) == -1)
    return -1;
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  const char *gen = p->generation ? p->generation : "";
  struct hello h = {
    .version = SHARE_VERSION, .block_size = p->block_size, .size = p->size,
    .fingerprint = p->fingerprint, .validate = p->validate,
    .pid = getpid (), .key_len = p->key_len, .gen_len = strlen (gen),
  };
  struct msg m;
  uid_t uid;
  const uint64_t welcome_by = fsc_mono_ms () + HELLO_MS;
  sh_set_send_timeout (fd);
  /* An owner of another user (a socket planted in its place) could
   * feed us bytes that we would serve as the upstream's: refused.
   */
  if (connect (fd, (struct sockaddr *) &sa, sizeof sa) == -1)
    goto fail;
  if (sh_check_peer (fd, &uid) == -1) {
    if (errno == EACCES)
      FSC_STAT_ADD (&o->cache->stats, share_peers_refused, 1);
    goto fail;
  }
  if (sh_send_msg (fd, MSG_HELLO, 0, sizeof h + h.key_len + h.gen_len, 0, 0,
                   &h, sizeof h) == -1 ||
      sh_send_all (fd, p->key, p->key_len) == -1 ||
      sh_send_all (fd, gen, h.gen_len) == -1 ||
      sh_recv_msg_until (fd, &m, welcome_by) == -1)
    goto fail;
  if (m.type != MSG_WELCOME || m.count != sizeof *wel) {
    errno = EPROTO;
    goto fail;
  }
  if (sh_recv_all_until (fd, wel, sizeof *wel, welcome_by) == -1)
    goto fail;
  if (m.err != FSC_OK) {
    *reason = m.err;
    errno = EPERM;
    goto fail;
  }
  return fd;
 fail:;
  int e = errno;
  close (fd);
  errno = e;
  return -1;
}

/* The identity of the files the direct path reads (the epochs, the
 * data's first segment, the sums), into IDS; false if any is missing.
 */
bool
sh_file_ids (struct fsc_object *o, dev_t ids[6])
{
  static const char *const sfx[3] = { ".epochs", ".data", ".sums" };
  for (int i = 0; i < 3; ++i) {
    char name[FILE_NAME_MAX];
    struct stat st;
    if (fstatat (o->files.fandirfd, fsc_file_name (&o->files, sfx[i], name),
                 &st,
                 AT_SYMLINK_NOFOLLOW) == -1)
      return false;
    ids[2 * i] = st.st_dev;
    ids[2 * i + 1] = st.st_ino;
  }
  return true;
}

/* A socket for one request: an idle one, or a new one.  Returns -1 if
 * there is no owner to talk to; then *LOCAL may be the object we just
 * took over.
 */
int
sh_get_conn (struct fsc_object *o, struct fsc_object **local)
{
  struct fsc_join *j = o->join;
  *local = NULL;
  pthread_mutex_lock (&j->lock);
  /* At most JOIN_MAX_CONNS requests in flight to the owner, which
   * serves a bounded number of sockets (MAX_CONNS) for every joiner.
   */
  while (j->nidle == 0 && j->nbusy >= JOIN_MAX_CONNS && !j->local &&
         !j->broken)
    pthread_cond_wait (&j->freed, &j->lock);
  if (j->local) {
    *local = j->local;
    pthread_mutex_unlock (&j->lock);
    return -1;
  }
  if (j->nidle > 0) {
    int fd = j->idle[--j->nidle];
    j->nbusy++;
    pthread_mutex_unlock (&j->lock);
    return fd;
  }
  if (j->broken && fsc_mono_ms () < j->retry_at) {
    pthread_mutex_unlock (&j->lock);
    return -1;
  }
  uint64_t deadline = fsc_mono_ms () + TAKEOVER_MS;
 again:;
  /* Connect (with the lock: one rejoin or takeover at a time). */
  struct welcome wel;
  int reason;
  int fd = sh_join_connect (o, &j->p, &reason, &wel);
  if (fd >= 0) {
    /* Joined again after the link broke: a new owner, maybe with the
     * files made anew (a cull, a discard) which we do not have open:
     * then the owner serves every read (the files we hold open stay
     * open until the shell closes, so that no read in flight uses a
     * descriptor closed under it).
     */
    dev_t ids[6];
    if (j->broken && j->ep &&
        (!sh_file_ids (o, ids) || memcmp (ids, j->ids, sizeof ids) != 0))
      j->direct_off = true;             /* files made anew: not ours */
    j->broken = false;
    if (j->watch < 0) {
      /* A new owner (or the same one after a broken link): this socket
       * watches it, and the request gets one of its own.
       */
      j->watch = fd;
      fd = sh_join_connect (o, &j->p, &reason, &wel);
    }
    if (fd >= 0) {
      j->nbusy++;
      pthread_mutex_unlock (&j->lock);
      return fd;
    }
  }
  if (errno == EPERM) {
    /* The new owner holds it with settings we cannot share (or a
     * different upstream): uncached from now on.
     */
    j->broken = true;
    j->retry_at = UINT64_MAX;
    pthread_mutex_unlock (&j->lock);
    return -1;
  }
  /* Nobody listening: take the object over, if nobody holds it. */
  struct fsc_object *l = NULL;
  struct fsc_open_info info;
  if (fsc_object_open_local (o->cache, &j->p, &l, &info) == 0) {
    j->local = l;
    *local = l;
    FSC_STAT_ADD (&o->cache->stats, share_takeovers, 1);
  }
  else if (errno == EWOULDBLOCK && fsc_mono_ms () < deadline) {
    /* Another process holds it and is not listening yet: it is
     * taking over (or starting).  Its socket comes in milliseconds;
     * the upstream would cost this request far more.
     */
    pthread_mutex_unlock (&j->lock);
    poll (NULL, 0, RETRY_MS);
    pthread_mutex_lock (&j->lock);
    if (j->local) {
      *local = j->local;
      pthread_mutex_unlock (&j->lock);
      return -1;
    }
    goto again;
  }
  else {
    /* Nobody came: uncached for a while, then requests try again. */
    j->broken = true;
    j->retry_at = fsc_mono_ms () + RETRY_AFTER_MS;
  }
  pthread_mutex_unlock (&j->lock);
  return -1;
}

void
sh_put_conn (struct fsc_object *o, int fd, bool ok)
{
  struct fsc_join *j = o->join;
  if (!ok) {
    close (fd);
    SCOPED_LOCK (&j->lock);
    j->nbusy--;
    /* The owner went away: drop the other sockets too (their next
     * request would fail the same way) and its maps.
     */
    owner_gone_locked (j);
    return;
  }
  SCOPED_LOCK (&j->lock);
  j->nbusy--;
  pthread_cond_signal (&j->freed);
  if (j->nidle == j->cap) {
    size_t ncap = j->cap ? 2 * j->cap : 4;
    int *p = realloc (j->idle, ncap * sizeof *p);
    if (p == NULL) {
      close (fd);
      return;
    }
    j->idle = p;
    j->cap = ncap;
  }
  j->idle[j->nidle++] = fd;
}

/* Run one request on FD: send it, answer the owner's FETCHes from UP,
 * then take its DONE (and a READ's data into BUF).  Returns 0 with
 * *ERR the owner's errno (0: done), or -1 if the link broke.
 */
int
sh_run (struct fsc_object *o, int fd, unsigned type, unsigned flags,
        uint64_t offset, uint32_t count, const void *payload, uint32_t plen,
        void *buf, const struct fsc_upstream *up, int *err, unsigned *dflags)
{
  struct msg m;
  unsigned char *fetched = NULL;
  size_t cap = 0;
  int r = -1;

  if (sh_send_msg (fd, type, flags, type == MSG_WEND || plen ? plen : count,
                   0, offset,
                   payload, plen) == -1)
    return -1;
  for (;;) {
    /* An owner that says nothing for REPLY_MS (stopped, or hung) is
     * taken for gone: the link breaks, and the request is served
     * without it.
     */
    const uint64_t reply_by = fsc_mono_ms () + REPLY_MS;
    if (sh_recv_msg_until (fd, &m, reply_by) == -1)
      goto out;
    if (m.type == MSG_DONE) {
      if (m.count && (buf == NULL || m.count != count ||
                      sh_recv_all_until (fd, buf, m.count, reply_by) == -1)) {
        errno = EPROTO;
        goto out;
      }
      *err = m.err;
      if (dflags)
        *dflags = m.flags;
      r = 0;
      goto out;
    }
    /* A fetch of ours, inside the export (the upstream call would
     * abort nbdkit on a range outside it).
     */
    uint64_t end;
    if (m.type != MSG_FETCH || up == NULL || m.count > SHARE_MAX_COUNT ||
        m.count == 0 || ADD_OVERFLOW (m.offset, (uint64_t) m.count, &end) ||
        end > o->geom.size) {
      errno = EPROTO;
      goto out;
    }
    if (m.count > cap) {
      unsigned char *nb = realloc (fetched, m.count);
      if (nb == NULL)
        goto out;
      fetched = nb;
      cap = m.count;
    }
    int e = 0;
    if (up->pread (up->opaque, fetched, m.count, m.offset) == -1)
      e = errno ? errno : EIO;
    if (sh_send_msg (fd, MSG_FETCHED, 0, e ? 0 : m.count, e, m.offset,
                     fetched, e ? 0 : m.count) == -1)
      goto out;
  }
 out:
  free (fetched);
  return r;
}
