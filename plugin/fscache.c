/* nbdkit-fscache-filter: a persistent, coherent, checksummed local
 * cache of a slow upstream's blocks.
 *
 * This file is the thin nbdkit side: the filter's callbacks, which
 * turn NBD requests into calls of libfscache (core/fscache.h), which
 * does the caching.  Beside it, one concern each:
 *
 *   params.c    the fscache-* parameters, parsed and checked;
 *   identity.c  each export's object key and coherency fingerprint;
 *   upstream.c  every call to the upstream, gated;
 *   writeback.c fscache-mode=writeback: the writer's upstream, who may
 *               open an object with a write log, the client's requests
 *               through the log.
 *
 * Every call to the upstream, from a client request or from a
 * readahead thread, goes through upstream.c, which keeps the
 * upstream's thread model: misses of many requests and connections
 * proceed in parallel where the upstream allows it, one at a time per
 * connection or per server where it does not, and hits never wait for
 * the upstream at all.
 *
 * State: the process's cache and trace (struct filter_state, one
 * instance, from .config_complete to .cleanup) and each connection's
 * struct handle.  See nbdkit-fscache-filter(1) for the user's view.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "keyenc.h"
#include "readahead.h"
#include "trace.h"
#include "blocksize.h"
#include "pool.h"
#include "peers.h"
#include "catchup.h"
#include "view.h"
#include "upstream.h"
#include "utils.h"

#include "identity.h"
#include "params.h"
#include "writeback.h"

/* The process's cache state, open from .config_complete to .cleanup
 * and shared by every connection (core/ locks what it needs).
 */
static struct filter_state {
  struct fsc_cache *cache;
  struct fsc_trace *trace;      /* fscache-trace, or NULL */
  time_t skips_said_at;         /* last note of skipped fills (also
                                 * read without skips_lock), and */
  uint64_t skips_said;          /* fill_skipped_bytes then (skips_lock) */
} state;
static pthread_mutex_t skips_lock = PTHREAD_MUTEX_INITIALIZER;

/* Skipped fills are logged at most once in this many seconds. */
#define SKIP_LOG_SECONDS 60

/* A read starting within this of where the last one ended is near
 * it.  Two near reads in a row (a stream whose requests overtake each
 * other, a reader skipping a little), or an exactly sequential one,
 * get whole blocks (FSC_READ_NEAR); any other read only the pieces it
 * covers.  Random reads land near twice in a row with a chance of
 * about (2 * NEAR_BYTES / export size)^2: 0.1% over 16 MiB.
 */
#define NEAR_BYTES (256 * 1024)

struct handle {
  struct fsc_object *obj;
  uint64_t size;                /* the export's size, fixed at .prepare */
  time_t err_said;              /* last upstream failure logged (atomic) */
  uint64_t last_end;            /* end of the last read (atomic) */
  bool last_near;               /* the last read was near the one
                                 * before (atomic) */
  unsigned err_unsaid;          /* failures since, not logged (atomic) */
  struct fsc_readahead *ra;     /* NULL if fscache-readahead=0 */
  struct upstream upstream;     /* this connection's upstream, gated */
  struct fsc_upstream up;       /* the same, for core/ */
  char *exportname;
  bool traced;                  /* its reads go into the trace */
  struct wb *wb;                /* writeback mode: the export's writer
                                 * and log (the process's, shared) */
  struct pool *pool;            /* its reads' pool of upstream contexts,
                                 * or NULL (pool.c) */
  bool need_view;               /* an upstream without multi-conn: once
                                 * written, one view for all (view.c) */
  struct view *view;            /* that view, once this connection has
                                 * seen it open, or NULL (atomic) */
  bool wbmode;                  /* writeback mode, and the upstream
                                 * can write (wb_wanted) */
  struct peer_export *fleet;    /* its misses ask the range's owner
                                 * among the peers (peers.c), or NULL */
  uint64_t peer_want;           /* a peer's connection: the identity it
                                 * asked for; 0 for a client's */
  bool peer_serving;            /* a peer's connection, accepted: its
                                 * misses go to the origin only (P1) */
};

/* Held while a connection opens an object not yet open in this
 * process: the write log's flock is per open file, so two connections
 * of one process racing to open it would refuse each other.  Only
 * first opens take it, never a request.
 */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

static void
fscache_unload (void)
{
  params_free ();
}

/* Ours (fscache-*), or the plugin's, which go on to it. */
static int
fscache_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *k, const char *value)
{
  int r = params_config (k, value);
  if (r <= 0)
    return r;
  return next (nxdata, k, value);
}

/* Is the stats file a symlink (or other non-regular file)?  Then it is
 * refused: a link planted there must not redirect our writes, and a
 * rename over it would silently replace someone's link.
 */
static bool
stats_file_refused (void)
{
  struct stat st;
  return lstat (params.stats_file, &st) == 0 && !S_ISREG (st.st_mode);
}

