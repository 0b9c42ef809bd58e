/* nbdkit-fscache-filter: the peer tier.  Proxies on different hosts
 * fetch their misses from each other, so that a fleet reads each
 * range of an image from the origin once.  No daemon and no protocol
 * of our own: peers are proxies of this filter, and speak NBD to each
 * other through libnbd.
 *
 * Membership: fscache-peers=FILE or dns:NAME:PORT, read and followed
 * by members.c.
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
 * (core/base/peertree.c): the first reads the origin, the member at
 * position p asks the one at (p - 1) / K, so that a member serves each
 * range to at most K others, in log_K N hops.  A peer's connection
 * asks upward as a client's does.  K = 0, or N <= K + 1: the flat
 * fleet, where every node asks the owner.  The ranges share
 * fscache-peer-stripes trees (T3: a node's parents, and so its links,
 * at most that many per object whatever N), range r the tree of stripe
 * r mod S.
 *
 * No loops (invariant T1 of core/base/peertree.c).  A node asks only a
 * member whose score for the range is strictly above its own, so a
 * chain of asks never loops, whatever the nodes' files say.  Broken by
 * tests/unit/unit-peertree.c, "chains"; tests/filter/test-fscache-peers.sh, part
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
 * Locks: members.c's guards the snapshot and the reload; each
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
#include <sys/resource.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "keyenc.h"
#include "manifest.h"
#include "peertree.h"
#include "xxh.h"
#include "utils.h"

#include "params.h"
#include "peers.h"
#include "members.h"
#include "peerhealth.h"
#include "peerlink.h"
#include "say.h"

/* One owner per range of this size.  Smaller ranges spread an image
 * more evenly over the fleet (128 MiB over 4 nodes: 32 ranges each at
 * 1 MiB) at the cost of one peer request per MiB, which a LAN answers
 * in well under the time the MiB takes to cross it.
 */
#define RANGE_SIZE (1024 * 1024)

#define MAX_PEER_TRIES 2        /* peers tried for one range */
#define DEFAULT_TIMEOUT_MS 10000

/* The origin fallbacks of one export in flight at once (issue 41):
 * when a parent dies, every read in flight on its ranges fails over
 * to the origin at the same moment, on every node that asked it; a
 * client's queue depth of them per node, N nodes at once, is the surge
 * that takes an origin down.  Past the budget a fallback waits for one
 * to finish, at most the peer timeout (then it goes anyway: a client
 * is never failed for the budget), counted in peer_fallbacks_waited.
 * A fallback is one range at most: one origin read (pool.c splits only
 * reads over 1 MiB).  Broken by test-fscache-peers-tree.sh, part 4.
 */
#define FALLBACK_BUDGET 4

static struct {
  char *psk_user;               /* the PSK file's first user name */
  struct fsc_cache *cache;      /* for the prober's counters */
  uint64_t self_seed;           /* fscache-peer-self's hash: our score */
  int timeout_ms;               /* the peer timeout: a fallback's wait */
} fleet;

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
  pthread_mutex_t lock;         /* links, by_member, members,
                                 * fallbacks */
  pthread_cond_t fallback_done;
  unsigned fallbacks;           /* origin fallbacks in flight */
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
  fsc_thread_name ("fsc-peer-reap");
  pthread_mutex_lock (&reaper.lock);
  while (!reaper.stopping) {
    struct timespec ts;
    deadline_ms (&ts, 1000);
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
  fleet.timeout_ms = timeout_ms;
  if (params.peer_psk &&
      (fleet.psk_user = psk_user (params.peer_psk)) == NULL) {
    nbdkit_error ("fscache-peer-tls-psk=%s: cannot read a user name "
                  "(lines of USER:HEXKEY, as psktool writes): %m",
                  params.peer_psk);
    return -1;
  }
  peer_link_configure (timeout_ms, params.peer_psk, fleet.psk_user,
                       params.peer_certs,
                       params.peer_self);
  raise_fd_limit ();
  fleet.self_seed = XXH3_64bits (params.peer_self, strlen (params.peer_self));
  return members_start ();
}

void
peers_bind (struct fsc_cache *cache)
{
  fleet.cache = cache;
  members_bind (cache);
}

void
peers_stop (void)
{
  reaper_stop ();
  peer_health_prober_stop ();
  fleet.cache = NULL;
  members_stop ();
  free (fleet.psk_user);
  fleet.psk_user = NULL;
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
    peer_health_self_seen ((uint32_t) token);
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
  peer_health_prober_start (fleet.cache, peer_link_probe);
  pe->refs = 1;
  pe->key_lo = lo;
  pe->key_hi = hi;
  pe->identity = identity;
  pthread_mutex_init (&pe->lock, NULL);
  pthread_cond_init (&pe->fallback_done, NULL);
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
  pthread_cond_destroy (&pe->fallback_done);
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
  members_ref (ms);
  members_put (pe->members);
  pe->members = ms;
  return 0;
}

/* Whom to ask for range R among MS's members (core/base/peertree.c: the
 * tree of askers), leaving out ourselves, links set aside and the
 * NSKIP links of SKIP (tried already): an index, or -1 for the origin;
 * *HOPS then our depth in the range's tree (the hops from us to its
 * origin reader, peer_hops).  SC and IX are scratch of MS->n entries.
 */
