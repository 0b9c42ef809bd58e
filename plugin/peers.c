/* nbdkit-fscache-filter: the peer tier.  Proxies on different hosts
 * fetch their misses from each other, so that a fleet reads each
 * range of an image from the origin once.  No daemon and no protocol
 * of our own: peers are proxies of this filter, and speak NBD to each
 * other through libnbd.
 *
 * Membership.  fscache-peers=FILE lists one NBD URI per line (blank
 * lines and lines starting with '#' ignored), the same file on every
 * node; fscache-peer-self=URI is this node's line.  The file is read
 * again when its inode, size or mtime changes, checked at most every
 * CHECK_MS by the reads that need it (nbdkit ends on SIGHUP, so a
 * signal cannot be the trigger), and only once it is whole (issue
 * 41): a new inode (a file renamed over the old one, as a writer that
 * means it to be read whole does) is taken at once; a file changed in
 * place only once two stats at least CHECK_MS apart saw it the same,
 * so that a half-written file is not taken.  The list in use is a
 * reference-counted snapshot, replaced whole.
 *
 * Ownership.  Every RANGE_SIZE range of an object has one owner:
 * rendezvous hashing (highest random weight) of the object key's hash,
 * the range's index and each member's URI.  A member that comes or
 * goes moves only its own ranges.  A member set aside after errors
 * (below) is skipped, so its ranges move to their second choice, which
 * every node that saw the same failure agrees on: the dead peer's
 * ranges are fetched from the origin about once, not once per node.
 * A node not in its own file owns nothing and asks for everything.
 *
 * A miss on a range another member owns is asked of the owner, on a
 * connection whose export name is PEER_EXPORT_PREFIX, the identity,
 * ':', the export.  The owner serves it from its cache, or fetches it
 * from the origin once and caches it (the core's claims make
 * concurrent askers of one range wait for that one fetch).
 *
 * A tree per range (issue 41).  The members, ranked by their scores
 * for a range, form a complete fscache-peer-fanout-ary tree
 * (core/peertree.c): the first reads the origin, the member at
 * position p asks the one at (p - 1) / K, so that a member serves each
 * range to at most K others, in log_K N hops.  A peer's connection
 * asks upward as a client's does.  K = 0, or N <= K + 1: the flat
 * fleet, where every node asks the owner.
 *
 * No loops (invariant T1 of core/peertree.c).  A node asks only a
 * member whose score for the range is strictly above its own, so a
 * chain of asks never loops, whatever the nodes' files say.  Broken by
 * tests/unit-peertree.c, "chains"; tests/test-fscache-peers.sh, part
 * "disagreeing files", runs the fleet so.
 *
 * Only the same image (invariant P2).  The identity hashes the object
 * key, the size, fscache-generation and the sampled fingerprint of the
 * upstream (computed for the fleet even under fscache-validate=size or
 * none).  The owner compares it with its own object's and refuses the
 * connection if they differ; the asker then sets that link aside and
 * goes to the next owner or the origin.  Peer data enters the cache as
 * any fill does, checksummed.  Broken by the test's part "another
 * image".
 *
 * Failure never reaches a client (invariant P3).  A connect or read
 * that fails or takes longer than the timeout is retried once on a
 * fresh connection; if that fails too the link is set aside for a
 * back-off (BACKOFF_MIN seconds, doubling to BACKOFF_MAX) and the range
 * goes to the next owner, at most MAX_PEER_TRIES peers per range, then
 * the origin.  Only the origin's errors reach the client.  Errors are
 * counted (peer_errors) and logged at most once a minute.  Broken by
 * the test's parts "killed" and "stopped".
 *
 * Who may ask.  With fscache-peer-tls-psk=FILE, connections to peers
 * use TLS with that pre-shared key (an nbd:// line is dialled as
 * nbds://), and a proxy refuses a peer export name on a connection
 * without TLS (fscache.c); nbdkit's --tls=on --tls-psk=FILE serves it.
 *
 * Writes.  A node whose clients write an export stops asking peers for
 * it (peers_export_written): an owner may hold the range as it was
 * before, and the node must read its own writes.  Writeback objects
 * never use peers.
 *
 * Connections to a peer, their deadlines, retry and back-off are
 * peerlink.c's.
 *
 * Locks: fleet.lock guards the snapshot pointer and the reload; each
 * export's lock its links (peerlink.c: each link's lock its idle
 * connections).  No lock is held across a connect or a read.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "keyenc.h"
#include "peertree.h"
#include "xxh.h"
#include "utils.h"

#include "params.h"
#include "peers.h"
#include "peerlink.h"
#include "say.h"

/* One owner per range of this size.  Smaller ranges spread an image
 * more evenly over the fleet (128 MiB over 4 nodes: 32 ranges each at
 * 1 MiB) at the cost of one peer request per MiB, which a LAN answers
 * in well under the time the MiB takes to cross it.
 */
