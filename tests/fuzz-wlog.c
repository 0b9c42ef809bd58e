/* Fuzz target: the write log of writeback mode (core/wlog/wlog.c): its
 * header, its records and their recovery.
 *
 * One input is the content of an object's write log (NAME.wlog).  For
 * each input the target
 *
 *  1. works out, by itself, from docs/format.md ("Write log"), what
 *     recovery must make of it: refused (no valid header slot, or one
 *     of another key: EBADMSG; records for another upstream size,
 *     generation or sample: ESTALE, with which mismatch), or which
 *     records are kept (read from the newest valid slot's tail, each
 *     whole, the next sequence number, its epoch not lower, its
 *     checksum right; where they stop, a later record of the log's
 *     incarnation with a higher sequence number, found at any 8-byte
 *     aligned offset, that is a marker covering the stop makes the log damaged:
 *     EUCLEAN, the file unchanged (Rule 7); a record whose data fails
 *     and that no flush marker covers cut off with everything after
 *     it, one a marker covers kept as damaged), and so the client's view of the export: the newest
 *     record of each 4 KiB unit over the upstream, a read error
 *     (EBADMSG: the log's own) where that record's unit is damaged;
 *
 *  2. installs the input as the log of an object in a private cache
 *     (sometimes followed by a hole, so that a record claiming more
 *     data than the input holds finds zeroes, not the end of the file),
 *     and checks fsc_wlog_inspect (no lock, no data check) against the
 *     same reading;
 *
 *  3. opens it with fsc_wlog_open: refused exactly when and as it must
 *     be (an EBADMSG leaves the file as it was), else the counters
 *     (records, dirty and log bytes, epochs, oldest, dropped and damaged
 *     records) as expected, and fsc_wlog_read of the whole export (in
 *     odd pieces, or unit by unit when some unit must fail) exactly
 *     the expected view;
 *
 *  4. closes and reopens it: nothing more dropped, the same view; adds
 *     a FUA write (if nothing is damaged), closes and reopens: the view
 *     plus that write, nothing of what recovery cut coming back; and,
 *     for a quarter of the inputs, starts the writer on an in-memory
 *     upstream and drains it: with nothing damaged the upstream then
 *     holds exactly the view, with damage the writer must stop (not
 *     hang).
 *
 * Any difference, any other error, a crash or a sanitizer report aborts.
 *
 * Built like tests/fuzz-index.c: by automake as tests/fuzz-wlog with
 * ASan and UBSan and the standalone driver of tests/fuzz-common.h (see
 * --help); or with -DFUZZ_LIBFUZZER by clang -fsanitize=fuzzer as a
 * libFuzzer target, whose custom mutator then recomputes the header and
 * record checksums (and unit hashes) after half of the mutations, so
 * that mutated fields get past them and are really parsed.
 */
#include <config.h>

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "fscache.h"
#include "keyenc.h"
#include "wlog.h"

#define KEY "fuzz-wlog:export"
#define KEY_LEN (sizeof KEY - 1)
#define GENERATION "g1"
#define SIZE (1024u * 1024u + 12345u)   /* the last unit is short */
#define UNIT 4096u
#define NUNITS ((SIZE + UNIT - 1) / UNIT)
#define INPUT_MAX (320 * 1024)  /* mutations never grow inputs past this */
#define HOLE (300 * 1024)       /* the hole some inputs are followed by */

/* The log's layout (docs/format.md, "Write log"). */
#define SLOT 4096u
#define START (2 * SLOT)
#define REC_HDR 64u
#define REC_MAGIC 0x524c5746u
#define REC_UNITS 64u
#define REC_MAX_DATA (REC_UNITS * UNIT)
/* Counters no real log gets near (see "forged" below). */
#define COUNT_MAX (UINT64_C (1) << 62)
enum { T_DATA = 1, T_ZERO = 2, T_TRIM = 3, T_FLUSH = 4 };

#define FUZZ_NAME "fuzz-wlog"
#include "fuzz-common.h"

static uint64_t
le64_get (const unsigned char *p)
{
  uint64_t v;
  memcpy (&v, p, 8);
  return le64toh (v);
}

static uint64_t
round8 (uint64_t x)
{
  return (x + 7) & ~(uint64_t) 7;
}

/*----------------------------------------------------------------------
 * The upstream (never changed: reads see it as it was) and the
 * writer's copy of it.
 */
static unsigned char *upstream, *wup, *view, *expect;
static pthread_mutex_t wup_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fsc_wlog_sample sample;   /* of UPSTREAM */

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  if (offset > SIZE || count > SIZE - offset) {
    fprintf (stderr, "fuzz-wlog: upstream read out of range: offset %"
             PRIu64 " count %" PRIu32 "\n", offset, count);
    abort ();
  }
  memcpy (buf, upstream + offset, count);
  return 0;
}

static const struct fsc_upstream up = { .pread = up_pread };

static int
wb_write (const void *buf, uint32_t count, uint64_t offset)
{
  if (offset > SIZE || count > SIZE - offset) {
    fprintf (stderr, "fuzz-wlog: writer's write out of range: offset %"
             PRIu64 " count %" PRIu32 "\n", offset, count);
    abort ();
  }
  pthread_mutex_lock (&wup_lock);
  if (buf)
    memcpy (wup + offset, buf, count);
  else
    memset (wup + offset, 0, count);
  pthread_mutex_unlock (&wup_lock);
  return 0;
}

static int
wb_pwrite (void *o, const void *buf, uint32_t count, uint64_t offset)
{
  return wb_write (buf, count, offset);
}

static int
wb_zero (void *o, uint32_t count, uint64_t offset)
{
  return wb_write (NULL, count, offset);
}

static int
wb_flush (void *o)
{
  return 0;
}

static int
wb_pread (void *o, void *buf, uint32_t count, uint64_t offset)
{
  if (offset > SIZE || count > SIZE - offset)
    abort ();
  pthread_mutex_lock (&wup_lock);
  memcpy (buf, wup + offset, count);
  pthread_mutex_unlock (&wup_lock);
  return 0;
}

static const struct fsc_wb_upstream wbup = {
  .pwrite = wb_pwrite, .zero = wb_zero, .trim = wb_zero, .flush = wb_flush,
  .pread = wb_pread, .nparallel = 2, .can_trim = true, .can_zero = true,
  .can_flush = true,
};

/*----------------------------------------------------------------------
 * The private cache.
 */
static char fan_path[512];
static char log_path[1024];
static char log_name[FSC_NAME_MAX + 1];
static struct fsc_cache *cache;
static struct fsc_object *obj;
static uint64_t key_lo, key_hi;

static void
teardown (void)
{
  if (obj)
    fsc_object_close (obj);
  obj = NULL;
  if (cache)
    fsc_cache_close (cache);
  cache = NULL;
  if (cache_dir[0])
    rm_rf (cache_dir);
  cache_dir[0] = '\0';
  free (upstream);
  free (wup);
  free (view);
  free (expect);
  upstream = wup = view = expect = NULL;
}

