/* Fuzz target: the index parser (core/base/index.c) and object loading
 * (fsc_object_open in core/object/object.c).
 *
 * One input is the content of an object's index file (NAME.idx).  For
 * each input the target
 *
 *  1. decodes every whole superblock slot and group record slot the
 *     input covers with fsc_sb_decode / fsc_grec_decode (each from an
 *     exactly sized heap copy, so that ASan sees any overread), and
 *     checks that a valid slot re-encodes to the same decoded values;
 *
 *  2. installs the input as the index of an object in a private cache
 *     directory, next to a data file whose content is derived from a
 *     hash of the input: holes, garbage, the upstream's own bytes, or a
 *     per-block mix of those and near misses (upstream bytes with one
 *     byte changed).  Data is only ever at the offset of its own block,
 *     and no upstream block is all zeroes, so a block served from the
 *     cache is right exactly when its checksum in the index is that of
 *     the upstream block;
 *
 *  3. opens the object (block size 4096, or 65536 if the input's first
 *     superblock slot says so, so that blocks held in 4 KiB pieces are
 *     fuzzed too; size 1 MiB + 12345, verify on, validate=size), reads
 *     all of it twice through fsc_object_read in odd-sized pieces (as
 *     random, near and sequential reads) from an in-memory upstream
 *     and aborts if any byte differs from the upstream: a damaged or
 *     forged index may cost cache contents, never correctness (zero
 *     blocks too: one is served only if its checksum is that of
 *     zeroes, which no upstream block has, so a forged zero bit must
 *     be dropped, never served);
 *
 *  4. closes the object cleanly and, if it stayed available, opens it
 *     again: the index the core itself wrote must be accepted
 *     (reason ok) with exactly the blocks that were present at close,
 *     and read right once more.
 *
 * Built two ways:
 *   - by automake as tests/fuzz-index, with ASan and UBSan and the
 *     standalone driver of tests/fuzz-common.h (see --help);
 *   - with -DFUZZ_LIBFUZZER by clang -fsanitize=fuzzer, as a real
 *     libFuzzer target (see tests/README.md).  The custom mutator then
 *     recomputes checksums after libFuzzer's mutations half the time,
 *     so mutated fields get past the checksum and are really parsed.
 */
#include <config.h>

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
#include "index.h"
#include "keyenc.h"

/* The object every input is loaded as. */
#define KEY "fuzz-index:export"
#define KEY_LEN (sizeof KEY - 1)
#define BS 4096u
#define SIZE (1024u * 1024u + 12345u)           /* last block short */
#define NBLOCKS ((SIZE + BS - 1) / BS)           /* 260 */
#define NGROUPS ((NBLOCKS + FSC_GROUP_BLOCKS - 1) / FSC_GROUP_BLOCKS) /* 5,
                                                 * the last one partial */
/* Largest index the object can use: both superblocks and every group. */
#define INDEX_MAX (FSC_GROUPS_OFFSET + NGROUPS * 2 * FSC_GREC_SIZE)
#define INPUT_MAX (64 * 1024)   /* mutations never grow inputs past this */

/* On-disk layout details the mutator needs (docs/format.md, the
 * offsets in core/base/index.c).
 */
#define SB_CHECKSUM (FSC_SB_SIZE - 8)
#define GR_CHECKSUM (FSC_GREC_SIZE - 8)
#define GR_MAGIC 0x47435346u    /* "FSCG" */
#define GR_PIECES (40 + 8 * FSC_GROUP_BLOCKS)
#define GR_ZERO (GR_PIECES + 2 * FSC_GROUP_BLOCKS)      /* version 3 */

/* The block size of the input being run: BS, or BIG_BS for inputs
 * whose superblock slot 0 says so.
 */
#define BIG_BS 65536u
static uint32_t bs = BS;
static uint64_t nblocks = NBLOCKS;
static struct fsc_object_params params = {
  .key = KEY, .key_len = KEY_LEN, .block_size = BS, .size = SIZE,
  .verify = true, .validate = FSC_VALIDATE_SIZE,
};

#define FUZZ_NAME "fuzz-index"
#include "fuzz-common.h"

/*----------------------------------------------------------------------
 * The upstream: SIZE bytes in memory, every block different and none
 * all zeroes.
 */
static unsigned char *upstream;         /* changed by writes */
static unsigned char *pristine;         /* as each input starts */
static unsigned char *readbuf;

/* Run the next input as an object of block size B. */
static void
set_geometry (uint32_t b)
{
  bs = b;
  nblocks = (SIZE + b - 1) / b;
  params.block_size = b;
}