static int
fscache_config_complete (nbdkit_next_config_complete *next,
                         nbdkit_backend *nxdata)
{
  if (params_config_complete () == -1)
    return -1;
  if (params.stats_file && stats_file_refused ()) {
    nbdkit_error ("fscache-stats=%s: not a regular file (a symlink?): "
                  "refusing to write through it", params.stats_file);
    return -1;
  }

  if (peers_start () == -1)
    return -1;

  /* Created now (before the cache, so that a refused start creates no
   * cache directory), so that a trace that cannot be written is an
   * error at start-up rather than a silent loss.
   */
  if (params.trace_file &&
      fsc_trace_open (params.trace_file, params.trace_max,
                      &state.trace) == -1) {
    nbdkit_error ("fscache-trace=%s: %m", params.trace_file);
    return -1;
  }

  char why[512] = "";
  struct fsc_cache_config cfg = {
    .dir = params.dir,
    .create = true,
    .min_free_pct = params.min_free,
    .min_free_files_pct = params.min_free_inodes,
    .faults = getenv ("NBD_FSCACHE_FAULTS"),
    .why = why,
    .why_len = sizeof why,
  };
  if (fsc_cache_open (&cfg, &state.cache) == -1) {
    switch (errno) {
    case EPERM:
      if (why[0]) {
        nbdkit_error ("fscache-dir: %s", why);
        break;
      }
      nbdkit_error ("fscache-dir=%s: refusing to use a cache directory "
                    "owned by another user or writable by others "
                    "(it should be mode 0700 and owned by uid %d)",
                    params.dir, (int) geteuid ());
      break;
    case EPROTONOSUPPORT:
      nbdkit_error ("fscache-dir=%s: written by a newer nbd-fscache; "
                    "refusing to touch it", params.dir);
      break;
    case EINVAL:
      nbdkit_error ("NBD_FSCACHE_FAULTS: malformed fault spec");
      break;
    default:
      nbdkit_error ("fscache-dir=%s: cannot create or open the cache "
                    "directory: %m", params.dir);
    }
    return -1;
  }
  peers_bind (state.cache);
  return next (nxdata);
}

/* The server's final thread model: how upstream calls must be gated. */
static int
fscache_get_ready (int thread_model)
{
  upstream_set_thread_model (thread_model);
  if (params.mode == MODE_WRITEBACK && !upstream_model_allows_shared ()) {
    nbdkit_error ("fscache-mode=writeback: the upstream's thread model "
                  "(%s) allows one connection at a time, and the writer "
                  "needs one of its own", upstream_thread_model_name ());
    return -1;
  }
  nbdkit_debug ("fscache: upstream calls follow thread model %s",
                upstream_thread_model_name ());
  return 0;
}

static int
fscache_after_fork (nbdkit_backend *nxdata)
{
  if (fsc_cache_start (state.cache) == -1) {
    nbdkit_error ("fscache: starting the committer thread: %m");
    return -1;
  }
  wb_set_backend (nxdata);
  pool_set_backend (nxdata);
  view_set_backend (nxdata);
  catchup_set_backend (nxdata);
  return 0;
}

/* Write the counters to a fresh file with an unpredictable name in
 * FILE's directory (mkostemp: O_CREAT | O_EXCL, so never through a
 * planted link or FIFO), mode 0644 whatever the umask, and rename it
 * over FILE.
 */
static void
write_stats (void)
{
  if (!params.stats_file || !state.cache)
    return;
  struct fsc_stats st;
  char buf[4096];
  CLEANUP_FREE char *tmp = NULL;

  if (stats_file_refused ()) {
    nbdkit_error ("fscache-stats=%s: not a regular file (a symlink?): "
                  "not written", params.stats_file);
    return;
  }
  fsc_cache_stats (state.cache, &st);
  size_t len = fsc_stats_format (&st, buf, sizeof buf);
  if (len >= sizeof buf ||
      asprintf (&tmp, "%s.XXXXXX", params.stats_file) == -1) {
    tmp = NULL;
    return;
  }
  int fd = mkostemp (tmp, O_CLOEXEC);
  if (fd == -1) {
    nbdkit_debug ("fscache-stats=%s: %m", params.stats_file);
    return;
  }
  bool ok = write (fd, buf, len) == (ssize_t) len && fchmod (fd, 0644) == 0;
  if (close (fd) == -1)
    ok = false;
  if (!ok || rename (tmp, params.stats_file) == -1) {
    nbdkit_debug ("fscache-stats=%s: %m", params.stats_file);
    unlink (tmp);
  }
}

static void
fscache_cleanup (nbdkit_backend *nxdata)
{
  /* Writers first: they write back through the cache's objects. */
  catchup_stop_all ();
  wb_shutdown_all ();
  view_close_all ();
  if (state.cache) {
    /* The fills still queued count in the stats written below. */
    fsc_cache_drain (state.cache);
    fsc_cache_commit_all (state.cache);
    write_stats ();
    fsc_cache_close (state.cache);
    state.cache = NULL;
  }
  if (state.trace) {
    uint64_t rec = 0;
    if (fsc_trace_close (state.trace, &rec) == -1)
      nbdkit_error ("fscache-trace=%s: writing the trace: %m",
                    params.trace_file);
    else
      nbdkit_debug ("fscache-trace=%s: %" PRIu64 " bytes recorded",
                    params.trace_file, rec);
    state.trace = NULL;
  }
  peers_stop ();
}

/*----------------------------------------------------------------------
 * Connections.
 */

/* The upstream context is ours, not nbdkit's (upstream.h says why):
 * opened here, prepared in .prepare, finalized in .finalize, closed in
 * .close, each through the connection's gate.  nbdkit therefore passes
 * NEXT == NULL to every callback, which use h->upstream instead.
 */
/* The core's upstream reads (misses, pieces, prefetches) of connection
 * OPAQUE: through its pool if it has one, else its own context; in
 * shapes the upstream accepts (blocksize.c).
 */
/* The view of H's export, if it needs one (view.c): opened if WRITING
 * (the first write makes it), else only found if already open.  NULL
 * if none: the connection's own context (or the pool) then.
 */