static void
setup (void)
{
  if (cache)
    return;
  const char *tmp = getenv ("TMPDIR");
  snprintf (cache_dir, sizeof cache_dir, "%s/fuzz-wlog.XXXXXX",
            tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp (cache_dir) == NULL) {
    perror (cache_dir);
    exit (1);
  }
  char fan[FSC_FAN_MAX + 1];
  fsc_key_encode (KEY, KEY_LEN, log_name, fan);
  fsc_key_hash (KEY, KEY_LEN, &key_lo, &key_hi);
  snprintf (fan_path, sizeof fan_path, "%s/objects/%s", cache_dir, fan);
  snprintf (log_path, sizeof log_path, "%s/%s.wlog", fan_path, log_name);

  upstream = malloc (SIZE);
  wup = malloc (SIZE);
  view = malloc (SIZE);
  expect = malloc (SIZE);
  if (!upstream || !wup || !view || !expect)
    abort ();
  uint64_t s = 0x5eed;
  rng_fill (&s, upstream, SIZE);
  sample.n = 2;
  sample.off[0] = 0;
  sample.len[0] = UNIT;
  sample.off[1] = SIZE - 1000;
  sample.len[1] = 1000;
  for (unsigned i = 0; i < sample.n; ++i)
    sample.hash[i] = XXH3_64bits (upstream + sample.off[i], sample.len[i]);

  struct fsc_cache_config cfg = { .dir = cache_dir, .create = true };
  if (fsc_cache_open (&cfg, &cache) == -1) {
    perror ("fsc_cache_open");
    exit (1);
  }
  /* The object serves what the log does not hold, from UPSTREAM, which
   * never changes: its cached blocks stay right whatever the input.
   */
  struct fsc_object_params p = {
    .key = KEY, .key_len = KEY_LEN, .block_size = 65536, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE,
  };
  struct fsc_open_info info;
  if (fsc_object_open (cache, &p, &obj, &info) == -1) {
    perror ("fsc_object_open");
    exit (1);
  }
  atexit (teardown);
}

static void
write_file (const char *path, const void *buf, size_t n)
{
  if (mkdir (fan_path, 0700) == -1 && errno != EEXIST) {
    perror (fan_path);
    abort ();
  }
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd == -1 || (n > 0 && pwrite (fd, buf, n, 0) != (ssize_t) n) ||
      close (fd) == -1) {
    perror (path);
    abort ();
  }
}

static unsigned char *
read_file (const char *path, size_t *n)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd == -1 || fstat (fd, &st) == -1) {
    perror (path);
    abort ();
  }
  unsigned char *p = malloc (st.st_size ? st.st_size : 1);
  if (!p || read (fd, p, st.st_size) != st.st_size) {
    perror (path);
    abort ();
  }
  close (fd);
  *n = st.st_size;
  return p;
}

/*----------------------------------------------------------------------
 * The expected reading of a log file F (N bytes), from the format's
 * description alone.
 */
struct orec {
  uint8_t type;
  uint64_t seq, epoch, off, len, pos, time_ms;
  uint32_t nunits;
  uint64_t bad_units;           /* bit u: unit u's data fails its hash */
};

struct oracle {
  int err;                      /* 0, EBADMSG, EUCLEAN or ESTALE */
  uint64_t damage_seq, damage_pos;  /* EUCLEAN: where */
  int mismatch;
  bool created;
  uint64_t size;                /* the upstream size of the records */
  uint64_t hdr_size;            /* the header's */
  uint64_t tail_pos, tail_seq, head_pos;
  bool has_gen;
  char gen[256];
  struct fsc_wlog_sample sample;
  struct orec *r;               /* records kept */
  size_t n, cap;
  size_t nstruct;               /* whole, in sequence, checksums right */
  bool dropped;
  uint64_t damaged, dirty;
  bool forged;                  /* a counter at or past COUNT_MAX */
};

/* Slot P (SLOT bytes): valid?  Then its fields into O. */
static bool
o_slot (const unsigned char *p, struct oracle *o, uint64_t *gen)
{
  if (memcmp (p, "FSCWLOG", 8) != 0 ||
      le64_get (p + SLOT - 8) != XXH3_64bits (p, SLOT - 8) ||
      le32_get (p + 8) != 1 || le32_get (p + 12) != UNIT)
    return false;
  uint32_t ns = le32_get (p + 88), gl = le32_get (p + 92);
  if (ns > FSC_WLOG_SAMPLES || (gl != UINT32_MAX && gl > 255))
    return false;
  if (le64_get (p + 64) < START || le64_get (p + 72) < 1)
    return false;
  *gen = le64_get (p + 16);
  if (o) {
    o->size = le64_get (p + 56);
    o->tail_pos = le64_get (p + 64);
    o->tail_seq = le64_get (p + 72);
    o->sample.n = ns;
    for (unsigned i = 0; i < FSC_WLOG_SAMPLES; ++i) {
      o->sample.off[i] = le64_get (p + 96 + 8 * i);
      o->sample.len[i] = le32_get (p + 160 + 4 * i);
      o->sample.hash[i] = le64_get (p + 192 + 8 * i);
    }
    o->has_gen = gl != UINT32_MAX;
    memset (o->gen, 0, sizeof o->gen);
    if (o->has_gen)
      memcpy (o->gen, p + 256, gl);     /* a C string: up to a NUL */
  }
  return true;
}

static uint64_t
units_of (uint64_t len)
{
  return len / UNIT + (len % UNIT != 0);
}

/* Record header at H decodes within an export of SIZE bytes? */
static bool
o_rec_head (const unsigned char *h, uint64_t size, struct orec *r)
{
  if (le32_get (h) != REC_MAGIC)
    return false;
  r->type = h[4];
  r->seq = le64_get (h + 8);
  r->epoch = le64_get (h + 16);
  r->off = le64_get (h + 24);
  r->len = le64_get (h + 32);
  r->nunits = le32_get (h + 40);
  r->time_ms = le64_get (h + 48);
  switch (r->type) {
  case T_FLUSH:
    /* "its offset: the sequence number below which every record was
     * durable when it was written" -- never beyond itself.
     */
    return r->off <= r->seq && r->len == 0 && r->nunits == 0;
  case T_DATA:
  case T_ZERO:
  case T_TRIM:
    if (r->len == 0 || r->off % UNIT || r->off >= size ||
        r->len > size - r->off)
      return false;
    /* "a multiple of 4096 unless the range ends at the export's end" */
    if (r->len % UNIT && r->off + r->len != size)
      return false;
    if (r->type == T_DATA)
      return r->len <= REC_MAX_DATA && r->nunits == units_of (r->len);
    return r->nunits == 0;
  default:
    return false;
  }
}

static void
o_push (struct oracle *o, const struct orec *r)
{
  if (o->n == o->cap) {
    o->cap = o->cap ? 2 * o->cap : 64;
    o->r = realloc (o->r, o->cap * sizeof *o->r);
    if (!o->r)
      abort ();
  }
  o->r[o->n++] = *r;
}

