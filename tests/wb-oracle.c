/* Tests: wb-oracle, a write-history oracle for ordered writeback.
 *
 * A writeback cache may hold writes back from its upstream, but the
 * upstream must always hold a state the client could have seen: the
 * state at one of its FLUSHes, plus some of the writes of the epoch
 * that followed it; and a write sent after a FUA write completed is
 * never there without that FUA write.  Anything else (a flushed write
 * lost, a write from a later epoch reaching the upstream before one of
 * an earlier epoch, a write issued after a completed FUA write present
 * without it, a torn block) is a bug.  This program produces a history and
 * judges images against it.
 *
 *   wb-oracle write URI LOG [options]   writes self-describing blocks
 *                                       through URI, logging each step
 *   wb-oracle check IMAGE LOG           is IMAGE a state of the history?
 *   wb-oracle check-flushed URI LOG     nothing flushed is lost
 *   wb-oracle check-final URI LOG       the last acknowledged writes
 *   wb-oracle block LOG SEQ             the 4 KiB of write SEQ, on stdout
 *                                       (to forge images in tests)
 *
 * Exit status: 0 success; 1 the image fails the check; 2 usage error or
 * the tool itself could not work (log unreadable, image too small,
 * cannot connect); 3 `write` stopped on an error from the server.
 *
 * Blocks (4096 bytes, every integer little-endian):
 *
 *   0   magic "WBORACLE"
 *   8   seq: 1, 2, 3... in issue order, unique within a run
 *   16  block index (the block it was written to)
 *   24  epoch: the number of flushes issued before it
 *   32  run id: random per run, so a block left by another run on the
 *       same disk is never taken for one of this run
 *   40  XXH3-64 of bytes 48..4095 seeded with XXH3-64 of bytes 0..39
 *   48  filler: 506 words, word i = mix (run id, seq, i)
 *
 * The filler is fully determined by the header, so a block mixing two
 * versions (torn at a sector) or one version and older content fails
 * the check even where the checksum alone could not say which part is
 * wrong; where the header sector itself is old, the filler of the
 * other sectors still names the write that tore it.
 *
 * The log, appended and flushed line by line so that a server killed
 * mid-run leaves a usable log:
 *
 *   # wb-oracle run=HEX blocks=N seed=S   the first line
 *   W seq blk epoch [fua]                 a write, before it is issued
 *   A seq                                 that write acknowledged
 *   F epoch                               a flush ending EPOCH, issued
 *   FA epoch                              that flush acknowledged
 *   E what errno                          the error that stopped the run
 *
 * Flush numbers: flush k (k >= 1) is the k-th flush, the one logged as
 * "F k-1"; it ends epoch k-1, and epoch k is the writes issued after it
 * (epoch 0 being the writes before the first flush).  "Flush 0" is the
 * start of the run.  S_k(b), the state of block b at flush k, is the
 * last write to b of an epoch < k, or b's initial content if none.
 *
 * The writer never has two writes to one block in flight at once: NBD
 * does not order concurrent requests, so the history would not say
 * which one the block holds.  And it waits for every write in flight
 * before a flush, so a flush covers exactly the writes of the epochs
 * before it.
 *
 * `check` computes, for each block, the interval of flush numbers k at
 * which its content is allowed (S_k(b), or a write to b of epoch k);
 * a version of epoch e followed by the next write to b in epoch e'
 * fits [e, e'].  The image is consistent at k when every block fits k,
 * found by one sweep over the intervals: O(writes + blocks + flushes).
 * Then FUA order, as a disk that lost power keeps it: let T be the
 * write issued last (by its W line) of those the image holds; every
 * FUA write acknowledged (its A line) before T's W line must be held,
 * or a later write to its block.  Non-FUA writes of an epoch stay
 * unordered among themselves, as on a disk.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#include "utils.h"
#include "xxh.h"

#define PROG "wb-oracle"
#define BLK 4096
#define HDR 48
#define NWORDS ((BLK - HDR) / 8)
#define SECTOR 512

#define EXIT_BAD 1
#define EXIT_TOOL 2
#define EXIT_SERVER 3

static const char magic[8] = { 'W', 'B', 'O', 'R', 'A', 'C', 'L', 'E' };

/* ---- blocks ---- */

/* splitmix64's finaliser: a bijection that scatters its input. */
static uint64_t
mix64 (uint64_t x)
{
  x ^= x >> 30;
  x *= UINT64_C (0xbf58476d1ce4e5b9);
  x ^= x >> 27;
  x *= UINT64_C (0x94d049bb133111eb);
  x ^= x >> 31;
  return x;
}

static uint64_t
filler_word (uint64_t run, uint64_t seq, uint64_t i)
{
  return mix64 (run ^ mix64 (seq * UINT64_C (0x9e3779b97f4a7c15) + i));
}

static uint64_t
block_sum (const unsigned char *p)
{
  return XXH3_64bits_withSeed (p + HDR, BLK - HDR, XXH3_64bits (p, 40));
}

