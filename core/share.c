/* libfscache: one object for the whole host.
 *
 * Several processes (one nbdkit per VM or per CI job) open the same
 * object: same cache directory, same key.  One of them holds it, as
 * before: it has the index's flock and the object's state in memory
 * (the owner).  The others join it: their object is a shell whose
 * misses, writes and flushes go to the owner over a Unix socket beside
 * the object's files (HASH.sock, sock_addr), and the owner serves them
 * with the same code as its own clients' requests.  Hits a joiner
 * serves itself from the shared files, checked against maps of groups
 * the owner gives it and epochs the owner bumps (direct_read).
 * So every rule of a single process holds for the host: a block
 * several processes miss at once is fetched once (the owner's claims,
 * retrieve.c), the cap and quotas hold for the object as a whole
 * (evict.c), a write through any process drops the blocks it touches
 * before it goes upstream (store.c), commits and counters are the
 * owner's.
 *
 * Why this design, of the three (docs/design.md, "One cache for the
 * whole host"): the state that makes the cache correct (present bits,
 * claims, checksums, the eviction policy, the dirty groups of the next
 * commit) lives in the owner's memory, under its locks, paged
 * (groups.c).  Putting it in shared memory would mean robust
 * cross-process locks around every structure and a second, shared
 * format for all of it; a daemon owning every object would put a
 * second process in every request even when one process is alone.
 * Here a process alone pays nothing, and a joiner pays a round trip
 * on a local socket per miss (and per map of a group).
 *
 * Misses of a joiner are fetched by the joiner, from its own upstream
 * (it may be the only one with a connection that allows it): the owner
 * claims the blocks, sends FETCH on the joiner's socket, the joiner
 * reads upstream and sends the bytes back, and the owner stores them
 * and releases the claim.  So a claim is never held by a process that
 * could die without the owner noticing: if the joiner dies, its socket
 * closes, the fetch fails, and the claim is released as any failed
 * fetch's.
 *
 * If the owner dies (kill -9) or closes, a joiner's request in flight
 * fails on the socket; the joiner then serves it uncached from its own
 * upstream (never wrong data: the upstream is the truth), and tries to
 * take the object over: it opens the object itself (flock, and the
 * crash recovery of an unclean index), and from then on its shell
 * forwards to that local object, which serves the others in turn.  A
 * joiner that loses the race joins the winner.  A write whose link
 * breaks before the owner dropped its blocks marks the copy stale
 * (NAME.stale), as a process that cannot join does: whoever holds the
 * object next discards it.
 *
 * A joiner's own hits come from maps the owner gave it; they are
 * served only while that owner is alive, which a socket carrying no
 * request tells (the watch, owner_alive_locked): a new owner's writes
 * would otherwise go unseen by a joiner that never used its socket
 * since.  Every new owner also bumps the object's epoch before it
 * serves anything.
 *
 * Trust (docs/design.md, "Trust model, deadlines and limits"): only
 * our own user or root, on either end (check_peer); every wait on a
 * peer has a deadline (the hello, sends, a joiner's fetch: the claim
 * it holds is given back, fetch_from_joiner; a joiner's wait for its
 * owner), and everything a peer can make the owner hold is bounded
 * (connections, pending hellos, message sizes, ranges).
 *
 * Mismatched settings: a joiner is checked as an opener would be
 * (check_sb's reasons): another block size or validation mode is
 * refused (the process that asks gets an error, instead of discarding
 * the copy under the others); another size, generation or coherency
 * fingerprint (a different upstream) is served uncached.
 *
 * The protocol (docs/format.md, "The share socket"): messages of a
 * fixed header (struct msg, native byte order: both ends run on one
 * host and are checked by the version in HELLO) and a payload of
 * header.count bytes for the types that carry data.  One request at a
 * time per socket; a joiner keeps a pool of sockets, one per request
 * in flight, and the owner a thread per socket.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "keyenc.h"
#include "xxh.h"
#include "utils.h"

#define SHARE_MAGIC 0x46534831u         /* "FSH1" */
#define SHARE_VERSION 1
#define SHARE_MAX_COUNT (64u << 20)     /* nbdkit's largest request */
#define RETRY_MS 10                     /* between tries to rejoin */
#define RETRY_AFTER_MS 1000             /* after a wait that failed */
#define TAKEOVER_MS 2000                /* how long a request waits for
                                         * a new owner's socket */
#define EPOCH_SLOTS 65536               /* the epochs file: slot 0 for the
                                         * object, the others for groups
                                         * (hashed) */
#define NMAPS 1024                      /* group maps a joiner keeps */
#define REF_BATCH 256                   /* block numbers a joiner sends at
                                         * a time */
#define MAP_FRESH_MS 50                 /* a map showing a block absent
                                         * is taken again after this */

/* Deadlines and limits: what a peer of the share socket can make the
 * other end wait for or hold (docs/design.md, "One cache for the whole
 * host", the trust model).
 */
#define HELLO_MS 2000                   /* a connection's hello, and the
                                         * welcome to it */
#define SEND_MS 10000                   /* a peer that reads nothing */
#define FETCH_FLOOR_MS 2000             /* a joiner's fetch: at least this
                                         * or 4 times the slowest recent
                                         * latency, ... */
#define FETCH_FLOOR_MS_PER_MIB 1000     /* ...plus per MiB at least this
                                         * (1 MiB/s) or 4 times the
                                         * slowest recent time per MiB */
#define FETCH_SLOW_FACTOR 4
#define FETCH_SLOW_CAP_MS 60000         /* how far timeouts raise them */
#define REPLY_MS 60000                  /* a joiner waits for its owner's
                                         * next message at most this */
#define MAX_CONNS 1024                  /* share sockets an owner serves */
#define MAX_PENDING 32                  /* of which not past their hello */
#define JOIN_MAX_CONNS 64               /* sockets a joiner opens to its
                                         * owner: more requests wait */
#define MAX_REF_BLOCKS REF_BATCH        /* blocks in one hit report */
#define MAX_REF_REQUESTS 65536          /* hits counted in one report */

