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
 *   report.c    the log lines an object wants said once, the stats file;
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
#include "yield.h"
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
#include "handle.h"
#include "label.h"
#include "ownctx.h"
#include "peerhost.h"
#include "say.h"

struct filter_state state;

/* Test knob: NBD_FSCACHE_TEST_GUARD=0 makes the latency guard's
 * default off, for tests that count what is read upstream to see what
 * the cache holds (tests/functions.sh says why).  Set before the
 * parameters are parsed, so that a given fscache-latency-guard wins.
 */
static void
fscache_load (void)
{
  const char *tg = getenv ("NBD_FSCACHE_TEST_GUARD");
  if (tg && strcmp (tg, "0") == 0)
    params.latency_guard = false;
}

static void
fscache_unload (void)
{
  params_free ();
  label_free ();
}

/* Ours (fscache-*), or the plugin's, which go on to it. */
static int
fscache_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *k, const char *value)
{
  int r = params_config (k, value);
  if (r <= 0)
    return r;
  ownctx_config (k, value);
  label_config (k, value);
  return next (nxdata, k, value);
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
  /* Not in writeback mode: there the cache holds blocks the upstream
   * does not have yet (invariant G1 of core/ops/guard.c).
   */
  fsc_cache_set_guard (state.cache,
                       params.latency_guard && params.mode != MODE_WRITEBACK);
  fsc_cache_set_fill_probe (state.cache, params.fill_probe);
  peers_bind (state.cache);
  return next (nxdata);
}

/* The server's final thread model: how upstream calls must be gated. */
static int
fscache_get_ready (int thread_model)
{
  upstream_set_thread_model (thread_model);
  yield_set_budget_us (params.worker_yield);
  ownctx_init ();
  if (params.mode == MODE_WRITEBACK && !upstream_model_allows_shared ()) {
    nbdkit_error ("fscache-mode=writeback: the upstream's thread model "
                  "(%s) allows one connection at a time, and the writer "
                  "needs one of its own", upstream_thread_model_name ());
    return -1;
  }
  nbdkit_debug ("fscache: upstream calls follow thread model %s",
                upstream_thread_model_name ());
  /* Said once, at start, what a serial plugin costs in one process and
   * how to avoid it (issue 42), without the plugin's parameters (they
   * may hold passwords).
   */
  if (upstream_serial_requests ()) {
    const char *p = *ownctx_plugin_name () ? ownctx_plugin_name () : "PLUGIN";
    say_note ("the %s plugin takes one request at a time per connection "
              "(thread model serialize_requests), and nbdkit hands this "
              "filter one request at a time per client connection: a "
              "client's misses wait one round trip each, whatever its "
              "queue depth.  To read at queue depth, run the plugin in a "
              "process of its own: 'nbdkit -U BACK.sock %s ...' and "
              "'nbdkit --filter=fscache nbd socket=BACK.sock "
              "fscache-upstream-connections=16 fscache-key=...', or "
              "nbd-fscache-proxy, which does so (nbd-fscache-proxy(8))",
              p, p);
  }
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
  peerhost_set_backend (nxdata);
  return 0;
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
 * Data.
 */

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
  if (h->peer_busy) {
    fsc_object_count_peer (h->obj, FSC_PEER_BUSY, 1);
    *err = ESHUTDOWN;           /* "busy": connect.c, peerlink.c */
    return -1;
  }
  CATCHUP_REQUEST ();
  /* Stream or random (core/ops/readahead.c, the one place that tells). */
  unsigned rflags = fsc_pattern_classify (&h->pattern, offset, count);
  fsc_readahead_observe (h->ra, offset, count);
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
  catchup_maybe_start (h->obj, h->exportname);
  if (h->traced)
    fsc_trace_note (state.trace, offset, count);
  if (yield_after_request ())
    fsc_cache_count_yield (state.cache);
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
  return upstream_export_description (h->u);
}

static int
fscache_block_size (nbdkit_next *next, void *handle, uint32_t *minimum,
                    uint32_t *preferred, uint32_t *maximum)
{
  struct handle *h = handle;
  return upstream_block_size (h->u, minimum, preferred, maximum);
}

#define QUERY(name)                                                     \
  static int                                                            \
  fscache_##name (nbdkit_next *next, void *handle)                      \
  {                                                                     \
    struct handle *h = handle;                                          \
    return upstream_##name (h->u);                              \
  }
QUERY (is_rotational)

/* A peer's connection only reads (peers.c). */
static int
fscache_can_write (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  if (h->peer_want)
    return 0;
  return upstream_can_write (h->u);
}

/* In writeback mode the answers are the log's: flushes, FUA, zeroes
 * and trims are ours (written back later, or emulated, by the writer),
 * every connection sees the one log (multi-conn holds), and extents
 * are not offered, since the upstream's would call freshly written
 * data holes.  The upstream is still asked first: where its answer is
 * an error (a failing can_flush, a can_fua nbdkit finds invalid), the
 * connection is refused, as it would be with the plugin alone,
 * instead of the writer finding the broken upstream later (issue 29,
 * item 7: tests/filter/test-transparent.sh).
 */
#define WB_QUERY(name, wbval)                                           \
  static int                                                            \
  fscache_##name (nbdkit_next *next, void *handle)                      \
  {                                                                     \
    struct handle *h = handle;                                          \
    int r = upstream_##name (h->u);                             \
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

/* Multi-conn: may a client spread its requests over several
 * connections, a flush on one covering the writes of all?  In
 * writeback mode, yes: every connection writes the one log.  On a
 * read-only connection, yes, whatever the upstream says: every
 * connection reads the one cache object, and nothing is written
 * (issue 42: through the filter a read-only curl export said no, so
 * nbdcopy used one connection and the kernel's nbd-client refused -C).
 * Writable, without writeback: once written, an upstream without
 * multi-conn is reached through one shared view (view.c), so yes
 * then; without a view (no contexts of the filter's own, ownctx.c),
 * the upstream's answer.  The upstream is asked first, so that its
 * error refuses the connection as the plugin alone would.
 */
static int
fscache_can_multi_conn (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  int r = upstream_can_multi_conn (h->u);
  if (r == -1)
    return -1;
  if (h->wb || h->need_view)
    return 1;
  int w = fscache_can_write (next, handle);
  if (w == -1)
    return -1;
  return w == 0 ? 1 : r;
}

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
  .load = fscache_load,
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
