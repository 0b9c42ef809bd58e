/* nbd-fscache warm: fill a running fscache proxy's cache ahead of its
 * clients, either over a byte range or by replaying an access trace.
 *
 * The tool is a plain NBD client (libnbd): it asks the proxy, over N
 * connections, to NBD_CMD_CACHE each piece of what is to be warmed;
 * the filter answers a cache request by fetching the blocks it lacks
 * (fsc_object_prefetch), so nothing crosses the wire back but the
 * reply.  A server that does not advertise cache support is read from
 * instead, into scratch buffers that are thrown away: through the
 * fscache filter this fills the cache just the same.
 *
 * One thread drives every connection with libnbd's asynchronous calls
 * and one poll(2) over their sockets.  The requests come from one
 * generator (next_piece), in order:
 *
 *  - Range: [O, O+L) cut at multiples of the chunk size (1 MiB, or the
 *    server's maximum request), so that every piece but the first and
 *    last is whole blocks of any power-of-2 block size up to it.  At
 *    most DEPTH requests in flight per connection.
 *  - Trace: the entries in recorded order (an entry larger than the
 *    largest request the server takes is split in order).  At most W
 *    requests in flight across all connections, and the k-th is handed
 *    to libnbd only after the (k-1)-th: the order of a trace is what
 *    makes it worth replaying (a boot reads what it needs first).  The
 *    entries' timestamps are not replayed: warming goes as fast as the
 *    window and the link allow.
 *
 * --max-rate is a token bucket in front of the generator: a request
 * may be issued while the bucket is not negative, and takes its length
 * out of it (so a request larger than the bucket still goes, and the
 * average rate holds); the bucket refills at R bytes per second and
 * holds at most a tenth of a second's worth, so an idle moment does
 * not turn into a burst.  Requests are cut to a tenth of a second's
 * worth too (at least 4 KiB) so the rate is smooth.
 *
 * Exit status: 0 warmed, 1 a failure while warming (connection, server
 * error, trace unreadable or of another export), 2 a usage error.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#include "utils.h"

#include "trace-read.h"

#define PROG "nbd-fscache"
#define EXIT_WARM_FAILED 1
#define EXIT_USAGE 2

#define CHUNK_MAX (1024 * 1024)         /* range pieces, read buffers */
#define NBD_REQ_MAX (32 * 1024 * 1024)  /* without a server maximum */
#define DEPTH 8                         /* per connection, range mode */
#define DEFAULT_CONNECTIONS 4
#define MAX_CONNECTIONS 64
#define DEFAULT_WINDOW 16
#define MAX_WINDOW 1024
#define BAR_INTERVAL 0.1                /* seconds between bar updates */

struct warm;

struct conn {
  struct nbd_handle *nbd;
  unsigned inflight;
};

/* One request slot: in flight or free. */
struct slot {
  struct warm *w;
  struct conn *c;
  uint64_t offset, length;
  char *buf;                    /* scratch for reads, NULL for cache */
  bool busy;
};

struct warm {
  struct conn *conns;
  unsigned nconns;
  bool use_cache;               /* NBD_CMD_CACHE, else reads */
  uint64_t piece_max;           /* largest request we send */

  /* What to send: a range, or a trace's entries. */
  const struct trace *tr;       /* NULL: range */
  uint64_t next, end;           /* range: next offset, end */
  uint64_t chunk;               /* range: pieces cut at its multiples */
  size_t entry;                 /* trace: next entry */
  uint64_t entry_done;          /* trace: bytes of it already sent */

  struct slot *slots;
  unsigned nslots;              /* the window */
  unsigned per_conn;            /* in flight per connection, at most */
  unsigned inflight;

  /* Accounting, updated by the completion callback. */
  uint64_t total, done_bytes, requests, errors;
  int first_errno;
  const char *first_err_what;
  uint64_t first_err_offset, first_err_length;

  /* --max-rate, bytes per second (0: none). */
  double rate, tokens, last_refill;

  bool tty;
  double t0, last_bar;
};