static void
o_read (const unsigned char *f, uint64_t n, struct oracle *o,
        const struct fsc_wlog_params *p)
{
  uint64_t inc;
  free (o->r);
  memset (o, 0, sizeof *o);
  if (n == 0) {
    o->created = true;
    o->size = p->size;
    o->tail_pos = o->head_pos = START;
    return;
  }
  /* The newest valid slot; the first on a tie. */
  int best = -1;
  uint64_t best_gen = 0, gen;
  for (int s = 0; s < 2; ++s)
    if ((uint64_t) (s + 1) * SLOT <= n && o_slot (f + s * SLOT, NULL, &gen) &&
        (best == -1 || gen > best_gen)) {
      best = s;
      best_gen = gen;
    }
  if (best < 0) {
    o->err = EBADMSG;
    return;
  }
  const unsigned char *hp = f + best * SLOT;
  o_slot (hp, o, &gen);
  o->hdr_size = o->size;
  o->forged = gen >= COUNT_MAX || o->tail_seq >= COUNT_MAX ||
    le64_get (hp + 80) >= COUNT_MAX;
  inc = le64_get (hp + 24);
  if (le64_get (hp + 32) != key_lo || le64_get (hp + 40) != key_hi ||
      le64_get (hp + 48) != KEY_LEN) {
    o->err = EBADMSG;
    return;
  }

  /* The records, from the tail. */
  uint64_t pos = o->tail_pos, seq = o->tail_seq, epoch = 0;
  while (pos <= n && n - pos >= REC_HDR) {
    struct orec r;
    const unsigned char *h = f + pos;
    if (!o_rec_head (h, o->size, &r) || r.seq != seq || r.epoch < epoch)
      break;
    uint64_t hl = 8 * (uint64_t) r.nunits;
    if (n - pos - REC_HDR < hl)
      break;
    if (le64_get (h + 56) !=
        (XXH3_64bits_withSeed (h, 56, inc) ^
         XXH3_64bits_withSeed (h + REC_HDR, hl, inc)))
      break;
    uint64_t rsize = round8 (REC_HDR + hl + (r.type == T_DATA ? r.len : 0));
    if (rsize > n - pos)
      break;
    r.pos = pos;
    r.bad_units = 0;
    for (uint32_t u = 0; r.type == T_DATA && u < r.nunits; ++u) {
      uint64_t ul = r.len - (uint64_t) u * UNIT < UNIT
        ? r.len - (uint64_t) u * UNIT : UNIT;
      if (XXH3_64bits (h + REC_HDR + hl + (uint64_t) u * UNIT, ul) !=
          le64_get (h + REC_HDR + 8 * u))
        r.bad_units |= UINT64_C (1) << u;
    }
    o_push (o, &r);
    epoch = r.epoch;
    pos += rsize;
    seq++;
  }
  o->nstruct = o->n;
  o->head_pos = pos;
  o->dropped = pos < n;
  /* Rule 7: a torn tail, or damage?  Later records of this log (its
   * incarnation's checksum, a higher sequence number), at any 8-byte
   * aligned offset of the file (a forged tail need not be aligned), each stepped over whole; a marker among them above SEQ
   * says SEQ was synced.
   */
  uint64_t beyond = 0;
  for (uint64_t q = round8 (pos); pos < n && q <= n && n - q >= REC_HDR;) {
    struct orec r;
    const unsigned char *h = f + q;
    uint64_t hl;
    if (o_rec_head (h, o->size, &r) && r.seq > seq &&
        n - q - REC_HDR >= (hl = 8 * (uint64_t) r.nunits) &&
        le64_get (h + 56) ==
        (XXH3_64bits_withSeed (h, 56, inc) ^
         XXH3_64bits_withSeed (h + REC_HDR, hl, inc))) {
      if (r.type == T_FLUSH && r.off > beyond)
        beyond = r.off;
      q += round8 (REC_HDR + hl + (r.type == T_DATA ? r.len : 0));
    }
    else
      q += 8;
  }
  if (beyond > seq) {
    o->err = EUCLEAN;
    o->damage_seq = seq;
    o->damage_pos = pos;
    return;
  }
  /* A bad record no marker covers was never promised: cut there.  One
   * a marker covers (its sequence number below a marker's offset):
   * damage, kept.
   */
  uint64_t cover = 0;
  for (size_t i = 0; i < o->n; ++i)
    if (o->r[i].type == T_FLUSH && o->r[i].off > cover)
      cover = o->r[i].off;
  for (size_t i = 0; i < o->n; ++i)
    if (o->r[i].bad_units && o->r[i].seq >= cover) {
      o->head_pos = o->r[i].pos;
      o->n = i;
      o->dropped = true;
      break;
    }
  for (size_t i = 0; i < o->n; ++i) {
    o->damaged += o->r[i].bad_units != 0;
    o->dirty += o->r[i].len;
    o->forged |= o->r[i].epoch >= COUNT_MAX;
  }
  if (o->n == 0) {
    /* Empty: started over with the upstream's data. */
    o->size = p->size;
    o->tail_pos = o->head_pos = START;
    return;
  }
  /* Records for this upstream? */
  if (p->size != o->size)
    o->mismatch = FSC_WLOG_SIZE_CHANGED;
  else if ((p->generation != NULL) != o->has_gen ||
           (p->generation && strcmp (p->generation, o->gen) != 0))
    o->mismatch = FSC_WLOG_GENERATION_CHANGED;
  else if (p->sample.n && o->sample.n) {
    for (unsigned i = 0; i < o->sample.n && i < p->sample.n &&
           !o->mismatch; ++i) {
      if (p->sample.off[i] != o->sample.off[i] ||
          p->sample.len[i] != o->sample.len[i]) {
        o->mismatch = FSC_WLOG_SAMPLE_CHANGED;
        break;
      }
      uint64_t a = o->sample.off[i], b = a + o->sample.len[i];
      bool touched = false;
      for (size_t k = 0; k < o->n && !touched; ++k)
        touched = o->r[k].off < b && o->r[k].off + o->r[k].len > a;
      if (!touched && p->sample.hash[i] != o->sample.hash[i])
        o->mismatch = FSC_WLOG_SAMPLE_CHANGED;
    }
  }
  if (o->mismatch)
    o->err = ESTALE;
}

/* The view O gives over UPSTREAM, into EXPECT; EIO[u] for the units
 * whose newest record's data is bad.  Returns how many.
 */
static uint64_t
o_view (const unsigned char *f, const struct oracle *o, bool *eio)
{
  static int32_t newest[NUNITS];
  for (uint64_t u = 0; u < NUNITS; ++u)
    newest[u] = -1;
  for (size_t i = 0; i < o->n; ++i)
    if (o->r[i].type != T_FLUSH)
      for (uint64_t u = o->r[i].off / UNIT;
           u < (o->r[i].off + o->r[i].len + UNIT - 1) / UNIT; ++u)
        newest[u] = i;
  memcpy (expect, upstream, SIZE);
  uint64_t neio = 0;
  for (uint64_t u = 0; u < NUNITS; ++u) {
    uint64_t a = u * UNIT, l = SIZE - a < UNIT ? SIZE - a : UNIT;
    eio[u] = false;
    if (newest[u] < 0)
      continue;
    const struct orec *r = &o->r[newest[u]];
    if (r->type != T_DATA) {
      memset (expect + a, 0, l);
      continue;
    }
    uint64_t ru = (a - r->off) / UNIT;
    memcpy (expect + a,
            f + r->pos + REC_HDR + 8 * (uint64_t) r->nunits + ru * UNIT, l);
    if (r->bad_units & (UINT64_C (1) << ru)) {
      eio[u] = true;
      neio++;
    }
  }
  return neio;
}

/*----------------------------------------------------------------------
 * The target.
 */

static uint64_t n_inputs, n_refused[4], n_opened, n_records, n_damaged;
static uint64_t n_dropped, n_writer, n_mismatch[4], n_forged;

static void
fail (const char *what)
{
  fprintf (stderr, "fuzz-wlog: %s\n", what);
  abort ();
}