static struct view *
view_of (struct handle *h, bool writing)
{
  if (!h->need_view)
    return NULL;
  struct view *v = __atomic_load_n (&h->view, __ATOMIC_ACQUIRE);
  if (v)
    return v;
  v = writing ? view_get (h->exportname) : view_find (h->exportname);
  if (v == NULL)
    return NULL;
  struct view *none = NULL;
  if (!__atomic_compare_exchange_n (&h->view, &none, v, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    view_put (v);               /* another thread of ours was first */
    v = none;
  }
  return v;
}

/* Where H's data calls go: its export's view once there is one, else
 * its own context.  A write that cannot open the view fails (EIO,
 * said by view_get) rather than write through a second view.
 */
static struct upstream *
data_upstream (struct handle *h, bool writing, int *err)
{
  struct view *v = view_of (h, writing);
  if (v)
    return view_upstream (v);
  if (writing && h->need_view) {
    *err = EIO;
    return NULL;
  }
  return &h->upstream;
}

static int
origin_pread (void *opaque, void *buf, uint32_t count, uint64_t offset,
              int *err)
{
  struct handle *h = opaque;
  struct view *v = view_of (h, false);
  return v ? bs_pread (view_upstream (v), buf, count, offset, 0, err)
    : pool_pread (h->pool, &h->upstream, buf, count, offset, err);
}

/* ... and with a fleet, the ranges other peers own from them. */
static int
fill_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  struct handle *h = opaque;
  int err = 0;
  if (h->fleet ? peers_pread (h->fleet, h->obj, buf, count, offset,
                              origin_pread, h, &err)
      : origin_pread (h, buf, count, offset, &err)) {
    errno = err ? err : EIO;
    return -1;
  }
  return 0;
}

/* Refuse a peer's connection (PEER_EXPORT_PREFIX export name) for WHY:
 * its asker then goes to the next owner or the origin.  Said at most
 * once a minute.
 */
