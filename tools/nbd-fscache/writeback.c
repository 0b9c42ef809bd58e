/* nbd-fscache writeback: drain an object's write log to an upstream,
 * without a proxy.
 *
 * For a host whose writeback proxy will not come back (its upstream
 * moved, the filter's configuration is gone): the log NAME.wlog is the
 * only copy of what the clients wrote and flushed, and this sends it
 * to the upstream the operator names, through libfscache's own writer
 * (core/wlog/writeback.c), so in the same order and with the same
 * guarantees as the proxy would: one flush epoch at a time, each
 * followed by an upstream flush before the log's tail advances.
 *
 *   1. The object is found as every subcommand finds it (tool_find),
 *      and its key recovered: the name decoded (fsc_key_decode), or,
 *      for a hashed name, the whole key kept in its superblock.
 *   2. The upstream is opened with libnbd, N connections; its size is
 *      what the log must have been written for.
 *   3. The log is opened with fsc_wlog_open (never created), taking its
 *      lock: a proxy holding it is refused (EBUSY), and while we hold
 *      it no proxy can open the object.  Coherency: the size must match
 *      (ESTALE otherwise); the coherency sample is not checked (n = 0:
 *      the filter's sample is not ours to take), nor the generation
 *      unless --generation gives one; the operator named the upstream,
 *      which is what this command is for.
 *   4. The writer runs with a struct fsc_wb_upstream over the
 *      connections (one request per connection at a time; a flush goes
 *      to every connection, so that it covers the writes of all of them
 *      whether or not the server has multi-conn), and we poll the
 *      counters until the log is empty, drawing a bar on a terminal.
 *      An upstream outage is retried by the writer; a damaged record or
 *      a failing log stops us (exit 1).
 *   5. Drained: the object's cached data was a copy of the upstream
 *      before these writes, and is discarded (its log still locked,
 *      so that no proxy opens it in between); then the log is closed
 *      and removed in turn if nothing took it meanwhile.  The next
 *      proxy starts cold.
 *
 * A damaged log (Rule 7 of core/wlog/wlog.c: a record a later marker shows
 * was flushed cannot be read) is refused as the proxy refuses it,
 * saying what would be lost.  With --salvage it is opened with
 * FSC_WLOG_SALVAGE: the intact records before the damage are written
 * back as above, in order, after saying exactly what is lost (the
 * damaged record and every record after it, which cannot be written
 * back without it first); then the log, damage and all, is discarded
 * with the cache, so that the export can be opened again.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#include "fscache.h"
#include "nbd-fscache.h"

#define WRITEBACK_USAGE \
  "writeback [--dir DIR] OBJECT URI [--connections N] [--generation G] " \
  "[--salvage]"
#define MAX_CONNECTIONS 16
#define POLL_MS 100

struct wb_opts {
  unsigned connections;
  const char *generation;
  bool salvage;                 /* past damage, losing what follows it */
};

static int
wb_opt (int c, const char *arg, void *opaque)
{
  struct wb_opts *wo = opaque;
  char *end;
  unsigned long n;

  switch (c) {
  case 'c':
    errno = 0;
    n = strtoul (arg, &end, 10);
    if (errno || end == arg || *end || n < 1 || n > MAX_CONNECTIONS) {
      tool_error ("writeback: --connections %s: a number from 1 to %d", arg,
                  MAX_CONNECTIONS);
      return -1;
    }
    wo->connections = (unsigned) n;
    return 0;
  case 'g':
    if (strlen (arg) > FSC_GEN_MAX) {
      tool_error ("writeback: --generation: at most %d bytes", FSC_GEN_MAX);
      return -1;
    }
    wo->generation = arg;
    return 0;
  case 's':
    wo->salvage = true;
    return 0;
  default:
    return -1;
  }
}

/* ---- the upstream: N libnbd connections behind a small pool ------- */

struct pool {
  const char *uri;
  unsigned n;
  struct nbd_handle **h;
  bool *busy;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int64_t size;
};

static int
nbd_err (void)
{
  int e = nbd_get_errno ();
  errno = e ? e : EIO;
  return -1;
}

