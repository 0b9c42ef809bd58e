/* Unit test: the write log of writeback mode (core/wlog/wlog.c) and its
 * writer (core/wlog/writeback.c), against a model.
 *
 * The upstream is a buffer in memory; the client's view is another
 * (the model), changed by every write, zero and trim the test makes
 * through the log.  Checked: every read through the log equals the
 * model; after a drain the upstream equals it; at every upstream flush
 * the upstream equals the client's state at one of its flushes (the
 * writer keeps epochs in order); recovery after a clean close and
 * after a torn tail; a log that no longer fits the upstream is
 * refused; a damaged dirty unit reads as EIO, never as the upstream's
 * older bytes; a damaged record header before a marker refuses the
 * log and a salvage sends only what precedes it (Rule 7), after the
 * last marker it is a torn tail; writes wait at the dirty bound
 * instead of failing; a flush with nothing new costs no marker and no
 * sync, and the bound holds markers and records too (rule 9 of
 * core/wlog/wlog.c), whose memory per dirty GiB is measured.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fscache.h"
#include "keyenc.h"
#include "wlog.h"
#include "unit.h"
#include "utils.h"

#define BS 4096u
#define SIZE (1024u * 1024u + 12345u)   /* not a multiple of 4K */
#define MAXSNAP 256

static unsigned char upstream[SIZE];
static unsigned char model[SIZE];
static pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned in_flight, max_in_flight;
static int up_fail;                     /* writer's calls fail */
static uint64_t up_writes, up_flushes;

/* Client states at each flush, for the epoch check. */
static unsigned char *snap[MAXSNAP];
static unsigned nsnap;
static bool check_epochs;
static unsigned epoch_violations;

static const char *key = "wkey\0export=";
static const size_t key_len = 12;
static char dir[64];

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  CHECK (offset + count <= SIZE);
  pthread_mutex_lock (&up_lock);
  memcpy (buf, upstream + offset, count);
  pthread_mutex_unlock (&up_lock);
  return 0;
}

static int
enter (void)
{
  pthread_mutex_lock (&up_lock);
  if (up_fail) {
    pthread_mutex_unlock (&up_lock);
    errno = EIO;
    return -1;
  }
  if (++in_flight > max_in_flight)
    max_in_flight = in_flight;
  pthread_mutex_unlock (&up_lock);
  return 0;
}

/* Calls overlap (the writer's requests are disjoint): counted only. */
static void
leave (void)
{
  pthread_mutex_lock (&up_lock);
  in_flight--;
  pthread_mutex_unlock (&up_lock);
}

static int
wb_pwrite (void *o, const void *buf, uint32_t count, uint64_t offset)
{
  CHECK (offset + count <= SIZE);
  if (enter () == -1)
    return -1;
  memcpy (upstream + offset, buf, count);
  __atomic_add_fetch (&up_writes, 1, __ATOMIC_RELAXED);
  usleep (100);                         /* long enough to overlap */
  leave ();
  return 0;
}

static int
wb_zero (void *o, uint32_t count, uint64_t offset)
{
  CHECK (offset + count <= SIZE);
  if (enter () == -1)
    return -1;
  memset (upstream + offset, 0, count);
  leave ();
  return 0;
}

static int
wb_flush (void *o)
{
  if (enter () == -1)
    return -1;
  up_flushes++;
  /* The writer sends nothing while it flushes. */
  if (check_epochs) {
    bool ok = false;
    for (unsigned i = 0; i < nsnap && !ok; ++i)
      ok = memcmp (snap[i], upstream, SIZE) == 0;
    if (!ok)
      epoch_violations++;
  }
  leave ();
  return 0;
}

static int
wb_pread (void *o, void *buf, uint32_t count, uint64_t offset)
{
  return up_pread (o, buf, count, offset);
}

static struct fsc_wb_upstream wbup = {
  .pwrite = wb_pwrite, .zero = wb_zero, .trim = wb_zero, .flush = wb_flush,
  .pread = wb_pread, .nparallel = 4, .can_trim = true, .can_zero = true,
  .can_flush = true,
};
static const struct fsc_upstream up = { .pread = up_pread };

static struct fsc_cache *
open_cache (const char *faults)
{
  struct fsc_cache *c;
  struct fsc_cache_config cfg = { .dir = dir, .create = true,
                                  .faults = faults };
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  return c;
}

static struct fsc_object *
open_obj (struct fsc_cache *c)
{
  struct fsc_object *o;
  struct fsc_open_info info;
  struct fsc_object_params p = {
    .key = key, .key_len = key_len, .block_size = 65536, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE,
  };
  CHECK (fsc_object_open (c, &p, &o, &info) == 0);
  return o;
}