static void
refuse_peer (const char *exportname, const char *why)
{
  static time_t said;
  time_t now = time (NULL);
  time_t last = __atomic_load_n (&said, __ATOMIC_RELAXED);
  fsc_cache_count_peer (state.cache, FSC_PEER_REFUSED, 1);
  if (now - last >= 60 &&
      __atomic_compare_exchange_n (&said, &last, now, false,
                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    nbdkit_error ("fscache: refusing a peer's connection for \"%s\": %s "
                  "(peer_refused counts them)", exportname, why);
  else
    nbdkit_debug ("fscache: refusing a peer's connection for \"%s\": %s",
                  exportname, why);
}

static void *
fscache_open (nbdkit_next_open *next, nbdkit_context *nxdata,
              int readonly, const char *exportname, int is_tls)
{
  /* A peer's connection: it reads the export named after the prefix,
   * if this node is in a fleet that may serve it (peers.c).
   */
  const char *real;
  uint64_t want = 0;
  int pr = peers_parse_export (exportname, &real, &want);
  const char *why = pr == -1 ? "malformed peer export name"
    : pr == 0 ? NULL
    : !peers_enabled () ? "this proxy has no fscache-peers"
    : params.mode == MODE_WRITEBACK ? "writeback objects are not shared"
    : params.peer_psk && !is_tls ? "fscache-peer-tls-psk is set and the "
    "connection has no TLS" : NULL;
  if (why) {
    refuse_peer (exportname, why);
    return NULL;
  }
  if (pr == 1)
    exportname = real;
  struct handle *h = calloc (1, sizeof *h);
  if (h == NULL || (h->exportname = strdup (exportname)) == NULL) {
    nbdkit_error ("calloc: %m");
    free (h);
    return NULL;
  }
  h->up.pread = fill_pread;
  h->up.opaque = h;
  h->peer_want = want;
  if (upstream_open (&h->upstream, nxdata, readonly, exportname) == -1 &&
      !params.offline) {
    nbdkit_error ("fscache: export \"%s\": cannot open the upstream "
                  "(fscache-offline=true would serve what is cached)",
                  exportname);
    upstream_close (&h->upstream);
    free (h->exportname);
    free (h);
    return NULL;
  }
  return h;
}

static void
fscache_close (void *handle)
{
  struct handle *h = handle;
  /* Only if .finalize did not run (a failed .prepare). */
  fsc_readahead_free (h->ra);
  if (h->obj)
    fsc_object_close (h->obj);
  pool_put (h->pool);
  peers_export_put (h->fleet);
  view_put (h->view);
  upstream_close (&h->upstream);
  free (h->exportname);
  free (h);
}

/* The trace follows the first export opened; the others' reads are
 * not recorded (one trace, one object: its replay warms that object).
 */
static void
bind_trace (struct handle *h, const char *k, size_t klen, uint64_t size)
{
  if (state.trace == NULL)
    return;
  uint64_t lo, hi;
  fsc_key_hash (k, klen, &lo, &hi);
  int r = fsc_trace_bind (state.trace, lo, hi, size, params.block_size);
  if (r == -1)
    nbdkit_error ("fscache-trace=%s: writing the header: %m",
                  params.trace_file);
  else if (r == 0)
    nbdkit_debug ("fscache-trace: export \"%s\" is not traced (the trace "
                  "follows the first export opened)", h->exportname);
  h->traced = r == 1;
}

static void log_notices (struct handle *h);

static const char *
validate_name (int v)
{
  switch (v) {
  case FSC_VALIDATE_NONE: return "none";
  case FSC_VALIDATE_SIZE: return "size";
  case FSC_VALIDATE_SAMPLE: return "sample";
  default: return "?";
  }
}

/* After a connection's object is ready: its readahead, and the noting
 * of skipped fills for the catch-up worker (catchup.c; not in
 * writeback mode, nor with fscache-catchup=false).
 */
static int
start_readahead (struct handle *h)
{
  if (params.catchup && !h->wbmode &&
      fsc_object_state (h->obj) == FSC_OBJ_AVAILABLE)
    fsc_catchup_enable (h->obj, true);
  /* A peer asks for exactly the ranges it wants: reading ahead of it
   * would fetch ranges other peers own.
   */
  if (params.readahead == 0 || h->peer_serving ||
      fsc_object_state (h->obj) != FSC_OBJ_AVAILABLE ||
      !upstream_available (&h->upstream))
    return 0;
  /* With a pool, one prefetch per context runs at a time, and the
   * window is at least two chunks per context, so that a stream keeps
   * them all busy (a serial upstream's round trip is per request: only
   * requests in flight at once cover it).
   */
  unsigned threads = upstream_max_background ();
  uint64_t window = params.readahead;
  if (h->pool) {
    threads = MIN (params.upstream_connections, FSC_RA_THREADS_MAX);
    window = MAX (window, (uint64_t) threads * 2 * FSC_RA_CHUNK);
  }
  h->ra = fsc_readahead_new (h->obj, window, threads, &h->up);
  if (h->ra == NULL) {
    nbdkit_error ("fscache: readahead: %m");
    return -1;
  }
  return 0;
}

/* The object is open: the fleet's part, then readahead.  The identity
 * peers compare (peers.c, P2) is the object's tag, computed by the
 * connection that opened it (FP: the sampled fingerprint if it took
 * one), so that joining connections need not read the upstream again.
 * A peer's connection asking for another identity is refused; one
 * asking for ours is served, and never asks peers itself (P1).
 */
static int
connection_ready (struct handle *h, const char *k, size_t klen,
                  uint64_t size, const uint64_t *fp)
{
  if (!peers_enabled () || h->wbmode || !upstream_available (&h->upstream)) {
    if (h->peer_want) {
      refuse_peer (h->exportname, h->wbmode
                   ? "writeback objects are not shared"
                   : "no upstream to fetch the misses from");
      return -1;
    }
    return start_readahead (h);
  }
  uint64_t id = fsc_object_tag (h->obj);
  if (id == 0) {
    uint64_t f;
    if (fp)
      f = *fp;
    else if (fingerprint (&h->upstream, k, klen, size, &f) == -1) {
      nbdkit_error ("fscache: export \"%s\": reading the sample that "
                    "identifies it to peers: %m; not using peers",
                    h->exportname);
      if (h->peer_want)
        return -1;
      return start_readahead (h);
    }
    id = peers_identity (k, klen, size, params.generation, f);
    fsc_object_set_tag (h->obj, id);
  }
  if (h->peer_want) {
    if (h->peer_want != id) {
      refuse_peer (h->exportname, "the asker has another version of it "
                   "(key, size, generation or sampled content differ)");
      return -1;
    }
    h->peer_serving = true;
  }
  else
    h->fleet = peers_export_get (h->exportname, k, klen, id);
  return start_readahead (h);
}

/* The upstream could not be opened and fscache-offline is set: serve
 * the recorded copy read-only, as it was last validated, if there is
 * one that passes every check but the fingerprint.
 */
static int
prepare_offline (struct handle *h, struct fsc_object_params *p)
{
  uint64_t size;
  if (fsc_object_peek_size (state.cache, p->key, p->key_len,
                            params.block_size, &size) == -1) {
    nbdkit_error ("fscache: export \"%s\": upstream unavailable, and no "
                  "cached copy to serve (%m)", h->exportname);
    return -1;
  }
  /* Written data not yet written back: the copy alone is stale. */
  struct fsc_wlog_info wi;
  int wr = fsc_wlog_peek (state.cache, p->key, p->key_len, &wi);
  if (wr == -1 && (errno == EUCLEAN || errno == EBADMSG)) {
    nbdkit_error ("fscache: export \"%s\": upstream unavailable, and the "
                  "cache's write log for it is damaged (%m; see "
                  "nbd-fscache check); refusing to serve a stale copy",
                  h->exportname);
    return -1;
  }
  if (wr == 0 && wi.records) {
    nbdkit_error ("fscache: export \"%s\": upstream unavailable, and the "
                  "cache holds %" PRIu64 " bytes written in writeback mode "
                  "that the upstream lacks; refusing to serve a stale copy",
                  h->exportname, wi.dirty_bytes);
    return -1;
  }
  p->size = size;
  p->offline = true;
  struct fsc_open_info info = { .shared = true };
  h->obj = fsc_object_get (state.cache, p);
  if (h->obj == NULL &&
      fsc_object_open (state.cache, p, &h->obj, &info) == -1) {
    nbdkit_error ("fscache: opening the cache object: %m");
    return -1;
  }
  if (fsc_object_state (h->obj) != FSC_OBJ_AVAILABLE) {
    nbdkit_error ("fscache: export \"%s\": upstream unavailable, and the "
                  "cached copy cannot be served (%s)", h->exportname,
                  info.busy ? "another process holds it" :
                  info.reason != FSC_OK ? fsc_reason_name (info.reason) :
                  "withdrawn");
    fsc_object_close (h->obj);
    h->obj = NULL;
    return -1;
  }
  h->size = size;
  nbdkit_error ("fscache: warning: export \"%s\": upstream unavailable; "
                "serving the cached copy read-only, as last validated "
                "(%" PRIu64 " blocks cached; reads of the rest fail with "
                "EIO)", h->exportname, fsc_object_present_blocks (h->obj));
  return 0;
}


/* Test knob: with NBD_FSCACHE_TEST_OPEN_GATE=DIR, an open stops
 * between opening the object and checking the write log (in writeback
 * mode: between the log and the object): it creates DIR/reached and
 * waits until DIR/go exists, so tests/test-wb-open-race.sh can run
 * another process's open in that gap.
 */
static void
open_gate (void)
{
  const char *dir = getenv ("NBD_FSCACHE_TEST_OPEN_GATE");
  if (dir == NULL || *dir == 0)
    return;
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/reached", dir);
  FILE *fp = fopen (path, "w");
  if (fp)
    fclose (fp);
  snprintf (path, sizeof path, "%s/go", dir);
  while (access (path, F_OK) == -1)
    usleep (10000);
}

/* If the object is open in this process already, join it (and its
 * writer, in writeback mode) and return true; h->obj is then NULL only
 * if joining failed (said).  LOCKED: we hold open_lock.  Without it, an
 * object open but without its writer yet may be one whose first
 * connection is still starting the writer (under open_lock): then
 * return false, so that the caller asks again under the lock.
 */
static bool
join_open (struct handle *h, const struct fsc_object_params *p,
           const char *k, size_t klen, bool locked)
{
  h->obj = fsc_object_get (state.cache, p);
  if (h->obj == NULL)
    return false;
  if (h->wbmode) {
    h->wb = wb_find (k, klen);
    if (h->wb == NULL && !locked) {
      fsc_object_close (h->obj);
      h->obj = NULL;
      return false;
    }
    if (h->wb == NULL) {
      /* Open here without a writer: its first open was refused one. */
      nbdkit_error ("fscache: export \"%s\": no writeback for it in this "
                    "process (see the first connection's error)",
                    h->exportname);
      fsc_object_close (h->obj);
      h->obj = NULL;
      return true;
    }
  }
  bind_trace (h, k, klen, h->size);
  return true;
}

/* Writeback for H?  Only in writeback mode, and only if the upstream
 * can write: over one that cannot (pattern, a read-only server) the
 * plugin alone, writethrough and nbdkit's cache filter all serve the
 * export read-only, and so does writeback, said once per process;
 * writing it back would fail anyway.  An upstream whose can_write
 * fails is refused, as the plugin alone would be.  Sets h->wbmode.
 * Returns 0 or -1.  (Issue 29, item 1: tests/test-transparent.sh.)
 */
static int
wb_wanted (struct handle *h)
{
  static bool said;
  h->wbmode = false;
  if (params.mode != MODE_WRITEBACK)
    return 0;
  int w = upstream_can_write (&h->upstream);
  if (w == -1)
    return -1;
  h->wbmode = w == 1;
  if (w == 0 && !__atomic_test_and_set (&said, __ATOMIC_RELAXED))
    nbdkit_error ("fscache: warning: export \"%s\": fscache-mode=writeback, "
                  "but the upstream cannot write: serving it read-only, "
                  "cached as in writethrough mode", h->exportname);
  return 0;
}

static int
fscache_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  size_t klen;
  CLEANUP_FREE char *k = object_key (h->exportname, &klen);
  if (k == NULL) {
    nbdkit_error ("malloc: %m");
    return -1;
  }
  if (upstream_prepare (&h->upstream) == -1)
    return -1;
  h->need_view = params.mode != MODE_WRITEBACK &&
    upstream_available (&h->upstream) && view_wanted (&h->upstream);
  if (h->pool == NULL && upstream_available (&h->upstream) &&
      pool_wanted (&h->upstream))
    h->pool = pool_get (h->exportname);

  struct fsc_object_params p = {
    .key = k, .key_len = klen, .block_size = params.block_size,
    .verify = params.verify, .validate = params.validate,
    .generation = params.generation, .max_size = params.max_size,
    .resident_groups = params.resident_groups,
  };
  if (!upstream_available (&h->upstream))
    return prepare_offline (h, &p);
  if (wb_wanted (h) == -1)
    return -1;
  /* The write log is one process's: never shared (core/share-*.c). */
  p.exclusive = h->wbmode;

  int64_t size = upstream_get_size (&h->upstream);
  if (size == -1)
    return -1;
  h->size = p.size = size;
  bs_check_block_size (&h->upstream, params.block_size);

  /* Another connection has the object open: it was validated then. */
  if (join_open (h, &p, k, klen, false))
    return h->obj ? connection_ready (h, k, klen, size, NULL) : -1;

  struct fscache_sample_set set = { 0 };
  if (params.validate == FSC_VALIDATE_SAMPLE &&
      fingerprint_regions (&h->upstream, k, klen, size, &set,
                           &p.fingerprint) == -1) {
    nbdkit_error ("fscache: reading the coherency sample upstream: %m");
    return -1;
  }

  pthread_mutex_lock (&open_lock);
  if (join_open (h, &p, k, klen, true)) {
    pthread_mutex_unlock (&open_lock);
    return h->obj ? connection_ready (h, k, klen, size, NULL) : -1;
  }
  /* The log and the object, in the order that leaves no gap between
   * the check of one and the open of the other for a process in
   * another mode (the open race, issue 25): a writeback process takes
   * the log's flock, then the object to itself, and refuses an object
   * another process holds.  Any other process opens (holds or joins)
   * the object first and checks the log after: a writeback process
   * that came first holds the log (EBUSY: refused here); one that
   * comes later finds the object held and refuses.  Checking the log
   * first left a gap in which a writeback process could take both, and
   * this one would then serve the object uncached, writing around that
   * process's dirty log.  Broken by tests/test-wb-open-race.sh.
   */
  bool wbmode = h->wbmode;
  struct fsc_wlog *wl = NULL;
  if (wbmode && wb_check_log (state.cache, h->exportname, k, klen, size,
                              &set, wbmode, &wl) == -1) {
    pthread_mutex_unlock (&open_lock);
    return -1;
  }
  if (wbmode)
    open_gate ();
  struct fsc_open_info info;
  if (fsc_object_open (state.cache, &p, &h->obj, &info) == -1) {
    pthread_mutex_unlock (&open_lock);
    if (errno == EPERM && info.refused)
      nbdkit_error ("fscache: export \"%s\": process %d holds its cache "
                    "object in %s with fscache-block-size=%" PRIu32
                    " fscache-validate=%s, and this one has "
                    "fscache-block-size=%" PRIu32 " fscache-validate=%s; "
                    "refusing (one object is shared by every process: "
                    "give them the same settings, or another "
                    "fscache-key)", h->exportname, info.owner_pid,
                    params.dir, info.owner_block_size,
                    validate_name (info.owner_validate), params.block_size,
                    validate_name (params.validate));
    else
      nbdkit_error ("fscache: opening the cache object: %m");
    fsc_wlog_close (wl);
    return -1;
  }
  if (!wbmode) {
    open_gate ();
    if (wb_check_log (state.cache, h->exportname, k, klen, size, &set,
                      wbmode, &wl) == -1) {
      pthread_mutex_unlock (&open_lock);
      fsc_object_close (h->obj);
      h->obj = NULL;
      return -1;
    }
  }
  if (wl) {
    h->wb = wb_start (state.cache, h->exportname, k, klen, wl, h->obj,
                      &info);
    if (h->wb == NULL) {
      pthread_mutex_unlock (&open_lock);
      fsc_object_close (h->obj);
      h->obj = NULL;
      return -1;
    }
  }
  pthread_mutex_unlock (&open_lock);
  if (info.busy)
    nbdkit_error ("fscache: warning: export \"%s\" is cached by another "
                  "process using %s%s; serving it uncached",
                  h->exportname, params.dir,
                  info.reason == FSC_REJ_UPSTREAM_SIZE ||
                  info.reason == FSC_REJ_GENERATION ||
                  info.reason == FSC_REJ_FINGERPRINT
                  ? ", for a different upstream (size, generation or "
                  "sample)" : "");
  else if (info.joined)
    nbdkit_debug ("fscache: export \"%s\": joined the copy of process %d "
                  "(%" PRIu64 " blocks cached)", h->exportname,
                  info.owner_pid, info.present_blocks);
  else if (info.err == EPERM || info.err == ENOTDIR)
    nbdkit_error ("fscache: warning: export \"%s\": cache unusable: its "
                  "fan-out directory in %s/objects (or a file in it) is not "
                  "this user's alone (owned by another user, writable by "
                  "others, or not a directory: it must be uid %d's, mode "
                  "0700); refusing it and serving the export uncached",
                  h->exportname, params.dir, (int) geteuid ());
  else if (info.err)
    nbdkit_error ("fscache: warning: export \"%s\": cache unusable (%s); "
                  "serving it uncached", h->exportname,
                  strerror (info.err));
  else if (!info.shared) {
    if (info.reason != FSC_OK && info.reason != FSC_REJ_NEW)
      nbdkit_error ("fscache: warning: export \"%s\": discarding cached "
                    "data (%s), starting cold", h->exportname,
                    fsc_reason_name (info.reason));
    if (info.old_version)
      nbdkit_error ("fscache: export \"%s\": cache index of format "
                    "version %u read and upgraded to version %u",
                    h->exportname, info.old_version, FSC_INDEX_VERSION);
    if (info.unclean)
      nbdkit_error ("fscache: warning: export \"%s\": previous user did "
                    "not shut down cleanly; the cache was checked and "
                    "kept", h->exportname);
    nbdkit_debug ("fscache: export \"%s\": %s, %" PRIu64 " blocks cached",
                  h->exportname, fsc_reason_name (info.reason),
                  info.present_blocks);
  }
  bind_trace (h, k, klen, size);
  return connection_ready (h, k, klen, size,
                           params.validate == FSC_VALIDATE_SAMPLE
                           ? &p.fingerprint : NULL);
}

static int
fscache_finalize (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  if (h->obj == NULL)
    return upstream_finalize (&h->upstream);
  /* Readahead threads use this connection's upstream: stop them first. */
  fsc_readahead_free (h->ra);
  h->ra = NULL;
  if (fsc_object_needs_fingerprint (h->obj)) {
    size_t klen;
    uint64_t fp;
    CLEANUP_FREE char *k = object_key (h->exportname, &klen);
    int64_t size = upstream_get_size (&h->upstream);
    /* If we cannot fingerprint, the index stays marked stale and the
     * next open starts cold: safe.
     */
    if (k && size >= 0 &&
        fingerprint (&h->upstream, k, klen, size, &fp) == 0)
      fsc_object_set_fingerprint (h->obj, fp);
  }
  log_notices (h);
  fsc_object_close (h->obj);
  h->obj = NULL;
  write_stats ();
  return upstream_finalize (&h->upstream);
}

/*----------------------------------------------------------------------
 * Data.
 */

/* Say that the cache disk could not keep up and fills were skipped
 * (core/fill.c, FSC_NOTICE_SKIPPED): at once the first time, then at
 * most once a minute for the process, with the bytes skipped since.
 */
static void
log_skipped_fills (struct handle *h)
{
  time_t now = time (NULL);
  time_t said = __atomic_load_n (&state.skips_said_at, __ATOMIC_RELAXED);
  if (said != 0 && now - said < SKIP_LOG_SECONDS)
    return;                     /* the usual case: no lock */
  pthread_mutex_lock (&skips_lock);
  if (state.skips_said_at == 0 ||
      now - state.skips_said_at >= SKIP_LOG_SECONDS) {
    struct fsc_stats st;
    fsc_cache_stats (state.cache, &st);
    nbdkit_error ("fscache: note: export \"%s\": the cache disk is slower "
                  "than the upstream: reads do not wait for it, and %" PRIu64
                  " bytes read %s were not cached (fill_skipped_bytes)",
                  h->exportname, st.fill_skipped_bytes - state.skips_said,
                  state.skips_said_at ? "since the last note" : "so far");
    state.skips_said = st.fill_skipped_bytes;
    __atomic_store_n (&state.skips_said_at, now, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock (&skips_lock);
}

/* Log what the cache object wants said once: withdrawal, full disk. */
static void
log_notices (struct handle *h)
{
  int err;
  unsigned n = fsc_object_take_notices (h->obj, &err);
  if (n & FSC_NOTICE_WITHDRAWN)
    nbdkit_error ("fscache: warning: export \"%s\": cache I/O error (%s); "
                  "cache withdrawn, serving from upstream", h->exportname,
                  strerror (err));
  if (n & FSC_NOTICE_BADQUOTA)
    nbdkit_error ("fscache: warning: export \"%s\": its quota record "
                  "(.quota) is malformed; ignored", h->exportname);
  if (n & FSC_NOTICE_NOFILL)
    nbdkit_error ("fscache: warning: export \"%s\": cache directory full; "
                  "not caching new blocks for a while", h->exportname);
  if (n & FSC_NOTICE_SKIPPED)
    log_skipped_fills (h);
  if (n & FSC_NOTICE_PEER)
    nbdkit_error ("fscache: warning: export \"%s\": refused a process of "
                  "uid %ld on the object's share socket: only processes of "
                  "uid %ld (ours) or root may join it", h->exportname,
                  fsc_share_refused_uid (h->obj), (long) geteuid ());
}

/* Say that an upstream call failed: at most one line a second per
 * connection, counting the rest (an outage would flood the log).
 */
static void
log_upstream_error (struct handle *h, const char *what, uint64_t offset,
                    uint32_t count, int err)
{
  time_t now = time (NULL);
  time_t last = __atomic_load_n (&h->err_said, __ATOMIC_RELAXED);
  if (now == last ||
      !__atomic_compare_exchange_n (&h->err_said, &last, now, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    __atomic_add_fetch (&h->err_unsaid, 1, __ATOMIC_RELAXED);
    return;
  }
  unsigned unsaid = __atomic_exchange_n (&h->err_unsaid, 0, __ATOMIC_RELAXED);
  char more[64] = "";
  if (unsaid)
    snprintf (more, sizeof more, " (and %u more since the last message)",
              unsaid);
  nbdkit_error ("fscache: export \"%s\": upstream %s at %" PRIu64 "+%" PRIu32
                " failed: %s%s", h->exportname, what, offset, count,
                strerror (err), more);
}

static int
fscache_can_cache (nbdkit_next *next, void *handle)
{
  /* We implement NBD_CMD_CACHE ourselves: it fills our cache. */
  return NBDKIT_CACHE_NATIVE;
}

static int
fscache_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  CATCHUP_REQUEST ();
  /* A read that starts where this connection's last one ended is part
   * of a stream: its hits do not protect blocks from eviction.
   */
  uint64_t prev = __atomic_exchange_n (&h->last_end, offset + count,
                                       __ATOMIC_RELAXED);
  unsigned rflags = prev == offset && offset != 0 ? FSC_READ_SEQUENTIAL : 0;
  bool near = prev != 0 && offset <= prev + NEAR_BYTES &&
    offset + count + NEAR_BYTES >= prev;
  bool was_near = __atomic_exchange_n (&h->last_near, near, __ATOMIC_RELAXED);
  if (rflags || (near && was_near))
    rflags |= FSC_READ_NEAR;
  int r;
  if (h->wb)
    r = wb_pread (h->wb, h->obj, &h->up, buf, count, offset, rflags, err);
  else {
    r = fsc_object_read (h->obj, buf, count, offset, &h->up, rflags);
    *err = errno;
  }
  log_notices (h);
  if (r == WB_DAMAGED)
    return -1;
  if (r == -1) {
    log_upstream_error (h, "read", offset, count, *err);
    return -1;
  }
  if (h->peer_serving) {
    fsc_object_count_peer (h->obj, FSC_PEER_SERVED, 1);
    fsc_object_count_peer (h->obj, FSC_PEER_SERVED_BYTES, count);
  }
  fsc_readahead_observe (h->ra, offset, count);
  catchup_maybe_start (h->obj, h->exportname);
  if (h->traced)
    fsc_trace_note (state.trace, offset, count);
  return 0;
}

static int
fscache_cache (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  CATCHUP_REQUEST ();
  struct handle *h = handle;
  /* Exactly what is asked, in pieces at the ends: a client that
   * names the ranges it will read (nbd-fscache warm --trace) should
   * not pay for whole blocks around them.  Aligned ranges are whole
   * blocks anyway.
   */
  int r = fsc_object_prefetch (h->obj, offset, count, &h->up,
                               FSC_PREFETCH_EXACT);
  *err = errno;
  log_notices (h);
  if (r == -1)
    log_upstream_error (h, "read (cache)", offset, count, *err);
  return r;
}

static int
fscache_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  CATCHUP_REQUEST ();
  struct handle *h = handle;
  peers_export_written (h->fleet);
  if (h->wb)
    return wb_pwrite (h->wb, h->obj, &h->up, buf, count, offset, flags, err);
  struct fsc_write w;
  if (fsc_object_write_begin (h->obj, offset, count,
                              params.mode == MODE_WRITETHROUGH,
                              &w) == -1) {
    *err = errno;
    nbdkit_error ("fscache: write: %m");
    return -1;
  }
  struct upstream *u = data_upstream (h, true, err);
  int r = u ? upstream_pwrite (u, buf, count, offset, flags, err) : -1;
  fsc_object_write_end (h->obj, &w, buf, r == 0);
  log_notices (h);
  if (r == -1)
    log_upstream_error (h, "write", offset, count, *err);
  return r;
}

/* Zero and trim: drop the blocks (durably), then the upstream op
 * (upstream_zero or upstream_trim, which share a signature).  With
 * KEEP (a zero in writethrough mode) the blocks it covers are stored
 * afterwards as zero blocks, which cost no data; a trimmed range's
 * content is unspecified, so a trim only drops.
 */
typedef int upstream_range_op (struct upstream *u, uint32_t count,
                               uint64_t offset, uint32_t flags, int *err);

static int
drop_then (struct handle *h, upstream_range_op *op, bool keep,
           const char *what, uint32_t count, uint64_t offset,
           uint32_t flags, int *err)
{
  struct fsc_write w;
  peers_export_written (h->fleet);
  if (fsc_object_write_begin (h->obj, offset, count, keep, &w) == -1) {
    *err = errno;
    nbdkit_error ("fscache: %s: %m", what);
    return -1;
  }
  struct upstream *u = data_upstream (h, true, err);
  int r = u ? op (u, count, offset, flags, err) : -1;
  fsc_object_write_end (h->obj, &w, NULL, r == 0);
  log_notices (h);
  if (r == -1)
    log_upstream_error (h, what, offset, count, *err);
  return r;
}

static int
fscache_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  CATCHUP_REQUEST ();
  struct handle *h = handle;
  if (h->wb)
    return wb_zero (h->wb, h->obj, &h->up, count, offset, flags, err);
  return drop_then (handle, upstream_zero, params.mode == MODE_WRITETHROUGH,
                    "zero", count, offset, flags, err);
}

static int
fscache_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  CATCHUP_REQUEST ();
  struct handle *h = handle;
  if (h->wb)
    return wb_trim (h->wb, count, offset, flags, err);
  return drop_then (handle, upstream_trim, false, "trim", count, offset,
                    flags, err);
}