static double
now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: " PROG " warm URI [--offset O] [--length L] [--connections N]\n"
"                        [--max-rate R]\n"
"       " PROG " warm URI --trace FILE [--window W] [--connections N]\n"
"                        [--max-rate R]\n"
"\n"
"Ask the nbdkit fscache proxy at URI to cache [O, O+L) of its export\n"
"(default: all of it), or the ranges of an access trace recorded with\n"
"fscache-trace=FILE, in recorded order.\n"
"\n"
"  -o, --offset O        start of the range (default 0)\n"
"  -l, --length L        bytes from O (default: to the end of the export)\n"
"  -c, --connections N   NBD connections (default %d, at most %d)\n"
"  -r, --max-rate R      at most R bytes per second (default: no limit)\n"
"  -t, --trace FILE      replay FILE's entries instead of a range\n"
"  -w, --window W        trace requests in flight, across connections\n"
"                        (default %d, at most %d)\n"
"  -d, --dir DIR         accepted as by every subcommand; unused here\n"
"  -h, --help            this text\n"
"\n"
"Sizes are bytes, or take a suffix: K, M, G, T (also KiB, MiB...) are\n"
"powers of 1024, like nbdkit's sizes (25M = 26214400); kB, MB, GB, TB\n"
"are powers of 1000 (25MB = 25000000).\n"
"\n"
"Exit status: 0 warmed, 1 failed while warming, 2 usage error.\n",
           DEFAULT_CONNECTIONS, MAX_CONNECTIONS, DEFAULT_WINDOW, MAX_WINDOW);
}

int
tool_parse_size (const char *s, uint64_t *out)
{
  static const struct { const char *suffix; uint64_t base; int power; }
  suffixes[] = {
    { "", 1, 0 }, { "b", 1, 0 }, { "B", 1, 0 },
    { "k", 1024, 1 }, { "K", 1024, 1 }, { "KiB", 1024, 1 },
    { "m", 1024, 2 }, { "M", 1024, 2 }, { "MiB", 1024, 2 },
    { "g", 1024, 3 }, { "G", 1024, 3 }, { "GiB", 1024, 3 },
    { "t", 1024, 4 }, { "T", 1024, 4 }, { "TiB", 1024, 4 },
    { "kB", 1000, 1 }, { "KB", 1000, 1 }, { "MB", 1000, 2 },
    { "GB", 1000, 3 }, { "TB", 1000, 4 },
  };
  uint64_t v = 0;
  const char *p = s;
  if (*p < '0' || *p > '9')
    return -1;
  for (; *p >= '0' && *p <= '9'; p++)
    if (MUL_OVERFLOW (v, 10, &v) || ADD_OVERFLOW (v, *p - '0', &v))
      return -1;
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    if (strcmp (p, suffixes[i].suffix) != 0)
      continue;
    for (int k = 0; k < suffixes[i].power; k++)
      if (MUL_OVERFLOW (v, suffixes[i].base, &v))
        return -1;
    *out = v;
    return 0;
  }
  return -1;
}

/* A count in [1, MAX]. */
static int
parse_count (const char *s, unsigned max, unsigned *out)
{
  uint64_t v;
  if (tool_parse_size (s, &v) == -1 || strcmp (s, "0") == 0 ||
      s[strspn (s, "0123456789")] != '\0' || v < 1 || v > max)
    return -1;
  *out = v;
  return 0;
}

/* The next piece to send, in order; false when there is none. */
static bool
next_piece (struct warm *w, uint64_t *offset, uint64_t *length)
{
  if (w->tr == NULL) {
    if (w->next >= w->end)
      return false;
    /* Cut at the next multiple of the chunk (never past the end). */
    uint64_t cut = w->next - w->next % w->chunk;
    if (ADD_OVERFLOW (cut, w->chunk, &cut) || cut > w->end)
      cut = w->end;
    *offset = w->next;
    *length = cut - w->next;
    w->next = cut;
    return true;
  }
  if (w->entry >= w->tr->nr_entries)
    return false;
  /* Entries are never empty (trace_read checks), so the next entry
   * always has a piece to give.
   */
  const struct trace_entry *e = &w->tr->entries[w->entry];
  *offset = e->offset + w->entry_done;
  *length = MIN (e->length - w->entry_done, w->piece_max);
  w->entry_done += *length;
  if (w->entry_done == e->length) {
    w->entry++;
    w->entry_done = 0;
  }
  return true;
}