enum {
  MSG_HELLO = 1,        /* J->O: struct hello, key, generation */
  MSG_WELCOME,          /* O->J: err = 0 or an FSC_REJ_* reason;
                         * struct welcome */
  MSG_READ,             /* J->O: offset, count, flags */
  MSG_PREFETCH,         /* J->O: offset, count, flags */
  MSG_WBEGIN,           /* J->O: offset, count, flags (FSC_WRITE_*) */
  MSG_WEND,             /* J->O: flags WEND_*, data if WEND_DATA */
  MSG_COMMIT,           /* J->O */
  MSG_FETCH,            /* O->J: read offset, count upstream */
  MSG_FETCHED,          /* J->O: err, or count bytes */
  MSG_DONE,             /* O->J: err; a READ's data, a MAP's map */
  MSG_MAP,              /* J->O: the map of group offset */
  MSG_REF,              /* J->O: hits served here: u64 requests, u64
                         * bytes, then u64 block numbers */
};
#define WEND_OK   1u    /* the upstream write succeeded */
#define WEND_DATA 2u    /* the written data follows (else: zeroes) */
#define DONE_HIT  1u    /* a READ served from the cache: a joiner's map
                         * that showed it absent is out of date */

struct msg {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint32_t count;
  int32_t err;
  uint64_t offset;
};

struct hello {
  uint32_t version;
  uint32_t block_size;
  uint64_t size;
  uint64_t fingerprint;
  int32_t validate;
  int32_t pid;
  uint32_t key_len;
  uint32_t gen_len;
};

struct welcome {
  int32_t pid;                  /* the owner's */
  uint32_t block_size;          /* the owner's settings, for messages */
  int32_t validate;
  uint32_t pad;
  uint64_t present_blocks;
};

/* A group's map, for a joiner's own hits: what was present, with
 * the epochs read before it was taken.
 */
struct gmap {
  uint64_t gi;                  /* UINT64_MAX: empty slot */
  uint32_t epoch;               /* the object's (slot 0) */
  uint32_t gepoch;              /* the group's slot */
  uint64_t present;
  uint64_t zero;
  uint64_t csum[FSC_GROUP_BLOCKS];
  uint16_t pieces[FSC_GROUP_BLOCKS];
  uint64_t taken_ms;            /* joiner's: when it came */
};

/* The owner's side: a listening socket, and a thread per joiner's
 * socket.
 */
struct share_conn {
  struct share_conn *next;
  int fd;
};

struct share_server {
  uint32_t *ep;                 /* the epochs file, mapped */
  uint64_t slow_ms;             /* the slowest recent joiner's fetch of
                                 * up to 1 MiB (decaying) ... */
  uint64_t slow_ms_per_mib;     /* ... and per MiB of larger ones: for
                                 * fetch_deadline; under lock */
  long refused_uid;             /* the last other user refused, or -1 */
  int lfd;
  pthread_t listener;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stopping;
  unsigned nconns;
  unsigned npending;            /* of nconns, still before the hello */
  struct share_conn *conns;
};

/* The joiner's side. */
struct fsc_join {
  pthread_mutex_t lock;         /* the pool, broken, local */
  int *idle;                    /* sockets with no request in flight */
  size_t nidle, cap;
  unsigned nbusy;               /* sockets with a request in flight */
  pthread_cond_t freed;         /* one of them came back */
  bool broken;                  /* the owner went away */
  uint64_t retry_at;            /* ms: next try to rejoin or take over */
  struct fsc_object *local;     /* taken over: forward to it */
  struct fsc_object_params p;   /* ours, for rejoining and taking over */
  int owner_pid;
  const uint32_t *ep;           /* the epochs file, mapped, or NULL */
  uint64_t refs[REF_BATCH];     /* blocks hit here, not yet reported */
  unsigned nrefs;
  uint64_t hit_requests, hit_bytes;     /* the same, counted */
  struct gmap *maps;            /* NMAPS, by group number; under lock */
  bool files;                   /* the data and sums files are open */
  bool direct_off;              /* the files are not the owner's now */
  dev_t ids[6];                 /* the files' (device, inode) pairs */
  int watch;                    /* a socket to the owner that carries no
                                 * request: it ends when the owner does
                                 * (owner_alive), or -1 */
  uint32_t *seen;               /* EPOCH_SLOTS: the highest epoch seen in
                                 * each slot, to tell a rollback */
};

static uint64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

static int
sock_addr (const struct fsc_object *o, struct sockaddr_un *sa, char *name,
           size_t namelen)
{
  hash_name (o, ".sock", name, namelen);
  memset (sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int n = snprintf (sa->sun_path, sizeof sa->sun_path, "/proc/self/fd/%d/%s",
                    o->fandirfd, name);
  if (n < 0 || (size_t) n >= sizeof sa->sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

static int
send_all (int fd, const void *buf, size_t len)
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
    uint64_t now = now_ms ();
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

/* recv_all, before DEADLINE. */
static int
recv_all_until (int fd, void *buf, size_t len, uint64_t deadline)
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

/* recv_all_until with no deadline (a link that has its own). */
static int
recv_all (int fd, void *buf, size_t len)
{
  return recv_all_until (fd, buf, len, UINT64_MAX);
}

/* A send that a peer reading nothing cannot block for ever: past
 * SEND_MS it fails (EAGAIN), and the link with it.
 */
static void
set_send_timeout (int fd)
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
static int
check_peer (int fd, uid_t *uid)
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
static int
send_msg (int fd, unsigned type, unsigned flags, uint32_t count, int err,
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
    if (send_all (fd, (char *) &m + sent, sizeof m - sent) == -1)
      return -1;
    sent = sizeof m;
  }
  return send_all (fd, (const char *) payload + (sent - sizeof m),
                   plen - (sent - sizeof m));
}

static int
recv_msg (int fd, struct msg *m)
{
  if (recv_all (fd, m, sizeof *m) == -1)
    return -1;
  if (m->magic != SHARE_MAGIC) {
    errno = EPROTO;
    return -1;
  }
  return 0;
}

/* recv_msg, before DEADLINE. */
static int
recv_msg_until (int fd, struct msg *m, uint64_t deadline)
{
  if (recv_all_until (fd, m, sizeof *m, deadline) == -1)
    return -1;
  if (m->magic != SHARE_MAGIC) {
    errno = EPROTO;
    return -1;
  }
  return 0;
}

/* The epochs file (NAME.epochs, with the object's files, culled with
 * them), mapped: WRITABLE for the owner, read-only for joiners.  Never
 * truncated, so that the epochs only grow, whoever owns the object; a
 * joiner maps it anew whenever it joins a new owner (the file may have
 * been culled and made again meanwhile).
 */
static uint32_t *
map_epochs (struct fsc_object *o, bool writable, bool create)
{
  char name[FILE_NAME_MAX];
  fsc_file_name (o, ".epochs", name);
  const size_t len = EPOCH_SLOTS * sizeof (uint32_t);
  int fd = openat (o->fandirfd, name,
                   (writable ? O_RDWR | (create ? O_CREAT : 0) : O_RDONLY) |
                   O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd == -1)
    return NULL;
  struct stat st;
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode) ||
      ((uint64_t) st.st_size < len &&
       (!writable || ftruncate (fd, len) == -1))) {
    close (fd);
    return NULL;
  }
  void *p = mmap (NULL, len, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                  MAP_SHARED, fd, 0);
  close (fd);
  return p == MAP_FAILED ? NULL : p;
}