#define RANGE_SIZE (1024 * 1024)

#define MAX_MEMBERS 65536
#define MAX_LINE 4096
#define MAX_PEER_TRIES 2        /* peers tried for one range */
#define CHECK_MS 200            /* the peers file's stat, at most */
#define DEFAULT_TIMEOUT_MS 10000

struct member {
  char *uri;                    /* as in the file */
  char *dial;                   /* what libnbd is given (nbds with PSK) */
  uint64_t seed;                /* the URI's hash */
};

struct members {
  unsigned refs;                /* under fleet_lock */
  size_t n;
  long self;                    /* our index, or -1 */
  struct member m[];
};

static struct {
  struct fsc_cache *cache;
  pthread_mutex_t lock;
  struct members *snap;         /* NULL: no fleet */
  struct stat st;               /* the file as last read */
  struct stat seen;             /* a change seen, not yet taken */
  bool pending;                 /* SEEN holds one */
  int64_t checked;              /* monotonic ms of the last stat */
  char *psk_user;               /* the PSK file's first user name */
  uint64_t self_seed;           /* fscache-peer-self's hash: our score */
  char *dns_text;               /* dns: the members last taken, as text */
  int64_t dns_ms;               /* dns: how often to resolve; 0: a file */
} fleet = { .lock = PTHREAD_MUTEX_INITIALIZER };

struct peer_export {
  struct peer_export *next;     /* exports; under exports_lock */
  unsigned refs;                /* under exports_lock */
  char *exportname;
  char *peer_name;              /* the prefix and identity of the export
                                 * name peers are asked (peerlink.c adds
                                 * the node, the link and the export) */
  uint64_t key_lo, key_hi;
  uint64_t identity;
  bool written;                 /* atomic */
  pthread_mutex_t lock;         /* links, by_member, members */
  struct peer_link *links;
  struct members *members;      /* by_member is for this snapshot */
  struct peer_link **by_member;
};

static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct peer_export *exports;

/* The reaper: closes links' idle connections (peerlink.c says why),
 * once a second, from the first export on (a thread must start after
 * nbdkit forks) to peers_stop.
 */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool running, stopping;
  pthread_t thread;
} reaper = { .lock = PTHREAD_MUTEX_INITIALIZER,
              .cond = PTHREAD_COND_INITIALIZER };

static void *
reap_loop (void *arg)
{
  pthread_mutex_lock (&reaper.lock);
  while (!reaper.stopping) {
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait (&reaper.cond, &reaper.lock, &ts);
    if (reaper.stopping)
      break;
    pthread_mutex_unlock (&reaper.lock);
    /* The closes are of idle sockets, no request: fast enough to make
     * under the list's locks, which only an export's first and last
     * connections and a member reload take.
     */
    int64_t now = peer_now_ms ();
    pthread_mutex_lock (&exports_lock);
    for (struct peer_export *pe = exports; pe; pe = pe->next) {
      pthread_mutex_lock (&pe->lock);
      for (struct peer_link *l = pe->links; l; l = peer_link_next (l))
        peer_link_reap (l, now);
      pthread_mutex_unlock (&pe->lock);
    }
    pthread_mutex_unlock (&exports_lock);
    pthread_mutex_lock (&reaper.lock);
  }
  pthread_mutex_unlock (&reaper.lock);
  return NULL;
}