static struct nbd_handle *
connect_one (const char *uri)
{
  struct nbd_handle *h = nbd_create ();
  if (h == NULL)
    return NULL;
  if (nbd_connect_uri (h, uri) == -1) {
    int e = nbd_get_errno ();
    nbd_close (h);
    errno = e ? e : EIO;
    return NULL;
  }
  return h;
}

static unsigned
take (struct pool *p)
{
  pthread_mutex_lock (&p->lock);
  for (;;) {
    for (unsigned i = 0; i < p->n; ++i)
      if (!p->busy[i]) {
        p->busy[i] = true;
        pthread_mutex_unlock (&p->lock);
        return i;
      }
    pthread_cond_wait (&p->cond, &p->lock);
  }
}

static void
give (struct pool *p, unsigned i)
{
  pthread_mutex_lock (&p->lock);
  p->busy[i] = false;
  pthread_cond_signal (&p->cond);
  pthread_mutex_unlock (&p->lock);
}

static int
up_pwrite (void *opaque, const void *buf, uint32_t count, uint64_t offset)
{
  struct pool *p = opaque;
  unsigned i = take (p);
  int r = nbd_pwrite (p->h[i], buf, count, offset, 0);
  int e = r == -1 ? (nbd_err (), errno) : 0;
  give (p, i);
  errno = e;
  return r == -1 ? -1 : 0;
}

static int
up_zero (void *opaque, uint32_t count, uint64_t offset)
{
  struct pool *p = opaque;
  unsigned i = take (p);
  int r = nbd_zero (p->h[i], count, offset, 0);
  int e = r == -1 ? (nbd_err (), errno) : 0;
  give (p, i);
  errno = e;
  return r == -1 ? -1 : 0;
}

static int
up_trim (void *opaque, uint32_t count, uint64_t offset)
{
  struct pool *p = opaque;
  unsigned i = take (p);
  int r = nbd_trim (p->h[i], count, offset, 0);
  int e = r == -1 ? (nbd_err (), errno) : 0;
  give (p, i);
  errno = e;
  return r == -1 ? -1 : 0;
}

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  struct pool *p = opaque;
  unsigned i = take (p);
  int r = nbd_pread (p->h[i], buf, count, offset, 0);
  int e = r == -1 ? (nbd_err (), errno) : 0;
  give (p, i);
  errno = e;
  return r == -1 ? -1 : 0;
}

/* Every connection: without multi-conn a flush covers only the
 * writes of its own connection, and the writer's flush must cover all
 * of them.  The writer sends it with nothing else in flight.
 */
static int
up_flush (void *opaque)
{
  struct pool *p = opaque;
  int r = 0, e = 0;

  pthread_mutex_lock (&p->lock);
  for (unsigned i = 0; i < p->n; ++i)
    while (p->busy[i])
      pthread_cond_wait (&p->cond, &p->lock);
  for (unsigned i = 0; i < p->n; ++i)
    p->busy[i] = true;
  pthread_mutex_unlock (&p->lock);
  for (unsigned i = 0; i < p->n && r == 0; ++i)
    if (nbd_flush (p->h[i], 0) == -1) {
      r = nbd_err ();
      e = errno;
    }
  pthread_mutex_lock (&p->lock);
  for (unsigned i = 0; i < p->n; ++i)
    p->busy[i] = false;
  pthread_cond_broadcast (&p->cond);
  pthread_mutex_unlock (&p->lock);
  errno = e;
  return r;
}

/* After failures (nothing in flight): connect every connection anew.
 * One that cannot connect (or finds another size) keeps its old
 * handle, to fail on and be reopened at the next failure.
 */
static int
up_reopen (void *opaque)
{
  struct pool *p = opaque;
  unsigned ok = 0;

  pthread_mutex_lock (&p->lock);
  for (unsigned i = 0; i < p->n; ++i) {
    struct nbd_handle *h = connect_one (p->uri);
    if (h && nbd_get_size (h) != p->size) {
      nbd_close (h);
      h = NULL;
    }
    if (h == NULL)
      continue;
    nbd_close (p->h[i]);
    p->h[i] = h;
    ok++;
  }
  pthread_cond_broadcast (&p->cond);
  pthread_mutex_unlock (&p->lock);
  if (ok < p->n) {
    errno = EIO;
    return -1;
  }
  return 0;
}