static int
fscache_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  CATCHUP_REQUEST ();
  struct handle *h = handle;
  /* Writeback: one local sync, never the upstream. */
  if (h->wb)
    return wb_flush (h->wb, err);
  if (upstream_flush (data_upstream (h, false, err), flags, err) == -1)
    return -1;
  /* A cache failure only withdraws the object: not the client's error. */
  fsc_object_commit (h->obj);
  log_notices (h);
  return 0;
}

/* The queries: the upstream's answers (gated), or the read-only answers
 * of a connection without upstream (upstream.h).
 */
static int64_t
fscache_get_size (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->size;
}

static const char *
fscache_export_description (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return upstream_export_description (&h->upstream);
}

static int
fscache_block_size (nbdkit_next *next, void *handle, uint32_t *minimum,
                    uint32_t *preferred, uint32_t *maximum)
{
  struct handle *h = handle;
  return upstream_block_size (&h->upstream, minimum, preferred, maximum);
}

#define QUERY(name)                                                     \
  static int                                                            \
  fscache_##name (nbdkit_next *next, void *handle)                      \
  {                                                                     \
    struct handle *h = handle;                                          \
    return upstream_##name (&h->upstream);                              \
  }
QUERY (is_rotational)

/* A peer's connection only reads (peers.c). */
static int
fscache_can_write (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  if (h->peer_want)
    return 0;
  return upstream_can_write (&h->upstream);
}