static struct fsc_wlog_params
params (uint64_t size, const char *gen)
{
  struct fsc_wlog_params p = {
    .key = key, .key_len = key_len, .size = size, .generation = gen,
    .dirty_max = 64 << 20,
  };
  return p;
}

static struct fsc_wlog *
open_log (struct fsc_cache *c, struct fsc_wlog_info *info)
{
  struct fsc_wlog *wl;
  struct fsc_wlog_params p = params (SIZE, "g1");
  CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, info) == 0);
  return wl;
}

static uint64_t
rnd (uint64_t n)
{
  return ((uint64_t) rand () << 31 ^ rand ()) % n;
}

/* Read the whole export through the log in odd pieces; compare. */
static void
check_reads (struct fsc_wlog *wl, struct fsc_object *o)
{
  static unsigned char got[SIZE];
  for (uint64_t off = 0; off < SIZE;) {
    uint64_t want = 1 + rnd (200000);
    uint32_t n = MIN (SIZE - off, want);
    if (fsc_wlog_read (wl, o, got + off, n, off, &up, 0) != 0)
      fprintf (stderr, "read %llu+%u: %m\n", (unsigned long long) off, n), exit (1);
    off += n;
  }
  for (size_t i = 0; i < SIZE; ++i)
    if (got[i] != model[i]) {
      fprintf (stderr, "first difference at %zu (block %zu present %d), "
               "upstream %s\n", i, i / 65536,
               fsc_object_block_present (o, i / 65536),
               upstream[i] == model[i] ? "right" : "wrong");
      break;
    }
  CHECK (memcmp (got, model, SIZE) == 0);
}

/* One random client operation through the log, mirrored in the model. */
static void
random_op (struct fsc_wlog *wl, struct fsc_object *o)
{
  static unsigned char buf[300000];
  unsigned k = rnd (10);
  uint64_t off, n;
  if (k < 3) {                  /* aligned write */
    off = rnd (SIZE / BS) * BS;
    uint64_t want = (1 + rnd (40)) * BS;
    n = MIN (SIZE - off, want);
  }
  else {                        /* any alignment */
    off = rnd (SIZE);
    uint64_t most = MIN (SIZE - off, (uint64_t) sizeof buf);
    n = 1 + rnd (most);
  }
  if (k < 7) {
    for (uint64_t i = 0; i < n; ++i)
      buf[i] = rand ();
    bool fua = rnd (8) == 0;
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, n, off, fua) == 0);
    memcpy (model + off, buf, n);
    if (fua) {
      /* A completed FUA write ends its epoch (rule 6, atop
       * core/wlog/writeback.c): the upstream may be flushed at this state.
       */
      CHECK (nsnap < MAXSNAP);
      snap[nsnap] = malloc (SIZE);
      CHECK (snap[nsnap] != NULL);
      memcpy (snap[nsnap++], model, SIZE);
    }
  }
  else if (k < 9) {
    CHECK (fsc_wlog_zero (wl, o, &up, n, off, false) == 0);
    memset (model + off, 0, n);
  }
  else {
    /* A trim drops only whole units; they then read as zeroes here and
     * upstream (wb_zero serves as trim).
     */
    CHECK (fsc_wlog_trim (wl, n, off, false) == 0);
    uint64_t a = (off + BS - 1) / BS * BS;
    uint64_t b = off + n == SIZE ? SIZE : (off + n) / BS * BS;
    if (a < b)
      memset (model + a, 0, b - a);
  }
}

static void
flush_snap (struct fsc_wlog *wl)
{
  CHECK (fsc_wlog_flush (wl) == 0);
  CHECK (nsnap < MAXSNAP);
  snap[nsnap] = malloc (SIZE);
  CHECK (snap[nsnap] != NULL);
  memcpy (snap[nsnap++], model, SIZE);
}

/* A thread that flushes until told to stop. */
struct flusher {
  struct fsc_wlog *wl;
  bool stop;
  int err;
  unsigned n;
};

static void *
flush_loop (void *arg)
{
  struct flusher *f = arg;
  while (!__atomic_load_n (&f->stop, __ATOMIC_SEQ_CST)) {
    if (fsc_wlog_flush (f->wl) == -1)
      f->err = errno;
    f->n++;
  }
  return NULL;
}

static void
path_of (char *buf, size_t n, const char *suffix)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  fsc_key_encode (key, key_len, name, fan);
  snprintf (buf, n, "%s/objects/%s/%s%s", dir, fan, name, suffix);
}