static bool
more_to_send (const struct warm *w)
{
  if (w->tr == NULL)
    return w->next < w->end;
  return w->entry < w->tr->nr_entries;
}

/* libnbd calls this once per request, from the poll loop's notify. */
static int
request_done (void *opaque, int *error)
{
  struct slot *s = opaque;
  struct warm *w = s->w;
  s->busy = false;
  s->c->inflight--;
  w->inflight--;
  w->requests++;
  if (*error) {
    if (w->errors++ == 0) {
      w->first_errno = *error;
      w->first_err_what = w->use_cache ? "cache" : "read";
      w->first_err_offset = s->offset;
      w->first_err_length = s->length;
    }
  }
  else
    w->done_bytes += s->length;
  return 1;                     /* retire the command */
}

/* The connection with the fewest requests in flight, if it takes one
 * more; NULL if none does.
 */
static struct conn *
pick_conn (struct warm *w)
{
  struct conn *best = NULL;
  for (unsigned i = 0; i < w->nconns; i++) {
    struct conn *c = &w->conns[i];
    if (c->inflight < w->per_conn && (!best || c->inflight < best->inflight))
      best = c;
  }
  return best;
}

static struct slot *
free_slot (struct warm *w)
{
  for (unsigned i = 0; i < w->nslots; i++)
    if (!w->slots[i].busy)
      return &w->slots[i];
  return NULL;
}

static void
refill (struct warm *w, double t)
{
  if (w->rate == 0)
    return;
  w->tokens += (t - w->last_refill) * w->rate;
  if (w->tokens > w->rate * 0.1)
    w->tokens = w->rate * 0.1;
  w->last_refill = t;
}

/* Issue what the window, the connections and the bucket allow.
 * Returns -1 (with a message printed) if libnbd refuses a request.
 */
static int
issue (struct warm *w)
{
  while (w->inflight < w->nslots && more_to_send (w) &&
         (w->rate == 0 || w->tokens >= 0)) {
    struct conn *c = pick_conn (w);
    struct slot *s = free_slot (w);
    if (c == NULL || s == NULL)
      break;
    uint64_t off, len;
    if (!next_piece (w, &off, &len))
      break;
    s->c = c;
    s->offset = off;
    s->length = len;
    nbd_completion_callback cb = { .callback = request_done, .user_data = s };
    int64_t cookie;
    if (w->use_cache)
      cookie = nbd_aio_cache (c->nbd, len, off, cb, 0);
    else
      cookie = nbd_aio_pread (c->nbd, s->buf, len, off, cb, 0);
    if (cookie == -1) {
      fprintf (stderr, PROG ": warm: %s at offset %" PRIu64 ": %s\n",
               w->use_cache ? "cache" : "read", off, nbd_get_error ());
      return -1;
    }
    s->busy = true;
    c->inflight++;
    w->inflight++;
    w->tokens -= len;
  }
  return 0;
}

/* Wait for the sockets (at most TIMEOUT ms) and let libnbd move on.
 * Returns -1 (with a message printed) if a connection failed.
 */