/* In writeback mode the answers are the log's: flushes, FUA, zeroes
 * and trims are ours (written back later, or emulated, by the writer),
 * every connection sees the one log (multi-conn holds), and extents
 * are not offered, since the upstream's would call freshly written
 * data holes.  The upstream is still asked first: where its answer is
 * an error (a failing can_flush, a can_fua nbdkit finds invalid), the
 * connection is refused, as it would be with the plugin alone,
 * instead of the writer finding the broken upstream later (issue 29,
 * item 7: tests/test-transparent.sh).
 */
#define WB_QUERY(name, wbval)                                           \
  static int                                                            \
  fscache_##name (nbdkit_next *next, void *handle)                      \
  {                                                                     \
    struct handle *h = handle;                                          \
    int r = upstream_##name (&h->upstream);                             \
    if (h->wb && r != -1)                                               \
      return (wbval);                                                   \
    return r;                                                           \
  }
WB_QUERY (can_flush, 1)
WB_QUERY (can_trim, 1)
WB_QUERY (can_zero, NBDKIT_ZERO_NATIVE)
WB_QUERY (can_fast_zero, 1)
WB_QUERY (can_extents, 0)
WB_QUERY (can_fua, NBDKIT_FUA_NATIVE)
WB_QUERY (can_multi_conn, 1)