static void
reaper_start (void)
{
  pthread_mutex_lock (&reaper.lock);
  if (!reaper.running && !reaper.stopping &&
      pthread_create (&reaper.thread, NULL, reap_loop, NULL) == 0)
    reaper.running = true;
  pthread_mutex_unlock (&reaper.lock);
}

static void
reaper_stop (void)
{
  pthread_mutex_lock (&reaper.lock);
  bool join = reaper.running;
  reaper.stopping = true;
  pthread_cond_signal (&reaper.cond);
  pthread_mutex_unlock (&reaper.lock);
  if (join)
    pthread_join (reaper.thread, NULL);
}

/*----------------------------------------------------------------------
 * Membership.
 */

static void
members_put_locked (struct members *ms)
{
  if (ms == NULL || --ms->refs > 0)
    return;
  for (size_t i = 0; i < ms->n; ++i) {
    free (ms->m[i].uri);
    free (ms->m[i].dial);
  }
  free (ms);
}

static void
members_put (struct members *ms)
{
  pthread_mutex_lock (&fleet.lock);
  members_put_locked (ms);
  pthread_mutex_unlock (&fleet.lock);
}

/* What libnbd dials for URI: with a PSK, the TLS scheme of it. */
static char *
dial_uri (const char *uri)
{
  static const char *const plain[] = { "nbd://", "nbd+unix://",
                                       "nbd+vsock://" };
  if (params.peer_psk)
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; ++i) {
      size_t l = strlen (plain[i]);
      char *d;
      if (strncmp (uri, plain[i], l) == 0) {
        if (asprintf (&d, "nbds%s", uri + 3) == -1)
          return NULL;
        return d;
      }
    }
  return strdup (uri);
}

/* Parse FP into a new snapshot.  NULL with errno on failure. */
static struct members *
members_read (FILE *fp)
{
  size_t cap = 16;
  struct members *ms = calloc (1, sizeof *ms + cap * sizeof ms->m[0]);
  if (ms == NULL)
    return NULL;
  ms->refs = 1;
  ms->self = -1;
  char line[MAX_LINE + 2];
  while (fgets (line, sizeof line, fp)) {
    size_t len = strlen (line);
    if (len > MAX_LINE && line[len - 1] != '\n') {
      errno = ENAMETOOLONG;
      goto fail;
    }
    char *s = line, *e = line + len;
    while (*s == ' ' || *s == '\t')
      s++;
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' ||
                     e[-1] == '\t'))
      e--;
    *e = 0;
    if (*s == 0 || *s == '#')
      continue;
    if (ms->n == MAX_MEMBERS) {
      errno = E2BIG;
      goto fail;
    }
    if (ms->n == cap) {
      cap *= 2;
      struct members *b = realloc (ms, sizeof *ms + cap * sizeof ms->m[0]);
      if (b == NULL)
        goto fail;
      ms = b;
    }
    struct member *m = &ms->m[ms->n];
    m->uri = strdup (s);
    m->dial = m->uri ? dial_uri (s) : NULL;
    if (m->dial == NULL) {
      free (m->uri);
      goto fail;
    }
    m->seed = XXH3_64bits (s, strlen (s));
    if (ms->self == -1 && strcmp (s, params.peer_self) == 0)
      ms->self = ms->n;
    ms->n++;
  }
  if (ferror (fp)) {
    errno = EIO;
    goto fail;
  }
  return ms;
 fail:;
  int e = errno;
  members_put_locked (ms);
  errno = e;
  return NULL;
}