static void
pool_close (struct pool *p)
{
  for (unsigned i = 0; i < p->n && p->h; ++i)
    if (p->h[i]) {
      nbd_shutdown (p->h[i], 0);
      nbd_close (p->h[i]);
    }
  free (p->h);
  free (p->busy);
  pthread_mutex_destroy (&p->lock);
  pthread_cond_destroy (&p->cond);
}

/* ---- the command --------------------------------------------------- */

static volatile sig_atomic_t stop_signal;

static void
on_signal (int sig)
{
  stop_signal = sig;
}

static double
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
draw_bar (uint64_t done, uint64_t total, double t0, bool end)
{
  if (end) {
    fprintf (stderr, "\r%-78s\r", "");
    fflush (stderr);
    return;
  }
  int pct = total ? (int) (100.0 * done / total) : 100;
  int bar = pct * 40 / 100;
  double el = now_s () - t0;
  char d[16], t[16];
  fprintf (stderr, "\r" PROG ": writeback: [%.*s%*s] %3d%%  %s / %s  "
           "%.1f MB/s\033[K",
           bar, "########################################", 40 - bar, "",
           pct, fmt_size (done, d), fmt_size (total, t),
           el > 0 ? done / el / 1e6 : 0.0);
  fflush (stderr);
}

/* The key of O, into KEY (KEYSZ bytes); its length or -1 (said). */
static ssize_t
object_key (const struct tool_object *o, unsigned char *key, size_t keysz)
{
  ssize_t n = fsc_key_decode (o->f.name, key, keysz);
  if (n == -1 && errno == ENOENT && o->err == 0 &&
      o->info.reason == FSC_OK &&
      o->info.sb.key_prefix_len == o->info.sb.key_len &&
      o->info.sb.key_len <= keysz) {
    /* A hashed name: the superblock keeps the whole key. */
    memcpy (key, o->info.sb.key_prefix, o->info.sb.key_len);
    n = (ssize_t) o->info.sb.key_len;
  }
  if (n <= 0) {
    tool_error ("writeback: %s: cannot tell the object's key (%s)",
                o->f.name, n == 0 ? "empty" : errno == ENOENT
                ? "a hashed name, and no readable index that keeps the "
                  "whole key" : strerror (errno));
    return -1;
  }
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], want[FSC_FAN_MAX + 1];
  fsc_key_encode (key, (size_t) n, name, fan);
  snprintf (want, sizeof want, "@%02x", o->f.fan);
  if (strcmp (name, o->f.name) != 0 || strcmp (fan, want) != 0) {
    tool_error ("writeback: %s: its key does not name it (a file not of "
                "the filter's?)", o->f.name);
    return -1;
  }
  return n;
}

/* Say why the log cannot be opened; the exit status. */
static int
say_open_error (const struct tool_object *o, const char *uri, int e,
                const struct fsc_wlog_info *info, uint64_t size,
                const struct wb_opts *wo)
{
  switch (e) {
  case EBUSY:
    tool_error ("writeback: %s: its write log is in use by a running "
                "process (a writeback proxy writes it back itself): "
                "refusing", o->f.name);
    return EXIT_FINDING;
  case ESTALE:
    if (info->mismatch == FSC_WLOG_SIZE_CHANGED)
      tool_error ("writeback: %s: the log holds %" PRIu64 " bytes of dirty "
                  "data written for an upstream of %" PRIu64 " bytes, but "
                  "%s has %" PRIu64 " bytes: refusing (is it the right "
                  "upstream?)", o->f.name, info->dirty_bytes, info->size,
                  uri, size);
    else if (info->mismatch == FSC_WLOG_GENERATION_CHANGED)
      tool_error ("writeback: %s: the log was written by a proxy with %s "
                  "fscache-generation: give the proxy's with --generation",
                  o->f.name, wo->generation ? "another" : "an");
    else
      tool_error ("writeback: %s: the log does not fit %s (%s): refusing",
                  o->f.name, uri, fsc_wlog_mismatch_name (info->mismatch));
    return EXIT_FINDING;
  case EUCLEAN:
    tool_error ("writeback: %s: its write log is DAMAGED: record %" PRIu64
                " (at byte %" PRIu64 " of the log) cannot be read although "
                "a later flush marker shows it was flushed; %" PRIu64
                " records (%" PRIu64 " bytes) before it are intact, and it "
                "and every record after it (%" PRIu64 " intact writes, %"
                PRIu64 " bytes) would be lost.  Refusing: run again with "
                "--salvage to write back the intact records and discard the "
                "rest, or discard it all with 'nbd-fscache invalidate "
                "--force %s'", o->f.name, info->damage_seq, info->damage_pos,
                info->records, info->dirty_bytes, info->lost_records,
                info->lost_bytes, o->f.name);
    return EXIT_FINDING;
  case EBADMSG:
    tool_error ("writeback: %s: its write log is damaged or not its own: "
                "refusing (nbd-fscache invalidate --force discards it)",
                o->f.name);
    return EXIT_FINDING;
  default:
    errno = e;
    tool_error ("writeback: %s: opening its write log: %m", o->f.name);
    return EXIT_USAGE;
  }
}