static inline size_t
slot_of (uint64_t gi)
{
  return 1 + gi % (EPOCH_SLOTS - 1);
}

/* Joiners serve hits themselves from maps of groups tagged with these
 * epochs (see direct_read): a write must make every map that shows its
 * blocks' old contents stale before it is acknowledged.  Called after
 * the blocks are dropped (a map taken later shows them absent).
 */
void
fsc_share_bump (struct fsc_object *o, uint64_t g0, uint64_t g1)
{
  struct share_server *srv = o->share;
  uint32_t *ep = srv ? __atomic_load_n (&srv->ep, __ATOMIC_SEQ_CST) : NULL;
  if (ep == NULL)
    return;                     /* no joiner ever: no map to make stale */
  if (g1 - g0 >= EPOCH_SLOTS - 1) {
    __atomic_add_fetch (&ep[0], 1, __ATOMIC_SEQ_CST);
    return;
  }
  for (uint64_t gi = g0; gi <= g1; ++gi)
    __atomic_add_fetch (&ep[slot_of (gi)], 1, __ATOMIC_SEQ_CST);
}

/* Every map stale: the object was withdrawn (or changed owner). */
void
fsc_share_bump_all (struct fsc_object *o)
{
  struct share_server *srv = o->share;
  uint32_t *ep = srv ? __atomic_load_n (&srv->ep, __ATOMIC_SEQ_CST) : NULL;
  if (ep)
    __atomic_add_fetch (&ep[0], 1, __ATOMIC_SEQ_CST);
}

/* The epochs file, made (or mapped) when the first joiner comes, so
 * that an object nobody joins has none.  Bumping the object's epoch
 * then makes every map a joiner kept of an earlier owner stale.
 * Without it joiners only lose their own hits: every read goes to us.
 */
static void
ensure_epochs (struct fsc_object *o)
{
  struct share_server *srv = o->share;
  SCOPED_LOCK (&srv->lock);
  if (srv->ep)
    return;
  uint32_t *ep = map_epochs (o, true, true);
  if (ep) {
    __atomic_add_fetch (&ep[0], 1, __ATOMIC_SEQ_CST);
    __atomic_store_n (&srv->ep, ep, __ATOMIC_SEQ_CST);
  }
}

/*----------------------------------------------------------------------
 * The owner.
 */

/* The reason to refuse joiner H (check_sb's, in its order), or FSC_OK. */
static int
check_joiner (struct fsc_object *o, const struct hello *h, const void *key,
              const char *gen)
{
  if (h->key_len != o->key_len || memcmp (key, o->key, o->key_len) != 0)
    return FSC_REJ_KEY;
  if (h->block_size != o->block_size)
    return FSC_REJ_BLOCK_SIZE;
  if (h->size != o->size)
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
  return now_ms () + lat + per_mib * count / (1024 * 1024);
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
  const uint64_t t0 = now_ms (), deadline = fetch_deadline (srv, count);
  struct msg m;
  if (send_msg (jl->fd, MSG_FETCH, 0, count, 0, offset, NULL, 0) == -1 ||
      recv_msg_until (jl->fd, &m, deadline) == -1)
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
  if (recv_all_until (jl->fd, buf, count, deadline) == -1)
    goto broken;
  note_fetch_time (srv, count, now_ms () - t0);
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
  if (gi >= o->ngroups || srv->ep == NULL) {
    errno = EINVAL;
    return -1;
  }
  m->epoch = __atomic_load_n (&srv->ep[0], __ATOMIC_SEQ_CST);
  m->gepoch = __atomic_load_n (&srv->ep[slot_of (gi)], __ATOMIC_SEQ_CST);
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
    if (b >= o->nblocks)
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
 * counts it if serve did not).
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

/* Serve one joiner's socket until it closes.  Returns false if the
 * hello was refused or the link broke (either way: done).
 */