#define EXPECT_EQ(what, got, want)                                      \
  do {                                                                  \
    uint64_t g_ = (got), w_ = (want);                                   \
    if (g_ != w_) {                                                     \
      fprintf (stderr, "fuzz-wlog: %s: %" PRIu64 ", expected %" PRIu64  \
               "\n", what, g_, w_);                                     \
      abort ();                                                         \
    }                                                                   \
  } while (0)

static struct fsc_wlog *
open_log (const struct fsc_wlog_params *p, struct fsc_wlog_info *info)
{
  struct fsc_wlog *wl;
  if (fsc_wlog_open (cache, p, 0, &wl, info) == -1) {
    fprintf (stderr, "fuzz-wlog: reopen: fsc_wlog_open: %s\n",
             strerror (errno));
    abort ();
  }
  return wl;
}

/* Read the whole export through WL and compare with EXPECT; units set
 * in EIO must fail with EIO (then read unit by unit).
 */
static void
check_view (struct fsc_wlog *wl, const bool *eio, uint64_t neio, uint64_t s,
            const char *what)
{
  memset (view, 0xa5, SIZE);
  if (neio) {
    for (uint64_t u = 0; u < NUNITS; ++u) {
      uint64_t a = u * UNIT, l = SIZE - a < UNIT ? SIZE - a : UNIT;
      int r = fsc_wlog_read (wl, obj, view + a, l, a, &up, 0);
      if (eio[u] ? r != -1 || errno != EBADMSG : r != 0) {
        fprintf (stderr, "fuzz-wlog: %s: unit %" PRIu64 ": %s, expected "
                 "%s\n", what, u, r ? strerror (errno) : "read",
                 eio[u] ? "EBADMSG" : "its data");
        abort ();
      }
      if (eio[u])
        memcpy (view + a, expect + a, l);
    }
  }
  else {
    uint64_t off = 0;
    while (off < SIZE) {
      uint64_t n;
      switch (rng_below (&s, 4)) {
      case 0: n = UNIT - off % UNIT; break;
      case 1: n = 1 + rng_below (&s, 3 * UNIT); break;
      case 2: n = 1 + rng_below (&s, 70 * UNIT); break;
      default: n = SIZE; break;
      }
      if (n > SIZE - off)
        n = SIZE - off;
      if (fsc_wlog_read (wl, obj, view + off, n, off, &up, 0) == -1) {
        fprintf (stderr, "fuzz-wlog: %s: fsc_wlog_read (%" PRIu64 ", %"
                 PRIu64 "): %s\n", what, n, off, strerror (errno));
        abort ();
      }
      off += n;
    }
  }
  if (memcmp (view, expect, SIZE) != 0) {
    uint64_t i = 0;
    while (view[i] == expect[i])
      i++;
    fprintf (stderr, "fuzz-wlog: %s: WRONG DATA at offset %" PRIu64
             " (unit %" PRIu64 "): %s\n", what, i, i / UNIT,
             expect[i] == upstream[i] ? "expected the upstream's" :
             "expected a record's");
    abort ();
  }
}

