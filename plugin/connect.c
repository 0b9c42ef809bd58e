/* nbdkit-fscache-filter: a connection's life.  .open takes the
 * upstream context (ours, not nbdkit's: upstream.h says why) and tells
 * a peer's connection from a client's (peers.c); .prepare finds the
 * export's cache object (joining one open in this process, or opening
 * it with its coherency sample, and in writeback mode its write log,
 * in the order that leaves no gap for another process), then the
 * fleet's identity and readahead; .finalize fingerprints what needs
 * it and closes the object; .close releases the rest.
 *
 * The upstream context is opened here, prepared in .prepare, finalized
 * in .finalize and closed in .close, each through the connection's
 * gate; nbdkit therefore passes NEXT == NULL to every callback, which
 * use h->upstream instead.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "manifest.h"
#include "keyenc.h"
#include "readahead.h"
#include "trace.h"
#include "utils.h"

#include "blocksize.h"
#include "handle.h"
#include "identity.h"
#include "label.h"
#include "ownctx.h"
#include "params.h"
#include "peerhost.h"
#include "peers.h"
#include "pool.h"
#include "upstream.h"
#include "view.h"
#include "writeback.h"
#include "say.h"

/* Held while a connection opens an object not yet open in this
 * process: the write log's flock is per open file, so two connections
 * of one process racing to open it would refuse each other.  Only
 * first opens take it, never a request.
 */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* Peers' connections open now (atomic): fscache-peer-max-inbound. */
static unsigned peers_inbound;

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
  v = writing ? view_get (h->exportname, h->size)
    : view_find (h->exportname);
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
struct upstream *
data_upstream (struct handle *h, bool writing, int *err)
{
  struct view *v = view_of (h, writing);
  if (v)
    return view_upstream (v);
  if (writing && h->need_view) {
    *err = EIO;
    return NULL;
  }
  return h->u;
}

