/* libfscache, host sharing: the socket (share-int.h has the overview).
 *
 * The protocol (docs/format.md, "The share socket"): messages of a
 * fixed header (struct msg, native byte order: both ends run on one
 * host and are checked by the version in HELLO) and a payload of
 * header.count bytes for the types that carry data.  One request at a
 * time per socket; a joiner keeps a pool of sockets, one per request
 * in flight (share-link.c), and the owner a thread per socket
 * (share-owner.c).
 *
 * Here is what both ends do with a socket: its address, sends that a
 * peer reading nothing cannot block for ever, receives before a
 * deadline, and the check of who is at the other end.  What the
 * messages mean is the owner's and the joiner's.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "share-int.h"
#include "keyenc.h"
#include "utils.h"

/* The socket's address: its name in the fan-out directory, reached
 * through /proc so that a deep cache directory still fits sun_path.
 * The name is the key's hash: fixed length, whatever the key.
 */
static void
hash_name (const struct fsc_object *o, const char *suffix, char *name,
           size_t namelen)
{
  uint64_t lo, hi;
  fsc_key_hash (o->key, o->key_len, &lo, &hi);
  snprintf (name, namelen, "%016" PRIx64 "%016" PRIx64 "%s", lo, hi, suffix);
}

int
sh_sock_addr (const struct fsc_object *o, struct sockaddr_un *sa, char *name,
              size_t namelen)
{
  hash_name (o, ".sock", name, namelen);
  memset (sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int n = snprintf (sa->sun_path, sizeof sa->sun_path, "/proc/self/fd/%d/%s",
                    o->files.fandirfd, name);
  if (n < 0 || (size_t) n >= sizeof sa->sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

int
sh_send_all (int fd, const void *buf, size_t len)
{
  const char *p = buf;
  while (len > 0) {
    ssize_t r = send (fd, p, len, MSG_NOSIGNAL);
    if (r == -1 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    len -= r;
  }
  return 0;
}

/* Wait until FD is readable, or the monotonic time DEADLINE (ms).
 * -1 with ETIMEDOUT past it.
 */
static int
wait_readable (int fd, uint64_t deadline)
{
  for (;;) {
    uint64_t now = fsc_mono_ms ();
    if (now >= deadline) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    int r = poll (&pfd, 1, (int) MIN (deadline - now, (uint64_t) 60000));
    if (r == -1 && errno != EINTR)
      return -1;
    if (r == 1)
      return 0;
  }
}

/* sh_recv_all, before DEADLINE. */
int
sh_recv_all_until (int fd, void *buf, size_t len, uint64_t deadline)
{
  char *p = buf;
  while (len > 0) {
    if (wait_readable (fd, deadline) == -1)
      return -1;
    ssize_t r = recv (fd, p, len, MSG_DONTWAIT);
    if (r == -1 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (r == 0)
      errno = ECONNRESET;
    if (r <= 0)
      return -1;
    p += r;
    len -= r;
  }
  return 0;
}

/* sh_recv_all_until with no deadline (a link that has its own). */
int
sh_recv_all (int fd, void *buf, size_t len)
{
  return sh_recv_all_until (fd, buf, len, UINT64_MAX);
}

/* A send that a peer reading nothing cannot block for ever: past
 * SEND_MS it fails (EAGAIN), and the link with it.
 */
void
sh_set_send_timeout (int fd)
{
  struct timeval tv = { .tv_sec = SEND_MS / 1000 };
  (void) setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Who may be at the other end of a share socket: a process of our own
 * user, or root (SO_PEERCRED, the credentials at connect or listen
 * time).  Another user could otherwise feed a joiner bytes it serves
 * as ours, or hold an owner's resources.  -1 with EACCES (and the
 * peer's uid in *UID) if not.
 */
int
sh_check_peer (int fd, uid_t *uid)
{
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == -1)
    return -1;
  *uid = cr.uid;
  if (cr.uid != geteuid () && cr.uid != 0) {
    errno = EACCES;
    return -1;
  }
  return 0;
}

/* One message, header and payload in one system call where the
 * socket takes it all.
 */
int
sh_send_msg (int fd, unsigned type, unsigned flags, uint32_t count, int err,
             uint64_t offset, const void *payload, size_t plen)
{
  struct msg m = {
    .magic = SHARE_MAGIC, .type = type, .flags = flags, .count = count,
    .err = err, .offset = offset,
  };
  struct iovec iov[2] = {
    { .iov_base = &m, .iov_len = sizeof m },
    { .iov_base = (void *) payload, .iov_len = plen },
  };
  struct msghdr mh = { .msg_iov = iov, .msg_iovlen = plen ? 2 : 1 };
  ssize_t r;
  do
    r = sendmsg (fd, &mh, MSG_NOSIGNAL);
  while (r == -1 && errno == EINTR);
  if (r == -1)
    return -1;
  size_t sent = r;
  if (sent < sizeof m) {
    if (sh_send_all (fd, (char *) &m + sent, sizeof m - sent) == -1)
      return -1;
    sent = sizeof m;
  }
  return sh_send_all (fd, (const char *) payload + (sent - sizeof m),
                      plen - (sent - sizeof m));
}

int
sh_recv_msg (int fd, struct msg *m)
{
  if (sh_recv_all (fd, m, sizeof *m) == -1)
    return -1;
  if (m->magic != SHARE_MAGIC) {
    errno = EPROTO;
    return -1;
  }
  return 0;
}

/* sh_recv_msg, before DEADLINE. */
int
sh_recv_msg_until (int fd, struct msg *m, uint64_t deadline)
{
  if (sh_recv_all_until (fd, m, sizeof *m, deadline) == -1)
    return -1;
  if (m->magic != SHARE_MAGIC) {
    errno = EPROTO;
    return -1;
  }
  return 0;
}