/* Log syncs seen (the trace of section 10). */
static unsigned syncs;

static void
count_syncs (void *opaque, int op, int kind, const void *buf, size_t n,
             uint64_t off)
{
  if (op == FSC_OP_SYNC && kind == FSC_FILE_WLOG)
    __atomic_add_fetch (&syncs, 1, __ATOMIC_RELAXED);
}

/* Section 11's client: N zeroes of one unit, each with a flush. */
struct zloop {
  struct fsc_wlog *wl;
  struct fsc_object *o;
  uint64_t n, done;
  bool stop;                            /* set: end the loop early */
};

static void *
zero_loop (void *arg)
{
  struct zloop *z = arg;
  for (uint64_t i = 0; i < z->n && !__atomic_load_n (&z->stop,
                                                      __ATOMIC_ACQUIRE); ++i) {
    uint64_t off = i % (SIZE / BS) * BS;
    CHECK (fsc_wlog_zero (z->wl, z->o, &up, BS, off, false) == 0);
    memset (model + off, 0, BS);
    CHECK (fsc_wlog_flush (z->wl) == 0);
    __atomic_store_n (&z->done, i + 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

int
main (void)
{
  struct fsc_wlog_info info;
  char logpath[512];

  srand (7);
  for (size_t i = 0; i < SIZE; ++i)
    upstream[i] = model[i] = rand ();
  snprintf (dir, sizeof dir, "/tmp/unit-wlog-XXXXXX");
  CHECK (mkdtemp (dir) != NULL);
  strcat (dir, "/cache");
  path_of (logpath, sizeof logpath, ".wlog");

  /* 1. Writes without a writer: reads see them, the upstream not. */
  struct fsc_cache *c = open_cache (NULL);
  struct fsc_object *o = open_obj (c);
  struct fsc_wlog *wl = open_log (c, &info);
  CHECK (info.created);
  snap[nsnap] = malloc (SIZE);
  memcpy (snap[nsnap++], model, SIZE);  /* the state before any write */
  static unsigned char orig[SIZE];
  memcpy (orig, upstream, SIZE);
  for (int i = 0; i < 300; ++i) {
    random_op (wl, o);
    if (rnd (12) == 0)
      flush_snap (wl);
    if (rnd (50) == 0)
      check_reads (wl, o);
  }
  flush_snap (wl);
  check_reads (wl, o);
  CHECK (memcmp (upstream, orig, SIZE) == 0);
  fsc_wlog_counters (wl, &info);
  CHECK (info.records > 0 && info.dirty_bytes > 0 && info.epochs > 1);
  uint64_t epochs_logged = info.epochs;
  fprintf (stderr, "logged: %llu records, %llu epochs, %llu bytes\n",
           (unsigned long long) info.records,
           (unsigned long long) info.epochs,
           (unsigned long long) info.log_bytes);

  /* 2. Recovery after a clean close: the same view. */
  fsc_wlog_close (wl);
  wl = open_log (c, &info);
  CHECK (!info.created && info.records > 0);
  check_reads (wl, o);

  /* 3. A log that does not fit the upstream is refused, untouched. */
  struct fsc_wlog *wl2;
  struct fsc_wlog_params p2 = params (SIZE, "g1");
  CHECK (fsc_wlog_open (c, &p2, 0, &wl2, &info) == -1 && errno == EBUSY);
  fsc_wlog_close (wl);
  p2 = params (SIZE + 4096, "g1");
  CHECK (fsc_wlog_open (c, &p2, 0, &wl2, &info) == -1 && errno == ESTALE);
  CHECK_EQ (info.mismatch, FSC_WLOG_SIZE_CHANGED);
  p2 = params (SIZE, "g2");
  CHECK (fsc_wlog_open (c, &p2, 0, &wl2, &info) == -1 && errno == ESTALE);
  CHECK_EQ (info.mismatch, FSC_WLOG_GENERATION_CHANGED);
  wl = open_log (c, &info);
  check_reads (wl, o);

  /* 4. The writer, epoch by epoch: at each upstream flush the upstream
   * is one of the client's flushed states; after the drain, the model.
   */
  check_epochs = true;
  CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
  CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
  CHECK (memcmp (upstream, model, SIZE) == 0);
  CHECK_EQ (epoch_violations, 0);
  CHECK (up_flushes >= epochs_logged);
  CHECK (max_in_flight > 1);            /* it used the parallelism */
  check_reads (wl, o);
  fprintf (stderr, "written back: %llu writes, %llu flushes, %u at once\n",
           (unsigned long long) up_writes, (unsigned long long) up_flushes,
           max_in_flight);
  check_epochs = false;

  /* 5. With the writer running: reads always right, then drained; a
   * serial upstream never sees two calls at once.
   */
  fsc_wlog_close (wl);
  wbup.nparallel = 1;
  max_in_flight = 0;
  wl = open_log (c, &info);
  CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
  for (int i = 0; i < 300; ++i) {
    random_op (wl, o);
    if (rnd (10) == 0)
      CHECK (fsc_wlog_flush (wl) == 0);
    if (rnd (60) == 0)
      check_reads (wl, o);
  }
  CHECK (fsc_wlog_flush (wl) == 0);
  CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
  CHECK (memcmp (upstream, model, SIZE) == 0);
  CHECK_EQ (max_in_flight, 1);
  check_reads (wl, o);

  /* 6. An outage: writes and flushes go on, the writer retries. */
  up_fail = 1;
  for (int i = 0; i < 50; ++i)
    random_op (wl, o);
  CHECK (fsc_wlog_flush (wl) == 0);
  check_reads (wl, o);
  CHECK (fsc_wlog_drain (wl, 300) > 0);
  up_fail = 0;
  CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
  CHECK (memcmp (upstream, model, SIZE) == 0);
  unsigned n = fsc_wlog_take_notices (wl, NULL, NULL);
  CHECK (n & FSC_WLOG_NOTICE_UPSTREAM);
  fsc_wlog_close (wl);

  /* 7. A torn tail: flushed records survive any cut after them. */
  wl = open_log (c, &info);
  CHECK_EQ (info.records, 0);
  /* Rule 6 (atop core/wlog/writeback.c): a completed FUA write ends its
   * epoch, so the write after it is in the next one; a flush right
   * after it finds nothing to end.  Writes 0 (FUA) | flush | 1, 2
   * (FUA) | 3: three epochs (two without the rule).
   */
  {
    static unsigned char b1[BS];
    for (int i = 0; i < 4; ++i) {
      memset (b1, 0xa0 + i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, b1, BS, i * BS,
                              i == 0 || i == 2) == 0);
      memcpy (model + i * BS, b1, BS);
      if (i == 0)
        CHECK (fsc_wlog_flush (wl) == 0);
    }
    fsc_wlog_counters (wl, &info);
    CHECK_EQ (info.epochs, 3);
  }
  /* ... and concurrent flushes make no empty epochs: 100 FUA writes,
   * one at a time, while another thread flushes in a loop; a flush
   * that ends a FUA write's epoch while it syncs leaves it nothing to
   * end.  Each FUA write then has an epoch of its own, and there are
   * no others: 3 + 100.
   */
  {
    static unsigned char b1[BS];
    CHECK (fsc_wlog_flush (wl) == 0);   /* ends write 3's epoch */
    struct flusher fl = { .wl = wl };
    pthread_t th;
    CHECK (pthread_create (&th, NULL, flush_loop, &fl) == 0);
    for (int i = 0; i < 100; ++i) {
      uint64_t off = (4 + i % 8) * BS;
      memset (b1, i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, b1, BS, off, true) == 0);
      memcpy (model + off, b1, BS);
    }
    __atomic_store_n (&fl.stop, true, __ATOMIC_SEQ_CST);
    CHECK (pthread_join (th, NULL) == 0);
    CHECK (fl.err == 0 && fl.n > 0);
    fsc_wlog_counters (wl, &info);
    fprintf (stderr, "FUA writes and %u concurrent flushes: %llu epochs\n",
             fl.n, (unsigned long long) info.epochs);
    CHECK_EQ (info.epochs, 103);
  }
  for (int i = 0; i < 40; ++i)
    random_op (wl, o);
  CHECK (fsc_wlog_flush (wl) == 0);
  static unsigned char flushed[SIZE];
  memcpy (flushed, model, SIZE);
  struct stat st;
  CHECK (stat (logpath, &st) == 0);
  off_t durable = st.st_size;
  /* Then 40 writes of one record each, unflushed, and the client's
   * state after each: recovery must find one of these states.
   */
  enum { NW = 40 };
  static unsigned char states[NW + 1][SIZE];
  memcpy (states[0], model, SIZE);
  for (int i = 0; i < NW; ++i) {
    static unsigned char buf[16 * BS];
    uint64_t off = rnd (SIZE / BS - 16) * BS, len = (1 + rnd (16)) * BS;
    for (uint64_t k = 0; k < len; ++k)
      buf[k] = rand ();
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, len, off, false) == 0);
    memcpy (model + off, buf, len);
    memcpy (states[i + 1], model, SIZE);
  }
  fsc_wlog_close (wl);
  CHECK (stat (logpath, &st) == 0);
  CHECK (st.st_size > durable);
  /* Cut in the middle of the unflushed records. */
  CHECK (truncate (logpath, durable + (st.st_size - durable) / 2 + 3) == 0);
  wl = open_log (c, &info);
  CHECK (info.dropped_records == 1);
  {
    static unsigned char got[SIZE];
    CHECK (fsc_wlog_read (wl, o, got, SIZE, 0, &up, 0) == 0);
    int k = -1;
    for (int i = 0; i <= NW && k < 0; ++i)
      if (memcmp (got, states[i], SIZE) == 0)
        k = i;
    CHECK (k >= 0 && k < NW);
    fprintf (stderr, "torn tail: recovered the flush and %d of %d writes\n",
             k, NW);
    memcpy (model, got, SIZE);          /* this is the client's disk now */
  }

  /* 8. A flipped byte in a flushed unit: EIO, never the older bytes.
   * A fresh log: unit 0 (the first record, right after the header
   * slots), a flush, unit 1, a flush.
   */
  fsc_wlog_close (wl);
  CHECK (unlink (logpath) == 0);
  memcpy (model, upstream, SIZE);
  wl = open_log (c, &info);
  {
    static unsigned char buf[BS];
    memset (buf, 0xa5, BS);
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, 0, false) == 0);
    CHECK (fsc_wlog_flush (wl) == 0);
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, BS, false) == 0);
    CHECK (fsc_wlog_flush (wl) == 0);
  }
  fsc_wlog_close (wl);
  {
    int fd = open (logpath, O_RDWR);
    CHECK (fd >= 0);
    unsigned char b;
    off_t at = 8192 + 64 + 8 + 100;     /* record 1's data */
    CHECK (pread (fd, &b, 1, at) == 1);
    CHECK (b == 0xa5);
    b ^= 0x40;
    CHECK (pwrite (fd, &b, 1, at) == 1);
    close (fd);
  }
  wl = open_log (c, &info);
  CHECK_EQ (info.damaged_records, 1);
  CHECK_EQ (info.dropped_records, 0);
  {
    static unsigned char got[2 * BS];
    CHECK (fsc_wlog_read (wl, o, got, BS, 0, &up, 0) == -1 &&
           errno == EBADMSG);
    CHECK (fsc_wlog_take_notices (wl, NULL, NULL) &
           FSC_WLOG_NOTICE_BADREAD);
    CHECK (fsc_wlog_read (wl, o, got, BS, BS, &up, 0) == 0);
    CHECK (got[0] == 0xa5 && got[BS - 1] == 0xa5);
  }
  /* The writer will not send it: it stops, loudly, the log refuses. */
  CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
  fsc_wlog_drain (wl, 10000);
  CHECK (fsc_wlog_take_notices (wl, NULL, NULL) & FSC_WLOG_NOTICE_FAILED);
  CHECK (memcmp (upstream, model, BS) == 0);    /* still the old bytes */
  fsc_wlog_close (wl);
  CHECK (unlink (logpath) == 0);

  /* 8b. Rule 7: a damaged record header before a marker is damage,
   * never a shorter log.  Units 0, 1, 2 each written and flushed:
   * W1 M2 W3 M4 W5 M6, then W7 unflushed.  W3's header overwritten:
   * the open is refused (EUCLEAN, where), the file left as it was;
   * a salvage opens the 2 records before it, refuses appends, and
   * its writer sends W1 only.  Then W7's header overwritten instead
   * (after the last marker): a torn tail, cut without a word.
   */
  {
    static unsigned char buf[BS], before[65536], after[65536];
    const uint64_t w3 = 8192 + (64 + 8 + BS) + 64;    /* after W1, M2 */
    memcpy (model, upstream, SIZE);
    wl = open_log (c, &info);
    for (unsigned i = 0; i < 3; ++i) {
      memset (buf, 0x31 + i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, (uint64_t) i * BS,
                              false) == 0);
      CHECK (fsc_wlog_flush (wl) == 0);
    }
    memset (buf, 0x77, BS);
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, 3 * BS, false) == 0);
    fsc_wlog_close (wl);
    int fd = open (logpath, O_RDWR);
    CHECK (fd >= 0);
    CHECK (pread (fd, buf, 8, w3) == 8 && buf[0] == 0x46);     /* "FWLR" */
    memset (buf, 0xee, 64);
    CHECK (pwrite (fd, buf, 64, w3) == 64);
    ssize_t nb = pread (fd, before, sizeof before, 0);
    CHECK (nb > 0);
    close (fd);
    struct fsc_wlog_params p = params (SIZE, "g1");
    CHECK (fsc_wlog_open (c, &p, 0, &wl, &info) == -1 && errno == EUCLEAN);
    CHECK (info.damaged);
    CHECK_EQ (info.damage_seq, 3);
    CHECK_EQ (info.damage_pos, w3);
    CHECK_EQ (info.damage_cover, 6);            /* M6: below 6 synced */
    CHECK_EQ (info.records, 2);                 /* W1, M2 */
    CHECK_EQ (info.dirty_bytes, BS);
    CHECK_EQ (info.lost_records, 2);            /* W5, W7 */
    CHECK_EQ (info.lost_last_seq, 7);
    fd = open (logpath, O_RDONLY);
    CHECK (fd >= 0 && pread (fd, after, sizeof after, 0) == nb);
    close (fd);
    CHECK (memcmp (before, after, nb) == 0);    /* never cut */
    struct fsc_wlog_info pi;
    CHECK (fsc_wlog_peek (c, key, key_len, &pi) == -1 && errno == EUCLEAN);
    CHECK (pi.damaged && pi.damage_seq == 3 && pi.records == 2);
    /* Salvage: the intact prefix only, nothing appended. */
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_SALVAGE, &wl, &info) == 0);
    CHECK (info.damaged && info.records == 2);
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, 0, false) == -1 &&
           errno == EROFS);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
    fsc_wlog_close (wl);
    CHECK (upstream[0] == 0x31 && upstream[BS - 1] == 0x31);
    CHECK (memcmp (upstream + BS, model + BS, 3 * BS) == 0);
    memcpy (model, upstream, SIZE);
    /* Still damaged: the salvage never hides it. */
    CHECK (fsc_wlog_open (c, &p, 0, &wl, &info) == -1 && errno == EUCLEAN);
    CHECK (unlink (logpath) == 0);

    /* W1 damaged: a salvage finds nothing intact, and still changes
     * nothing at its open (the tool says what is lost first).
     */
    wl = open_log (c, &info);
    for (unsigned i = 0; i < 2; ++i) {
      memset (buf, 0x31 + i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, (uint64_t) i * BS,
                              false) == 0);
      CHECK (fsc_wlog_flush (wl) == 0);
    }
    fsc_wlog_close (wl);
    fd = open (logpath, O_RDWR);
    CHECK (fd >= 0);
    memset (buf, 0xee, 64);
    CHECK (pwrite (fd, buf, 64, 8192) == 64);
    nb = pread (fd, before, sizeof before, 0);
    close (fd);
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_SALVAGE, &wl, &info) == 0);
    CHECK (info.damaged && info.damage_seq == 1 && info.records == 0);
    CHECK_EQ (info.lost_records, 1);
    fsc_wlog_close (wl);
    fd = open (logpath, O_RDONLY);
    CHECK (fd >= 0 && pread (fd, after, sizeof after, 0) == nb);
    close (fd);
    CHECK (memcmp (before, after, nb) == 0);
    CHECK (unlink (logpath) == 0);

    /* The same with W7 damaged: after M6, never promised. */
    wl = open_log (c, &info);
    for (unsigned i = 0; i < 3; ++i) {
      memset (buf, 0x31 + i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, (uint64_t) i * BS,
                              false) == 0);
      memcpy (model + (uint64_t) i * BS, buf, BS);
      CHECK (fsc_wlog_flush (wl) == 0);
    }
    memset (buf, 0x77, BS);
    CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, 3 * BS, false) == 0);
    fsc_wlog_close (wl);
    const uint64_t w7 = 8192 + 3 * (64 + 8 + BS + 64);
    fd = open (logpath, O_RDWR);
    CHECK (fd >= 0);
    CHECK (pread (fd, buf, 8, w7) == 8 && buf[0] == 0x46);
    memset (buf, 0xee, 64);
    CHECK (pwrite (fd, buf, 64, w7) == 64);
    close (fd);
    wl = open_log (c, &info);
    CHECK (!info.damaged);
    CHECK_EQ (info.dropped_records, 1);
    CHECK_EQ (info.records, 6);
    check_reads (wl, o);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
    CHECK (memcmp (upstream, model, SIZE) == 0);
    fsc_wlog_close (wl);
    CHECK (unlink (logpath) == 0);
  }

  /* 9. Backpressure: a bound of 64 KiB, a slow writer; writes of
   * 1 MiB in all wait, none fails.
   */
  {
    struct fsc_wlog_params p = params (SIZE, "g1");
    p.dirty_max = 64 * 1024;
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, &info) == 0);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    static unsigned char buf[BS];
    for (int i = 0; i < 256; ++i) {
      memset (buf, i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, (uint64_t) i * BS,
                              false) == 0);
      memcpy (model + (uint64_t) i * BS, buf, BS);
      fsc_wlog_counters (wl, &info);
      CHECK (info.log_bytes <= 64 * 1024 + BS + 200);
    }
    CHECK (fsc_wlog_flush (wl) == 0);
    CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
    fsc_wlog_close (wl);
  }

  /* 10. A flush loop during an outage (rule 9 of core/wlog/wlog.c): once
   * the log is flushed, flushes with nothing new write no marker and
   * sync nothing, however many; the log's size and blocks stay.
   */
  CHECK (unlink (logpath) == 0);
  {
    struct fsc_wlog_params p = params (SIZE, "g1");
    p.dirty_max = 1 << 20;
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, &info) == 0);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    up_fail = 1;
    static unsigned char buf[BS];
    for (int i = 0; i < 20; ++i) {
      memset (buf, 'a' + i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, (uint64_t) i * 3 * BS,
                              false) == 0);
      memcpy (model + (uint64_t) i * 3 * BS, buf, BS);
    }
    CHECK (fsc_wlog_flush (wl) == 0);
    struct stat st0, st1;
    struct fsc_wlog_info i0, i1;
    CHECK (stat (logpath, &st0) == 0);
    fsc_wlog_counters (wl, &i0);
    syncs = 0;
    fsc_cache_set_trace (c, count_syncs, NULL);
    for (int i = 0; i < 2000; ++i)
      CHECK (fsc_wlog_flush (wl) == 0);
    fsc_cache_set_trace (c, NULL, NULL);
    CHECK (stat (logpath, &st1) == 0);
    fsc_wlog_counters (wl, &i1);
    fprintf (stderr, "unit-wlog: 2000 flushes with nothing new during an "
             "outage: %u log syncs, log %lld -> %lld bytes (%lld -> %lld "
             "blocks), %" PRIu64 " -> %" PRIu64 " records\n", syncs,
             (long long) st0.st_size, (long long) st1.st_size,
             (long long) st0.st_blocks, (long long) st1.st_blocks,
             i0.records, i1.records);
    CHECK_EQ (syncs, 0);
    CHECK_EQ (st1.st_size, st0.st_size);
    CHECK_EQ (st1.st_blocks, st0.st_blocks);
    CHECK_EQ (i1.log_bytes, i0.log_bytes);
    CHECK_EQ (i1.records, i0.records);
    up_fail = 0;
    CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
    CHECK (memcmp (upstream, model, SIZE) == 0);
    fsc_wlog_close (wl);
  }

  /* 11. Zero records at the bound, each followed by a flush, during an
   * outage (rule 9): the writes wait once the records (markers
   * included) reach dirty-max / 4096, and their bytes dirty-max plus
   * one marker; before, 64-byte records filled 1 MiB as 16384 records
   * in memory.
   */
  CHECK (unlink (logpath) == 0);
  {
    struct fsc_wlog_params p = params (SIZE, "g1");
    p.dirty_max = 1 << 20;
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, &info) == 0);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    up_fail = 1;
    struct zloop z = { .wl = wl, .o = o, .n = 10000 };
    pthread_t t;
    CHECK (pthread_create (&t, NULL, zero_loop, &z) == 0);
    /* Until the zero loop waits at the bound (its notice), 30 s at
     * most.
     */
    unsigned got = 0;
    for (int w = 0; w < 30000 && !(got & FSC_WLOG_NOTICE_STALLED); ++w) {
      got |= fsc_wlog_take_notices (wl, NULL, NULL);
      if (!(got & FSC_WLOG_NOTICE_STALLED))
        usleep (1000);
    }
    CHECK (got & FSC_WLOG_NOTICE_STALLED);
    fsc_wlog_counters (wl, &info);
    uint64_t done = __atomic_load_n (&z.done, __ATOMIC_ACQUIRE);
    fprintf (stderr, "unit-wlog: zero records and flushes at a bound of "
             "1 MiB: stalled after %" PRIu64 " with %" PRIu64 " records, %"
             PRIu64 " bytes of log\n", done, info.records, info.log_bytes);
    CHECK (done < z.n);
    CHECK (info.records <= (1 << 20) / BS + 1);
    CHECK (info.log_bytes <= (1 << 20) + 64);
    __atomic_store_n (&z.stop, true, __ATOMIC_RELEASE);
    up_fail = 0;
    CHECK (pthread_join (t, NULL) == 0);
    CHECK (fsc_wlog_flush (wl) == 0);
    CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
    CHECK (memcmp (upstream, model, SIZE) == 0);
    fsc_wlog_close (wl);
  }

  /* 12. Memory per dirty GiB (docs/design.md, "Writeback"): records of
   * 4 KiB writes, and of zeroes, each a unit of its own, no writer.
   */
  CHECK (unlink (logpath) == 0);
  {
    const uint64_t big = UINT64_C (1) << 30, nrec = 2048;
    struct fsc_wlog_params p = params (big, "g1");
    p.dirty_max = 64 << 20;
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, &info) == 0);
    static unsigned char buf[BS];
    struct mallinfo2 m0 = mallinfo2 ();
    for (uint64_t i = 0; i < nrec; ++i) {
      memset (buf, (int) i, BS);
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, BS, i * 2 * BS, false) == 0);
    }
    struct mallinfo2 m1 = mallinfo2 ();
    for (uint64_t i = 0; i < nrec; ++i)
      CHECK (fsc_wlog_zero (wl, o, &up, BS, (2 * i + 1) * BS, false) == 0);
    struct mallinfo2 m2 = mallinfo2 ();
    double wr = (double) (m1.uordblks - m0.uordblks) / nrec;
    double zr = (double) (m2.uordblks - m1.uordblks) / nrec;
    /* A GiB of dirty-max holds at most 2^18 records (rule 9). */
    fprintf (stderr, "unit-wlog: memory per record: %.0f bytes (4 KiB "
             "write), %.0f bytes (zero); per GiB of dirty-max at most %.1f "
             "MiB (4 KiB writes), %.1f MiB (zero records)\n", wr, zr,
             wr * 262144 / 1048576, zr * 262144 / 1048576);
    CHECK (wr * 262144 <= 64.0 * 1048576 && zr * 262144 <= 64.0 * 1048576);
    fsc_wlog_close (wl);
  }

  /* 13. A record write that fails (ENOSPC, then EIO for its void
   * header too) fails that request only: the next write fills the
   * slot with a void record and goes on, without a restart; recovery
   * accepts the void record; all is written back (rule 9).
   */
  fsc_object_close (o);
  fsc_cache_close (c);
  CHECK (unlink (logpath) == 0);
  /* Log writes 1 and 2 are its header slots: 12 is the tenth record. */
  c = open_cache ("write:wlog:12:ENOSPC,write:wlog:13:EIO");
  o = open_obj (c);
  {
    struct fsc_wlog_params p = params (SIZE, "g1");
    CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, &info) == 0);
    static unsigned char buf[BS];
    int failed = -1, nfailed = 0;
    for (int i = 0; i < 40; ++i) {
      memset (buf, 'A' + i, BS);
      uint64_t off = (uint64_t) (i * 5 % 200) * BS;
      if (fsc_wlog_pwrite (wl, o, &up, buf, BS, off, false) == 0)
        memcpy (model + off, buf, BS);
      else {
        CHECK_EQ (errno, EIO);
        failed = i;
        nfailed++;
      }
    }
    unsigned nt = fsc_wlog_take_notices (wl, NULL, NULL);
    fprintf (stderr, "unit-wlog: 40 writes, the 10th record's write and "
             "its void header failing: %d failed (write %d), notices %#x\n",
             nfailed, failed, nt);
    CHECK_EQ (nfailed, 1);
    CHECK_EQ (failed, 9);
    CHECK (nt & FSC_WLOG_NOTICE_WRITEFAIL);
    CHECK (!(nt & FSC_WLOG_NOTICE_FAILED));
    CHECK (fsc_wlog_flush (wl) == 0);
    check_reads (wl, o);
    fsc_wlog_close (wl);
    CHECK (fsc_wlog_open (c, &p, 0, &wl, &info) == 0);
    CHECK_EQ (info.dropped_records, 0);
    CHECK_EQ (info.damaged_records, 0);
    check_reads (wl, o);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    CHECK_EQ (fsc_wlog_drain (wl, 60000), 0);
    CHECK (memcmp (upstream, model, SIZE) == 0);
    fsc_wlog_close (wl);
  }

  fsc_object_close (o);
  fsc_cache_close (c);
  for (unsigned i = 0; i < nsnap; ++i)
    free (snap[i]);
  char cmd[128];
  snprintf (cmd, sizeof cmd, "rm -rf %.*s", (int) (strlen (dir) - 6), dir);
  CHECK (system (cmd) == 0);
  fprintf (stderr, "unit-wlog: ok\n");
  return 0;
}