static void
check_counters (struct fsc_wlog *wl, const struct fsc_wlog_info *info,
                const struct oracle *o)
{
  struct fsc_wlog_info c;
  memset (&c, 0, sizeof c);
  fsc_wlog_counters (wl, &c);
  EXPECT_EQ ("records", info->records, o->n);
  EXPECT_EQ ("counters: records", c.records, o->n);
  EXPECT_EQ ("dirty bytes", info->dirty_bytes, o->dirty);
  EXPECT_EQ ("counters: dirty bytes", c.dirty_bytes, o->dirty);
  EXPECT_EQ ("log bytes", info->log_bytes, o->head_pos - o->tail_pos);
  EXPECT_EQ ("counters: log bytes", c.log_bytes, info->log_bytes);
  EXPECT_EQ ("size", c.size, o->size);
  /* Epochs and age count the records that hold writes, not markers
   * (which carry the epoch they were written in).
   */
  size_t fi = 0, li = o->n;
  while (fi < o->n && o->r[fi].type == T_FLUSH)
    fi++;
  while (li > fi && o->r[li - 1].type == T_FLUSH)
    li--;
  EXPECT_EQ ("epochs", c.epochs,
             fi < li ? o->r[li - 1].epoch - o->r[fi].epoch + 1 : 0);
  EXPECT_EQ ("oldest", c.oldest_ms, fi < li ? o->r[fi].time_ms : 0);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static struct oracle o;
  static bool eio[NUNITS];
  struct fsc_wlog_info info, ii;
  struct fsc_wlog *wl;

  setup ();
  n_inputs++;
  uint64_t h = XXH3_64bits (data, size);

  /* The file: the input, and sometimes a hole after it. */
  size_t n = size + ((h & 0x30) == 0 && size >= START ? HOLE : 0);
  unsigned char *f = calloc (1, n ? n : 1);
  if (!f)
    abort ();
  memcpy (f, data, size);
  write_file (log_path, f, size);
  if (n > size && truncate (log_path, n) == -1)
    abort ();

  /* Small: the open reserves dirty-max of space (on /dev/shm, memory
   * zeroed at every open), and the inputs hold well under 1 MiB.
   */
  struct fsc_wlog_params p = {
    .key = KEY, .key_len = KEY_LEN, .size = SIZE, .generation = GENERATION,
    .dirty_max = 4 << 20,
  };
  if (h & 0x40)
    p.sample = sample;
  o_read (f, n, &o, &p);

  /* Tools: no lock, no data check, no key check. */
  int dfd = open (fan_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd == -1)
    abort ();
  int r = fsc_wlog_inspect (dfd, log_name, &ii);
  close (dfd);
  if (o.created)
    EXPECT_EQ ("inspect of an empty file", r, 0);
  else if (o.err == EBADMSG && o.tail_pos == 0) {
    /* No valid slot. */
    if (r != -1 || errno != EBADMSG)
      fail ("inspect: a log without a valid header slot not refused");
  }
  else if (o.err == EUCLEAN) {
    if (r != -1 || errno != EUCLEAN)
      fail ("inspect: a damaged log not reported as such");
    EXPECT_EQ ("inspect: records before the damage", ii.records, o.nstruct);
    EXPECT_EQ ("inspect: damaged", ii.damaged, true);
    EXPECT_EQ ("inspect: damage seq", ii.damage_seq, o.damage_seq);
    EXPECT_EQ ("inspect: damage pos", ii.damage_pos, o.damage_pos);
  }
  else {
    /* A log of another key (EBADMSG at open: inspect does not check
     * the key) may be damaged too.
     */
    if (r == -1 && !(o.err == EBADMSG && errno == EUCLEAN)) {
      fprintf (stderr, "fuzz-wlog: inspect: %s\n", strerror (errno));
      abort ();
    }
    if (o.err != EBADMSG) {
      EXPECT_EQ ("inspect: records", ii.records, o.nstruct);
      EXPECT_EQ ("inspect: size", ii.size, o.hdr_size);
    }
  }

  r = fsc_wlog_open (cache, &p, 0, &wl, &info);
  if (o.err) {
    if (r == 0)
      fsc_wlog_close (wl);
    if (r == 0 || errno != o.err) {
      fprintf (stderr, "fuzz-wlog: fsc_wlog_open: %s, expected %s\n",
               r == 0 ? "opened" : strerror (errno), strerror (o.err));
      abort ();
    }
    n_refused[o.err == EBADMSG ? 1 : o.err == EUCLEAN ? 3 : 2]++;
    if (o.err == ESTALE) {
      EXPECT_EQ ("mismatch", info.mismatch, o.mismatch);
      n_mismatch[o.mismatch & 3]++;
    }
    else {
      /* Refused before anything was read, or (EUCLEAN) never cut:
       * the file as it was.
       */
      if (o.err == EUCLEAN) {
        EXPECT_EQ ("damage seq", info.damage_seq, o.damage_seq);
        EXPECT_EQ ("damage pos", info.damage_pos, o.damage_pos);
      }
      size_t m;
      unsigned char *now = read_file (log_path, &m);
      if (m != n || memcmp (now, f, n) != 0)
        fail ("a log refused as EBADMSG or EUCLEAN was changed");
      free (now);
    }
    free (f);
    return 0;
  }
  if (r == -1) {
    fprintf (stderr, "fuzz-wlog: fsc_wlog_open: %s, expected success\n",
             strerror (errno));
    abort ();
  }
  n_opened++;
  n_records += o.n;
  n_damaged += o.damaged != 0;
  n_dropped += o.dropped;
  EXPECT_EQ ("created", info.created, o.created);
  EXPECT_EQ ("damaged records", info.damaged_records, o.damaged);
  EXPECT_EQ ("dropped records", info.dropped_records, o.dropped);
  EXPECT_EQ ("mismatch", info.mismatch, 0);
  check_counters (wl, &info, &o);
  uint64_t neio = o_view (f, &o, eio);
  check_view (wl, eio, neio, h ^ 1, "first open");

  /* KNOWN ISSUE (reported): a header gen, tail sequence number or
   * epoch near 2^64, which only a forged log holds, wraps as the log
   * goes on (a new header losing to the forged slot, new records
   * numbered or in epochs below their predecessors), and the next
   * recovery refuses the log or cuts what was written since.  Such
   * inputs are only checked this far.
   */
  if (o.forged) {
    n_forged++;
    fsc_wlog_close (wl);
    free (f);
    return 0;
  }

  /* Recovery again finds what the first one kept. */
  fsc_wlog_close (wl);
  wl = open_log (&p, &info);
  EXPECT_EQ ("reopen: dropped records", info.dropped_records, 0);
  EXPECT_EQ ("reopen: damaged records", info.damaged_records, o.damaged);
  EXPECT_EQ ("reopen: records", info.records, o.n);
  check_view (wl, eio, neio, h ^ 2, "reopen");

  /* A write now comes after the records kept, never after the cut. */
  if (neio == 0) {
    static unsigned char buf[3 * UNIT];
    uint64_t s = h ^ 3;
    uint64_t off = rng_below (&s, NUNITS) * UNIT;
    uint64_t len = 1 + rng_below (&s, sizeof buf);
    if (len > SIZE - off)
      len = SIZE - off;
    rng_fill (&s, buf, len);
    if (fsc_wlog_pwrite (wl, obj, &up, buf, len, off, true) == -1) {
      fprintf (stderr, "fuzz-wlog: fsc_wlog_pwrite: %s\n", strerror (errno));
      abort ();
    }
    memcpy (expect + off, buf, len);
    fsc_wlog_close (wl);
    wl = open_log (&p, &info);
    EXPECT_EQ ("after a write: dropped records", info.dropped_records, 0);
    /* The write and the marker its sync leaves. */
    EXPECT_EQ ("after a write: records", info.records, o.n + 2);
    check_view (wl, eio, 0, h ^ 4, "after a write");
  }

  /* The writer, on a quarter of the inputs. */
  if ((h & 0x300) == 0) {
    n_writer++;
    unsigned char *want = malloc (SIZE);
    if (!want)
      abort ();
    memcpy (want, expect, SIZE);
    memcpy (wup, upstream, SIZE);
    if (fsc_wlog_start_writer (wl, NULL, &wbup) == -1)
      fail ("fsc_wlog_start_writer failed");
    uint64_t left = fsc_wlog_drain (wl, 20000);
    pthread_mutex_lock (&wup_lock);
    if (o.damaged == 0) {
      /* The upstream ends up holding the view. */
      EXPECT_EQ ("dirty bytes left after the drain", left, 0);
      if (memcmp (wup, want, SIZE) != 0)
        fail ("after the drain, the upstream is not the view");
    }
    else if (neio) {
      /* It stops at the damage, and never sends it. */
      if (left == 0)
        fail ("a log with damaged records drained");
      for (uint64_t u = 0; u < NUNITS; ++u) {
        uint64_t a = u * UNIT, l = SIZE - a < UNIT ? SIZE - a : UNIT;
        if (eio[u] && memcmp (wup + a, want + a, l) == 0 &&
            memcmp (upstream + a, want + a, l) != 0)
          fail ("the writer sent a damaged unit");
      }
    }
    pthread_mutex_unlock (&wup_lock);
    free (want);
  }
  fsc_wlog_close (wl);
  free (f);
  return 0;
}

/*----------------------------------------------------------------------
 * Mutations, shared by the standalone driver and the libFuzzer custom
 * mutator.  All take a buffer of capacity CAP holding *N bytes.
 */

/* The incarnation of the newer slot that looks like one. */
static uint64_t
incarnation (const unsigned char *p, size_t n, uint64_t *tail)
{
  uint64_t inc = 0, best = 0;
  bool any = false;
  *tail = START;
  for (int s = 0; s < 2; ++s)
    if ((size_t) (s + 1) * SLOT <= n && memcmp (p + s * SLOT, "FSCWLOG", 8) == 0
        && (!any || le64_get (p + s * SLOT + 16) > best)) {
      any = true;
      best = le64_get (p + s * SLOT + 16);
      inc = le64_get (p + s * SLOT + 24);
      *tail = le64_get (p + s * SLOT + 64);
    }
  return inc;
}

/* Where the records look to start: walked from START (and from the
 * tail) by their own lengths, as far as they look like records.
 */
static size_t
record_starts (const unsigned char *p, size_t n, size_t *at, size_t max)
{
  size_t k = 0;
  uint64_t tail;
  (void) incarnation (p, n, &tail);
  uint64_t from[2] = { START, tail };
  for (int w = 0; w < 2; ++w) {
    uint64_t pos = from[w];
    if (w == 1 && pos == START)
      break;
    while (pos <= n && n - pos >= REC_HDR && k < max &&
           le32_get (p + pos) == REC_MAGIC) {
      uint32_t nu = le32_get (p + pos + 40);
      uint64_t len = le64_get (p + pos + 32);
      if (nu > REC_UNITS || (p[pos + 4] == T_DATA && len > REC_MAX_DATA))
        break;
      at[k++] = pos;
      pos += round8 (REC_HDR + 8 * (uint64_t) nu +
                     (p[pos + 4] == T_DATA ? len : 0));
    }
  }
  return k;
}

/* Recompute the checksums of every header slot and record that looks
 * like one; with HASHES, the records' unit hashes too (so that changed
 * data reads as good data).
 */