static void
make_block (unsigned char *p, uint64_t run, uint64_t seq, uint64_t blk,
            uint64_t epoch)
{
  memcpy (p, magic, 8);
  put_le64 (p + 8, seq);
  put_le64 (p + 16, blk);
  put_le64 (p + 24, epoch);
  put_le64 (p + 32, run);
  for (uint64_t i = 0; i < NWORDS; i++)
    put_le64 (p + HDR + 8 * i, filler_word (run, seq, i));
  put_le64 (p + 40, block_sum (p));
}

/* ---- small helpers ---- */

static bool
parse_u64 (const char *s, uint64_t *v)
{
  char *end;
  if (*s < '0' || *s > '9')
    return false;
  errno = 0;
  unsigned long long r = strtoull (s, &end, 10);
  if (errno != 0 || *end != '\0')
    return false;
  *v = r;
  return true;
}

static void
opt_u64 (const char *name, const char *arg, uint64_t min, uint64_t max,
         uint64_t *v)
{
  if (!parse_u64 (arg, v) || *v < min || *v > max) {
    fprintf (stderr, "%s: --%s %s: not a number in [%" PRIu64 ", %" PRIu64
             "]\n", PROG, name, arg, min, max);
    exit (EXIT_TOOL);
  }
}

static void *
xcalloc (size_t n, size_t size)
{
  void *p = calloc (n ? n : 1, size);
  if (p == NULL) {
    perror (PROG ": calloc");
    exit (EXIT_TOOL);
  }
  return p;
}

static struct nbd_handle *
connect_uri (const char *uri)
{
  struct nbd_handle *h = nbd_create ();
  if (h == NULL || nbd_connect_uri (h, uri) == -1) {
    fprintf (stderr, "%s: %s: %s\n", PROG, uri, nbd_get_error ());
    exit (EXIT_TOOL);
  }
  return h;
}

/* ---- write ---- */

struct slot {
  struct writer *w;
  bool busy;
  uint64_t seq, blk;
  unsigned char buf[BLK];
};

struct writer {
  FILE *log;
  const char *logname;
  struct nbd_handle *h;
  struct slot *slots;
  uint64_t depth, inflight, acked;
  bool *busy_blk;           /* a write to this block is in flight */
  int err;                  /* the first error, logged; 0 if none */
};