/* Discard O's cached data, its log being ours (locked): the next proxy
 * starts cold.  True if done.
 */
static bool
discard_cache (struct tool_cache *c, struct tool_object *o, unsigned flags)
{
  struct fscd_grave g;
  if (tool_grave_open (c, &g, "writeback") == -1)
    return false;
  enum fscd_cull_result r = tool_discard (c, o, &g, flags);
  fscd_grave_close (&g);
  return r == FSCD_CULLED;
}

int
fscache_cmd_writeback (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { "connections", required_argument, NULL, 'c' },
    { "generation", required_argument, NULL, 'g' },
    { "salvage", no_argument, NULL, 's' },
    { NULL, 0, NULL, 0 },
  };
  struct wb_opts wo = { .connections = 1, .generation = NULL };
  struct tool_cache c;
  struct pool pool = { .n = 0 };
  struct fsc_cache *cache = NULL;
  struct fsc_wlog *wl = NULL;
  int ret = EXIT_USAGE;

  int i = tool_getopt ("writeback", WRITEBACK_USAGE, argc, argv, "d:hc:g:s",
                       longopts, wb_opt, &wo);
  if (argc - i != 2) {
    tool_error ("writeback: %s", argc - i < 2 ? "OBJECT and URI needed"
                                              : "unexpected arguments");
    fprintf (stderr, "usage: " PROG " " WRITEBACK_USAGE "\n");
    return EXIT_USAGE;
  }
  const char *uri = argv[i + 1];
  if (tool_cache_open ("writeback", tool_dir (), &c) == -1) {
    tool_error ("writeback: %s: %m", tool_dir ());
    return EXIT_USAGE;
  }
  struct tool_object *o = tool_find ("writeback", &c, argv[i]);
  if (o == NULL) {
    tool_cache_close (&c);
    return EXIT_FINDING;
  }
  if (o->wlog_err == ENOENT || (o->wlog_err == 0 && o->wlog.records == 0)) {
    printf ("%s: no dirty data: nothing to write back\n", o->f.name);
    tool_cache_close (&c);
    return EXIT_SUCCESS;
  }
  /* A decoded name is at most FSC_NAME_MAX bytes; a hashed name's key
   * (too long to be a name) comes whole from the superblock.
   */
  unsigned char key[MAX (FSC_NAME_MAX + 1, FSC_SB_KEY_PREFIX)];
  ssize_t klen = object_key (o, key, sizeof key);
  if (klen == -1)
    goto out;

  /* The upstream. */
  pool.uri = uri;
  pool.n = wo.connections;
  pool.h = calloc (pool.n, sizeof *pool.h);
  pool.busy = calloc (pool.n, sizeof *pool.busy);
  pthread_mutex_init (&pool.lock, NULL);
  pthread_cond_init (&pool.cond, NULL);
  if (pool.h == NULL || pool.busy == NULL) {
    tool_error ("writeback: %m");
    goto out;
  }
  for (unsigned k = 0; k < pool.n; ++k)
    if ((pool.h[k] = connect_one (uri)) == NULL) {
      tool_error ("writeback: %s: %s", uri, nbd_get_error ());
      goto out;
    }
  pool.size = nbd_get_size (pool.h[0]);
  int can_trim = nbd_can_trim (pool.h[0]);
  int can_zero = nbd_can_zero (pool.h[0]);
  int can_flush = nbd_can_flush (pool.h[0]);
  int ro = nbd_is_read_only (pool.h[0]);
  if (pool.size == -1 || can_trim == -1 || can_zero == -1 ||
      can_flush == -1 || ro == -1) {
    tool_error ("writeback: %s: %s", uri, nbd_get_error ());
    goto out;
  }
  if (ro) {
    tool_error ("writeback: %s: the export is read-only", uri);
    ret = EXIT_FINDING;
    goto out;
  }

  /* The log, locked. */
  struct fsc_cache_config cc = { .dir = c.dir, .existing = true };
  if (fsc_cache_open (&cc, &cache) == -1) {
    tool_error ("writeback: %s: %m", c.dir);
    goto out;
  }
  /* Without --generation, the log's own: the generation is a label the
   * proxy was given, which nothing here could check anyway.
   */
  struct fsc_wlog_info peek;
  if (wo.generation == NULL &&
      (fsc_wlog_peek (cache, key, (size_t) klen, &peek) == 0 ||
       errno == EUCLEAN) &&
      peek.has_generation)
    wo.generation = peek.generation;
  struct fsc_wlog_params p = {
    .key = key, .key_len = (size_t) klen, .size = (uint64_t) pool.size,
    .generation = wo.generation, .sample = { .n = 0 },
  };
  struct fsc_wlog_info info;
  if (fsc_wlog_open (cache, &p, wo.salvage ? FSC_WLOG_SALVAGE : 0, &wl,
                     &info) == -1) {
    int e = errno;
    wl = NULL;
    if (e == ENOENT) {
      printf ("%s: no write log: nothing to write back\n", o->f.name);
      ret = EXIT_SUCCESS;
    }
    else
      ret = say_open_error (o, uri, e, &info, (uint64_t) pool.size, &wo);
    goto out;
  }
  if (info.dropped_records)
    tool_error ("writeback: %s: writes never flushed were cut off the end "
                "of the log (torn by a crash)", o->f.name);
  if (info.damaged_records)
    tool_error ("writeback: %s: warning: %" PRIu64 " flushed records are "
                "damaged: writeback stops at the first of them",
                o->f.name, info.damaged_records);
  if (info.damaged) {
    /* --salvage: say what is lost before anything is done. */
    printf ("%s: the write log is damaged at record %" PRIu64 " (byte %"
            PRIu64 " of the log; a marker shows records below %" PRIu64
            " were flushed)\n", o->f.name, info.damage_seq, info.damage_pos,
            info.damage_cover);
    printf ("%s: salvaging: the %" PRIu64 " intact records before it (%"
            PRIu64 " bytes in %" PRIu64 " epochs) are written back in "
            "order\n", o->f.name, info.records, info.dirty_bytes,
            info.epochs);
    printf ("%s: LOST: record %" PRIu64 " (unreadable: what it held is "
            "unknown) and every record after it, up to record %" PRIu64
            ": %" PRIu64 " intact writes, zeroes or trims of %" PRIu64
            " bytes", o->f.name, info.damage_seq,
            MAX (info.lost_last_seq, info.damage_seq), info.lost_records,
            info.lost_bytes);
    if (info.lost_end)
      printf (" within bytes %" PRIu64 "-%" PRIu64 " of the export",
              info.lost_start, info.lost_end - 1);
    printf (", which cannot be written back without it first\n");
    fflush (stdout);
  }
  if (info.records == 0 && !info.damaged) {
    printf ("%s: no dirty data: nothing to write back\n", o->f.name);
    ret = EXIT_SUCCESS;
    goto out;
  }

  struct fsc_wb_upstream up = {
    .pwrite = up_pwrite, .zero = up_zero, .trim = up_trim,
    .flush = up_flush, .pread = up_pread, .reopen = up_reopen,
    .opaque = &pool, .nparallel = pool.n,
    .can_trim = can_trim > 0, .can_zero = can_zero > 0,
    .can_flush = can_flush > 0,
  };
  /* The first signal stops us cleanly; a second one (the writer may
   * be stuck in a request to a hung server) kills.
   */
  struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESETHAND };
  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  if (info.records && fsc_wlog_start_writer (wl, NULL, &up) == -1) {
    tool_error ("writeback: %s: starting the writer: %m", o->f.name);
    goto out;
  }

  /* Wait for it, with a bar on a terminal. */
  bool tty = isatty (STDERR_FILENO);
  uint64_t total = info.dirty_bytes, epochs = info.epochs;
  double t0 = now_s ();
  bool outage = false, failed = false;
  struct fsc_wlog_info now;
  for (;;) {
    fsc_wlog_counters (wl, &now);
    if (now.records == 0)
      break;
    int err = 0;
    uint64_t off = 0;
    unsigned n = fsc_wlog_take_notices (wl, &err, &off);
    if (n & (FSC_WLOG_NOTICE_UPSTREAM | FSC_WLOG_NOTICE_BACK |
             FSC_WLOG_NOTICE_BADREAD | FSC_WLOG_NOTICE_FAILED) && tty)
      draw_bar (0, 0, t0, true);
    if ((n & FSC_WLOG_NOTICE_UPSTREAM) && !outage) {
      tool_error ("writeback: %s: cannot write to %s (%s); retrying "
                  "(interrupt to give up: the log keeps the rest)",
                  o->f.name, uri, strerror (err));
      outage = true;
    }
    if ((n & FSC_WLOG_NOTICE_BACK) && outage) {
      tool_error ("writeback: %s: reached %s again", o->f.name, uri);
      outage = false;
    }
    if (n & FSC_WLOG_NOTICE_BADREAD)
      tool_error ("writeback: %s: data logged for offset %" PRIu64 " is "
                  "damaged: it cannot be written back", o->f.name, off);
    if (n & FSC_WLOG_NOTICE_FAILED) {
      errno = err;
      tool_error ("writeback: %s: the write log failed (%m): stopping",
                  o->f.name);
      failed = true;
      break;
    }
    if (stop_signal)
      break;
    if (tty)
      draw_bar (total > now.dirty_bytes ? total - now.dirty_bytes : 0, total,
                t0, false);
    struct timespec ts = { 0, POLL_MS * 1000000L };
    nanosleep (&ts, NULL);
  }
  if (tty)
    draw_bar (0, 0, t0, true);
  double el = now_s () - t0;
  if (failed || stop_signal) {
    fsc_wlog_counters (wl, &now);
    fsc_wlog_close (wl);
    wl = NULL;
    tool_error ("writeback: %s: %s; %" PRIu64 " bytes of dirty data in %"
                PRIu64 " epochs left in the log (run writeback again, or "
                "start a writeback proxy)", o->f.name,
                failed ? "stopped" : "interrupted", now.dirty_bytes,
                now.epochs);
    ret = EXIT_FINDING;
    goto out;
  }

  /* Drained.  The cached copy predates what was written: drop it while
   * the log is still ours, then the empty log itself.
   */
  bool dropped = discard_cache (&c, o, FSCD_CULL_KEEP_WLOG);
  fsc_wlog_close (wl);
  wl = NULL;
  /* A salvaged log still holds its damage, which only a forced
   * discard removes: what it loses was said above.
   */
  bool log_gone = dropped &&
    discard_cache (&c, o, info.damaged ? FSCD_CULL_FORCE : 0);
  if (info.damaged && !log_gone) {
    tool_error ("writeback: %s: the damaged write log could NOT be "
                "discarded (nbd-fscache invalidate --force discards it)",
                o->f.name);
    dropped = false;
  }
  printf ("%s: wrote back %" PRIu64 " bytes in %" PRIu64 " epoch%s to %s "
          "in %.1f s; %s\n", o->f.name, total, epochs, epochs == 1 ? "" : "s",
          uri, el,
          dropped ? "its cached data was discarded (the next proxy starts "
                    "cold)"
                  : "its cached data could NOT be discarded: invalidate it "
                    "before serving it again");
  if (info.damaged && log_gone)
    printf ("%s: the damaged write log was discarded: the export opens "
            "again\n", o->f.name);
  ret = dropped ? EXIT_SUCCESS : EXIT_FINDING;

 out:
  if (wl)
    fsc_wlog_close (wl);
  if (cache)
    fsc_cache_close (cache);
  if (pool.n)
    pool_close (&pool);
  tool_cache_close (&c);
  return ret;
}