static void
fix_checksums (unsigned char *p, size_t n, bool hashes)
{
  size_t at[512];
  uint64_t tail;
  uint64_t inc = incarnation (p, n, &tail);
  size_t k = record_starts (p, n, at, 512);
  for (size_t i = 0; i < k; ++i) {
    unsigned char *h = p + at[i];
    uint32_t nu = le32_get (h + 40);
    uint64_t len = le64_get (h + 32);
    uint64_t hl = 8 * (uint64_t) nu;
    if (n - at[i] < REC_HDR + hl)
      continue;
    if (hashes && h[4] == T_DATA && n - at[i] - REC_HDR - hl >= len)
      for (uint32_t u = 0; u < nu && (uint64_t) u * UNIT < len; ++u) {
        uint64_t ul = len - (uint64_t) u * UNIT < UNIT
          ? len - (uint64_t) u * UNIT : UNIT;
        le64_put (h + REC_HDR + 8 * u,
                  XXH3_64bits (h + REC_HDR + hl + (uint64_t) u * UNIT, ul));
      }
    le64_put (h + 56, XXH3_64bits_withSeed (h, 56, inc) ^
              XXH3_64bits_withSeed (h + REC_HDR, hl, inc));
  }
  for (int s = 0; s < 2; ++s)
    if ((size_t) (s + 1) * SLOT <= n && memcmp (p + s * SLOT, "FSCWLOG", 8) == 0)
      le64_put (p + s * SLOT + SLOT - 8, XXH3_64bits (p + s * SLOT, SLOT - 8));
}

static const struct { uint16_t off, width; } hdr_fields[] = {
  { 0, 8 }, { 8, 4 }, { 12, 4 }, { 16, 8 }, { 24, 8 }, { 32, 8 }, { 40, 8 },
  { 48, 8 }, { 56, 8 }, { 64, 8 }, { 72, 8 }, { 80, 8 }, { 88, 4 },
  { 92, 4 }, { 96, 8 }, { 104, 8 }, { 160, 4 }, { 164, 4 }, { 192, 8 },
  { 256, 8 }, { SLOT - 8, 8 },
};
static const struct { uint16_t off, width; } rec_fields[] = {
  { 0, 4 }, { 4, 1 }, { 5, 1 }, { 8, 8 }, { 16, 8 }, { 24, 8 }, { 32, 8 },
  { 40, 4 }, { 44, 4 }, { 48, 8 }, { 56, 8 }, { 64, 8 }, { 72, 8 },
};
static const uint64_t interesting[] = {
  0, 1, 2, 3, 4, 5, 0x7f, 0xff, 63, 64, 65, 255, 256, 511, 512, 4095, 4096,
  4097, 8191, 8192, 8193, 8256, 12288, 65536, REC_MAX_DATA - 1, REC_MAX_DATA,
  REC_MAX_DATA + 1, REC_MAX_DATA + UNIT, SIZE, SIZE - 1, SIZE + 1,
  SIZE - SIZE % UNIT, SIZE - SIZE % UNIT - UNIT, SIZE % UNIT,
  SIZE - SIZE % UNIT + UNIT, NUNITS, 0x7fffffff, 0x80000000, 0xffffffff,
  UINT64_C (0x100000000), INT64_MAX, (uint64_t) INT64_MAX + 1, UINT64_MAX,
  UINT64_MAX - 1, UINT64_MAX - UNIT + 1, UINT64_MAX - UNIT + 2,
  UINT64_MAX - REC_HDR, UINT64_C (1) << 40, KEY_LEN, KEY_LEN + 1,
  COUNT_MAX - 1, COUNT_MAX - 2, COUNT_MAX,
};
#define N_INTERESTING (sizeof interesting / sizeof interesting[0])

static void
put_width (unsigned char *p, unsigned width, uint64_t v)
{
  if (width == 8)
    le64_put (p, v);
  else if (width == 1)
    p[0] = v;
  else
    le32_put (p, (uint32_t) v);
}

static uint64_t
get_width (const unsigned char *p, unsigned width)
{
  return width == 8 ? le64_get (p) : width == 1 ? p[0] : le32_get (p);
}

/* Set a field of a header slot or a record to an interesting value, a
 * small step from its own, or another record's (seq, epoch, offset).
 */
static void
mutate_field (uint64_t *s, unsigned char *p, size_t n)
{
  size_t at[512];
  size_t k = record_starts (p, n, at, 512);
  size_t base, off;
  unsigned width;
  if (n < SLOT)
    return;
  if (k == 0 || rng_below (s, 3) == 0) {
    base = n >= 2 * SLOT ? rng_below (s, 2) * SLOT : 0;
    size_t i = rng_below (s, sizeof hdr_fields / sizeof hdr_fields[0]);
    off = hdr_fields[i].off;
    width = hdr_fields[i].width;
  }
  else {
    base = at[rng_below (s, k)];
    size_t i = rng_below (s, sizeof rec_fields / sizeof rec_fields[0]);
    off = rec_fields[i].off;
    width = rec_fields[i].width;
  }
  if (base + off + width > n)
    return;
  unsigned char *f = p + base + off;
  uint64_t cur = get_width (f, width), v;
  switch (rng_below (s, 5)) {
  case 0: v = cur + 1 + rng_below (s, 3); break;
  case 1: v = cur - 1 - rng_below (s, 3); break;
  case 2:                       /* another record's value of the field */
    if (k > 0 && at[rng_below (s, k)] + off + width <= n) {
      v = get_width (p + at[rng_below (s, k)] + off, width);
      break;
    }
    /* fall through */
  default: v = interesting[rng_below (s, N_INTERESTING)]; break;
  }
  if (off == 0 && width == 8)   /* the slot's magic: break it */
    f[rng_below (s, 8)] ^= 1u << rng_below (s, 8);
  else
    put_width (f, width, v);
}

/* Apply one random mutation; OTHER (may be NULL) is a second input to
 * splice with.  Returns the new size (<= CAP).
 */
