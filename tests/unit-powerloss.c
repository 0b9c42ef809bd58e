/* Emulated power loss.
 *
 * One object is driven through a random workload of reads (fills),
 * writes and zero requests (invalidations and writethrough stores,
 * zero blocks among them, with the upstream changing underneath),
 * failed writes and commits, while every write
 * and sync of its cache files is recorded (fsc_cache_set_trace), in
 * order, together with each change of the upstream.
 *
 * Then many crash states are rebuilt from that record, as a disk could
 * leave them after a power cut at event I: every cache write up to the
 * last sync of its file before I, plus a random subset of the later
 * writes before I, some of them torn (only some of their 512-byte
 * sectors written).  Each state is opened as a cache and read whole,
 * with and without checksum verification; every byte must equal the
 * upstream as it was at I.  A block served from the cache that differs
 * from the upstream is a failure.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fscache.h"
#include "keyenc.h"
#include "unit.h"

#define SIZE (256u * 4096u + 777u)
#define MAX_BS 65536u

/* The block size of this run: 4K (whole blocks only), then 64K, whose
 * 4K pieces are fetched alone by small reads (docs/format.md).
 */
static uint32_t BS;
#define KEY "powerloss\0export="
#define KEYLEN 17
#define STEPS 600
#define STATES 150

enum { EV_WRITE, EV_SYNC, EV_UPSTREAM };

struct event {
  int type, kind;
  uint64_t off;
  size_t n;
  unsigned char *data;
};

static struct event *ev;
static size_t nev, capev;
static unsigned char upstream[SIZE];

static void
push (int type, int kind, const void *buf, size_t n, uint64_t off)
{
  if (nev == capev) {
    capev = capev ? capev * 2 : 1024;
    ev = realloc (ev, capev * sizeof *ev);
    CHECK (ev != NULL);
  }
  ev[nev].type = type;
  ev[nev].kind = kind;
  ev[nev].off = off;
  ev[nev].n = n;
  ev[nev].data = NULL;
  if (n) {
    ev[nev].data = malloc (n);
    CHECK (ev[nev].data != NULL);
    memcpy (ev[nev].data, buf, n);
  }
  nev++;
}

static void
trace (void *opaque, int op, int kind, const void *buf, size_t n,
       uint64_t off)
{
  push (op == FSC_OP_SYNC ? EV_SYNC : EV_WRITE, kind, buf, n, off);
}

/* The upstream the object reads from: OPAQUE is a SIZE-byte buffer. */
/* The object's own files (the write log has its own test, below). */
#define OBJ_FILE_KINDS (FSC_FILE_SUMS + 1)

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  CHECK (offset + count <= SIZE);
  memcpy (buf, (unsigned char *) opaque + offset, count);
  return 0;
}

static unsigned char *
slurp (const char *path, size_t *len)
{
  int fd = open (path, O_RDONLY);
  CHECK (fd >= 0);
  struct stat st;
  CHECK (fstat (fd, &st) == 0);
  unsigned char *p = calloc (1, st.st_size + 1);
  CHECK (p != NULL);
  CHECK (pread (fd, p, st.st_size, 0) == st.st_size);
  close (fd);
  *len = st.st_size;
  return p;
}

static void
spew (const char *path, const unsigned char *p, size_t len)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK (fd >= 0);
  CHECK (len == 0 || pwrite (fd, p, len, 0) == (ssize_t) len);
  close (fd);
}

/* A growable file image. */
struct image {
  unsigned char *p;
  size_t len;
};

static void
apply (struct image *im, uint64_t off, const unsigned char *buf, size_t n,
       int torn)
{
  if (off + n > im->len) {
    im->p = realloc (im->p, off + n);
    CHECK (im->p != NULL);
    memset (im->p + im->len, 0, off + n - im->len);
    im->len = off + n;
  }
  if (!torn) {
    memcpy (im->p + off, buf, n);
    return;
  }
  /* Torn: each 512-byte sector (of the disk) is written or not. */
  for (uint64_t s = off & ~511ull; s < off + n; s += 512) {
    uint64_t lo = s < off ? off : s, hi = s + 512 < off + n ? s + 512 : off + n;
    if (rand () & 1)
      memcpy (im->p + lo, buf + (lo - off), hi - lo);
  }
}

static struct fsc_object *
open_obj (struct fsc_cache *c, bool verify, struct fsc_open_info *info)
{
  struct fsc_object *o;
  struct fsc_object_params p = {
    .key = KEY, .key_len = KEYLEN, .block_size = BS, .size = SIZE,
    .verify = verify, .validate = FSC_VALIDATE_SIZE,
  };
  CHECK (fsc_object_open (c, &p, &o, info) == 0);
  return o;
}