static bool
same_stat (const struct stat *a, const struct stat *b)
{
  return a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
    a->st_size == b->st_size &&
    a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
    a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int install_locked (struct members *ms);

/* fscache-peers=dns:NAME:PORT.  The members are NAME's addresses
 * (A and AAAA records, through the system's resolver: /etc/hosts, DNS,
 * whatever NSS says), each as nbd://ADDRESS:PORT, sorted, so that a
 * Kubernetes headless Service or a Consul name lists the fleet and
 * drops the members that fail its health checks.  Resolved again every
 * DNS_MS (NBD_FSCACHE_TEST_PEER_DNS_MS for tests), from the reads that
 * need it; a new snapshot only if the list changed.  A failed lookup
 * keeps the last list.
 */
#define DNS_MS 5000

static int
cmp_str (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* NAME's members as the text of a peers file, or NULL with errno. */
static char *
resolve_members (const char *spec)
{
  const char *name = spec + 4, *colon = strrchr (name, ':');
  char host[1024];
  size_t hl = colon - name;
  if (hl >= sizeof host) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  memcpy (host, name, hl);
  host[hl] = 0;
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                            .ai_family = AF_UNSPEC }, *res;
  int r = getaddrinfo (host, colon + 1, &hints, &res);
  if (r != 0) {
    nbdkit_debug ("fscache-peers=%s: %s", spec, gai_strerror (r));
    errno = r == EAI_SYSTEM ? errno : ENOENT;
    return NULL;
  }
  size_t n = 0, cap = 0;
  char **uris = NULL;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    char addr[INET6_ADDRSTRLEN], *u;
    const void *in = a->ai_family == AF_INET6
      ? (const void *) &((struct sockaddr_in6 *) a->ai_addr)->sin6_addr
      : (const void *) &((struct sockaddr_in *) a->ai_addr)->sin_addr;
    if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
        inet_ntop (a->ai_family, in, addr, sizeof addr) == NULL)
      continue;
    if (asprintf (&u, a->ai_family == AF_INET6 ? "nbd://[%s]:%s"
                  : "nbd://%s:%s", addr, colon + 1) == -1)
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **b = realloc (uris, cap * sizeof *uris);
      if (b == NULL) {
        free (u);
        break;
      }
      uris = b;
    }
    uris[n++] = u;
  }
  freeaddrinfo (res);
  qsort (uris, n, sizeof *uris, cmp_str);
  char *text = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&text, &len);
  for (size_t i = 0; i < n; ++i) {
    if (fp && (i == 0 || strcmp (uris[i], uris[i - 1]) != 0))
      fprintf (fp, "%s\n", uris[i]);
    free (uris[i]);
  }
  free (uris);
  if (fp == NULL || fclose (fp) == EOF) {
    free (text);
    errno = ENOMEM;
    return NULL;
  }
  return text;
}

/* Take the members of TEXT (a peers file's) as the snapshot, if they
 * differ from the last text taken (or FORCE).  Under fleet.lock.
 */
static int
take_text_locked (char *text, bool force)
{
  if (!force && fleet.dns_text && strcmp (fleet.dns_text, text) == 0) {
    free (text);
    return 0;
  }
  FILE *fp = fmemopen (text, strlen (text), "r");
  struct members *ms = fp ? members_read (fp) : NULL;
  int e = errno;
  if (fp)
    fclose (fp);
  if (ms == NULL) {
    free (text);
    errno = e;
    return -1;
  }
  free (fleet.dns_text);
  fleet.dns_text = text;
  return install_locked (ms);
}

/* Read the file again if it changed and is whole (or FORCE).  Under
 * fleet.lock.  Returns 0, or -1 with errno (the old snapshot stays).
 */