static void
log_line (struct writer *w, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
static void
log_line (struct writer *w, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  vfprintf (w->log, fmt, ap);
  va_end (ap);
  if (fflush (w->log) == EOF || ferror (w->log)) {
    fprintf (stderr, "%s: %s: %m\n", PROG, w->logname);
    exit (EXIT_TOOL);
  }
}

/* Record the first error only: what follows it (the other writes in
 * flight failing with ENOTCONN) is its consequence.
 */
static void
fail_with (struct writer *w, const char *what, int err, const char *msg)
{
  if (w->err)
    return;
  if (err == 0)
    err = EIO;
  w->err = err;
  log_line (w, "E %s %d\n", what, err);
  fprintf (stderr, "%s: %s: %s\n", PROG, what, msg ? msg : strerror (err));
}

static int
write_done (void *user_data, int *error)
{
  struct slot *s = user_data;
  struct writer *w = s->w;

  if (*error)
    fail_with (w, "write", *error, NULL);     /* the server's reply */
  else if (!w->err) {
    log_line (w, "A %" PRIu64 "\n", s->seq);
    w->acked++;
  }
  s->busy = false;
  w->busy_blk[s->blk] = false;
  w->inflight--;
  return 1;
}

/* Wait for an event on the connection; false once the run has failed. */
static bool
poll_once (struct writer *w)
{
  if (w->err)
    return false;
  if (nbd_aio_is_dead (w->h) || nbd_aio_is_closed (w->h)) {
    fail_with (w, "connection", ENOTCONN, NULL);
    return false;
  }
  if (nbd_poll (w->h, -1) == -1) {
    fail_with (w, "poll", nbd_get_errno (), nbd_get_error ());
    return false;
  }
  return !w->err;
}

static bool
drain (struct writer *w)
{
  while (w->inflight > 0)
    if (!poll_once (w))
      return false;
  return true;
}

static uint64_t rng_state;

static uint64_t
rng (void)
{
  rng_state += UINT64_C (0x9e3779b97f4a7c15);
  return mix64 (rng_state);
}

/* The writes until the next flush: F/2 to 3F/2, at least 1. */
static uint64_t
flush_gap (uint64_t f)
{
  uint64_t lo = MAX (f / 2, 1);
  return lo + rng () % (f + 1);
}

static int
cmd_write (int argc, char *argv[])
{
  static const struct option longopts[] = {
    { "blocks", required_argument, NULL, 'b' },
    { "writes", required_argument, NULL, 'w' },
    { "flush-every", required_argument, NULL, 'f' },
    { "depth", required_argument, NULL, 'd' },
    { "seed", required_argument, NULL, 's' },
    { "fua-every", required_argument, NULL, 'u' },
    { "stop-after-flushes", required_argument, NULL, 'm' },
    { NULL, 0, NULL, 0 },
  };
  uint64_t blocks = 0, writes = 2000, flush_every = 16, depth = 1, seed = 0;
  uint64_t fua_every = 0, stop_after = 0;
  bool have_seed = false;
  int c;

  while ((c = getopt_long (argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'b': opt_u64 ("blocks", optarg, 1, UINT64_MAX / BLK, &blocks); break;
    case 'w': opt_u64 ("writes", optarg, 0, UINT64_MAX / 2, &writes); break;
    case 'f': opt_u64 ("flush-every", optarg, 0, UINT32_MAX, &flush_every);
      break;
    case 'd': opt_u64 ("depth", optarg, 1, 1024, &depth); break;
    case 's': opt_u64 ("seed", optarg, 0, UINT64_MAX, &seed);
      have_seed = true; break;
    case 'u': opt_u64 ("fua-every", optarg, 0, UINT64_MAX, &fua_every); break;
    case 'm': opt_u64 ("stop-after-flushes", optarg, 1, UINT64_MAX,
                       &stop_after); break;
    default: return EXIT_TOOL;
    }
  }
  if (argc - optind != 2) {
    fprintf (stderr, "usage: %s write URI LOG [--blocks N] [--writes W] "
             "[--flush-every F] [--depth D] [--seed S] [--fua-every K] "
             "[--stop-after-flushes M]\n", PROG);
    return EXIT_TOOL;
  }
  const char *uri = argv[optind], *logname = argv[optind + 1];

  uint64_t run;
  if (getrandom (&run, sizeof run, 0) != sizeof run) {
    perror (PROG ": getrandom");
    return EXIT_TOOL;
  }
  if (!have_seed)
    seed = mix64 (run);
  rng_state = seed;

  /* A writer killed by a dead socket would leave no E line. */
  struct sigaction sa = { .sa_handler = SIG_IGN };
  sigaction (SIGPIPE, &sa, NULL);

  struct writer w = { .logname = logname, .depth = depth };
  w.h = connect_uri (uri);
  int64_t size = nbd_get_size (w.h);
  if (size == -1) {
    fprintf (stderr, "%s: %s: %s\n", PROG, uri, nbd_get_error ());
    return EXIT_TOOL;
  }
  uint64_t export_blocks = (uint64_t) size / BLK;
  if (blocks == 0)
    blocks = export_blocks;
  if (blocks == 0 || blocks > export_blocks) {
    fprintf (stderr, "%s: %s: the export has %" PRIu64 " blocks of 4 KiB, "
             "cannot write to %" PRIu64 "\n", PROG, uri, export_blocks, blocks);
    return EXIT_TOOL;
  }
  if (blocks > SIZE_MAX / 2) {
    fprintf (stderr, "%s: --blocks %" PRIu64 ": too many\n", PROG, blocks);
    return EXIT_TOOL;
  }
  if (fua_every && nbd_can_fua (w.h) != 1) {
    fprintf (stderr, "%s: %s: the server does not support FUA\n", PROG, uri);
    return EXIT_TOOL;
  }

  w.log = fopen (logname, "w");
  if (w.log == NULL) {
    fprintf (stderr, "%s: %s: %m\n", PROG, logname);
    return EXIT_TOOL;
  }
  w.busy_blk = xcalloc (blocks, sizeof *w.busy_blk);
  w.slots = xcalloc (depth, sizeof *w.slots);
  for (uint64_t i = 0; i < depth; i++)
    w.slots[i].w = &w;

  log_line (&w, "# wb-oracle run=%016" PRIx64 " blocks=%" PRIu64
            " seed=%" PRIu64 "\n", run, blocks, seed);

  uint64_t seq = 0, epoch = 0, flushes = 0, since_flush = 0;
  uint64_t gap = flush_every ? flush_gap (flush_every) : 0;
  bool stopped = false;

  while (seq < writes && !w.err) {
    while (w.inflight >= depth)
      if (!poll_once (&w))
        goto out;
    uint64_t blk = rng () % blocks;
    while (w.busy_blk[blk])
      if (!poll_once (&w))
        goto out;
    struct slot *s = NULL;
    for (uint64_t i = 0; i < depth; i++)
      if (!w.slots[i].busy) {
        s = &w.slots[i];
        break;
      }
    if (s == NULL)              /* inflight < depth: cannot happen */
      abort ();

    seq++;
    bool fua = fua_every && seq % fua_every == 0;
    make_block (s->buf, run, seq, blk, epoch);
    s->seq = seq;
    s->blk = blk;
    s->busy = true;
    w.busy_blk[blk] = true;
    w.inflight++;
    log_line (&w, "W %" PRIu64 " %" PRIu64 " %" PRIu64 "%s\n",
              seq, blk, epoch, fua ? " fua" : "");
    nbd_completion_callback cb = { .callback = write_done, .user_data = s };
    if (nbd_aio_pwrite (w.h, s->buf, BLK, blk * BLK, cb,
                        fua ? LIBNBD_CMD_FLAG_FUA : 0) == -1) {
      /* The callback is not called for a command never queued. */
      s->busy = false;
      w.busy_blk[blk] = false;
      w.inflight--;
      fail_with (&w, "write", nbd_get_errno (), nbd_get_error ());
      break;
    }

    since_flush++;
    bool last = seq == writes;
    if ((gap && since_flush >= gap) || last) {
      if (!drain (&w))
        break;
      log_line (&w, "F %" PRIu64 "\n", epoch);
      if (nbd_flush (w.h, 0) == -1) {
        fail_with (&w, "flush", nbd_get_errno (), nbd_get_error ());
        break;
      }
      log_line (&w, "FA %" PRIu64 "\n", epoch);
      epoch++;
      flushes++;
      since_flush = 0;
      if (flush_every)
        gap = flush_gap (flush_every);
      if (stop_after && flushes >= stop_after) {
        stopped = true;
        break;
      }
    }
  }
 out:
  fprintf (stderr, "%s: write: %" PRIu64 " writes (%" PRIu64 " acked), %"
           PRIu64 " flushes, %" PRIu64 " blocks, depth %" PRIu64 ", seed %"
           PRIu64 ", run %016" PRIx64 "%s%s\n", PROG, seq, w.acked, flushes,
           blocks, depth, seed, run, stopped ? ", stopped as asked" : "",
           w.err ? ", FAILED" : "");
  int status = w.err ? EXIT_SERVER : 0;
  if (!w.err)
    nbd_shutdown (w.h, 0);      /* nothing in flight: a clean goodbye */
  nbd_close (w.h);
  if (fclose (w.log) == EOF) {
    fprintf (stderr, "%s: %s: %m\n", PROG, logname);
    status = EXIT_TOOL;
  }
  free (w.busy_blk);
  free (w.slots);
  return status;
}

/* ---- the log, parsed ---- */

struct wr {
  uint64_t blk, epoch;
  uint32_t pos;             /* its index among the writes to blk */
  bool acked, fua;
  uint64_t issued, acked_at;  /* the log lines of its W and A */
};

struct history {
  uint64_t run;
  bool have_run;
  uint64_t nblocks;         /* blocks=, or the highest block + 1 */
  uint64_t nw;              /* writes, seq 1..nw */
  struct wr *w;             /* indexed by seq; w[0] unused */
  uint64_t nflush;          /* F lines */
  uint64_t acked_flushes;   /* FA lines: flushes 1..acked_flushes acked */
  uint64_t *first;          /* per block: its first write's index in */
  uint64_t *seqs;           /* seqs, the writes grouped by block in order */
  uint32_t *count;          /* per block: writes to it */
};

static void
load_fail (const char *log, uint64_t line, const char *msg)
{
  fprintf (stderr, "%s: %s:%" PRIu64 ": %s\n", PROG, log, line, msg);
  exit (EXIT_TOOL);
}

/* Read LOG.  A last line without its newline is the writer killed
 * in the middle of it: ignored.
 */
static void
load_history (const char *log, struct history *hi)
{
  FILE *fp = fopen (log, "r");
  if (fp == NULL) {
    fprintf (stderr, "%s: %s: %m\n", PROG, log);
    exit (EXIT_TOOL);
  }
  memset (hi, 0, sizeof *hi);
  size_t cap = 1024;
  hi->w = xcalloc (cap, sizeof *hi->w);
  uint64_t maxblk = 0, line = 0, header_blocks = 0;
  char *buf = NULL;
  size_t bufsz = 0;
  ssize_t len;

  while ((len = getline (&buf, &bufsz, fp)) != -1) {
    line++;
    if (len == 0 || buf[len - 1] != '\n')
      break;
    buf[len - 1] = '\0';
    char *tok[6];
    int n = 0;
    for (char *save, *t = strtok_r (buf, " ", &save); t && n < 6;
         t = strtok_r (NULL, " ", &save))
      tok[n++] = t;
    if (n == 0)
      continue;
    uint64_t a, b, e;

    if (strcmp (tok[0], "#") == 0) {
      if (line != 1 || n < 2 || strcmp (tok[1], "wb-oracle") != 0)
        continue;               /* a comment */
      for (int i = 2; i < n; i++) {
        if (strncmp (tok[i], "run=", 4) == 0) {
          char *end;
          errno = 0;
          hi->run = strtoull (tok[i] + 4, &end, 16);
          if (errno || *end || end == tok[i] + 4)
            load_fail (log, line, "bad run=");
          hi->have_run = true;
        }
        else if (strncmp (tok[i], "blocks=", 7) == 0) {
          if (!parse_u64 (tok[i] + 7, &header_blocks) || header_blocks == 0
              || header_blocks > SIZE_MAX / 64)
            load_fail (log, line, "bad blocks=");
        }
      }
    }
    else if (strcmp (tok[0], "W") == 0) {
      if ((n != 4 && n != 5) || !parse_u64 (tok[1], &a)
          || !parse_u64 (tok[2], &b) || !parse_u64 (tok[3], &e)
          || (n == 5 && strcmp (tok[4], "fua") != 0))
        load_fail (log, line, "expected: W seq blk epoch [fua]");
      if (a != hi->nw + 1)
        load_fail (log, line, "writes are not numbered 1, 2, 3...");
      if (e != hi->nflush)
        load_fail (log, line, "the write's epoch is not the number of "
                   "flushes before it");
      if (header_blocks && b >= header_blocks)
        load_fail (log, line, "block beyond blocks=");
      if (b > SIZE_MAX / 64)
        load_fail (log, line, "block number too large");
      if (a >= cap) {
        size_t ncap;
        if (MUL_OVERFLOW (cap, (size_t) 2, &ncap))
          load_fail (log, line, "too many writes");
        struct wr *nw = realloc (hi->w, ncap * sizeof *nw);
        if (nw == NULL || ncap > SIZE_MAX / sizeof *nw)
          load_fail (log, line, "out of memory");
        memset (nw + cap, 0, (ncap - cap) * sizeof *nw);
        hi->w = nw;
        cap = ncap;
      }
      hi->w[a] = (struct wr) { .blk = b, .epoch = e, .fua = n == 5,
                               .issued = line };
      hi->nw = a;
      maxblk = MAX (maxblk, b);
    }
    else if (strcmp (tok[0], "A") == 0) {
      if (n != 2 || !parse_u64 (tok[1], &a) || a == 0 || a > hi->nw)
        load_fail (log, line, "expected: A seq, of a write issued before");
      if (hi->w[a].acked)
        load_fail (log, line, "a write acknowledged twice");
      hi->w[a].acked = true;
      hi->w[a].acked_at = line;
    }
    else if (strcmp (tok[0], "F") == 0) {
      if (n != 2 || !parse_u64 (tok[1], &e) || e != hi->nflush)
        load_fail (log, line, "expected: F epoch, the current epoch");
      hi->nflush++;
    }
    else if (strcmp (tok[0], "FA") == 0) {
      if (n != 2 || !parse_u64 (tok[1], &e) || e + 1 != hi->nflush
          || hi->acked_flushes != e)
        load_fail (log, line, "expected: FA epoch, of the last flush");
      hi->acked_flushes = e + 1;
    }
    else if (strcmp (tok[0], "E") == 0)
      ;                         /* the run stopped there */
    else
      load_fail (log, line, "unknown line");
  }
  if (ferror (fp)) {
    fprintf (stderr, "%s: %s: %m\n", PROG, log);
    exit (EXIT_TOOL);
  }
  free (buf);
  fclose (fp);

  hi->nblocks = header_blocks ? header_blocks : maxblk + 1;
  if (hi->nw == 0 && header_blocks == 0)
    hi->nblocks = 0;

  /* Group the writes by block, in issue order (a counting sort). */
  hi->count = xcalloc (hi->nblocks, sizeof *hi->count);
  hi->first = xcalloc (hi->nblocks + 1, sizeof *hi->first);
  hi->seqs = xcalloc (hi->nw, sizeof *hi->seqs);
  for (uint64_t s = 1; s <= hi->nw; s++) {
    if (hi->count[hi->w[s].blk] == UINT32_MAX)
      load_fail (log, line, "too many writes to one block");
    hi->w[s].pos = hi->count[hi->w[s].blk]++;
  }
  for (uint64_t b = 0; b < hi->nblocks; b++)
    hi->first[b + 1] = hi->first[b] + hi->count[b];
  for (uint64_t s = 1; s <= hi->nw; s++)
    hi->seqs[hi->first[hi->w[s].blk] + hi->w[s].pos] = s;
}

static void
free_history (struct history *hi)
{
  free (hi->w);
  free (hi->first);
  free (hi->seqs);
  free (hi->count);
}

/* ---- what a block holds ---- */

enum kind {
  K_INITIAL,                /* the content before the run */
  K_VERSION,                /* write seq, intact, in its place */
  K_BAD,                    /* anything else: why says what */
};

struct content {
  enum kind kind;
  uint64_t seq;             /* K_VERSION; for some K_BAD, the write */
  const char *why;          /* K_BAD */
};

enum initial { INIT_ANY, INIT_ZERO };

static bool
is_zero (const unsigned char *p)
{
  static const unsigned char zero[BLK];
  return memcmp (p, zero, BLK) == 0;
}

/* The write to block B, if any, whose filler appears at the start of
 * one of the sectors of P: the remains of a write torn at a sector.
 */
static uint64_t
torn_by (const struct history *hi, uint64_t b, const unsigned char *p)
{
  for (uint64_t j = hi->first[b]; j < hi->first[b + 1]; j++) {
    uint64_t s = hi->seqs[j];
    if (get_le64 (p + HDR) == filler_word (hi->run, s, 0))
      return s;
    for (uint64_t off = SECTOR; off < BLK; off += SECTOR)
      if (get_le64 (p + off) == filler_word (hi->run, s, (off - HDR) / 8))
        return s;
  }
  return 0;
}

static struct content
classify (const struct history *hi, uint64_t b, const unsigned char *p,
          enum initial init)
{
  struct content c = { .kind = K_BAD };

  if (memcmp (p, magic, 8) == 0 && get_le64 (p + 32) == hi->run) {
    uint64_t seq = get_le64 (p + 8);
    if (get_le64 (p + 40) != block_sum (p)) {
      c.why = "a block of this run with a bad checksum (torn or corrupt)";
      return c;
    }
    if (seq == 0 || seq > hi->nw || hi->w[seq].blk != b
        || get_le64 (p + 16) != b || get_le64 (p + 24) != hi->w[seq].epoch) {
      c.seq = seq <= hi->nw ? seq : 0;
      c.why = "a block of this run that was not written here (misplaced)";
      return c;
    }
    for (uint64_t i = 0; i < NWORDS; i++)
      if (get_le64 (p + HDR + 8 * i) != filler_word (hi->run, seq, i)) {
        c.seq = seq;
        c.why = "the header of a write but not all its data (torn)";
        return c;
      }
    c.kind = K_VERSION;
    c.seq = seq;
    return c;
  }

  /* Not a block of this run: the initial content, unless part of it
   * is one of this run's writes.
   */
  uint64_t s = hi->have_run ? torn_by (hi, b, p) : 0;
  if (s) {
    c.seq = s;
    c.why = "older content mixed with part of a write (torn)";
    return c;
  }
  if (init == INIT_ZERO && !is_zero (p)) {
    c.why = "neither zeroes nor a block of this run";
    return c;
  }
  c.kind = K_INITIAL;
  return c;
}

static void
describe (const struct history *hi, struct content c, char *out, size_t n)
{
  switch (c.kind) {
  case K_INITIAL:
    snprintf (out, n, "its initial content");
    break;
  case K_VERSION:
    snprintf (out, n, "write %" PRIu64 " (epoch %" PRIu64 ")", c.seq,
              hi->w[c.seq].epoch);
    break;
  case K_BAD:
    if (c.seq)
      snprintf (out, n, "%s, write %" PRIu64, c.why, c.seq);
    else
      snprintf (out, n, "%s", c.why);
    break;
  }
}

/* ---- images: a file or an NBD export, read block by block ---- */

struct image {
  const char *name;
  int fd;                   /* a file, or -1 */
  struct nbd_handle *h;     /* or an export */
  unsigned char *buf;
  uint64_t chunk;           /* blocks read at a time */
  uint64_t start, len;      /* the blocks in buf */
};

static void
open_image (struct image *im, const char *name, bool uri, uint64_t nblocks)
{
  uint64_t size;

  memset (im, 0, sizeof *im);
  im->name = name;
  im->fd = -1;
  if (uri) {
    im->h = connect_uri (name);
    int64_t sz = nbd_get_size (im->h);
    if (sz == -1) {
      fprintf (stderr, "%s: %s: %s\n", PROG, name, nbd_get_error ());
      exit (EXIT_TOOL);
    }
    size = sz;
    im->chunk = 1;              /* only the blocks of the log are read */
  }
  else {
    struct stat st;
    im->fd = open (name, O_RDONLY | O_CLOEXEC);
    if (im->fd == -1 || fstat (im->fd, &st) == -1) {
      fprintf (stderr, "%s: %s: %m\n", PROG, name);
      exit (EXIT_TOOL);
    }
    size = st.st_size;
    im->chunk = 256;
  }
  if (size / BLK < nblocks) {
    fprintf (stderr, "%s: %s: %" PRIu64 " bytes, smaller than the %" PRIu64
             " blocks of the log\n", PROG, name, size, nblocks);
    exit (EXIT_TOOL);
  }
  im->buf = xcalloc (im->chunk, BLK);
}

static const unsigned char *
read_block (struct image *im, uint64_t b, uint64_t nblocks)
{
  if (b < im->start || b >= im->start + im->len) {
    uint64_t n = MIN (im->chunk, nblocks - b);
    if (im->h) {
      if (nbd_pread (im->h, im->buf, n * BLK, b * BLK, 0) == -1) {
        fprintf (stderr, "%s: %s: reading block %" PRIu64 ": %s\n", PROG,
                 im->name, b, nbd_get_error ());
        exit (EXIT_TOOL);
      }
    }
    else {
      ssize_t r = pread (im->fd, im->buf, n * BLK, b * BLK);
      if (r != (ssize_t) (n * BLK)) {
        if (r >= 0)
          errno = EIO;          /* the file shrank under us */
        fprintf (stderr, "%s: %s: reading block %" PRIu64 ": %m\n", PROG,
                 im->name, b);
        exit (EXIT_TOOL);
      }
    }
    im->start = b;
    im->len = n;
  }
  return im->buf + (b - im->start) * BLK;
}

static void
close_image (struct image *im)
{
  if (im->h)
    nbd_close (im->h);
  if (im->fd >= 0)
    close (im->fd);
  free (im->buf);
}

/* ---- check at a flush ---- */

#define NONE UINT64_MAX

/* FUA order, given HELD (per block: the write it holds, 0 for its
 * initial content): a write acknowledged with FUA before the last
 * issued of the writes present was issued must be present, or a later
 * write to its block.  A disk that lost power may have lost any
 * unflushed write, but never a FUA write that completed before one it
 * kept was even sent.  O(writes + blocks).
 */
static int
check_fua_order (const struct history *hi, const uint64_t *held)
{
  uint64_t last = 0;                  /* the present write issued last */
  for (uint64_t b = 0; b < hi->nblocks; b++)
    if (held[b] && (!last || hi->w[held[b]].issued > hi->w[last].issued))
      last = held[b];
  if (!last)
    return 0;
  for (uint64_t s = 1; s <= hi->nw; s++) {
    const struct wr *x = &hi->w[s];
    if (!x->fua || !x->acked || x->acked_at > hi->w[last].issued)
      continue;
    if (held[x->blk] >= s)
      continue;
    char what[160];
    if (held[x->blk])
      snprintf (what, sizeof what, "write %" PRIu64 " (epoch %" PRIu64 ")",
                held[x->blk], hi->w[held[x->blk]].epoch);
    else
      snprintf (what, sizeof what, "its initial content");
    printf ("inconsistent: FUA order: block %" PRIu64 " holds %s, but write "
            "%" PRIu64 " (FUA, epoch %" PRIu64 ") to it completed before "
            "write %" PRIu64 " (block %" PRIu64 "), which is present, was "
            "issued\n", x->blk, what, s, x->epoch, last, hi->w[last].blk);
    return EXIT_BAD;
  }
  return 0;
}

static int
check_consistent (const struct history *hi, struct image *im,
                  enum initial init)
{
  uint64_t nb = hi->nblocks, nf = hi->nflush;
  CLEANUP_FREE uint64_t *lo = xcalloc (nb, sizeof *lo);
  CLEANUP_FREE uint64_t *hi_k = xcalloc (nb, sizeof *hi_k);
  CLEANUP_FREE uint64_t *held = xcalloc (nb, sizeof *held);
  CLEANUP_FREE uint64_t *diff = xcalloc (nf + 2, sizeof *diff);

  /* The interval of flush numbers at which each block fits. */
  for (uint64_t b = 0; b < nb; b++) {
    struct content c = classify (hi, b, read_block (im, b, nb), init);
    uint64_t n = hi->count[b];
    switch (c.kind) {
    case K_INITIAL:             /* S_k(b) until its first write's epoch */
      lo[b] = 0;
      hi_k[b] = n ? hi->w[hi->seqs[hi->first[b]]].epoch : nf;
      break;
    case K_VERSION: {           /* its epoch, to the next write's */
      const struct wr *v = &hi->w[c.seq];
      held[b] = c.seq;
      lo[b] = v->epoch;
      hi_k[b] = v->pos + 1 < n
        ? hi->w[hi->seqs[hi->first[b] + v->pos + 1]].epoch : nf;
      break;
    }
    case K_BAD:
      lo[b] = NONE;
      hi_k[b] = 0;
      continue;
    }
    diff[lo[b]]++;
    diff[hi_k[b] + 1]--;        /* wraps, and wraps back in the sum */
  }

  /* The sweep: at each k, how many blocks fit.  The best k is the
   * largest that all fit, or failing that the largest that most fit.
   */
  uint64_t best = 0, best_n = 0, fit = 0;
  for (uint64_t k = 0; k <= nf; k++) {
    fit += diff[k];
    if (fit >= best_n) {
      best = k;
      best_n = fit;
    }
  }

  if (best_n == nb) {
    if (check_fua_order (hi, held) != 0)
      return EXIT_BAD;
    uint64_t newer = 0;
    for (uint64_t b = 0; b < nb; b++)
      if (held[b] && hi->w[held[b]].epoch == best)
        newer++;
    printf ("consistent at flush %" PRIu64 " (%" PRIu64
            " blocks from epoch %" PRIu64 ")\n", best, newer, best);
    return 0;
  }

  for (uint64_t b = 0; b < nb; b++) {
    if (lo[b] != NONE && lo[b] <= best && best <= hi_k[b])
      continue;
    struct content c = classify (hi, b, read_block (im, b, nb), init);
    char what[160], want[160];
    describe (hi, c, what, sizeof what);
    /* S_best(b): the last write to b of an epoch before best. */
    uint64_t s = 0;
    for (uint64_t j = hi->first[b]; j < hi->first[b + 1]; j++)
      if (hi->w[hi->seqs[j]].epoch < best)
        s = hi->seqs[j];
    if (s)
      snprintf (want, sizeof want, "write %" PRIu64 " (epoch %" PRIu64 ")",
                s, hi->w[s].epoch);
    else
      snprintf (want, sizeof want, "its initial content");
    printf ("inconsistent: at best flush %" PRIu64 " (%" PRIu64 " of %"
            PRIu64 " blocks fit) block %" PRIu64 " holds %s, expected %s"
            " or a write of epoch %" PRIu64 "\n",
            best, best_n, nb, b, what, want, best);
    return EXIT_BAD;
  }
  abort ();                     /* best_n < nb: some block does not fit */
}

/* ---- check against a floor ---- */

/* Block B must hold write FLOOR (0: its initial content) or a write
 * to B issued after it.  Returns true if it does.
 */
static bool
fits_floor (uint64_t floor, struct content c)
{
  switch (c.kind) {
  case K_INITIAL: return floor == 0;
  case K_VERSION: return c.seq >= floor;
  case K_BAD: return false;
  }
  return false;
}

enum floor_kind { FLOOR_FINAL, FLOOR_FLUSHED };

static int
check_floor (const struct history *hi, struct image *im, enum initial init,
             enum floor_kind fk, bool all_blocks)
{
  uint64_t nb = hi->nblocks, checked = 0;
  /* Flushes 1..acked_flushes are acknowledged: S_k, k = acked_flushes. */
  uint64_t k = hi->acked_flushes;

  for (uint64_t b = 0; b < nb; b++) {
    if (!all_blocks && hi->count[b] == 0)
      continue;
    uint64_t floor = 0;
    for (uint64_t j = hi->first[b]; j < hi->first[b + 1]; j++) {
      uint64_t s = hi->seqs[j];
      const struct wr *v = &hi->w[s];
      if (fk == FLOOR_FINAL ? v->acked
          : v->epoch < k || (v->fua && v->acked))
        floor = s;
    }
    struct content c = classify (hi, b, read_block (im, b, nb), init);
    checked++;
    if (!fits_floor (floor, c)) {
      char what[160], want[160];
      describe (hi, c, what, sizeof what);
      if (floor)
        snprintf (want, sizeof want, "write %" PRIu64 " (epoch %" PRIu64
                  ") or a later one", floor, hi->w[floor].epoch);
      else
        snprintf (want, sizeof want, "its initial content or a write");
      printf ("%s: block %" PRIu64 " holds %s, expected %s\n",
              fk == FLOOR_FINAL ? "not final" : "flushed write lost",
              b, what, want);
      return EXIT_BAD;
    }
  }
  printf ("%" PRIu64 " blocks ok\n", checked);
  return 0;
}

static int
cmd_check (int argc, char *argv[], const char *cmd)
{
  static const struct option longopts[] = {
    { "final", no_argument, NULL, 'f' },
    { "initial", required_argument, NULL, 'i' },
    { NULL, 0, NULL, 0 },
  };
  bool final = false, uri = strcmp (cmd, "check") != 0;
  enum initial init = INIT_ANY;
  int c;

  while ((c = getopt_long (argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'f':
      if (uri)
        goto usage;
      final = true;
      break;
    case 'i':
      if (strcmp (optarg, "zero") == 0)
        init = INIT_ZERO;
      else if (strcmp (optarg, "any") == 0)
        init = INIT_ANY;
      else {
        fprintf (stderr, "%s: --initial %s: expected zero or any\n", PROG,
                 optarg);
        return EXIT_TOOL;
      }
      break;
    default:
      return EXIT_TOOL;
    }
  }
  if (argc - optind != 2) {
  usage:
    if (uri)
      fprintf (stderr, "usage: %s %s URI LOG [--initial zero|any]\n", PROG,
               cmd);
    else
      fprintf (stderr, "usage: %s check IMAGE LOG [--final] "
               "[--initial zero|any]\n", PROG);
    return EXIT_TOOL;
  }

  struct history hi;
  struct image im;
  int r;
  load_history (argv[optind + 1], &hi);
  if (!hi.have_run) {
    fprintf (stderr, "%s: %s: no run= header line\n", PROG, argv[optind + 1]);
    return EXIT_TOOL;
  }
  open_image (&im, argv[optind], uri, hi.nblocks);
  if (strcmp (cmd, "check-flushed") == 0)
    r = check_floor (&hi, &im, init, FLOOR_FLUSHED, false);
  else if (strcmp (cmd, "check-final") == 0)
    r = check_floor (&hi, &im, init, FLOOR_FINAL, false);
  else if (final)
    r = check_floor (&hi, &im, init, FLOOR_FINAL, true);
  else
    r = check_consistent (&hi, &im, init);
  close_image (&im);
  free_history (&hi);
  return r;
}

/* ---- block: forge a version ---- */

static int
cmd_block (int argc, char *argv[])
{
  uint64_t seq;
  if (argc != 3 || !parse_u64 (argv[2], &seq)) {
    fprintf (stderr, "usage: %s block LOG SEQ\n", PROG);
    return EXIT_TOOL;
  }
  struct history hi;
  load_history (argv[1], &hi);
  if (!hi.have_run || seq == 0 || seq > hi.nw) {
    fprintf (stderr, "%s: %s: no write %" PRIu64 " in this run\n", PROG,
             argv[1], seq);
    return EXIT_TOOL;
  }
  unsigned char p[BLK];
  make_block (p, hi.run, seq, hi.w[seq].blk, hi.w[seq].epoch);
  free_history (&hi);
  if (fwrite (p, BLK, 1, stdout) != 1 || fflush (stdout) == EOF) {
    fprintf (stderr, "%s: stdout: %m\n", PROG);
    return EXIT_TOOL;
  }
  return 0;
}

int
main (int argc, char *argv[])
{
  if (argc < 2) {
    fprintf (stderr, "usage: %s write|check|check-flushed|check-final|block "
             "ARGS...\n", PROG);
    return EXIT_TOOL;
  }
  const char *cmd = argv[1];
  argc--;
  argv++;
  if (strcmp (cmd, "write") == 0)
    return cmd_write (argc, argv);
  if (strcmp (cmd, "check") == 0 || strcmp (cmd, "check-flushed") == 0
      || strcmp (cmd, "check-final") == 0)
    return cmd_check (argc, argv, cmd);
  if (strcmp (cmd, "block") == 0)
    return cmd_block (argc, argv);
  fprintf (stderr, "%s: %s: unknown subcommand\n", PROG, cmd);
  return EXIT_TOOL;
}