static struct fsc_cache *
open_cache (const char *dir)
{
  struct fsc_cache *c;
  struct fsc_cache_config cfg = { .dir = dir, .create = true };
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  return c;
}

static void
run (unsigned seed)
{
  char dir[] = "/tmp/unit-powerloss-XXXXXX";
  char cdir[64], name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  char idx[512], data[512], sums[512], hdr[256];
  struct fsc_open_info info;

  srand (seed);
  CHECK (mkdtemp (dir) != NULL);
  snprintf (cdir, sizeof cdir, "%s/c", dir);
  fsc_key_encode (KEY, KEYLEN, name, fan);
  snprintf (idx, sizeof idx, "%s/objects/%s/%s.idx", cdir, fan, name);
  snprintf (data, sizeof data, "%s/objects/%s/%s.data", cdir, fan, name);
  snprintf (sums, sizeof sums, "%s/objects/%s/%s.sums", cdir, fan, name);
  snprintf (hdr, sizeof hdr, "%s/fscache.hdr", cdir);
  for (size_t i = 0; i < SIZE; ++i)
    upstream[i] = rand ();

  /* The object as created (durable: creation syncs). */
  struct fsc_cache *c = open_cache (cdir);
  struct fsc_object *o = open_obj (c, true, &info);
  CHECK_EQ (info.state, FSC_OBJ_AVAILABLE);
  struct image base[OBJ_FILE_KINDS];
  const char *paths[OBJ_FILE_KINDS];
  paths[FSC_FILE_DATA] = data;
  paths[FSC_FILE_INDEX] = idx;
  paths[FSC_FILE_SUMS] = sums;
  size_t hdr_len;
  unsigned char *base_hdr = slurp (hdr, &hdr_len);
  for (int i = 0; i < OBJ_FILE_KINDS; ++i)
    base[i].p = slurp (paths[i], &base[i].len);
  unsigned char *base_up = malloc (SIZE);
  memcpy (base_up, upstream, SIZE);

  /* The workload, recorded. */
  fsc_cache_set_trace (c, trace, NULL);
  struct fsc_upstream up = { .pread = up_pread, .opaque = upstream };
  static unsigned char buf[3 * MAX_BS + 100];
  static unsigned char got[64 * 1024];
  for (int step = 0; step < STEPS; ++step) {
    int what = rand () % 20;
    if (what < 10) {                    /* read: fills */
      /* Small reads half the time: pieces, with 64K blocks. */
      uint32_t n = 1 + rand () % (rand () % 2 ? 3 * 4096 : sizeof got);
      uint64_t off = rand () % (SIZE - n);
      static const unsigned flags[4] = {
        0, 0, FSC_READ_NEAR, FSC_READ_SEQUENTIAL,
      };
      CHECK (fsc_object_read (o, got, n, off, &up, flags[rand () % 4]) == 0);
      CHECK (memcmp (got, upstream + off, n) == 0);
    }
    else if (what < 17) {               /* write, maybe failing */
      uint32_t n = 1 + rand () % (3 * BS + 100);
      uint64_t off = rand () % (SIZE - n);
      if (rand () % 3 == 0)
        off &= ~(uint64_t) (BS - 1);
      /* A quarter are zero requests: whole blocks stored as zero
       * blocks, whose punched space the trace does not show (the
       * crash states keep the old bytes under them, never read).
       */
      bool zero = rand () % 4 == 0;
      for (uint32_t i = 0; i < n; ++i)
        buf[i] = zero ? 0 : rand ();
      bool ok = rand () % 8 != 0;
      struct fsc_write w;
      CHECK (fsc_object_write_begin (o, off, n, rand () % 4 != 0, &w) == 0);
      if (ok) {
        memcpy (upstream + off, buf, n);
        push (EV_UPSTREAM, 0, buf, n, off);
      }
      fsc_object_write_end (o, &w, zero ? NULL : buf, ok);
    }
    else
      CHECK (fsc_object_commit (o) == 0);
  }
  struct fsc_stats wst;
  fsc_cache_stats (c, &wst);
  /* With 64K blocks, the workload must have held blocks in pieces. */
  CHECK (BS == 4096 || wst.piece_fills > 0);
  fsc_object_close (o);
  fsc_cache_close (c);
  /* And zero blocks. */
  CHECK (wst.zero_blocks > 0);
  fprintf (stderr, "unit-powerloss: %" PRIu64 " piece fills, %" PRIu64
           " zero blocks\n", wst.piece_fills, wst.zero_blocks);
  fprintf (stderr, "unit-powerloss: block size %u, seed %u, %zu events "
           "recorded\n", BS, seed, nev);

  /* Rebuild crash states and read each whole. */
  unsigned char *up_at = malloc (SIZE);
  unsigned char *all = malloc (SIZE);
  uint64_t states_with_hits = 0, reused = 0;
  for (int k = 0; k < STATES; ++k) {
    size_t at = k == STATES - 1 ? nev : (size_t) rand () % (nev + 1);
    ssize_t last_sync[OBJ_FILE_KINDS] = { -1, -1, -1 };
    for (size_t j = 0; j < at; ++j)
      if (ev[j].type == EV_SYNC)
        last_sync[ev[j].kind] = j;

    struct image im[OBJ_FILE_KINDS];
    for (int i = 0; i < OBJ_FILE_KINDS; ++i) {
      im[i].p = malloc (base[i].len + 1);
      memcpy (im[i].p, base[i].p, base[i].len);
      im[i].len = base[i].len;
    }
    memcpy (up_at, base_up, SIZE);
    for (size_t j = 0; j < at; ++j) {
      struct event *e = &ev[j];
      if (e->type == EV_UPSTREAM)
        memcpy (up_at + e->off, e->data, e->n);
      else if (e->type == EV_WRITE) {
        if ((ssize_t) j < last_sync[e->kind])
          apply (&im[e->kind], e->off, e->data, e->n, 0);
        else {
          int r = rand () % 4;
          if (r == 1)
            apply (&im[e->kind], e->off, e->data, e->n, 0);
          else if (r == 2)
            apply (&im[e->kind], e->off, e->data, e->n, 1);
        }
      }
    }

    char cmd[256];
    snprintf (cmd, sizeof cmd, "rm -rf %s && mkdir -m 0700 -p %s/objects/%s",
              cdir, cdir, fan);
    CHECK (system (cmd) == 0);
    spew (hdr, base_hdr, hdr_len);
    for (int i = 0; i < OBJ_FILE_KINDS; ++i) {
      spew (paths[i], im[i].p, im[i].len);
      free (im[i].p);
    }
    /* Data and sums files keep their size (set when created). */
    CHECK (truncate (data, base[FSC_FILE_DATA].len) == 0);
    CHECK (truncate (sums, base[FSC_FILE_SUMS].len) == 0);

    bool verify = k % 2 == 0;
    c = open_cache (cdir);
    o = open_obj (c, verify, &info);
    if (info.reason == FSC_OK)
      reused++;
    struct fsc_upstream up2 = { .pread = up_pread, .opaque = up_at };
    /* In reads of 4K and 64K in turn: 4K ones hit the pieces held. */
    const uint32_t chunk = k % 4 < 2 ? 65536 : 4096;
    for (uint64_t off = 0; off < SIZE; off += chunk) {
      uint32_t n = SIZE - off < chunk ? SIZE - off : chunk;
      CHECK (fsc_object_read (o, all + off, n, off, &up2, 0) == 0);
    }
    for (uint64_t i = 0; i < SIZE; ++i)
      if (all[i] != up_at[i]) {
        fprintf (stderr, "unit-powerloss: seed %u state %d (event %zu of "
                 "%zu, verify=%d): byte %llu (block %llu) differs\n",
                 seed, k, at, nev, verify, (unsigned long long) i,
                 (unsigned long long) (i / BS));
        exit (1);
      }
    struct fsc_stats st;
    fsc_cache_stats (c, &st);
    if (st.hit_bytes > 0)
      states_with_hits++;
    fsc_object_close (o);
    fsc_cache_close (c);
  }
  fprintf (stderr, "unit-powerloss: block size %u: %d crash states, %llu "
           "reused the index, %llu served hits, 0 wrong bytes\n", BS, STATES,
           (unsigned long long) reused, (unsigned long long) states_with_hits);
  /* The test means something only if crash states did reuse data. */
  CHECK (states_with_hits > STATES / 4);

  char cmd[128];
  snprintf (cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK (system (cmd) == 0);
  for (int i = 0; i < OBJ_FILE_KINDS; ++i)
    free (base[i].p);
  for (size_t j = 0; j < nev; ++j)
    free (ev[j].data);
  free (ev);
  ev = NULL;
  nev = capev = 0;
  free (base_hdr);
  free (base_up);
  free (up_at);
  free (all);
}

int
main (int argc, char *argv[])
{
  unsigned seed = argc > 1 ? atoi (argv[1]) : 12345;
  BS = 4096;
  run (seed);
  BS = 65536;
  run (seed);
  return 0;
}