static int
reload_locked (bool force)
{
  if (strncmp (params.peers_file, "dns:", 4) == 0) {
    char *text = resolve_members (params.peers_file);
    if (text == NULL)
      return -1;
    return take_text_locked (text, force);
  }
  struct stat st;
  if (stat (params.peers_file, &st) == -1)
    return -1;
  if (!force) {
    if (same_stat (&st, &fleet.st)) {
      fleet.pending = false;
      return 0;
    }
    /* Changed in place: taken once a second stat saw it the same. */
    if (st.st_ino == fleet.st.st_ino &&
        (!fleet.pending || !same_stat (&st, &fleet.seen))) {
      fleet.seen = st;
      fleet.pending = true;
      return 0;
    }
  }
  fleet.pending = false;
  FILE *fp = fopen (params.peers_file, "re");
  if (fp == NULL)
    return -1;
  struct members *ms = members_read (fp);
  int e = errno;
  fclose (fp);
  if (ms == NULL) {
    errno = e;
    return -1;
  }
  fleet.st = st;
  return install_locked (ms);
}

/* MS becomes the snapshot in use.  Under fleet.lock. */
static int
install_locked (struct members *ms)
{
  members_put_locked (fleet.snap);
  fleet.snap = ms;
  size_t others = ms->n - (ms->self >= 0);
  if (fleet.cache)
    fsc_cache_set_peers_known (fleet.cache, others);
  if (ms->self >= 0)
    nbdkit_debug ("fscache-peers=%s: %zu other peers", params.peers_file,
                  others);
  else
    say_warning ("fscache-peers=%s: fscache-peer-self=%s "
                 "is not one of its %zu members: no node asks this one, "
                 "and it asks the others", params.peers_file,
                 params.peer_self, ms->n);
  return 0;
}

/* The snapshot in use, with a reference (NULL: none), after a reload
 * if the file changed and it was not checked within CHECK_MS.
 */
static struct members *
members_get (void)
{
  int64_t now = peer_now_ms ();
  struct members *ms;
  pthread_mutex_lock (&fleet.lock);
  if (now - fleet.checked >= (fleet.dns_ms ? fleet.dns_ms : CHECK_MS)) {
    fleet.checked = now;
    if (reload_locked (false) == -1)
      nbdkit_debug ("fscache-peers=%s: not read again: %m; keeping the "
                    "last list", params.peers_file);
  }
  ms = fleet.snap;
  if (ms)
    ms->refs++;
  pthread_mutex_unlock (&fleet.lock);
  return ms;
}

/* The first user name of the PSK file ("name:hexkey" lines), which
 * libnbd must present (it would otherwise use the login name).
 */
static char *
psk_user (const char *file)
{
  FILE *fp = fopen (file, "re");
  if (fp == NULL)
    return NULL;
  char line[1024];
  char *user = NULL;
  while (user == NULL && fgets (line, sizeof line, fp)) {
    char *c = strchr (line, ':');
    if (c && c > line) {
      *c = 0;
      user = strdup (line);
      if (user == NULL)
        break;
    }
  }
  if (user == NULL && !ferror (fp))
    errno = EINVAL;
  fclose (fp);
  return user;
}

/* A fleet node holds links to its peers and serves theirs: raise the
 * soft limit on descriptors to the hard one (the default soft 1024 ran
 * out at 24 nodes on one machine, and every peer read then failed at
 * once), and say what there is.
 */
static void
raise_fd_limit (void)
{
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) == -1)
    return;
  rlim_t was = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit (RLIMIT_NOFILE, &rl) == -1)
      rl.rlim_cur = was;
  }
  if (rl.rlim_cur != was)
    say_note ("fscache-peers: descriptors: soft limit raised from %llu to "
              "the hard limit, %llu", (unsigned long long) was,
              (unsigned long long) rl.rlim_cur);
  else
    nbdkit_debug ("fscache-peers: descriptors: limit %llu",
                  (unsigned long long) rl.rlim_cur);
}