static int
origin_pread (void *opaque, void *buf, uint32_t count, uint64_t offset,
              int *err)
{
  struct handle *h = opaque;
  struct view *v = view_of (h, false);
  int r = v ? bs_pread (view_upstream (v), buf, count, offset, 0, err)
    : pool_pread (h->pool, h->u, buf, count, offset, err);
  if (r == -1 && *err == ESTALE) {
    /* Not the image cached any more (said by the pool). */
    if (h->obj)
      fsc_object_withdraw (h->obj, ESTALE);
    *err = EIO;
  }
  return r;
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

void *
fscache_open (nbdkit_next_open *next, nbdkit_context *nxdata,
              int readonly, const char *exportname, int is_tls)
{
  /* A peer's connection: it reads the export named after the prefix,
   * if this node is in a fleet that may serve it (peers.c).
   */
  const char *real;
  uint64_t want = 0;
  bool self = false;
  int pr = peers_parse_export (exportname, &real, &want, &self);
  if (pr == 0 && params.peer_only) {
    nbdkit_error ("fscache: refusing export \"%s\": this listener "
                  "(fscache-peer-only) serves fleet peers alone; clients "
                  "use the proxy's own socket", exportname);
    return NULL;
  }
  const char *why = pr == -1 ? "malformed peer export name"
    : pr == 0 ? NULL
    : !peers_enabled () ? "this proxy has no fscache-peers"
    : self ? "it comes from this very node, through a line of fscache-peers "
    "that names it under another spelling (said by the asker)"
    : params.mode == MODE_WRITEBACK ? "writeback objects are not shared"
    : (params.peer_psk || params.peer_certs) && !is_tls
    ? "fscache-peer-tls-psk or -certificates is set and the connection has "
    "no TLS" : NULL;
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
  /* Peers' connections served at once are bounded (issue 41): past
   * the bound one is accepted and answers every read "busy", so that
   * its asker skips this node for the range, neither waiting nor
   * setting it aside.  The slot is released at .close.
   */
  if (pr == 1 &&
      __atomic_add_fetch (&peers_inbound, 1, __ATOMIC_RELAXED) >
      params.peer_max_inbound)
    h->peer_busy = true;
  /* A peer's connection shares the export's context for peers
   * (peerhost.c), where the filter may open one; else its own.
   */
  h->u = &h->upstream;
  if (pr == 1 && ownctx_allowed (exportname)) {
    struct upstream *shared = peerhost_get (exportname);
    if (shared) {
      h->u = shared;
      return h;
    }
  }
  if (upstream_open (&h->upstream, nxdata, readonly, exportname) == -1 &&
      !params.offline) {
    nbdkit_error ("fscache: export \"%s\": cannot open the upstream "
                  "(fscache-offline=true would serve what is cached)",
                  exportname);
    upstream_close (&h->upstream);
    if (h->peer_want)             /* no .close after a failed .open */
      __atomic_sub_fetch (&peers_inbound, 1, __ATOMIC_RELAXED);
    free (h->exportname);
    free (h);
    return NULL;
  }
  return h;
}

void
fscache_close (void *handle)
{
  struct handle *h = handle;
  if (h->peer_want)
    __atomic_sub_fetch (&peers_inbound, 1, __ATOMIC_RELAXED);
  /* Only if .finalize did not run (a failed .prepare). */
  fsc_readahead_free (h->ra);
  if (h->obj)
    fsc_object_close (h->obj);
  pool_put (h->pool);
  peers_export_put (h->fleet);
  view_put (h->view);
  if (h->u == &h->upstream)
    upstream_close (&h->upstream);
  else
    peerhost_put (h->u);
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
      fsc_object_state (h->obj) == FSC_OBJ_AVAILABLE &&
      ownctx_allowed (h->exportname))
    fsc_catchup_enable (h->obj, true);
  /* A peer asks for exactly the ranges it wants: reading ahead of it
   * would fetch ranges other peers own.
   */
  if (params.readahead == 0 || h->peer_serving ||
      fsc_object_state (h->obj) != FSC_OBJ_AVAILABLE ||
      !upstream_available (h->u))
    return 0;
  /* With a pool, one prefetch per context runs at a time, and the
   * window is at least two chunks per context, so that a stream keeps
   * them all busy (a serial upstream's round trip is per request: only
   * requests in flight at once cover it).
   */
  unsigned threads = upstream_max_background ();
  uint64_t window = params.readahead;
  if (h->pool) {
    threads = MIN (pool_size (), FSC_RA_THREADS_MAX);
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
 * asking for ours is served, and asks upward in the range's tree as a
 * client's connection does (peers.c, T1).
 */
static int
connection_ready (struct handle *h, const char *k, size_t klen,
                  uint64_t size, const uint64_t *fp)
{
  if (params.manifest && size != fsc_manifest_size (params.manifest)) {
    nbdkit_error ("fscache-manifest=%s is the manifest of an image of %"
                  PRIu64 " bytes (generation \"%s\"); export \"%s\" is %"
                  PRIu64 " bytes: another image; refusing it",
                  params.manifest_file, fsc_manifest_size (params.manifest),
                  fsc_manifest_generation (params.manifest), h->exportname,
                  size);
    return -1;
  }
  if (!peers_enabled () || h->wbmode || !upstream_available (h->u)) {
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
    else if (fingerprint (h->u, k, klen, size, &f) == -1) {
      nbdkit_error ("fscache: export \"%s\": reading the sample that "
                    "identifies it to peers: %m; not using peers",
                    h->exportname);
      if (h->peer_want)
        return -1;
      return start_readahead (h);
    }
    /* With a manifest, nodes of another manifest are of another
     * image: its root is in the identity.
     */
    if (params.manifest)
      f ^= fsc_manifest_root64 (params.manifest);
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
  say_warning ("export \"%s\": upstream unavailable; "
               "serving the cached copy read-only, as last validated "
               "(%" PRIu64 " blocks cached; reads of the rest fail with "
               "EIO)", h->exportname, fsc_object_present_blocks (h->obj));
  return 0;
}


/* Test knob: with NBD_FSCACHE_TEST_OPEN_GATE=DIR, an open stops
 * between opening the object and checking the write log (in writeback
 * mode: between the log and the object): it creates DIR/reached and
 * waits until DIR/go exists, so tests/writeback/test-wb-open-race.sh can run
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
 * Returns 0 or -1.  (Issue 29, item 1: tests/filter/test-transparent.sh.)
 */
static int
wb_wanted (struct handle *h)
{
  static bool said;
  h->wbmode = false;
  if (params.mode != MODE_WRITEBACK)
    return 0;
  /* The writer needs a context of its own (ownctx.c says when there
   * is none, once): without one, written through.
   */
  if (!ownctx_allowed (h->exportname))
    return 0;
  int w = upstream_can_write (h->u);
  if (w == -1)
    return -1;
  h->wbmode = w == 1;
  if (w == 0 && !__atomic_test_and_set (&said, __ATOMIC_RELAXED))
    say_warning ("export \"%s\": fscache-mode=writeback, "
                 "but the upstream cannot write: serving it read-only, "
                 "cached as in writethrough mode", h->exportname);
  return 0;
}

/* The first open of the object in this process, under open_lock:
 * the write log and the object (and the writer, in writeback mode).
 * Returns 0 with h->obj and *INFO, or -1 (said).
 */
static int
open_first (struct handle *h, struct fsc_object_params *p, const char *k,
            size_t klen, uint64_t size, struct fscache_sample_set *set,
            struct fsc_open_info *info)
{
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
   * process's dirty log.  Broken by tests/writeback/test-wb-open-race.sh.
   */
  bool wbmode = h->wbmode;
  struct fsc_wlog *wl = NULL;
  if (wbmode && wb_check_log (state.cache, h->exportname, k, klen, size,
                              set, wbmode, &wl) == -1)
    return -1;
  if (wbmode)
    open_gate ();
  if (fsc_object_open (state.cache, p, &h->obj, info) == -1) {
    if (errno == EPERM && info->refused)
      nbdkit_error ("fscache: export \"%s\": process %d holds its cache "
                    "object in %s with fscache-block-size=%" PRIu32
                    " fscache-validate=%s, and this one has "
                    "fscache-block-size=%" PRIu32 " fscache-validate=%s; "
                    "refusing (one object is shared by every process: "
                    "give them the same settings, or another "
                    "fscache-key)", h->exportname, info->owner_pid,
                    params.dir, info->owner_block_size,
                    validate_name (info->owner_validate), params.block_size,
                    validate_name (params.validate));
    else
      nbdkit_error ("fscache: opening the cache object: %m");
    fsc_wlog_close (wl);
    return -1;
  }
  if (!wbmode) {
    open_gate ();
    if (wb_check_log (state.cache, h->exportname, k, klen, size, set,
                      wbmode, &wl) == -1) {
      fsc_object_close (h->obj);
      h->obj = NULL;
      return -1;
    }
  }
  if (wl) {
    h->wb = wb_start (state.cache, h->exportname, k, klen, wl, h->obj,
                      info);
    if (h->wb == NULL) {
      fsc_object_close (h->obj);
      h->obj = NULL;
      return -1;
    }
  }
  return 0;
}

/* Say how the object was found (INFO, from fsc_object_open). */
static void
say_open (struct handle *h, const struct fsc_open_info *info)
{
  if (info->busy)
    say_warning ("export \"%s\" is cached by another "
                 "process using %s%s; serving it uncached",
                 h->exportname, params.dir,
                 info->reason == FSC_REJ_UPSTREAM_SIZE ||
                 info->reason == FSC_REJ_GENERATION ||
                 info->reason == FSC_REJ_FINGERPRINT
                 ? ", for a different upstream (size, generation or "
                 "sample)" : "");
  else if (info->joined)
    nbdkit_debug ("fscache: export \"%s\": joined the copy of process %d "
                  "(%" PRIu64 " blocks cached)", h->exportname,
                  info->owner_pid, info->present_blocks);
  else if (info->err == EPERM || info->err == ENOTDIR)
    say_warning ("export \"%s\": cache unusable: its "
                 "fan-out directory in %s/objects (or a file in it) is not "
                 "this user's alone (owned by another user, writable by "
                 "others, or not a directory: it must be uid %d's, mode "
                 "0700); refusing it and serving the export uncached",
                 h->exportname, params.dir, (int) geteuid ());
  else if (info->err)
    say_warning ("export \"%s\": cache unusable (%s); "
                 "serving it uncached", h->exportname,
                 strerror (info->err));
  else if (!info->shared) {
    if (info->reason != FSC_OK && info->reason != FSC_REJ_NEW)
      say_warning ("export \"%s\": discarding cached "
                   "data (%s), starting cold", h->exportname,
                   fsc_reason_name (info->reason));
    if (info->old_version)
      say_note ("export \"%s\": cache index of format "
                "version %u read and upgraded to version %u",
                h->exportname, info->old_version, FSC_INDEX_VERSION);
    if (info->unclean)
      say_warning ("export \"%s\": previous user did "
                   "not shut down cleanly; the cache was checked and "
                   "kept", h->exportname);
    nbdkit_debug ("fscache: export \"%s\": %s, %" PRIu64 " blocks cached",
                  h->exportname, fsc_reason_name (info->reason),
                  info->present_blocks);
  }
}

int
fscache_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  size_t klen;
  CLEANUP_FREE char *k = object_key (h->exportname, &klen);
  if (k == NULL) {
    nbdkit_error ("malloc: %m");
    return -1;
  }
  if (h->u == &h->upstream && upstream_prepare (h->u) == -1)
    return -1;
  h->need_view = params.mode != MODE_WRITEBACK &&
    upstream_available (h->u) && view_wanted (h->u) &&
    ownctx_allowed (h->exportname);
  bool want_pool = h->pool == NULL && upstream_available (h->u) &&
    pool_wanted (h->u) && ownctx_allowed (h->exportname);

  CLEANUP_FREE char *label = label_of (h->exportname);
  struct fsc_object_params p = {
    .key = k, .key_len = klen, .block_size = params.block_size,
    .verify = params.verify, .validate = params.validate,
    .generation = params.generation, .max_size = params.max_size,
    .resident_groups = params.resident_groups, .label = label,
    .no_mrc = !params.mrc,
  };
  if (!upstream_available (h->u))
    return prepare_offline (h, &p);
  if (wb_wanted (h) == -1)
    return -1;
  /* The write log is one process's: never shared (core/share-*.c). */
  p.exclusive = h->wbmode;

  int64_t size = upstream_get_size (h->u);
  if (size == -1)
    return -1;
  h->size = p.size = size;
  bs_check_block_size (h->u, params.block_size);
  if (want_pool)
    h->pool = pool_get (h->exportname, size);

  /* Another connection has the object open: it was validated then. */
  if (join_open (h, &p, k, klen, false))
    return h->obj ? connection_ready (h, k, klen, size, NULL) : -1;

  struct fscache_sample_set set = { 0 };
  if (params.validate == FSC_VALIDATE_SAMPLE &&
      fingerprint_regions (h->u, k, klen, size, &set,
                           &p.fingerprint) == -1) {
    nbdkit_error ("fscache: reading the coherency sample upstream: %m");
    return -1;
  }

  pthread_mutex_lock (&open_lock);
  if (join_open (h, &p, k, klen, true)) {
    pthread_mutex_unlock (&open_lock);
    return h->obj ? connection_ready (h, k, klen, size, NULL) : -1;
  }
  struct fsc_open_info info;
  int r = open_first (h, &p, k, klen, size, &set, &info);
  pthread_mutex_unlock (&open_lock);
  if (r == -1)
    return -1;
  say_open (h, &info);
  bind_trace (h, k, klen, size);
  return connection_ready (h, k, klen, size,
                           params.validate == FSC_VALIDATE_SAMPLE
                           ? &p.fingerprint : NULL);
}

int
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
    int64_t size = upstream_get_size (h->u);
    /* If we cannot fingerprint, the index stays marked stale and the
     * next open starts cold: safe.
     */
    if (k && size >= 0 &&
        fingerprint (h->u, k, klen, size, &fp) == 0)
      fsc_object_set_fingerprint (h->obj, fp);
  }
  log_notices (h);
  fsc_object_close (h->obj);
  h->obj = NULL;
  write_stats ();
  return upstream_finalize (&h->upstream);
}