static int
fscache_preconnect (nbdkit_next_preconnect *next, nbdkit_backend *nxdata,
                    int readonly)
{
  return upstream_preconnect (next, nxdata, readonly);
}

static int
fscache_list_exports (nbdkit_next_list_exports *next, nbdkit_backend *nxdata,
                      int readonly, int is_tls,
                      struct nbdkit_exports *exports)
{
  return upstream_list_exports (next, nxdata, readonly, exports);
}

static const char *
fscache_default_export (nbdkit_next_default_export *next,
                        nbdkit_backend *nxdata, int readonly, int is_tls)
{
  return upstream_default_export (next, nxdata, readonly);
}

/* Extents pass through, but gated like every other upstream call. */
static int
fscache_extents (nbdkit_next *next, void *handle, uint32_t count,
                 uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  struct handle *h = handle;
  return upstream_extents (data_upstream (h, false, err), count, offset,
                           flags, extents, err);
}

static int
fscache_thread_model (void)
{
  return NBDKIT_THREAD_MODEL_PARALLEL;
}

static struct nbdkit_filter filter = {
  .name = "fscache",
  .longname = "nbdkit persistent local cache filter",
  .unload = fscache_unload,
  .config = fscache_config,
  .config_complete = fscache_config_complete,
  .config_help = params_help,
  .thread_model = fscache_thread_model,
  .get_ready = fscache_get_ready,
  .after_fork = fscache_after_fork,
  .cleanup = fscache_cleanup,
  .preconnect = fscache_preconnect,
  .list_exports = fscache_list_exports,
  .default_export = fscache_default_export,
  .open = fscache_open,
  .close = fscache_close,
  .prepare = fscache_prepare,
  .finalize = fscache_finalize,
  .get_size = fscache_get_size,
  .export_description = fscache_export_description,
  .block_size = fscache_block_size,
  .can_write = fscache_can_write,
  .can_flush = fscache_can_flush,
  .is_rotational = fscache_is_rotational,
  .can_trim = fscache_can_trim,
  .can_zero = fscache_can_zero,
  .can_fast_zero = fscache_can_fast_zero,
  .can_extents = fscache_can_extents,
  .can_fua = fscache_can_fua,
  .can_multi_conn = fscache_can_multi_conn,
  .can_cache = fscache_can_cache,
  .pread = fscache_pread,
  .pwrite = fscache_pwrite,
  .zero = fscache_zero,
  .trim = fscache_trim,
  .flush = fscache_flush,
  .cache = fscache_cache,
  .extents = fscache_extents,
};

NBDKIT_REGISTER_FILTER (filter)