int
peers_start (void)
{
  if (params.peers_file == NULL)
    return 0;
  /* Test knob: the peer timeout, so that a test of a stopped peer
   * need not wait the default.
   */
  const char *t = getenv ("NBD_FSCACHE_TEST_PEER_TIMEOUT_MS");
  int timeout_ms = t && atoi (t) > 0 ? atoi (t) : DEFAULT_TIMEOUT_MS;
  if (params.peer_psk &&
      (fleet.psk_user = psk_user (params.peer_psk)) == NULL) {
    nbdkit_error ("fscache-peer-tls-psk=%s: cannot read a user name "
                  "(lines of USER:HEXKEY, as psktool writes): %m",
                  params.peer_psk);
    return -1;
  }
  peer_link_configure (timeout_ms, params.peer_psk, fleet.psk_user,
                       params.peer_self);
  if (strncmp (params.peers_file, "dns:", 4) == 0) {
    const char *d = getenv ("NBD_FSCACHE_TEST_PEER_DNS_MS");
    fleet.dns_ms = d && atoi (d) > 0 ? atoi (d) : DNS_MS;
  }
  raise_fd_limit ();
  fleet.self_seed = XXH3_64bits (params.peer_self, strlen (params.peer_self));
  pthread_mutex_lock (&fleet.lock);
  int r = reload_locked (true);
  pthread_mutex_unlock (&fleet.lock);
  if (r == -1) {
    nbdkit_error ("fscache-peers=%s: %m", params.peers_file);
    return -1;
  }
  return 0;
}

void
peers_bind (struct fsc_cache *cache)
{
  pthread_mutex_lock (&fleet.lock);
  fleet.cache = cache;
  if (fleet.snap)
    fsc_cache_set_peers_known (cache, fleet.snap->n -
                               (fleet.snap->self >= 0));
  pthread_mutex_unlock (&fleet.lock);
}

void
peers_stop (void)
{
  reaper_stop ();
  pthread_mutex_lock (&fleet.lock);
  members_put_locked (fleet.snap);
  fleet.snap = NULL;
  fleet.cache = NULL;
  pthread_mutex_unlock (&fleet.lock);
  free (fleet.psk_user);
  fleet.psk_user = NULL;
  free (fleet.dns_text);
  fleet.dns_text = NULL;
}

bool
peers_enabled (void)
{
  return params.peers_file != NULL;
}

/* N lowercase hex digits at S into *V; false if not. */
static bool
hex_field (const char *s, int n, uint64_t *v)
{
  *v = 0;
  for (int i = 0; i < n; ++i) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ?
      c - 'a' + 10 : -1;
    if (d < 0)
      return false;
    *v = *v << 4 | (unsigned) d;
  }
  return true;
}

int
peers_parse_export (const char *exportname, const char **real,
                    uint64_t *identity, bool *self)
{
  size_t pl = strlen (PEER_EXPORT_PREFIX);
  if (strncmp (exportname, PEER_EXPORT_PREFIX, pl) != 0)
    return 0;
  const char *s = exportname + pl;
  uint64_t id, node, token;
  if (!hex_field (s, 16, &id) || s[16] != ':' || id == 0 ||
      !hex_field (s + 17, 16, &node) || !hex_field (s + 33, 8, &token) ||
      s[41] != ':')
    return -1;
  *real = s + 42;
  *identity = id;
  *self = node == peer_node_id ();
  if (*self)
    peer_link_self_seen ((uint32_t) token);
  return 1;
}

uint64_t
peers_identity (const void *key, size_t klen, uint64_t size,
                const char *generation, uint64_t fingerprint)
{
  XXH3_state_t *st = XXH3_createState ();
  uint64_t h;
  if (st == NULL)
    return 0;
  XXH3_64bits_reset (st);
  uint64_t len = klen;
  XXH3_64bits_update (st, &len, sizeof len);
  XXH3_64bits_update (st, key, klen);
  XXH3_64bits_update (st, &size, sizeof size);
  len = generation ? strlen (generation) + 1 : 0;
  XXH3_64bits_update (st, &len, sizeof len);
  if (generation)
    XXH3_64bits_update (st, generation, len);
  XXH3_64bits_update (st, &fingerprint, sizeof fingerprint);
  h = XXH3_64bits_digest (st);
  XXH3_freeState (st);
  return h ? h : 1;
}