static size_t
mutate_once (uint64_t *s, unsigned char *p, size_t n, size_t cap,
             const unsigned char *other, size_t other_n)
{
  size_t at[512];
  size_t k = record_starts (p, n, at, 512);
  switch (rng_below (s, 12)) {
  case 0:                       /* flip a bit */
    if (n > 0)
      p[rng_below (s, n)] ^= 1u << rng_below (s, 8);
    break;
  case 1: case 2: case 3:       /* a field */
    mutate_field (s, p, n);
    break;
  case 4: {                     /* truncate: in or at a record */
    if (k > 0 && rng_below (s, 3)) {
      size_t r = at[rng_below (s, k)];
      size_t l = rng_below (s, 3) == 0 ? 0 : rng_below (s, 600);
      if (r + l < n)
        n = r + l;
    }
    else if (n > 0)
      n = rng_below (s, n);
    break;
  }
  case 5: {                     /* extend: zeroes, garbage or a copy */
    size_t l = 1 + rng_below (s, rng_below (s, 2) ? 100 : 5000);
    if (l > cap - n)
      l = cap - n;
    unsigned how = rng_below (s, 3);
    if (how == 0)
      memset (p + n, 0, l);
    else if (how == 1 || k == 0)
      rng_fill (s, p + n, l);
    else {
      size_t r = at[rng_below (s, k)];
      if (l > n - r)
        l = n - r;
      memmove (p + n, p + r, l);        /* a record again: seq repeats */
    }
    n += l;
    break;
  }
  case 6: {                     /* tear a 512-byte sector */
    if (n > START) {
      size_t sec = START / 512 + rng_below (s, (n - START + 511) / 512);
      size_t a = sec * 512, l = a + 512 <= n ? 512 : n - a;
      memset (p + a, 0, l);
    }
    break;
  }
  case 7: {                     /* drop a record: a sequence gap */
    if (k > 0) {
      size_t i = rng_below (s, k);
      size_t end = i + 1 < k ? at[i + 1] : n;
      if (end > at[i] && end <= n) {
        memmove (p + at[i], p + end, n - end);
        n -= end - at[i];
      }
    }
    break;
  }
  case 8: {                     /* swap two neighbouring records */
    if (k >= 3) {
      size_t i = rng_below (s, k - 2);
      size_t a = at[i], b = at[i + 1], c = at[i + 2];
      if (c <= n && b > a && c > b) {
        unsigned char *t = malloc (b - a);
        if (!t)
          abort ();
        memcpy (t, p + a, b - a);
        memmove (p + a, p + b, c - b);
        memcpy (p + a + (c - b), t, b - a);
        free (t);
      }
    }
    break;
  }
  case 9:                       /* splice: our start, the other's end */
    if (other && other_n > 0) {
      size_t cut = n ? rng_below (s, n + 1) : 0;
      if (k > 0 && rng_below (s, 2))
        cut = at[rng_below (s, k)];
      size_t from = rng_below (s, other_n);
      size_t l = other_n - from;
      if (l > cap - cut)
        l = cap - cut;
      memcpy (p + cut, other + from, l);
      n = cut + l;
    }
    break;
  case 10:                      /* copy one header slot onto the other */
    if (n >= 2 * SLOT) {
      size_t from = rng_below (s, 2);
      memcpy (p + (1 - from) * SLOT, p + from * SLOT, SLOT);
    }
    break;
  default: {                    /* set a byte, or zero a range */
    if (n > 0) {
      size_t a = rng_below (s, n);
      if (rng_below (s, 2))
        p[a] = rng_next (s);
      else {
        size_t l = 1 + rng_below (s, 64);
        memset (p + a, 0, l > n - a ? n - a : l);
      }
    }
    break;
  }
  }
  return n;
}

/* Stacked mutations; then, usually, checksums recomputed. */
static size_t
mutate (uint64_t *s, unsigned char *p, size_t n, size_t cap,
        const unsigned char *other, size_t other_n)
{
  for (uint64_t k = 1 + rng_below (s, 3); k > 0; --k)
    n = mutate_once (s, p, n, cap, other, other_n);
  if (rng_below (s, 4) != 0)
    fix_checksums (p, n, rng_below (s, 2));
  return n;
}

#ifdef FUZZ_LIBFUZZER