static long
parent_of (struct peer_export *pe, struct members *ms, struct peer_link **bm,
           uint64_t r, int64_t now, struct peer_link *const *skip,
           int nskip, uint64_t *sc, size_t *ix, unsigned *hops)
{
  const uint64_t s = fsc_peer_stripe (r, params.peer_stripes);
  size_t m = 0;
  for (size_t i = 0; i < ms->n; ++i) {
    if ((long) i == ms->self || !peer_link_usable (bm[i], now))
      continue;
    bool skipped = false;
    for (int k = 0; k < nskip; ++k)
      skipped |= bm[i] == skip[k];
    if (skipped)
      continue;
    sc[m] = fsc_peer_score (pe->key_lo, pe->key_hi, s, ms->m[i].seed);
    ix[m++] = i;
  }
  const uint64_t self = fsc_peer_score (pe->key_lo, pe->key_hi, s,
                                       fleet.self_seed);
  long p = fsc_peer_parent (sc, m, self, params.peer_fanout);
  if (p < 0)
    return -1;
  uint64_t pos = 0;             /* ours: the members above us */
  for (size_t i = 0; i < m; ++i)
    pos += sc[i] > self;
  *hops = fsc_peer_depth (pos, params.peer_fanout);
  return (long) ix[p];
}

/*----------------------------------------------------------------------
 * The fills' reads.
 */

/* Read [POS, END) of PE's export from L's peer into DST.  With
 * fscache-manifest, the whole blocks around it are asked for and
 * checked before anything is taken (issue 43): a peer that sends other
 * bytes (bad memory, a bug, a node of the fleet's key serving
 * anything) is never asked for this export again, said once, counted
 * (peer_bad_data), and the range goes up the tree or to the origin.
 * 0 or -1.
 */
static int
read_checked (struct peer_export *pe, struct peer_link *l, const char *dial,
              struct fsc_object *obj, char *dst, uint64_t pos, uint64_t end)
{
  const struct fsc_manifest *m = params.manifest;
  if (m == NULL)
    return peer_link_pread (l, pe->peer_name, pe->exportname, dial, obj,
                            dst, end - pos, pos);
  uint64_t bs = fsc_manifest_block_size (m);
  uint64_t a = pos & ~(bs - 1);
  uint64_t b = MIN ((end + bs - 1) & ~(bs - 1), fsc_manifest_size (m));
  char *buf = a == pos && b == end ? dst : malloc (b - a);
  if (buf == NULL)
    return -1;
  uint64_t bad;
  int r = peer_link_pread (l, pe->peer_name, pe->exportname, dial, obj, buf,
                           b - a, a);
  if (r == 0 && fsc_manifest_check (m, a, buf, b - a, &bad) == -1) {
    fsc_object_count_peer (obj, FSC_PEER_BAD_DATA, 1);
    if (peer_link_mark_bad (l))
      nbdkit_error ("fscache: peer %s sent export \"%s\" data that does not "
                    "match fscache-manifest=%s (the block at %" PRIu64 "): "
                    "not asking it for this export again; its cache, its "
                    "memory or its origin is not to be trusted",
                    peer_link_uri (l), pe->exportname, params.manifest_file,
                    bad);
    r = -1;
  }
  if (r == 0 && buf != dst)
    memcpy (dst, buf + (pos - a), end - pos);
  if (buf != dst)
    free (buf);
  return r;
}

/* Read [POS, POS + N) from the origin for a range whose peers failed,
 * within PE's FALLBACK_BUDGET (see there).
 */
static int
fallback (struct peer_export *pe, struct fsc_object *obj,
          peers_origin_fn *origin, void *opaque, char *dst, uint64_t n,
          uint64_t pos, int *err)
{
  fsc_object_count_peer (obj, FSC_PEER_FALLBACKS, 1);
  struct timespec until;
  deadline_ms (&until, (uint64_t) fleet.timeout_ms);
  pthread_mutex_lock (&pe->lock);
  if (pe->fallbacks >= FALLBACK_BUDGET) {
    fsc_object_count_peer (obj, FSC_PEER_FALLBACKS_WAITED, 1);
    while (pe->fallbacks >= FALLBACK_BUDGET &&
           pthread_cond_timedwait (&pe->fallback_done, &pe->lock,
                                   &until) != ETIMEDOUT)
      ;
  }
  pe->fallbacks++;
  pthread_mutex_unlock (&pe->lock);
  int r = origin (opaque, dst, n, pos, err);
  pthread_mutex_lock (&pe->lock);
  pe->fallbacks--;
  pthread_cond_signal (&pe->fallback_done);
  pthread_mutex_unlock (&pe->lock);
  return r;
}

int
peers_pread (struct peer_export *pe, struct fsc_object *obj, void *buf,
             uint32_t count, uint64_t offset, peers_origin_fn *origin,
             void *opaque, int *err)
{
  struct members *ms = NULL;
  if (pe == NULL || __atomic_load_n (&pe->written, __ATOMIC_RELAXED) ||
      fsc_object_written_ever (obj) ||
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
    int skip_n = 0;             /* peers tried for this range */
    unsigned hops = 0;
    for (int t = 0; t < MAX_PEER_TRIES && !got; ++t) {
      long i = parent_of (pe, ms, links, rix, peer_now_ms (), skip, t, sc,
                          ix, &hops);
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
      got = read_checked (pe, links[i], ms->m[i].dial, obj,
                          p + (pos - offset), pos, seg_end) == 0;
      skip[t] = links[i];
      skip_n = t + 1;
    }
    if (got) {
      run = seg_end;
      fsc_object_count_peer (obj, FSC_PEER_HOPS, hops);
    }
    else if (skip_n > 0) {
      /* The origin run before POS was read before the first try. */
      if (fallback (pe, obj, origin, opaque, p + (pos - offset),
                    seg_end - pos, pos, err) == -1) {
        r = -1;
        goto out;
      }
      run = seg_end;
    }
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