static void
serve (struct fsc_object *o, int fd, bool *hello_counted)
{
  struct fsc_stats *st = &o->cache->stats;
  struct joiner_link jl = { .o = o, .fd = fd };
  struct fsc_upstream up = { .pread = fetch_from_joiner, .opaque = &jl };
  struct fsc_write w;
  bool in_write = false;
  unsigned char *buf = NULL;
  size_t cap = 0;
  struct msg m;

  /* Who it is: our user or root, else refused, and said (the plugin
   * logs the notice).
   */
  uid_t uid = 0;
  if (check_peer (fd, &uid) == -1) {
    FSC_STAT_ADD (st, share_peers_refused, 1);
    if (errno == EACCES) {
      struct share_server *srv = o->share;
      pthread_mutex_lock (&srv->lock);
      srv->refused_uid = uid;
      pthread_mutex_unlock (&srv->lock);
      pthread_mutex_lock (&o->lock);
      o->notices |= FSC_NOTICE_PEER;
      pthread_mutex_unlock (&o->lock);
    }
    return;
  }

  /* The hello, in time: a connection that says nothing is closed. */
  struct hello h;
  const uint64_t hello_by = now_ms () + HELLO_MS;
  if (recv_msg_until (fd, &m, hello_by) == -1 || m.type != MSG_HELLO ||
      m.count < sizeof h || recv_all_until (fd, &h, sizeof h, hello_by) == -1 ||
      h.version != SHARE_VERSION || h.key_len > 65536 ||
      h.gen_len > FSC_GEN_MAX || m.count != sizeof h + h.key_len + h.gen_len) {
    FSC_STAT_ADD (st, share_peers_refused, 1);
    return;
  }
  char *kg = malloc (h.key_len + h.gen_len + 1);
  if (kg == NULL ||
      recv_all_until (fd, kg, h.key_len + h.gen_len, hello_by) == -1) {
    free (kg);
    FSC_STAT_ADD (st, share_peers_refused, 1);
    return;
  }
  kg[h.key_len + h.gen_len] = '\0';
  int reason = check_joiner (o, &h, kg, kg + h.key_len);
  free (kg);
  hello_done (o, hello_counted);
  if (reason == FSC_OK)
    ensure_epochs (o);
  struct welcome wel = {
    .pid = getpid (), .block_size = o->block_size,
    .validate = o->sb.validate,
    .present_blocks = fsc_object_present_blocks (o),
  };
  if (send_msg (fd, MSG_WELCOME, 0, sizeof wel, reason, 0, &wel,
                sizeof wel) == -1 || reason != FSC_OK) {
    if (reason != FSC_OK)
      FSC_STAT_ADD (st, share_refused, 1);
    return;
  }

  while (recv_msg (fd, &m) == 0) {
    int r = 0;
    uint32_t out = 0;
    FSC_STAT_ADD (st, share_served, 1);
    /* What a joiner may ask: ranges inside the object, reads of at
     * most nbdkit's largest request, write spans of at most its
     * largest zero or trim (the 32-bit count), and hit reports of the
     * size the joiner sends.  Anything else ends the link.
     */
    uint64_t end;
    switch (m.type) {
    case MSG_READ:
    case MSG_PREFETCH:
    case MSG_WBEGIN:
      if ((m.type != MSG_WBEGIN && m.count > SHARE_MAX_COUNT) ||
          ADD_OVERFLOW (m.offset, (uint64_t) m.count, &end) || end > o->size)
        goto refuse;
      break;
    case MSG_REF:
      if (m.count > (MAX_REF_BLOCKS + 2) * 8)
        goto refuse;
      break;
    }
    switch (m.type) {
    case MSG_READ:
    case MSG_WEND:
    case MSG_REF:
      if (m.count > SHARE_MAX_COUNT)
        goto refuse;
      if (m.count > cap) {
        unsigned char *nb = realloc (buf, m.count);
        if (nb == NULL)
          goto out;
        buf = nb;
        cap = m.count;
      }
      break;
    }
    unsigned dflags = 0;
    switch (m.type) {
    case MSG_READ: {
      uint64_t missed = 0;
      r = fsc_read_counted (o, buf, m.count, m.offset, &up, m.flags,
                            &missed);
      out = r == 0 ? m.count : 0;
      if (r == 0 && missed == 0)
        dflags = DONE_HIT;
      break;
    }
    case MSG_PREFETCH:
      r = fsc_object_prefetch (o, m.offset, m.count, &up, m.flags);
      break;
    case MSG_WBEGIN:
      if (in_write) {
        errno = EPROTO;
        goto out;
      }
      r = fsc_object_write_begin_flags (o, m.offset, m.count, m.flags, &w);
      in_write = true;          /* paired with an end, even if it failed */
      break;
    case MSG_WEND:
      if (!in_write || ((m.flags & WEND_DATA) && m.count != w.count) ||
          (!(m.flags & WEND_DATA) && m.count != 0) ||
          (m.count && recv_all (fd, buf, m.count) == -1))
        goto out;
      fsc_object_write_end (o, &w, (m.flags & WEND_DATA) ? buf : NULL,
                            m.flags & WEND_OK);
      in_write = false;
      break;
    case MSG_COMMIT:
      r = fsc_object_commit (o);
      break;
    case MSG_REF:
      if (m.count < 16 || m.count % 8 || recv_all (fd, buf, m.count) == -1)
        goto out;
      note_refs (o, (const uint64_t *) buf, m.count / 8);
      break;
    case MSG_MAP:
      if (cap < sizeof (struct gmap)) {
        unsigned char *nb = realloc (buf, sizeof (struct gmap));
        if (nb == NULL)
          goto out;
        buf = nb;
        cap = sizeof (struct gmap);
      }
      r = take_map (o, m.offset, (struct gmap *) buf);
      out = r == 0 ? sizeof (struct gmap) : 0;
      break;
    default:
      goto out;
    }
    if (send_msg (fd, MSG_DONE, dflags, out, r == -1 ? errno : 0, 0, buf,
                  out) == -1)
      goto out;
  }
  goto out;
 refuse:
  FSC_STAT_ADD (st, share_peers_refused, 1);
 out:
  /* A joiner gone between the two halves of a write: its blocks stay
   * dropped, as after a failed upstream write.
   */
  if (in_write)
    fsc_object_write_end (o, &w, NULL, false);
  free (buf);
}

struct conn_arg {
  struct fsc_object *o;
  struct share_conn *c;
};