static void
make_upstream (void)
{
  upstream = malloc (SIZE);
  pristine = malloc (SIZE);
  readbuf = malloc (SIZE);
  if (!upstream || !pristine || !readbuf)
    abort ();
  for (uint64_t b = 0; b < NBLOCKS; ++b) {
    uint64_t s = UINT64_C (0x5eed0000) + b;
    uint64_t len = b == NBLOCKS - 1 ? SIZE - b * BS : BS;
    rng_fill (&s, upstream + b * BS, len);
    upstream[b * BS] = 1 + b % 255;     /* never a zero block */
  }
  memcpy (pristine, upstream, SIZE);
}

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  if (offset > SIZE || count > SIZE - offset) {
    fprintf (stderr, "fuzz-index: upstream read out of range: "
             "offset %" PRIu64 " count %" PRIu32 "\n", offset, count);
    abort ();
  }
  memcpy (buf, upstream + offset, count);
  return 0;
}

static const struct fsc_upstream up = { .pread = up_pread };

/*----------------------------------------------------------------------
 * The private cache.
 */
static char fan_path[512];
static char idx_path[1024];
static char data_path[1024];
static char sums_path[1024];
static struct fsc_cache *cache;

static void
teardown (void)
{
  if (cache) {
    fsc_cache_close (cache);
    cache = NULL;
  }
  if (cache_dir[0])
    rm_rf (cache_dir);
  cache_dir[0] = '\0';
  free (upstream);
  free (pristine);
  free (readbuf);
  upstream = pristine = readbuf = NULL;
}