static int
poll_once (struct warm *w, int timeout)
{
  struct pollfd fds[MAX_CONNECTIONS];
  unsigned dirs[MAX_CONNECTIONS];
  for (unsigned i = 0; i < w->nconns; i++) {
    struct nbd_handle *h = w->conns[i].nbd;
    fds[i].fd = nbd_aio_get_fd (h);
    if (fds[i].fd == -1) {
      fprintf (stderr, PROG ": warm: connection %u: %s\n", i + 1,
               nbd_get_error ());
      return -1;
    }
    dirs[i] = nbd_aio_get_direction (h);
    fds[i].events = 0;
    if (dirs[i] & LIBNBD_AIO_DIRECTION_READ)
      fds[i].events |= POLLIN;
    if (dirs[i] & LIBNBD_AIO_DIRECTION_WRITE)
      fds[i].events |= POLLOUT;
    fds[i].revents = 0;
  }
  if (poll (fds, w->nconns, timeout) == -1) {
    if (errno == EINTR)
      return 0;
    fprintf (stderr, PROG ": warm: poll: %s\n", strerror (errno));
    return -1;
  }
  for (unsigned i = 0; i < w->nconns; i++) {
    struct nbd_handle *h = w->conns[i].nbd;
    int r = 0;
    /* A hang-up or an error is for libnbd to find by reading. */
    if ((dirs[i] & LIBNBD_AIO_DIRECTION_READ) &&
        (fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
      r = nbd_aio_notify_read (h);
    else if ((dirs[i] & LIBNBD_AIO_DIRECTION_WRITE) &&
             (fds[i].revents & (POLLOUT | POLLHUP | POLLERR)))
      r = nbd_aio_notify_write (h);
    if (r == -1) {
      fprintf (stderr, PROG ": warm: connection %u: %s\n", i + 1,
               nbd_get_error ());
      return -1;
    }
  }
  return 0;
}

static void
human (char *buf, size_t len, uint64_t bytes)
{
  if (bytes >= (uint64_t) 1 << 30)
    snprintf (buf, len, "%.1f GiB", bytes / (double) (1 << 30));
  else
    snprintf (buf, len, "%.1f MiB", bytes / (double) (1 << 20));
}

static void
draw_bar (struct warm *w, double t)
{
  double el = t - w->t0;
  double rate = el > 0 ? w->done_bytes / el : 0;
  double pct = w->total ? 100.0 * w->done_bytes / w->total : 100;
  char done[32], total[32], eta[32] = "--:--";
  human (done, sizeof done, w->done_bytes);
  human (total, sizeof total, w->total);
  if (rate > 0 && w->done_bytes <= w->total) {
    uint64_t s = (w->total - w->done_bytes) / rate;
    snprintf (eta, sizeof eta, "%" PRIu64 ":%02" PRIu64, s / 60, s % 60);
  }
  fprintf (stderr, "\r%5.1f%%  %s / %s  %.1f MB/s  ETA %s\033[K",
           pct, done, total, rate / 1e6, eta);
  fflush (stderr);
  w->last_bar = t;
}

static int
run (struct warm *w)
{
  w->t0 = w->last_refill = w->last_bar = now ();
  w->tokens = 0;
  if (w->tty)
    draw_bar (w, w->t0);
  for (;;) {
    double t = now ();
    refill (w, t);
    if (issue (w) == -1)
      return -1;
    if (w->inflight == 0 && !more_to_send (w))
      break;
    /* Wake for the bar, and for the bucket when it holds us back. */
    int timeout = -1;
    if (w->tty)
      timeout = BAR_INTERVAL * 1000;
    if (w->rate && w->tokens < 0 && more_to_send (w)) {
      int ms = -w->tokens / w->rate * 1000 + 1;
      if (timeout == -1 || ms < timeout)
        timeout = ms;
    }
    if (poll_once (w, timeout) == -1)
      return -1;
    t = now ();
    if (w->tty && t - w->last_bar >= BAR_INTERVAL)
      draw_bar (w, t);
  }
  if (w->tty) {
    draw_bar (w, now ());
    fputc ('\n', stderr);
  }
  return 0;
}

static void
close_all (struct warm *w)
{
  for (unsigned i = 0; i < w->nconns; i++)
    if (w->conns[i].nbd) {
      nbd_shutdown (w->conns[i].nbd, 0);
      nbd_close (w->conns[i].nbd);
    }
  if (w->slots)
    for (unsigned i = 0; i < w->nslots; i++)
      free (w->slots[i].buf);
  free (w->slots);
  free (w->conns);
}

int
fscache_cmd_warm (int argc, char **argv)
{
  static const struct option long_opts[] = {
    { "offset", required_argument, NULL, 'o' },
    { "length", required_argument, NULL, 'l' },
    { "connections", required_argument, NULL, 'c' },
    { "max-rate", required_argument, NULL, 'r' },
    { "trace", required_argument, NULL, 't' },
    { "window", required_argument, NULL, 'w' },
    { "help", no_argument, NULL, 'h' },
    { "dir", required_argument, NULL, 'd' },
    { NULL, 0, NULL, 0 }
  };
  uint64_t offset = 0, length = 0, rate = 0;
  bool have_offset = false, have_length = false;
  unsigned connections = DEFAULT_CONNECTIONS, window = DEFAULT_WINDOW;
  bool have_window = false;
  const char *trace_file = NULL;
  int c;

  /* 0, not 1: glibc then starts afresh, permuting, instead of keeping
   * the "+" (stop at the first operand) of the top-level parse, which
   * would leave the options after the URI unparsed.
   */
  optind = 0;
  while ((c = getopt_long (argc, argv, "o:l:c:r:t:w:hd:", long_opts,
                           NULL)) != -1) {
    switch (c) {
    case 'o':
      if (tool_parse_size (optarg, &offset) == -1) {
        fprintf (stderr, PROG ": warm: --offset %s: not a size\n", optarg);
        return EXIT_USAGE;
      }
      have_offset = true;
      break;
    case 'l':
      if (tool_parse_size (optarg, &length) == -1) {
        fprintf (stderr, PROG ": warm: --length %s: not a size\n", optarg);
        return EXIT_USAGE;
      }
      have_length = true;
      break;
    case 'c':
      if (parse_count (optarg, MAX_CONNECTIONS, &connections) == -1) {
        fprintf (stderr, PROG ": warm: --connections %s: not a number "
                 "from 1 to %d\n", optarg, MAX_CONNECTIONS);
        return EXIT_USAGE;
      }
      break;
    case 'r':
      if (tool_parse_size (optarg, &rate) == -1 || rate == 0) {
        fprintf (stderr, PROG ": warm: --max-rate %s: not a size "
                 "(bytes per second, above 0)\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 't':
      trace_file = optarg;
      break;
    case 'w':
      if (parse_count (optarg, MAX_WINDOW, &window) == -1) {
        fprintf (stderr, PROG ": warm: --window %s: not a number "
                 "from 1 to %d\n", optarg, MAX_WINDOW);
        return EXIT_USAGE;
      }
      have_window = true;
      break;
    case 'h':
      usage (stdout);
      return 0;
    case 'd':
      /* Like every subcommand's; warm talks to a proxy, not to a
       * directory, so it has no use for it.
       */
      break;
    default:
      /* getopt said what it did not like. */
      fprintf (stderr, PROG ": warm: see '" PROG " warm --help'\n");
      return EXIT_USAGE;
    }
  }
  if (optind >= argc) {
    fprintf (stderr, PROG ": warm: missing URI (see '" PROG
             " warm --help')\n");
    return EXIT_USAGE;
  }
  if (optind + 1 < argc) {
    fprintf (stderr, PROG ": warm: %s: one URI only\n", argv[optind + 1]);
    return EXIT_USAGE;
  }
  const char *uri = argv[optind];
  if (trace_file && (have_offset || have_length)) {
    fprintf (stderr, PROG ": warm: --trace replays the trace's ranges: "
             "it takes no --offset or --length\n");
    return EXIT_USAGE;
  }
  if (!trace_file && have_window) {
    fprintf (stderr, PROG ": warm: --window is for --trace\n");
    return EXIT_USAGE;
  }

  /* The trace first: a bad file should not cost a connection. */
  struct trace tr;
  bool have_trace = false;
  if (trace_file) {
    char err[256];
    if (trace_read (trace_file, &tr, err, sizeof err) == -1) {
      fprintf (stderr, PROG ": warm: %s: %s\n", trace_file, err);
      return EXIT_WARM_FAILED;
    }
    have_trace = true;
    if (tr.stopped)
      fprintf (stderr, PROG ": warm: warning: %s: %s at byte %" PRIu64
               "; replaying the %zu entries of the %zu chunks before it\n",
               trace_file, tr.stopped, tr.stopped_at, tr.nr_entries,
               tr.good_chunks);
  }

  struct warm w = { .nconns = connections, .tty = isatty (2) };
  int status = EXIT_WARM_FAILED;
  w.conns = calloc (connections, sizeof *w.conns);
  if (w.conns == NULL) {
    fprintf (stderr, PROG ": warm: %s\n", strerror (errno));
    goto out;
  }
  for (unsigned i = 0; i < connections; i++) {
    w.conns[i].nbd = nbd_create ();
    if (w.conns[i].nbd == NULL ||
        nbd_connect_uri (w.conns[i].nbd, uri) == -1) {
      fprintf (stderr, PROG ": warm: %s: %s\n", uri, nbd_get_error ());
      goto out;
    }
  }
  struct nbd_handle *h0 = w.conns[0].nbd;
  int64_t size = nbd_get_size (h0);
  int can_cache = nbd_can_cache (h0);
  int64_t maxblock = nbd_get_block_size (h0, LIBNBD_SIZE_MAXIMUM);
  if (size == -1 || can_cache == -1) {
    fprintf (stderr, PROG ": warm: %s: %s\n", uri, nbd_get_error ());
    goto out;
  }
  w.use_cache = can_cache == 1;

  /* The largest request: the server's maximum (NBD's 32 MiB when it
   * names none), a scratch buffer's size for reads, and a tenth of a
   * second at --max-rate.
   */
  w.piece_max = maxblock > 0 ? MIN ((uint64_t) maxblock, NBD_REQ_MAX)
                             : NBD_REQ_MAX;
  if (!w.use_cache)
    w.piece_max = MIN (w.piece_max, CHUNK_MAX);
  if (rate) {
    w.rate = rate;
    w.piece_max = MIN (w.piece_max, MAX (ROUND_DOWN (rate / 10, 4096),
                                         (uint64_t) 4096));
  }
  w.chunk = MIN (w.piece_max, CHUNK_MAX);

  if (have_trace) {
    if (tr.size != (uint64_t) size) {
      fprintf (stderr, PROG ": warm: %s: recorded on an export of %" PRIu64
               " bytes, but %s has %" PRIi64 " bytes\n",
               trace_file, tr.size, uri, size);
      goto out;
    }
    w.tr = &tr;
    w.total = tr.total_bytes;
    w.nslots = window;
    w.per_conn = window;
  }
  else {
    if (offset > (uint64_t) size ||
        (have_length && length > (uint64_t) size - offset)) {
      fprintf (stderr, PROG ": warm: --offset %" PRIu64 " --length %" PRIu64
               ": past the end of the export (%" PRIi64 " bytes)\n",
               offset, length, size);
      status = EXIT_USAGE;
      goto out;
    }
    if (!have_length)
      length = size - offset;
    w.next = offset;
    w.end = offset + length;
    w.total = length;
    w.per_conn = DEPTH;
    w.nslots = DEPTH * connections;
  }

  w.slots = calloc (w.nslots, sizeof *w.slots);
  if (w.slots == NULL) {
    fprintf (stderr, PROG ": warm: %s\n", strerror (errno));
    goto out;
  }
  for (unsigned i = 0; i < w.nslots; i++) {
    w.slots[i].w = &w;
    if (!w.use_cache && (w.slots[i].buf = malloc (w.piece_max)) == NULL) {
      fprintf (stderr, PROG ": warm: %s\n", strerror (errno));
      goto out;
    }
  }

  if (run (&w) == -1)
    goto out;

  double el = now () - w.t0;
  printf ("warmed %" PRIu64 " bytes in %.1f s (%.1f MB/s), %" PRIu64
          " requests, %" PRIu64 " errors\n",
          w.done_bytes, el, el > 0 ? w.done_bytes / el / 1e6 : 0.0,
          w.requests, w.errors);
  fflush (stdout);
  if (w.errors) {
    fprintf (stderr, PROG ": warm: %" PRIu64 " requests failed; the first: "
             "%s of %" PRIu64 " bytes at offset %" PRIu64 ": %s\n",
             w.errors, w.first_err_what, w.first_err_length,
             w.first_err_offset, strerror (w.first_errno));
    goto out;
  }
  status = 0;

 out:
  close_all (&w);
  if (have_trace)
    trace_free (&tr);
  return status;
}