static void *
conn_thread (void *arg)
{
  struct conn_arg *a = arg;
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
    set_send_timeout (fd);
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
  if (o->share || sock_addr (o, &sa, name, sizeof name) == -1)
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
  unlinkat (o->fandirfd, name, 0);
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
  srv->ep = map_epochs (o, true, false);
  if (srv->ep)
    __atomic_add_fetch (&srv->ep[0], 1, __ATOMIC_SEQ_CST);
  pthread_mutex_init (&srv->lock, NULL);
  pthread_cond_init (&srv->cond, NULL);
  o->share = srv;
  int e = pthread_create (&srv->listener, NULL, listener, o);
  if (e != 0) {
    o->share = NULL;
    unlinkat (o->fandirfd, name, 0);
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
  if (sock_addr (o, &sa, name, sizeof name) == 0)
    unlinkat (o->fandirfd, name, 0);

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

/*----------------------------------------------------------------------
 * The joiner.
 */

static void report_hits (struct fsc_object *o, bool force);
static void forget_maps (struct fsc_object *o, uint64_t offset,
                         uint32_t count);

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
static bool
owner_alive_locked (struct fsc_join *j)
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
static int
join_connect (struct fsc_object *o, const struct fsc_object_params *p,
              int *reason, struct welcome *wel)
{
  struct sockaddr_un sa;
  char name[64];
  *reason = FSC_OK;
  if (sock_addr (o, &sa, name, sizeof name) == -1)
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
  const uint64_t welcome_by = now_ms () + HELLO_MS;
  set_send_timeout (fd);
  /* An owner of another user (a socket planted in its place) could
   * feed us bytes that we would serve as the upstream's: refused.
   */
  if (connect (fd, (struct sockaddr *) &sa, sizeof sa) == -1)
    goto fail;
  if (check_peer (fd, &uid) == -1) {
    if (errno == EACCES)
      FSC_STAT_ADD (&o->cache->stats, share_peers_refused, 1);
    goto fail;
  }
  if (send_msg (fd, MSG_HELLO, 0, sizeof h + h.key_len + h.gen_len, 0, 0,
                &h, sizeof h) == -1 ||
      send_all (fd, p->key, p->key_len) == -1 ||
      send_all (fd, gen, h.gen_len) == -1 ||
      recv_msg_until (fd, &m, welcome_by) == -1)
    goto fail;
  if (m.type != MSG_WELCOME || m.count != sizeof *wel) {
    errno = EPROTO;
    goto fail;
  }
  if (recv_all_until (fd, wel, sizeof *wel, welcome_by) == -1)
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

static void
free_join (struct fsc_join *j)
{
  for (size_t i = 0; i < j->nidle; ++i)
    close (j->idle[i]);
  if (j->watch >= 0)
    close (j->watch);
  free (j->idle);
  free (j->maps);
  free (j->seen);
  if (j->ep)
    munmap ((void *) j->ep, EPOCH_SLOTS * sizeof (uint32_t));
  free ((void *) j->p.key);
  free ((void *) j->p.generation);
  pthread_mutex_destroy (&j->lock);
  pthread_cond_destroy (&j->freed);
  free (j);
}

/* Our own hits (direct_read) need the epochs, room for maps, and the
 * data and sums files, read-only in spirit (we never write them).
 * Without any of them every read goes to the owner.
 */
/* The identity of the files the direct path reads (the epochs, the
 * data's first segment, the sums), into IDS; false if any is missing.
 */
static bool
file_ids (struct fsc_object *o, dev_t ids[6])
{
  static const char *const sfx[3] = { ".epochs", ".data", ".sums" };
  for (int i = 0; i < 3; ++i) {
    char name[FILE_NAME_MAX];
    struct stat st;
    if (fstatat (o->fandirfd, fsc_file_name (o, sfx[i], name), &st,
                 AT_SYMLINK_NOFOLLOW) == -1)
      return false;
    ids[2 * i] = st.st_dev;
    ids[2 * i + 1] = st.st_ino;
  }
  return true;
}

static void
setup_direct (struct fsc_object *o, struct fsc_join *j)
{
  bool ok;
  if (!file_ids (o, j->ids))
    return;
  j->ep = map_epochs (o, false, false);
  j->maps = malloc (NMAPS * sizeof *j->maps);
  if (j->maps)
    for (size_t i = 0; i < NMAPS; ++i)
      j->maps[i].gi = UINT64_MAX;
  j->seen = calloc (EPOCH_SLOTS, sizeof *j->seen);
  if (j->ep && j->seen)
    for (size_t i = 0; i < EPOCH_SLOTS; ++i)
      j->seen[i] = __atomic_load_n (&j->ep[i], __ATOMIC_RELAXED);
  if (j->ep && j->maps && j->seen && fsc_data_open (o, &ok) == 0 && ok &&
      (o->sfd = fsc_open_file (o, ".sums")) >= 0) {
    j->files = true;
    return;
  }
  if (j->ep)
    munmap ((void *) j->ep, EPOCH_SLOTS * sizeof (uint32_t));
  j->ep = NULL;
}

int
fsc_share_join (struct fsc_object *o, const struct fsc_object_params *p,
                struct fsc_open_info *info)
{
  struct fsc_join *j = calloc (1, sizeof *j);
  if (j == NULL)
    return -1;
  pthread_mutex_init (&j->lock, NULL);
  pthread_cond_init (&j->freed, NULL);
  j->watch = -1;
  j->p = *p;
  j->p.key = malloc (p->key_len);
  j->p.generation = p->generation ? strdup (p->generation) : NULL;
  if (j->p.key == NULL || (p->generation && j->p.generation == NULL)) {
    free_join (j);
    errno = ENOMEM;
    return -1;
  }
  memcpy ((void *) j->p.key, p->key, p->key_len);

  struct welcome wel;
  int reason;
  /* The holder may still be opening the object (its socket comes right
   * after): wait for it a little.  A holder that never listens (a
   * writeback proxy, nbd-fscached culling, a tool) leaves us uncached,
   * as before sharing.
   */
  uint64_t deadline = now_ms () + TAKEOVER_MS;
  int fd;
  while ((fd = join_connect (o, p, &reason, &wel)) == -1 &&
         (errno == ENOENT || errno == ECONNREFUSED) && now_ms () < deadline)
    poll (NULL, 0, RETRY_MS);
  if (fd == -1 && errno == EPERM) {
    info->reason = reason;
    info->owner_pid = wel.pid;
    info->owner_block_size = wel.block_size;
    info->owner_validate = wel.validate;
    free_join (j);
    FSC_STAT_ADD (&o->cache->stats, share_refused, 1);
    /* Settings that would make a lone opener discard the copy are
     * refused; a different upstream is only served uncached.
     */
    errno = reason == FSC_REJ_BLOCK_SIZE || reason == FSC_REJ_VALIDATE
      ? EPERM : EBUSY;
    return -1;
  }
  if (fd == -1) {
    free_join (j);
    errno = EBUSY;
    return -1;
  }
  else {
    j->idle = malloc (4 * sizeof *j->idle);
    if (j->idle == NULL) {
      close (fd);
      free_join (j);
      return -1;
    }
    j->cap = 4;
    j->watch = fd;              /* requests open sockets of their own */
    j->owner_pid = wel.pid;
    setup_direct (o, j);
    info->owner_pid = wel.pid;
    info->present_blocks = wel.present_blocks;
  }
  o->join = j;
  info->joined = true;
  FSC_STAT_ADD (&o->cache->stats, share_joins, 1);
  return 0;
}

void
fsc_share_leave (struct fsc_object *o)
{
  struct fsc_join *j = o->join;
  if (j == NULL)
    return;
  report_hits (o, true);
  struct fsc_object *l = j->local;
  o->join = NULL;
  free_join (j);
  if (l)
    fsc_object_close (l);
}

struct fsc_object *
fsc_share_detach_local (struct fsc_object *o)
{
  if (o->join == NULL)
    return NULL;
  SCOPED_LOCK (&o->join->lock);
  struct fsc_object *l = o->join->local;
  o->join->local = NULL;
  return l;
}

/* A socket for one request: an idle one, or a new one.  Returns -1 if
 * there is no owner to talk to; then *LOCAL may be the object we just
 * took over.
 */
static int
get_conn (struct fsc_object *o, struct fsc_object **local)
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
  if (j->broken && now_ms () < j->retry_at) {
    pthread_mutex_unlock (&j->lock);
    return -1;
  }
  uint64_t deadline = now_ms () + TAKEOVER_MS;
 again:;
  /* Connect (with the lock: one rejoin or takeover at a time). */
  struct welcome wel;
  int reason;
  int fd = join_connect (o, &j->p, &reason, &wel);
  if (fd >= 0) {
    /* Joined again after the link broke: a new owner, maybe with the
     * files made anew (a cull, a discard) which we do not have open:
     * then the owner serves every read (the files we hold open stay
     * open until the shell closes, so that no read in flight uses a
     * descriptor closed under it).
     */
    dev_t ids[6];
    if (j->broken && j->ep &&
        (!file_ids (o, ids) || memcmp (ids, j->ids, sizeof ids) != 0))
      j->direct_off = true;             /* files made anew: not ours */
    j->broken = false;
    j->owner_pid = wel.pid;
    if (j->watch < 0) {
      /* A new owner (or the same one after a broken link): this socket
       * watches it, and the request gets one of its own.
       */
      j->watch = fd;
      fd = join_connect (o, &j->p, &reason, &wel);
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
  else if (errno == EWOULDBLOCK && now_ms () < deadline) {
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
    j->retry_at = now_ms () + RETRY_AFTER_MS;
  }
  pthread_mutex_unlock (&j->lock);
  return -1;
}

static void
put_conn (struct fsc_object *o, int fd, bool ok)
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
static int
run (struct fsc_object *o, int fd, unsigned type, unsigned flags,
     uint64_t offset, uint32_t count, const void *payload, uint32_t plen,
     void *buf, const struct fsc_upstream *up, int *err, unsigned *dflags)
{
  struct msg m;
  unsigned char *fetched = NULL;
  size_t cap = 0;
  int r = -1;

  if (send_msg (fd, type, flags, type == MSG_WEND || plen ? plen : count,
                0, offset,
                payload, plen) == -1)
    return -1;
  for (;;) {
    /* An owner that says nothing for REPLY_MS (stopped, or hung) is
     * taken for gone: the link breaks, and the request is served
     * without it.
     */
    const uint64_t reply_by = now_ms () + REPLY_MS;
    if (recv_msg_until (fd, &m, reply_by) == -1)
      goto out;
    if (m.type == MSG_DONE) {
      if (m.count && (buf == NULL || m.count != count ||
                      recv_all_until (fd, buf, m.count, reply_by) == -1)) {
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
        end > o->size) {
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
    if (send_msg (fd, MSG_FETCHED, 0, e ? 0 : m.count, e, m.offset,
                  fetched, e ? 0 : m.count) == -1)
      goto out;
  }
 out:
  free (fetched);
  return r;
}

/* Fetch the map of group GI from the owner into our slot.  Returns 0
 * or -1.
 */
static int
fetch_map (struct fsc_object *o, uint64_t gi)
{
  struct fsc_join *j = o->join;
  struct fsc_object *l;
  struct gmap m;
  int fd = get_conn (o, &l), err;
  if (fd < 0)
    return -1;
  if (run (o, fd, MSG_MAP, 0, gi, sizeof m, NULL, 0, &m, NULL, &err, NULL) == -1) {
    put_conn (o, fd, false);
    return -1;
  }
  put_conn (o, fd, true);
  if (err || m.gi != gi)
    return -1;
  m.taken_ms = now_ms ();
  SCOPED_LOCK (&j->lock);
  j->maps[gi % NMAPS] = m;
  return 0;
}

/* Serve a read from the shared files ourselves, without asking the
 * owner: the hit path of a joiner.  Safe without any lock the owner
 * holds because
 *  - what we serve is checked against the checksums of the group's
 *    map (the owner's index checksums, and for a block read in part
 *    its sub-block hashes from the sums file): a block evicted since
 *    (a hole) or being refilled fails the check;
 *  - a write changes a block's contents: the owner drops the block and
 *    then bumps its group's epoch before the write goes upstream
 *    (fsc_share_bump), so a map showing the old contents is stale
 *    before the write can be acknowledged; the epochs are read before
 *    and after our read, as a seqlock's readers do;
 *  - a withdrawal or a new owner bumps the object's epoch.
 * Returns DIRECT_SERVED; or (and nothing is known of BUF) if the owner
 * must serve it, DIRECT_ABSENT (a block not present or held in pieces
 * in our map) or DIRECT_NO (a read not aligned to sub-blocks at a
 * partial end, a check failing, a map we could not get).
 */
enum direct { DIRECT_SERVED, DIRECT_ABSENT, DIRECT_NO };

/* The epochs of the object (*E0) and of groups G0..G1 (at most two,
 * into EG).  They only grow (map_epochs): a slot lower than we saw it
 * was rolled back (a damaged or tampered file), and a map tagged with
 * the lower value might show blocks written since.  Then -1, and no
 * more hits of our own from these files: the owner serves every read.
 * Else the highest values seen are kept.  Loaded under j->lock, so
 * that two readers' loads are ordered and a slower one is no rollback.
 */
static int
load_epochs (struct fsc_join *j, uint64_t g0, uint64_t g1, uint32_t *e0,
             uint32_t *eg)
{
  SCOPED_LOCK (&j->lock);
  const size_t slots[3] = { 0, slot_of (g0), slot_of (g1) };
  uint32_t vals[3];
  for (int i = 0; i < 3; ++i)
    vals[i] = __atomic_load_n (&j->ep[slots[i]], __ATOMIC_SEQ_CST);
  for (int i = 0; i < 3; ++i)
    if ((int32_t) (vals[i] - j->seen[slots[i]]) < 0) {
      j->direct_off = true;
      for (size_t k = 0; k < NMAPS; ++k)
        j->maps[k].gi = UINT64_MAX;
      return -1;
    }
  for (int i = 0; i < 3; ++i)
    j->seen[slots[i]] = vals[i];
  *e0 = vals[0];
  eg[0] = vals[1];
  eg[g1 - g0] = vals[2];
  return 0;
}
static enum direct
direct_read (struct fsc_object *o, void *buf, uint32_t count,
             uint64_t offset, unsigned flags)
{
  struct fsc_join *j = o->join;
  uint64_t end;
  if (j->ep == NULL || count == 0 ||
      ADD_OVERFLOW (offset, (uint64_t) count, &end) || end > o->size)
    return DIRECT_NO;
  const uint64_t b0 = offset >> o->bshift, b1 = (end - 1) >> o->bshift;
  const uint64_t g0 = GROUP_OF (b0), g1 = GROUP_OF (b1);
  if (b1 - b0 >= FSC_GROUP_BLOCKS)
    return DIRECT_NO;                       /* spans at most two groups */

  uint32_t e0, eg[2];
  if (load_epochs (j, g0, g1, &e0, eg) == -1)
    return DIRECT_NO;

  uint64_t csum[FSC_GROUP_BLOCKS];
  bool zero[FSC_GROUP_BLOCKS];
  for (int attempt = 0; ; ++attempt) {
    bool stale = false, absent = false;
    pthread_mutex_lock (&j->lock);
    if (j->local || j->broken || j->direct_off || j->watch < 0) {
      pthread_mutex_unlock (&j->lock);
      return DIRECT_NO;
    }
    for (uint64_t gi = g0; gi <= g1 && !stale; ++gi) {
      const struct gmap *m = &j->maps[gi % NMAPS];
      if (m->gi != gi || m->epoch != e0 || m->gepoch != eg[gi - g0]) {
        stale = true;
        break;
      }
      for (uint64_t b = MAX (b0, gi * FSC_GROUP_BLOCKS);
           b <= MIN (b1, gi * FSC_GROUP_BLOCKS + FSC_GROUP_BLOCKS - 1); ++b) {
        uint64_t bit = UINT64_C (1) << IDX_OF (b);
        if (!(m->present & bit) || m->pieces[IDX_OF (b)] != 0) {
          /* The owner serves it (and may fill it): a map older than
           * MAP_FRESH_MS is taken again next time, so that blocks
           * filled since are served here.
           */
          absent = true;
          if (now_ms () - m->taken_ms > MAP_FRESH_MS)
            j->maps[gi % NMAPS].gi = UINT64_MAX;
        }
        csum[b - b0] = m->csum[IDX_OF (b)];
        zero[b - b0] = m->zero & bit;
      }
    }
    pthread_mutex_unlock (&j->lock);
    if (!stale) {
      if (absent)
        return DIRECT_ABSENT;
      break;
    }
    if (attempt > 0)
      return DIRECT_NO;
    for (uint64_t gi = g0; gi <= g1; ++gi)
      if (fetch_map (o, gi) == -1)
        return DIRECT_NO;
  }

  /* Block by block: whole ones straight into BUF, checked with the
   * index checksum; partial ends by sub-blocks, checked with their
   * hashes, which are checked with the index checksum.
   */
  for (uint64_t b = b0; b <= b1; ++b) {
    const uint64_t bs = block_start (o, b), be = block_end (o, b);
    const uint64_t lo = MAX (bs, offset), hi = MIN (be, end);
    unsigned char *out = (unsigned char *) buf + (lo - offset);
    if (zero[b - b0]) {
      if (csum[b - b0] != zero_csum (o, b))
        goto stale;
      memset (out, 0, hi - lo);
      continue;
    }
    if (lo == bs && hi == be) {
      if (fsc_data_pread (o, out, be - bs, bs) != (ssize_t) (be - bs) ||
          fsc_block_csum (out, be - bs) != csum[b - b0])
        goto stale;
      continue;
    }
    if (((lo - bs) & (SUB_SIZE - 1)) || ((hi - bs) & (SUB_SIZE - 1) &&
                                         hi != be))
      return DIRECT_NO;
    const unsigned kb = DIV_ROUND_UP (be - bs, SUB_SIZE);
    unsigned char le[8 * MAX_SUBS];
    uint64_t sums[MAX_SUBS];
    if (pread (o->sfd, le, 8 * kb, sums_offset (o, b)) != (ssize_t) (8 * kb))
      goto stale;
    for (unsigned i = 0; i < kb; ++i)
      sums[i] = get_le64 (le + 8 * i);
    if (fsc_sums_csum (sums, kb) != csum[b - b0] ||
        fsc_data_pread (o, out, hi - lo, lo) != (ssize_t) (hi - lo))
      goto stale;
    for (uint64_t x = lo; x < hi; x += SUB_SIZE) {
      uint64_t n = MIN (SUB_SIZE, hi - x);
      if (XXH3_64bits (out + (x - lo), n) != sums[(x - bs) >> SUB_SHIFT])
        goto stale;
    }
  }

  /* Nothing changed meanwhile, and the owner that gave the maps is
   * still there (else the owner, or its successor, serves it).  Once
   * is enough, at the end: a watch that has not ended now had not
   * ended when the read began either.
   */
  if (__atomic_load_n (&j->ep[0], __ATOMIC_SEQ_CST) != e0)
    return DIRECT_NO;
  for (uint64_t gi = g0; gi <= g1; ++gi)
    if (__atomic_load_n (&j->ep[slot_of (gi)], __ATOMIC_SEQ_CST) !=
        eg[gi - g0])
      return DIRECT_NO;
  pthread_mutex_lock (&j->lock);
  bool alive = owner_alive_locked (j);
  pthread_mutex_unlock (&j->lock);
  if (!alive)
    return DIRECT_NO;
  FSC_STAT_ADD (&o->cache->stats, share_direct_bytes, count);
  FSC_STAT_ADD (&o->cache->stats, hit_bytes, count);
  /* For the owner's counters and policy: a stream's hits are no
   * references there either.
   */
  bool full;
  pthread_mutex_lock (&j->lock);
  j->hit_requests++;
  j->hit_bytes += count;
  for (uint64_t b = b0; b <= b1 && !(flags & FSC_READ_SEQUENTIAL) &&
         j->nrefs < REF_BATCH; ++b)
    j->refs[j->nrefs++] = b;
  full = j->nrefs >= REF_BATCH || j->hit_requests >= MAX_REF_REQUESTS;
  pthread_mutex_unlock (&j->lock);
  if (full)
    report_hits (o, false);
  return DIRECT_SERVED;

 stale:
  /* A check failed: the block was evicted or is being refilled since
   * the map was taken (or a read failed).  Take the maps again next
   * time, so that a block gone stays with the owner.
   */
  forget_maps (o, offset, count);
  return DIRECT_NO;
}

/* Send the hits served here to the owner (note_refs): when REF_BATCH
 * blocks are waiting, or with FORCE (closing).  Best effort: lost
 * reports cost only counts and second chances.
 */
static void
report_hits (struct fsc_object *o, bool force)
{
  struct fsc_join *j = o->join;
  uint64_t v[REF_BATCH + 2];
  pthread_mutex_lock (&j->lock);
  /* Closing, only on a socket already open: a report is not worth
   * connecting to, nor taking over, an owner.
   */
  if (j->hit_requests == 0 ||
      (!force && j->nrefs < REF_BATCH && j->hit_requests < MAX_REF_REQUESTS) ||
      j->local || j->broken || (force && j->nidle == 0)) {
    pthread_mutex_unlock (&j->lock);
    return;
  }
  v[0] = j->hit_requests;
  v[1] = j->hit_bytes;
  memcpy (&v[2], j->refs, j->nrefs * sizeof *v);
  size_t n = 2 + j->nrefs;
  j->hit_requests = j->hit_bytes = 0;
  j->nrefs = 0;
  pthread_mutex_unlock (&j->lock);

  struct fsc_object *l;
  int fd = get_conn (o, &l), err;
  if (fd < 0)
    return;
  put_conn (o, fd, run (o, fd, MSG_REF, 0, 0, n * 8, v, n * 8, NULL, NULL,
                        &err, NULL) == 0);
}

/* The owner served [OFFSET, OFFSET+COUNT) from its cache: our maps of
 * those groups are out of date (they did not show it all present), and
 * are taken again at the next read.
 */
static void
forget_maps (struct fsc_object *o, uint64_t offset, uint32_t count)
{
  struct fsc_join *j = o->join;
  if (j->maps == NULL || count == 0)
    return;
  uint64_t g0 = GROUP_OF (offset >> o->bshift);
  uint64_t g1 = GROUP_OF ((offset + count - 1) >> o->bshift);
  SCOPED_LOCK (&j->lock);
  for (uint64_t gi = g0; gi <= g1 && gi - g0 < NMAPS; ++gi)
    if (j->maps[gi % NMAPS].gi == gi)
      j->maps[gi % NMAPS].gi = UINT64_MAX;
}

int
fsc_share_read (struct fsc_object *o, void *buf, uint32_t count,
                uint64_t offset, const struct fsc_upstream *up,
                unsigned flags)
{
  enum direct d = direct_read (o, buf, count, offset, flags);
  if (d == DIRECT_SERVED)
    return 0;

  /* A link that breaks is tried once more: the next owner (or our
   * takeover) serves it from the cache, the upstream only if nobody
   * comes.
   */
  for (int attempt = 0; attempt < 2; ++attempt) {
    struct fsc_object *l;
    int fd = get_conn (o, &l);
    if (l)
      return fsc_object_read (l, buf, count, offset, up, flags);
    if (fd < 0)
      break;
    int err;
    unsigned dflags = 0;
    if (run (o, fd, MSG_READ, flags, offset, count, NULL, 0, buf, up,
             &err, &dflags) == 0) {
      put_conn (o, fd, true);
      if (err == 0 && d == DIRECT_ABSENT && (dflags & DONE_HIT))
        forget_maps (o, offset, count);
      if (err == 0)
        return 0;
      errno = err;
      return -1;
    }
    put_conn (o, fd, false);
  }
  /* No owner: the upstream, uncached. */
  FSC_STAT_ADD (&o->cache->stats, share_fallbacks, 1);
  FSC_STAT_ADD (&o->cache->stats, miss_bytes, count);
  return up->pread (up->opaque, buf, count, offset);
}

int
fsc_share_prefetch (struct fsc_object *o, uint64_t offset, uint64_t count,
                    const struct fsc_upstream *up, unsigned flags)
{
  struct fsc_object *l;
  int fd = get_conn (o, &l);
  if (l)
    return fsc_object_prefetch (l, offset, count, up, flags);
  if (fd < 0)
    return 0;                   /* a prefetch may do nothing */
  int err;
  while (count > 0) {
    uint32_t n = MIN (count, (uint64_t) SHARE_MAX_COUNT);
    if (run (o, fd, MSG_PREFETCH, flags, offset, n, NULL, 0, NULL, up,
             &err, NULL) == -1) {
      put_conn (o, fd, false);
      return 0;
    }
    if (err) {
      put_conn (o, fd, true);
      errno = err;
      return -1;
    }
    offset += n;
    count -= n;
  }
  put_conn (o, fd, true);
  return 0;
}

int
fsc_share_write_begin (struct fsc_object *o, uint64_t offset, uint64_t count,
                       unsigned flags, struct fsc_write *w)
{
  struct fsc_object *l;
  int fd = get_conn (o, &l);
  if (l) {
    int r = fsc_object_write_begin_flags (l, offset, count, flags, w);
    w->local = l;
    return r;
  }
  memset (w, 0, sizeof *w);
  w->offset = offset;
  w->count = count;
  w->keep = flags & FSC_WRITE_KEEP;
  w->join_fd = -1;
  if (fd >= 0) {
    int err;
    if (run (o, fd, MSG_WBEGIN, flags, offset, (uint32_t) count, NULL, 0, NULL,
             NULL, &err, NULL) == 0 && err == 0) {
      w->join_fd = fd;          /* held until the end */
      return 0;
    }
    put_conn (o, fd, false);
  }
  /* Nobody could drop the blocks before the upstream changes: whoever
   * holds the object next discards its copy.
   */
  fsc_mark_stale (o);
  return 0;
}

void
fsc_share_write_end (struct fsc_object *o, struct fsc_write *w,
                     const void *buf, bool upstream_ok)
{
  if (w->local) {
    struct fsc_object *l = w->local;
    w->local = NULL;
    fsc_object_write_end (l, w, buf, upstream_ok);
    return;
  }
  int fd = w->join_fd;
  w->join_fd = -1;
  if (fd < 0)
    return;
  unsigned flags = (upstream_ok ? WEND_OK : 0) |
    (buf && w->keep && upstream_ok ? WEND_DATA : 0);
  uint32_t plen = (flags & WEND_DATA) ? (uint32_t) w->count : 0;
  int err;
  put_conn (o, fd, run (o, fd, MSG_WEND, flags, w->offset, (uint32_t) w->count,
                        buf, plen, NULL, NULL, &err, NULL) == 0);
}

int
fsc_share_commit (struct fsc_object *o)
{
  struct fsc_object *l;
  int fd = get_conn (o, &l);
  if (l)
    return fsc_object_commit (l);
  if (fd < 0)
    return 0;                   /* nothing of ours to make durable */
  int err;
  if (run (o, fd, MSG_COMMIT, 0, 0, 0, NULL, 0, NULL, NULL, &err, NULL) == -1) {
    put_conn (o, fd, false);
    return 0;
  }
  put_conn (o, fd, true);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
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

int
fsc_share_owner_pid (struct fsc_object *o)
{
  if (o->join == NULL)
    return 0;
  SCOPED_LOCK (&o->join->lock);
  return o->join->local ? (int) getpid () : o->join->owner_pid;
}