static void
setup (void)
{
  if (cache)
    return;
  const char *tmp = getenv ("TMPDIR");
  snprintf (cache_dir, sizeof cache_dir, "%s/fuzz-index.XXXXXX",
            tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp (cache_dir) == NULL) {
    perror (cache_dir);
    exit (1);
  }
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  fsc_key_encode (KEY, KEY_LEN, name, fan);
  snprintf (fan_path, sizeof fan_path, "%s/objects/%s", cache_dir, fan);
  snprintf (idx_path, sizeof idx_path, "%s/%s.idx", fan_path, name);
  snprintf (data_path, sizeof data_path, "%s/%s.data", fan_path, name);
  snprintf (sums_path, sizeof sums_path, "%s/%s.sums", fan_path, name);

  struct fsc_cache_config cfg = { .dir = cache_dir, .create = true };
  if (fsc_cache_open (&cfg, &cache) == -1) {
    perror ("fsc_cache_open");
    exit (1);
  }
  make_upstream ();
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

/* The data file for input hash H.  Mostly SIZE bytes, sometimes not
 * (the object must then start cold).
 */
static void
write_data (uint64_t h)
{
  uint64_t s = h;
  unsigned mode = rng_below (&s, 8);
  uint64_t dsize = SIZE;
  if (rng_below (&s, 16) == 0) {
    if (rng_below (&s, 2))
      dsize += bs;
    else
      dsize -= 1;
  }

  int fd = open (data_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd == -1 || ftruncate (fd, dsize) == -1) {
    perror (data_path);
    abort ();
  }
  /* The sums file: one XXH3 per 4 KiB sub-block, matching whatever
   * the data file holds, so that only the index decides what is
   * trusted.  The data is chosen per 4 KiB too: with 64 KiB blocks, a
   * block's pieces differ.
   */
  int sfd = open (sums_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (sfd == -1 || ftruncate (sfd, nblocks * (bs / BS) * 8) == -1) {
    perror (sums_path);
    abort ();
  }
  unsigned char *blk = malloc (BS);
  if (!blk)
    abort ();
  for (uint64_t b = 0; b < NBLOCKS; ++b) {
    uint64_t off = b * BS;
    uint64_t len = b == NBLOCKS - 1 ? SIZE - off : BS;
    unsigned what;              /* 0 hole, 1 garbage, 2 upstream, 3 near */
    /* (The units are BS bytes whatever the block size.) */
    switch (mode) {
    case 0: what = 0; break;
    case 1: what = 1; break;
    case 2: case 3: case 4: what = 2; break;
    default: what = rng_below (&s, 4); break;
    }
    if (what == 0)
      continue;
    if (what == 1)
      rng_fill (&s, blk, len);
    else {
      memcpy (blk, upstream + off, len);
      if (what == 3)
        blk[rng_below (&s, len)] ^= 1 + rng_below (&s, 255);
    }
    if (pwrite (fd, blk, len, off) != (ssize_t) len) {
      perror (data_path);
      abort ();
    }
    unsigned char le[8];
    le64_put (le, XXH3_64bits (blk, len));
    if (pwrite (sfd, le, 8, b * 8) != 8) {
      perror (sums_path);
      abort ();
    }
  }
  free (blk);
  if (close (fd) == -1 || close (sfd) == -1)
    abort ();
}

/*----------------------------------------------------------------------
 * The target.
 */

/* Statistics for the driver's summary. */
static uint64_t n_inputs, n_sb_ok, n_grec_ok, n_reused, n_hits_blocks;
static uint64_t n_reason[FSC_REASONS + 1];

static void
check_decoders (const uint8_t *data, size_t size)
{
  for (size_t off = 0; off + FSC_SB_SIZE <= size && off < FSC_GROUPS_OFFSET;
       off += FSC_SB_SIZE) {
    unsigned char *buf = malloc (FSC_SB_SIZE);
    unsigned char *re = malloc (FSC_SB_SIZE);
    struct fsc_sb *sb = malloc (sizeof *sb), *sb2 = malloc (sizeof *sb2);
    if (!buf || !re || !sb || !sb2)
      abort ();
    memcpy (buf, data + off, FSC_SB_SIZE);
    int r = fsc_sb_decode (buf, sb);
    if (r < 0 || r >= FSC_REASONS || fsc_reason_name (r) == NULL)
      abort ();
    if (r == FSC_OK) {
      n_sb_ok++;
      if (sb->gen_len > FSC_GEN_MAX ||
          sb->key_prefix_len > FSC_SB_KEY_PREFIX ||
          strlen (sb->generation) > sb->gen_len ||
          (sb->block_size & (sb->block_size - 1)) != 0 ||
          sb->nblocks != (sb->size + sb->block_size - 1) / sb->block_size)
        abort ();
      /* An older version is written back as the current one, with
       * every other field the same.
       */
      fsc_sb_encode (sb, re);
      sb->version = FSC_INDEX_VERSION;
      if (fsc_sb_decode (re, sb2) != FSC_OK ||
          memcmp (sb, sb2, sizeof *sb) != 0) {
        fprintf (stderr, "fuzz-index: superblock at %zu does not "
                 "survive re-encoding\n", off);
        abort ();
      }
    }
    free (buf); free (re); free (sb); free (sb2);
  }

  for (size_t off = FSC_GROUPS_OFFSET; off + FSC_GREC_SIZE <= size;
       off += FSC_GREC_SIZE) {
    unsigned char *buf = malloc (FSC_GREC_SIZE);
    unsigned char *re = malloc (FSC_GREC_SIZE);
    struct fsc_grec g, g2;
    if (!buf || !re)
      abort ();
    memcpy (buf, data + off, FSC_GREC_SIZE);
    memset (&g, 0, sizeof g);
    memset (&g2, 0, sizeof g2);
    if (fsc_grec_decode (buf, &g)) {
      n_grec_ok++;
      fsc_grec_encode (&g, re);
      if (!fsc_grec_decode (re, &g2) || memcmp (&g, &g2, sizeof g) != 0) {
        fprintf (stderr, "fuzz-index: group record at %zu does not "
                 "survive re-encoding\n", off);
        abort ();
      }
    }
    free (buf); free (re);
  }
}

/* Read the whole object in pieces whose sizes come from S and compare
 * with the upstream.
 */
static void
read_all (struct fsc_object *o, uint64_t s, const char *what)
{
  memset (readbuf, 0xa5, SIZE);
  static const unsigned flags[4] = {
    0, 0, FSC_READ_NEAR, FSC_READ_SEQUENTIAL,
  };
  uint64_t off = 0;
  while (off < SIZE) {
    uint64_t n;
    switch (rng_below (&s, 5)) {
    case 0: n = bs - off % bs; break;                   /* to a boundary */
    case 1: n = 1 + rng_below (&s, 3 * bs); break;      /* small */
    case 2: n = 1 + rng_below (&s, 70 * BS); break;     /* over groups */
    case 3: n = 1 + rng_below (&s, 2 * BS); break;      /* a piece or two */
    default: n = SIZE; break;
    }
    if (n > SIZE - off)
      n = SIZE - off;
    if (fsc_object_read (o, readbuf + off, n, off, &up,
                         flags[rng_below (&s, 4)]) == -1) {
      fprintf (stderr, "fuzz-index: %s: fsc_object_read (%" PRIu64
               ", %" PRIu64 "): %s\n", what, n, off, strerror (errno));
      abort ();
    }
    off += n;
  }
  if (memcmp (readbuf, upstream, SIZE) != 0) {
    uint64_t i = 0;
    while (readbuf[i] == upstream[i])
      i++;
    fprintf (stderr, "fuzz-index: %s: WRONG DATA at offset %" PRIu64
             " (block %" PRIu64 ")\n", what, i, i / bs);
    abort ();
  }
}

/* A few client writes through the object, as the filter does them:
 * invalidate, change the upstream, then (writethrough) store.  The
 * blocks' old contents stay in the data file, so an index that still
 * named them after this would serve stale data.  Some are zero
 * requests, which store the whole blocks they cover as zero blocks
 * (the only all-zero blocks the upstream ever has: an input starts
 * from the pristine upstream).
 */
static void
do_writes (struct fsc_object *o, uint64_t s)
{
  static unsigned char wbuf[70 * BS];
  for (uint64_t k = rng_below (&s, 3); k > 0; --k) {
    uint64_t off = rng_below (&s, SIZE);
    uint64_t n = 1 + rng_below (&s, rng_below (&s, 2) ? 2 * BS : 70 * BS);
    bool keep = rng_below (&s, 2);
    bool zero = rng_below (&s, 3) == 0;
    struct fsc_write w;
    if (n > SIZE - off)
      n = SIZE - off;
    if (fsc_object_write_begin (o, off, n, keep, &w) == -1) {
      fprintf (stderr, "fuzz-index: fsc_object_write_begin: %s\n",
               strerror (errno));
      abort ();
    }
    if (zero)
      memset (wbuf, 0, n);
    else {
      rng_fill (&s, wbuf, n);
      for (uint64_t i = 0; i < n; ++i)  /* keep every block non-zero */
        if ((off + i) % BS == 0 && wbuf[i] == 0)
          wbuf[i] = 1;
    }
    memcpy (upstream + off, wbuf, n);
    fsc_object_write_end (o, &w, zero ? NULL : wbuf, true);
  }
}

/* Close O, its walk after a crash ended first: a close while it runs
 * leaves the object lingering (core/space/evict.c), and the next open would
 * take it back instead of looking up the index this harness mutates.
 */
static void
close_object (struct fsc_object *o)
{
  fsc_object_wait_reclaim (o);
  fsc_object_close (o);
}

static struct fsc_object *
open_object (struct fsc_open_info *info)
{
  struct fsc_object *o;
  if (fsc_object_open (cache, &params, &o, info) == -1) {
    fprintf (stderr, "fuzz-index: fsc_object_open: %s\n", strerror (errno));
    abort ();
  }
  if (info->shared) {
    fprintf (stderr, "fuzz-index: object still open from a previous run\n");
    abort ();
  }
  return o;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static uint64_t present[NBLOCKS / 64 + 1];
  struct fsc_open_info info;

  setup ();
  n_inputs++;
  check_decoders (data, size);

  uint64_t h = XXH3_64bits (data, size);
  set_geometry (size >= 28 && le32_get (data + 24) == BIG_BS ? BIG_BS : BS);
  memcpy (upstream, pristine, SIZE);
  write_file (idx_path, data, size);
  write_data (h);

  struct fsc_object *o = open_object (&info);
  if (info.reason < 0 || info.reason >= FSC_REASONS)
    abort ();
  n_reason[info.reason]++;
  if (info.state != FSC_OBJ_AVAILABLE) {
    /* Only I/O errors make an object uncached, and there are none. */
    fprintf (stderr, "fuzz-index: object uncached at open (reason %s, "
             "%s)\n", fsc_reason_name (info.reason), strerror (info.err));
    abort ();
  }
  if (info.reason == FSC_OK) {
    n_reused++;
    n_hits_blocks += info.present_blocks;
  }
  if (info.present_blocks > nblocks)
    abort ();

  read_all (o, h ^ 1, "first read");
  do_writes (o, h ^ 4);
  /* Not always: the blocks written must sometimes reach the reopen
   * below without being filled again meanwhile.
   */
  if (h & 0x100)
    read_all (o, h ^ 2, "read after writes");

  if (fsc_object_commit (o) == -1 ||
      fsc_object_state (o) != FSC_OBJ_AVAILABLE) {
    /* No cache I/O fails here: withdrawing would be a bug too. */
    fprintf (stderr, "fuzz-index: object withdrawn\n");
    abort ();
  }
  uint64_t npresent = 0;
  memset (present, 0, sizeof present);
  for (uint64_t b = 0; b < nblocks; ++b)
    if (fsc_object_block_present (o, b)) {
      present[b / 64] |= UINT64_C (1) << (b % 64);
      npresent++;
    }
  close_object (o);

  /* What the core wrote itself must load back exactly, and serve the
   * upstream as it is now.
   */
  o = open_object (&info);
  uint64_t lost = 0, gained = 0;
  for (uint64_t b = 0; b < nblocks; ++b) {
    bool was = present[b / 64] & (UINT64_C (1) << (b % 64));
    bool is = fsc_object_block_present (o, b);
    lost += was && !is;
    gained += is && !was;
  }
  if (info.state == FSC_OBJ_AVAILABLE)
    read_all (o, h ^ 3, "read after reopen");
  if (info.reason != FSC_OK || info.state != FSC_OBJ_AVAILABLE ||
      info.unclean || lost || gained) {
    fprintf (stderr, "fuzz-index: reopen after a clean close: reason %s, "
             "state %d, unclean %d; of %" PRIu64 " blocks present at "
             "close %" PRIu64 " lost, %" PRIu64 " more present\n",
             fsc_reason_name (info.reason), info.state, info.unclean,
             npresent, lost, gained);
    abort ();
  }
  close_object (o);
  return 0;
}

/*----------------------------------------------------------------------
 * Mutations, shared by the standalone driver and the libFuzzer custom
 * mutator.  All take a buffer of capacity CAP holding *N bytes.
 */

/* Recompute the checksum of every whole superblock and group record
 * slot that looks like one, so that mutated fields get parsed.
 */
static void
fix_checksums (unsigned char *p, size_t n)
{
  for (size_t off = 0; off + FSC_SB_SIZE <= n && off < FSC_GROUPS_OFFSET;
       off += FSC_SB_SIZE)
    if (memcmp (p + off, "NBDFSCIX", 8) == 0)
      le64_put (p + off + SB_CHECKSUM, XXH3_64bits (p + off, SB_CHECKSUM));
  for (size_t off = FSC_GROUPS_OFFSET; off + FSC_GREC_SIZE <= n;
       off += FSC_GREC_SIZE)
    if (le32_get (p + off) == GR_MAGIC)
      le64_put (p + off + GR_CHECKSUM, XXH3_64bits (p + off, GR_CHECKSUM));
}

/* Field offsets and widths within a superblock and a group record. */
static const struct { uint16_t off, width; } sb_fields[] = {
  { 0, 8 }, { 8, 4 }, { 12, 4 }, { 16, 8 }, { 24, 4 }, { 28, 4 },
  { 32, 8 }, { 40, 8 }, { 48, 8 }, { 56, 8 }, { 64, 8 }, { 72, 4 },
  { 76, 4 }, { 80, 8 }, { 88, 8 }, { 96, 4 }, { 100, 4 }, { 104, 4 },
  { 108, 4 }, { 112, 8 }, { 368, 8 }, { SB_CHECKSUM, 8 },
};
static const struct { uint16_t off, width; } gr_fields[] = {
  { 0, 4 }, { 4, 4 }, { 8, 8 }, { 16, 8 }, { 24, 8 }, { 32, 8 },
  { 40, 8 }, { 48, 8 }, { 40 + 8 * 63, 8 }, { GR_CHECKSUM, 8 },
  /* Pieces (format version 2): the first blocks', the last. */
  { GR_PIECES, 2 }, { GR_PIECES + 2, 2 }, { GR_PIECES + 4, 2 },
  { GR_PIECES + 2 * 16, 2 }, { GR_PIECES + 2 * 63, 2 },
  /* Zero blocks (format version 3): the bitmap, and its halves. */
  { GR_ZERO, 8 }, { GR_ZERO, 8 }, { GR_ZERO, 4 }, { GR_ZERO + 4, 4 },
};
static const uint64_t interesting[] = {
  0, 1, 2, 3, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x7fffffff, 0x80000000,
  0xffffffff, UINT64_C (0x100000000), INT64_MAX, UINT64_MAX,
  UINT64_MAX - 1, 64, 65, 255, 256, 511, 512, 1024, 3072, 3073, 4095, 4096,
  4097, 8192, 4u << 20, 8u << 20, 64u << 20, UINT64_C (1) << 40,
  (UINT64_C (1) << 40) + 1, SIZE, SIZE - 1, SIZE + 1, NBLOCKS, NBLOCKS - 1,
  NBLOCKS + 1, NGROUPS, NGROUPS - 1, NGROUPS + 1, KEY_LEN, KEY_LEN + 1,
  FSC_INDEX_VERSION + 1, FSC_SB_CLEAN | FSC_SB_FP_STALE, 4,
  /* Versions before zero blocks, and bitmaps of present or zero blocks
   * (a zero bit on a present block, or on an absent one).
   */
  FSC_INDEX_VERSION - 1, FSC_INDEX_VERSION_MIN, UINT64_C (1) << 63,
  UINT64_C (0x5555555555555555), UINT64_C (0xaaaaaaaaaaaaaaaa),
  UINT64_C (0xf0), UINT64_C (0x0f00000000000000),
};
#define N_INTERESTING (sizeof interesting / sizeof interesting[0])

static void
put_width (unsigned char *p, unsigned width, uint64_t v)
{
  if (width == 8)
    le64_put (p, v);
  else if (width == 2) {
    p[0] = v;
    p[1] = v >> 8;
  }
  else
    le32_put (p, (uint32_t) v);
}

/* Set a field of a superblock or group record to an interesting value
 * (or to the value of another field, or a small step from its own).
 */
static void
mutate_field (uint64_t *s, unsigned char *p, size_t n)
{
  size_t base, off;
  unsigned width;
  if (n < FSC_SB_SIZE)
    return;
  if (n < FSC_GROUPS_OFFSET + FSC_GREC_SIZE || rng_below (s, 2)) {
    size_t nslots = n >= 2 * FSC_SB_SIZE ? 2 : 1;
    base = rng_below (s, nslots) * FSC_SB_SIZE;
    size_t i = rng_below (s, sizeof sb_fields / sizeof sb_fields[0]);
    off = sb_fields[i].off;
    width = sb_fields[i].width;
  }
  else {
    size_t nrec = (n - FSC_GROUPS_OFFSET) / FSC_GREC_SIZE;
    base = FSC_GROUPS_OFFSET + rng_below (s, nrec) * FSC_GREC_SIZE;
    size_t i = rng_below (s, sizeof gr_fields / sizeof gr_fields[0]);
    off = gr_fields[i].off;
    width = gr_fields[i].width;
  }
  unsigned char *f = p + base + off;
  uint64_t cur;
  if (width == 8) {
    memcpy (&cur, f, 8);
    cur = le64toh (cur);
  }
  else if (width == 2)
    cur = f[0] | (unsigned) f[1] << 8;
  else
    cur = le32_get (f);
  uint64_t v;
  switch (rng_below (s, 4)) {
  case 0: v = cur + 1 + rng_below (s, 3); break;
  case 1: v = cur - 1 - rng_below (s, 3); break;
  default: v = interesting[rng_below (s, N_INTERESTING)]; break;
  }
  if (off == 0 && width == 8)   /* the magic: break it, don't number it */
    f[rng_below (s, 8)] ^= 1u << rng_below (s, 8);
  else
    put_width (f, width, v);
}

/* Copy a whole slot onto another of the same kind. */
static void
copy_slot (uint64_t *s, unsigned char *p, size_t n)
{
  if (rng_below (s, 2) && n >= 2 * FSC_SB_SIZE) {
    size_t from = rng_below (s, 2);
    memcpy (p + (1 - from) * FSC_SB_SIZE, p + from * FSC_SB_SIZE,
            FSC_SB_SIZE);
  }
  else if (n >= FSC_GROUPS_OFFSET + 2 * FSC_GREC_SIZE) {
    size_t nrec = (n - FSC_GROUPS_OFFSET) / FSC_GREC_SIZE;
    size_t a = rng_below (s, nrec), b = rng_below (s, nrec);
    if (a != b)
      memmove (p + FSC_GROUPS_OFFSET + a * FSC_GREC_SIZE,
               p + FSC_GROUPS_OFFSET + b * FSC_GREC_SIZE, FSC_GREC_SIZE);
  }
}

/* A length near a structure boundary. */
static size_t
boundary_len (uint64_t *s)
{
  static const size_t at[] = {
    0, 1, 8, 12, FSC_SB_SIZE - 8, FSC_SB_SIZE - 1, FSC_SB_SIZE,
    FSC_SB_SIZE + 1, 2 * FSC_SB_SIZE - 1, FSC_GROUPS_OFFSET,
  };
  if (rng_below (s, 3) == 0)
    return at[rng_below (s, sizeof at / sizeof at[0])];
  size_t r = FSC_GROUPS_OFFSET + rng_below (s, 2 * NGROUPS + 2) * FSC_GREC_SIZE;
  switch (rng_below (s, 3)) {
  case 0: return r - 1 - rng_below (s, 8);
  case 1: return r + 1 + rng_below (s, 8);
  default: return r;
  }
}

/* Apply one random mutation; OTHER (may be NULL) is a second input to
 * splice with.  Returns the new size (<= CAP).
 */
static size_t
mutate_once (uint64_t *s, unsigned char *p, size_t n, size_t cap,
             const unsigned char *other, size_t other_n)
{
  switch (rng_below (s, 12)) {
  case 0:                       /* flip bits */
    for (uint64_t k = 1 + rng_below (s, 4); n > 0 && k > 0; --k)
      p[rng_below (s, n)] ^= 1u << rng_below (s, 8);
    break;
  case 1:                       /* set random bytes */
    for (uint64_t k = 1 + rng_below (s, 4); n > 0 && k > 0; --k)
      p[rng_below (s, n)] = rng_next (s);
    break;
  case 2: {                     /* set interesting bytes */
    static const unsigned char v[] = { 0, 1, 0x7f, 0x80, 0xfe, 0xff };
    for (uint64_t k = 1 + rng_below (s, 4); n > 0 && k > 0; --k)
      p[rng_below (s, n)] = v[rng_below (s, sizeof v)];
    break;
  }
  case 3: case 4: case 5:       /* interesting field values */
    mutate_field (s, p, n);
    break;
  case 6: {                     /* truncate */
    size_t l = rng_below (s, 2) ? boundary_len (s) : rng_below (s, n + 1);
    if (l < n)
      n = l;
    break;
  }
  case 7: {                     /* extend: zeroes, random, or a copy */
    size_t l = rng_below (s, 2) ? boundary_len (s)
      : n + 1 + rng_below (s, 3 * FSC_GREC_SIZE);
    if (l > cap)
      l = cap;
    if (l > n) {
      unsigned kind = rng_below (s, 3);
      for (size_t i = n; i < l; ++i)
        p[i] = kind == 0 ? 0 : kind == 1 || n == 0 ? (unsigned char) rng_next (s)
          : p[i - n];
      n = l;
    }
    break;
  }
  case 8: case 9:               /* splice with another input */
    if (other && other_n > 0) {
      if (rng_below (s, 2)) {
        /* Our bytes up to a point, OTHER's from there on. */
        size_t m = other_n > cap ? cap : other_n;
        size_t from = rng_below (s, (n < m ? n : m) + 1);
        memcpy (p + from, other + from, m - from);
        n = m;
      }
      else {
        /* One slot of OTHER in place of ours. */
        size_t slot = rng_below (s, 2 + 2 * NGROUPS);
        size_t off = slot < 2 ? slot * FSC_SB_SIZE
          : FSC_GROUPS_OFFSET + (slot - 2) * FSC_GREC_SIZE;
        size_t len = slot < 2 ? FSC_SB_SIZE : FSC_GREC_SIZE;
        if (off + len <= other_n && off + len <= cap) {
          if (off > n)
            memset (p + n, 0, off - n);
          memcpy (p + off, other + off, len);
          if (off + len > n)
            n = off + len;
        }
      }
    }
    break;
  case 10:                      /* copy a slot onto another */
    copy_slot (s, p, n);
    break;
  default: {                    /* zero a range */
    if (n > 0) {
      size_t a = rng_below (s, n);
      size_t l = 1 + rng_below (s, rng_below (s, 2) ? 16 : FSC_SB_SIZE);
      if (l > n - a)
        l = n - a;
      memset (p + a, 0, l);
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
    fix_checksums (p, n);
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
      fix_checksums (data, size);
  }
  return size;
}

#else /* !FUZZ_LIBFUZZER */

/*----------------------------------------------------------------------
 * Standalone driver: tests/fuzz-common.h's fuzz_main, with this
 * target's corpus maker, usage and summary line.
 */

/*----------------------------------------------------------------------
 * --make-corpus: real indexes written by the core.
 */

static unsigned char *
slurp (const char *path, size_t *n)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd == -1 || fstat (fd, &st) == -1) {
    perror (path);
    exit (1);
  }
  unsigned char *p = malloc (st.st_size ? st.st_size : 1);
  if (!p || read (fd, p, st.st_size) != st.st_size) {
    perror (path);
    exit (1);
  }
  close (fd);
  *n = st.st_size;
  return p;
}

static void
read_range (struct fsc_object *o, uint64_t off, uint64_t n)
{
  if (fsc_object_read (o, readbuf + off, n, off, &up, 0) == -1 ||
      memcmp (readbuf + off, upstream + off, n) != 0) {
    fprintf (stderr, "fuzz-index: --make-corpus: bad read\n");
    exit (1);
  }
}

static int
make_corpus (const char *dir)
{
  struct fsc_open_info info;
  struct fsc_object *o;
  unsigned char *p;
  size_t n;

  if (mkdir (dir, 0755) == -1 && errno != EEXIST) {
    perror (dir);
    return 1;
  }
  setup ();
  unlink (idx_path);
  unlink (data_path);

  /* A new object, part of it read, closed cleanly: superblock slot 0
   * (in use) and slot 1 (clean), one record slot in groups 0, 1, 4.
   */
  o = open_object (&info);
  read_range (o, 0, 200000);                    /* groups 0 and 1 */
  read_range (o, SIZE - 5000, 5000);            /* group 4, short block */
  close_object (o);
  p = slurp (idx_path, &n);
  save (dir, "clean.idx", p, n);

  /* A second torn variant of it: slot 1 (the newest) damaged, so the
   * loader must fall back to slot 0.
   */
  p[FSC_SB_SIZE + 200] ^= 0x10;
  save (dir, "torn-sb1.idx", p, n);
  p[FSC_SB_SIZE + 200] ^= 0x10;
  /* And with slot 0 blank: slot 1 alone. */
  memset (p, 0, FSC_SB_SIZE);
  save (dir, "sb1-only.idx", p, n);
  free (p);

  /* Reopened, more read and part of it overwritten, closed again:
   * both record slots of group 0 and 1 in use, blocks dropped.
   */
  o = open_object (&info);
  if (info.reason != FSC_OK || info.present_blocks == 0) {
    fprintf (stderr, "fuzz-index: --make-corpus: reopen: %s\n",
             fsc_reason_name (info.reason));
    return 1;
  }
  read_range (o, 100000, 700000);               /* groups 0 to 2 */
  struct fsc_write w;
  if (fsc_object_write_begin (o, 3 * BS + 100, 5 * BS, false, &w) == -1)
    return 1;
  fsc_object_write_end (o, &w, NULL, true);
  /* The upstream did not really change: block 3..8 refill below. */
  read_range (o, 0, 4 * BS);
  close_object (o);
  p = slurp (idx_path, &n);
  save (dir, "two-generations.idx", p, n);

  /* Truncated inside superblock slot 1 and inside group 1's records. */
  save (dir, "truncated-sb.idx", p, FSC_SB_SIZE + 1234);
  if (n > FSC_GROUPS_OFFSET + 3 * FSC_GREC_SIZE + 77)
    save (dir, "truncated-groups.idx", p,
          FSC_GROUPS_OFFSET + 3 * FSC_GREC_SIZE + 77);
  free (p);

  /* Unclean: records committed while the object is still open, as
   * after a crash.
   */
  o = open_object (&info);
  read_range (o, 900000, SIZE - 900000);        /* groups 3 and 4 */
  if (fsc_object_commit (o) == -1)
    return 1;
  p = slurp (idx_path, &n);
  save (dir, "unclean.idx", p, n);
  free (p);
  close_object (o);

  /* Format version 1 (what "clean" was before pieces): read as it is. */
  p = slurp (idx_path, &n);
  for (size_t off = 0; off < FSC_GROUPS_OFFSET && off + FSC_SB_SIZE <= n;
       off += FSC_SB_SIZE)
    if (memcmp (p + off, "NBDFSCIX", 8) == 0)
      le32_put (p + off + 8, 1);
  fix_checksums (p, n);
  save (dir, "version1.idx", p, n);
  free (p);

  /* Format version 3 with forged zero bits: every record marks all its
   * blocks zero, present or not, but keeps the checksums of their
   * data.  The loader must drop those present blocks (a zero block has
   * the checksum of zeroes), never serve zeroes for them.
   */
  p = slurp (idx_path, &n);
  for (size_t off = FSC_GROUPS_OFFSET; off + FSC_GREC_SIZE <= n;
       off += FSC_GREC_SIZE)
    if (le32_get (p + off) == GR_MAGIC)
      le64_put (p + off + GR_ZERO, UINT64_MAX);
  fix_checksums (p, n);
  save (dir, "zero-forged.idx", p, n);
  free (p);

  /* 64K blocks held in 4K pieces: small random reads, one block added
   * to, one made whole by a near read, closed cleanly; then more
   * pieces committed while still open, as after a crash.
   */
  unlink (idx_path);
  unlink (data_path);
  unlink (sums_path);
  set_geometry (BIG_BS);
  o = open_object (&info);
  static const uint64_t at[] = {
    5 * BS, 6 * BS, 20 * BS + 100, 47 * BS, 100 * BS, 255 * BS + 7,
  };
  for (size_t k = 0; k < sizeof at / sizeof at[0]; ++k)
    read_range (o, at[k], 1000);
  read_range (o, 3 * BIG_BS + 2 * BS, 3 * BS);  /* over three pieces */
  if (fsc_object_read (o, readbuf, BS, 9 * BIG_BS, &up, FSC_READ_NEAR) == -1)
    return 1;
  read_range (o, SIZE - 100, 100);              /* the short last block */
  close_object (o);
  p = slurp (idx_path, &n);
  save (dir, "pieces.idx", p, n);
  free (p);
  o = open_object (&info);
  if (info.reason != FSC_OK || info.present_blocks == 0) {
    fprintf (stderr, "fuzz-index: --make-corpus: reopen of pieces: %s\n",
             fsc_reason_name (info.reason));
    return 1;
  }
  read_range (o, 5 * BS + 10, 2 * BS);          /* added to */
  read_range (o, 12 * BIG_BS + 5 * BS, 10);
  if (fsc_object_commit (o) == -1)
    return 1;
  p = slurp (idx_path, &n);
  save (dir, "pieces-unclean.idx", p, n);
  free (p);
  close_object (o);
  set_geometry (BS);

  /* Empty: a brand new object. */
  save (dir, "empty.idx", (const unsigned char *) "", 0);
  return 0;
}

static void
usage (FILE *f)
{
  fprintf (f,
           "usage: fuzz-index [--mutations N] [--seed S] [--crash-file FILE]\n"
           "                  [--verbose] CORPUS_DIR_OR_FILE...\n"
           "       fuzz-index --seed S --dump K OUT CORPUS_DIR_OR_FILE...\n"
           "       fuzz-index --make-corpus DIR\n"
           "Runs every corpus file, then N mutations of them, through the\n"
           "index fuzz target; any wrong data, sanitizer error or crash\n"
           "aborts.  --dump writes mutation K (from 0) of seed S to OUT.\n"
           "The private cache lives under $TMPDIR (default /tmp).\n");
}

static void
summary (uint64_t seed, uint64_t mutations, double secs)
{
  printf ("fuzz-index: seed %" PRIu64 ": %zu corpus files + %" PRIu64
          " mutations in %.1f s: %" PRIu64 " valid superblocks, %" PRIu64
          " valid group records decoded; %" PRIu64 " objects reused "
          "(%" PRIu64 " blocks present at open); cold:",
          seed, ncorpus, mutations, secs, n_sb_ok, n_grec_ok, n_reused,
          n_hits_blocks);
  for (int r = 1; r < FSC_REASONS; ++r)
    if (n_reason[r])
      printf (" %s=%" PRIu64, fsc_reason_name (r), n_reason[r]);
  printf ("; no errors\n");
}

int
main (int argc, char *argv[])
{
  return fuzz_main (argc, argv, make_corpus, usage, summary);
}

#endif /* !FUZZ_LIBFUZZER */