size_t LLVMFuzzerMutate (uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator (uint8_t *data, size_t size,
                                size_t max_size, unsigned int seed);

size_t
LLVMFuzzerCustomMutator (uint8_t *data, size_t size, size_t max_size,
                         unsigned int seed)
{
  uint64_t s = seed;
  if (rng_below (&s, 2))
    size = mutate (&s, data, size, max_size, NULL, 0);
  else {
    size = LLVMFuzzerMutate (data, size, max_size);
    if (rng_below (&s, 2))
      fix_checksums (data, size, rng_below (&s, 2));
  }
  return size;
}

#else /* !FUZZ_LIBFUZZER */

/*----------------------------------------------------------------------
 * Standalone driver: tests/fuzz-common.h's fuzz_main, with this
 * target's corpus maker, usage and summary line.
 */

/*----------------------------------------------------------------------
 * --make-corpus: real logs written by the core.
 */

static struct fsc_wlog *
mk_open (bool with_sample, const char *gen)
{
  struct fsc_wlog_params p = {
    .key = KEY, .key_len = KEY_LEN, .size = SIZE, .generation = gen,
    .dirty_max = 64 << 20,
  };
  if (with_sample)
    p.sample = sample;
  struct fsc_wlog *wl;
  struct fsc_wlog_info info;
  if (fsc_wlog_open (cache, &p, FSC_WLOG_CREATE, &wl, &info) == -1) {
    perror ("fsc_wlog_open");
    exit (1);
  }
  return wl;
}

static void
mk_write (struct fsc_wlog *wl, uint64_t off, uint64_t len, bool fua,
          uint64_t *s)
{
  static unsigned char buf[80 * UNIT];
  if (len > sizeof buf)
    abort ();
  rng_fill (s, buf, len);
  if (fsc_wlog_pwrite (wl, obj, &up, buf, len, off, fua) == -1) {
    perror ("fsc_wlog_pwrite");
    exit (1);
  }
}

static void
mk_ok (int r, const char *what)
{
  if (r == -1) {
    perror (what);
    exit (1);
  }
}

/* Records of every kind: aligned and unaligned writes, one at the
 * export's short end, a zero with ragged ends, a zero and a trim to the
 * end, flush markers, FUA.
 */
static void
mk_records (struct fsc_wlog *wl, uint64_t *s)
{
  mk_write (wl, 0, UNIT, false, s);
  mk_write (wl, 5 * UNIT + 100, 2 * UNIT, false, s);
  mk_ok (fsc_wlog_flush (wl), "flush");
  mk_write (wl, SIZE - 100, 100, true, s);
  mk_ok (fsc_wlog_zero (wl, obj, &up, 3 * UNIT + 700, 20 * UNIT - 300,
                        false), "zero");
  mk_ok (fsc_wlog_trim (wl, 8 * UNIT, 40 * UNIT, false), "trim");
  mk_ok (fsc_wlog_flush (wl), "flush");
  mk_write (wl, 2 * UNIT, UNIT, false, s);
  mk_ok (fsc_wlog_zero (wl, obj, &up, SIZE - 200 * UNIT, 200 * UNIT, false),
         "zero");
  mk_ok (fsc_wlog_trim (wl, 3 * UNIT + SIZE % UNIT, SIZE - 3 * UNIT -
                        SIZE % UNIT, false), "trim");
  mk_write (wl, UNIT, UNIT, false, s);
}

static unsigned char *
mk_slurp (size_t *n)
{
  return read_file (log_path, n);
}

/* An upstream that refuses writes past LIMIT: the writer gets that far
 * and retries the rest.
 */
static uint64_t refuse_from = UINT64_MAX;

static int
wb_pwrite_limited (void *o, const void *buf, uint32_t count, uint64_t off)
{
  if (off + count > refuse_from) {
    errno = EIO;
    return -1;
  }
  return wb_write (buf, count, off);
}

static int
make_corpus (const char *dir)
{
  unsigned char *p;
  size_t n;
  uint64_t s = 42;

  setvbuf (stdout, NULL, _IOLBF, 0);
  if (mkdir (dir, 0755) == -1 && errno != EEXIST) {
    perror (dir);
    return 1;
  }
  setup ();
  unlink (log_path);

  /* Created, nothing written: two header slots. */
  struct fsc_wlog *wl = mk_open (false, GENERATION);
  fsc_wlog_close (wl);
  p = mk_slurp (&n);
  save (dir, "empty.wlog", p, n);
  free (p);

  /* Records of every kind, closed cleanly. */
  wl = mk_open (false, GENERATION);
  mk_records (wl, &s);
  fsc_wlog_close (wl);
  p = mk_slurp (&n);
  save (dir, "records.wlog", p, n);
  /* Torn, not covered by a marker: cut inside the last record. */
  save (dir, "torn-tail.wlog", p, n - 100);
  /* A unit of the first record (a marker covers it) damaged. */
  p[START + REC_HDR + 8 + 10] ^= 0x20;
  save (dir, "damaged.wlog", p, n);
  p[START + REC_HDR + 8 + 10] ^= 0x20;
  /* The last record's data torn (no marker covers it). */
  p[n - 50] ^= 0x01;
  save (dir, "torn-data.wlog", p, n);
  /* Both: covered damage does not keep the torn record. */
  p[START + REC_HDR + 8 + 10] ^= 0x20;
  save (dir, "damaged-torn.wlog", p, n);
  free (p);
  unlink (log_path);

  /* With a coherency sample and no generation. */
  struct fsc_wlog *w2 = mk_open (true, NULL);
  mk_records (w2, &s);
  fsc_wlog_close (w2);
  p = mk_slurp (&n);
  save (dir, "sample-nogen.wlog", p, n);
  free (p);
  unlink (log_path);

  /* One write of 66 units: a record of the most data (64 units) and
   * one of 2, then a flush.
   */
  wl = mk_open (false, GENERATION);
  mk_write (wl, 10 * UNIT, REC_MAX_DATA + 2 * UNIT, false, &s);
  mk_ok (fsc_wlog_flush (wl), "flush");
  fsc_wlog_close (wl);
  p = mk_slurp (&n);
  save (dir, "split-write.wlog", p, n);
  free (p);
  unlink (log_path);

  /* The writer retired the first epochs (the tail moved, the header's
   * gen went up, space was punched) and the upstream refuses the rest.
   */
  wl = mk_open (false, GENERATION);
  for (int e = 0; e < 4; ++e) {
    mk_write (wl, (uint64_t) e * 4 * UNIT, 3 * UNIT, false, &s);
    mk_write (wl, 100 * UNIT + e * UNIT, 10, false, &s);
    mk_ok (fsc_wlog_flush (wl), "flush");
  }
  mk_write (wl, 200 * UNIT, 2 * UNIT, false, &s);
  mk_write (wl, 200 * UNIT, 2 * UNIT, false, &s);      /* overwritten */
  struct fsc_wb_upstream lim = wbup;
  lim.pwrite = wb_pwrite_limited;
  refuse_from = 150 * UNIT;
  memcpy (wup, upstream, SIZE);
  if (fsc_wlog_start_writer (wl, NULL, &lim) == -1)
    abort ();
  struct fsc_wlog_info info;
  for (int i = 0; i < 500; ++i) {
    fsc_wlog_counters (wl, &info);
    if (info.epochs <= 1)
      break;
    usleep (10000);
  }
  fsc_wlog_close (wl);
  refuse_from = UINT64_MAX;
  p = mk_slurp (&n);
  save (dir, "retired.wlog", p, n);
  free (p);

  /* Drained whole and rewound (the tail's sequence number goes on),
   * then written again.
   */
  struct fsc_wlog_params pp = {
    .key = KEY, .key_len = KEY_LEN, .size = SIZE, .generation = GENERATION,
  };
  if (fsc_wlog_open (cache, &pp, 0, &wl, &info) == -1)
    abort ();
  if (fsc_wlog_start_writer (wl, NULL, &wbup) == -1 ||
      fsc_wlog_drain (wl, 20000) != 0)
    abort ();
  for (int i = 0; i < 500; ++i) {
    struct stat st;
    if (stat (log_path, &st) == 0 && st.st_size == START)
      break;
    usleep (10000);
  }
  fsc_wlog_close (wl);
  wl = mk_open (false, GENERATION);
  mk_write (wl, 7 * UNIT, UNIT, false, &s);
  mk_ok (fsc_wlog_flush (wl), "flush");
  mk_write (wl, 9 * UNIT + 1, 5, false, &s);
  fsc_wlog_close (wl);
  p = mk_slurp (&n);
  save (dir, "rewound.wlog", p, n);
  free (p);
  unlink (log_path);

  /* Empty: no log yet. */
  save (dir, "zero-length.wlog", (const unsigned char *) "", 0);

  /* Regression: a data record whose length, 2^64 - 4095, made its unit
   * count wrap to 0 (a header for an upstream of 2^64 - 1 bytes), so
   * that recovery read ~2^64 bytes into a 256 KiB buffer: as far as the
   * file went.  Followed by 280 KiB of zeroes.
   */
  wl = mk_open (false, GENERATION);
  mk_write (wl, 0, UNIT, false, &s);
  fsc_wlog_close (wl);
  p = mk_slurp (&n);
  unlink (log_path);
  size_t big = n + 280 * 1024;
  p = realloc (p, big);
  if (!p)
    abort ();
  memset (p + n, 0, big - n);
  for (int sl = 0; sl < 2; ++sl) {
    le64_put (p + sl * SLOT + 56, UINT64_MAX);
    le64_put (p + sl * SLOT + SLOT - 8, XXH3_64bits (p + sl * SLOT, SLOT - 8));
  }
  uint64_t inc = le64_get (p + 24);
  le64_put (p + START + 32, UINT64_MAX - UNIT + 2);
  le32_put (p + START + 40, 0);
  le64_put (p + START + 56, XXH3_64bits_withSeed (p + START, 56, inc) ^
            XXH3_64bits_withSeed (p + START + REC_HDR, 0, inc));
  save (dir, "regress-len-wrap.wlog", p, big);
  free (p);
  return 0;
}

static void
usage (FILE *f)
{
  fprintf (f,
           "usage: fuzz-wlog [--mutations N] [--seed S] [--crash-file FILE]\n"
           "                 [--verbose] CORPUS_DIR_OR_FILE...\n"
           "       fuzz-wlog --seed S --dump K OUT CORPUS_DIR_OR_FILE...\n"
           "       fuzz-wlog --make-corpus DIR\n"
           "Runs every corpus file, then N mutations of them, through the\n"
           "write log fuzz target; any wrong view, unexpected error,\n"
           "sanitizer error or crash aborts.  --dump writes mutation K\n"
           "(from 0) of seed S to OUT.  The private cache lives under\n"
           "$TMPDIR (default /tmp).\n");
}

static void
summary (uint64_t seed, uint64_t mutations, double secs)
{
  printf ("fuzz-wlog: seed %" PRIu64 ": %zu corpus files + %" PRIu64
          " mutations in %.1f s: %" PRIu64 " opened (%" PRIu64 " records "
          "kept, %" PRIu64 " with records cut, %" PRIu64 " with damaged "
          "ones, %" PRIu64 " written back, %" PRIu64 " with forged "
          "counters checked at the first open only); refused: %" PRIu64
          " EBADMSG, %" PRIu64 " EUCLEAN (damaged, Rule 7), %" PRIu64
          " ESTALE (size %" PRIu64 ", generation %"
          PRIu64 ", sample %" PRIu64 "); no errors\n",
          seed, ncorpus, mutations, secs, n_opened, n_records, n_dropped,
          n_damaged, n_writer, n_forged, n_refused[1], n_refused[3],
          n_refused[2],
          n_mismatch[1], n_mismatch[2], n_mismatch[3]);
}

int
main (int argc, char *argv[])
{
  return fuzz_main (argc, argv, make_corpus, usage, summary);
}

#endif /* !FUZZ_LIBFUZZER */