/*----------------------------------------------------------------------
 * Exports and their links.
 */

struct peer_export *
peers_export_get (const char *exportname, const void *key, size_t klen,
                  uint64_t identity)
{
  uint64_t lo, hi;
  fsc_key_hash (key, klen, &lo, &hi);
  pthread_mutex_lock (&exports_lock);
  struct peer_export *pe;
  for (pe = exports; pe; pe = pe->next)
    if (strcmp (pe->exportname, exportname) == 0 &&
        pe->identity == identity && pe->key_lo == lo && pe->key_hi == hi) {
      pe->refs++;
      pthread_mutex_unlock (&exports_lock);
      return pe;
    }
  pe = calloc (1, sizeof *pe);
  if (pe == NULL ||
      (pe->exportname = strdup (exportname)) == NULL ||
      asprintf (&pe->peer_name, PEER_EXPORT_PREFIX "%016" PRIx64,
                identity) == -1) {
    if (pe)
      free (pe->exportname);
    free (pe);
    pthread_mutex_unlock (&exports_lock);
    nbdkit_error ("fscache: peers: %m");
    return NULL;
  }
  reaper_start ();
  pe->refs = 1;
  pe->key_lo = lo;
  pe->key_hi = hi;
  pe->identity = identity;
  pthread_mutex_init (&pe->lock, NULL);
  pe->next = exports;
  exports = pe;
  pthread_mutex_unlock (&exports_lock);
  return pe;
}

void
peers_export_put (struct peer_export *pe)
{
  if (pe == NULL)
    return;
  pthread_mutex_lock (&exports_lock);
  if (--pe->refs > 0) {
    pthread_mutex_unlock (&exports_lock);
    return;
  }
  for (struct peer_export **pp = &exports; *pp; pp = &(*pp)->next)
    if (*pp == pe) {
      *pp = pe->next;
      break;
    }
  pthread_mutex_unlock (&exports_lock);
  /* The last connection is gone: nobody reads through the links. */
  while (pe->links) {
    struct peer_link *l = pe->links;
    pe->links = peer_link_next (l);
    peer_link_free (l);
  }
  members_put (pe->members);
  free (pe->by_member);
  pthread_mutex_destroy (&pe->lock);
  free (pe->exportname);
  free (pe->peer_name);
  free (pe);
}

void
peers_export_written (struct peer_export *pe)
{
  if (pe)
    __atomic_store_n (&pe->written, true, __ATOMIC_RELAXED);
}

/* PE's link to URI, created if none.  Under pe->lock. */
static struct peer_link *
link_of (struct peer_export *pe, const char *uri)
{
  for (struct peer_link *l = pe->links; l; l = peer_link_next (l))
    if (strcmp (peer_link_uri (l), uri) == 0)
      return l;
  struct peer_link *l = peer_link_new (uri, pe->links);
  if (l)
    pe->links = l;
  return l;
}

/* Make PE's by_member follow MS (links for URIs no longer listed stay
 * in pe->links, idle, until the export closes).  Under pe->lock.
 */
static int
follow (struct peer_export *pe, struct members *ms)
{
  if (pe->members == ms)
    return 0;
  struct peer_link **bm = calloc (ms->n ? ms->n : 1, sizeof *bm);
  if (bm == NULL)
    return -1;
  for (size_t i = 0; i < ms->n; ++i)
    if ((long) i != ms->self && (bm[i] = link_of (pe, ms->m[i].uri)) == NULL) {
      free (bm);
      return -1;
    }
  free (pe->by_member);
  pe->by_member = bm;
  pthread_mutex_lock (&fleet.lock);
  ms->refs++;
  members_put_locked (pe->members);
  pthread_mutex_unlock (&fleet.lock);
  pe->members = ms;
  return 0;
}

/* Whom to ask for range R among MS's members (core/peertree.c: the
 * tree of askers), leaving out ourselves, links set aside and the
 * NSKIP links of SKIP (tried already): an index, or -1 for the origin.
 * SC and IX are scratch of MS->n entries.
 */
static long
parent_of (struct peer_export *pe, struct members *ms, struct peer_link **bm,
           uint64_t r, int64_t now, struct peer_link *const *skip,
           int nskip, uint64_t *sc, size_t *ix)
{
  size_t m = 0;
  for (size_t i = 0; i < ms->n; ++i) {
    if ((long) i == ms->self || !peer_link_usable (bm[i], now))
      continue;
    bool skipped = false;
    for (int k = 0; k < nskip; ++k)
      skipped |= bm[i] == skip[k];
    if (skipped)
      continue;
    sc[m] = fsc_peer_score (pe->key_lo, pe->key_hi, r, ms->m[i].seed);
    ix[m++] = i;
  }
  long p = fsc_peer_parent (sc, m,
                            fsc_peer_score (pe->key_lo, pe->key_hi, r,
                                            fleet.self_seed),
                            params.peer_fanout);
  return p < 0 ? -1 : (long) ix[p];
}

/*----------------------------------------------------------------------
 * The fills' reads.
 */

int
peers_pread (struct peer_export *pe, struct fsc_object *obj, void *buf,
             uint32_t count, uint64_t offset, peers_origin_fn *origin,
             void *opaque, int *err)
{
  struct members *ms = NULL;
  if (pe == NULL || __atomic_load_n (&pe->written, __ATOMIC_RELAXED) ||
      (ms = members_get ()) == NULL || ms->n == 0) {
    members_put (ms);
    return origin (opaque, buf, count, offset, err);
  }
  /* The members' links for this snapshot, copied: a reload may
   * replace pe->by_member meanwhile, but a link lives as long as PE.
   * And the scratch of parent_of.
   */
  size_t n = ms->n;
  struct peer_link **links = malloc (n * sizeof *links);
  uint64_t *sc = malloc (n * sizeof *sc);
  size_t *ix = malloc (n * sizeof *ix);
  pthread_mutex_lock (&pe->lock);
  int f = links && sc && ix ? follow (pe, ms) : -1;
  if (f == 0)
    memcpy (links, pe->by_member, n * sizeof *links);
  pthread_mutex_unlock (&pe->lock);
  if (f == -1) {
    free (links);
    free (sc);
    free (ix);
    members_put (ms);
    return origin (opaque, buf, count, offset, err);
  }

  char *p = buf;
  uint64_t end = offset + count;
  uint64_t run = offset;        /* start of the pending origin run */
  int r = 0;
  for (uint64_t pos = offset; pos < end; ) {
    uint64_t rix = pos / RANGE_SIZE;
    uint64_t seg_end = MIN (end, (rix + 1) * RANGE_SIZE);
    struct peer_link *skip[MAX_PEER_TRIES];
    bool got = false;
    for (int t = 0; t < MAX_PEER_TRIES && !got; ++t) {
      long i = parent_of (pe, ms, links, rix, peer_now_ms (), skip, t, sc,
                          ix);
      if (i < 0)
        break;
      /* Ours before it: the origin run ends here. */
      if (run < pos) {
        if (origin (opaque, p + (run - offset), pos - run, run, err) == -1) {
          r = -1;
          goto out;
        }
        run = pos;
      }
      got = peer_link_pread (links[i], pe->peer_name, pe->exportname,
                             ms->m[i].dial, obj, p + (pos - offset),
                             seg_end - pos, pos) == 0;
      skip[t] = links[i];
    }
    if (got)
      run = seg_end;
    pos = seg_end;
  }
  if (run < end && origin (opaque, p + (run - offset), end - run, run,
                           err) == -1)
    r = -1;
 out:
  free (links);
  free (sc);
  free (ix);
  members_put (ms);
  return r;
}
