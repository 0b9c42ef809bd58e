/* Unit test: objects cache, persist, verify, invalidate and fall back.
 * The upstream is a buffer in memory that counts the bytes read from
 * it; the cache is a real directory on disk.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <inttypes.h>
#include <unistd.h>

#include "fscache.h"
#include "../index-patch.h"
#include "keyenc.h"
#include "unit.h"

#define BS 4096u
#define SIZE (1024u * 1024u + 12345u)   /* not a multiple of BS */

static unsigned char upstream[SIZE];
static uint64_t up_bytes;               /* atomic */
static int up_fail;

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  if (up_fail) {
    errno = EIO;
    return -1;
  }
  CHECK (offset + count <= SIZE);
  memcpy (buf, upstream + offset, count);
  __atomic_add_fetch (&up_bytes, count, __ATOMIC_RELAXED);
  return 0;
}

static const struct fsc_upstream up = { .pread = up_pread };
static char dir[64];

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
open_obj (struct fsc_cache *c, struct fsc_open_info *info,
          const char *gen, uint64_t size)
{
  struct fsc_object *o;
  struct fsc_object_params p = {
    .key = "key\0export=", .key_len = 11, .block_size = BS, .size = size,
    .verify = true, .validate = FSC_VALIDATE_SIZE, .generation = gen,
  };
  CHECK (fsc_object_open (c, &p, &o, info) == 0);
  return o;
}

/* Read the whole object in odd-sized pieces and compare. */
static void
read_all (struct fsc_object *o)
{
  static unsigned char buf[SIZE];
  uint64_t off = 0;
  while (off < SIZE) {
    uint32_t n = 1 + (off * 7919) % 70000;
    if (n > SIZE - off)
      n = SIZE - off;
    CHECK (fsc_object_read (o, buf + off, n, off, &up, 0) == 0);
    off += n;
  }
  CHECK (memcmp (buf, upstream, SIZE) == 0);
}

static void
path_of (char *out, size_t n, const char *suffix)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  fsc_key_encode ("key\0export=", 11, name, fan);
  snprintf (out, n, "%s/objects/%s/%s%s", dir, fan, name, suffix);
}

struct opener {
  struct fsc_cache *c;
  unsigned spin;
  struct fsc_object *o;
  struct fsc_open_info info;
};
static struct fsc_object *open_obj (struct fsc_cache *c,
                                    struct fsc_open_info *info,
                                    const char *gen, uint64_t size);

static void *
open_thread (void *arg)
{
  struct opener *op = arg;
  for (volatile unsigned i = 0; i < op->spin; ++i)
    ;
  op->o = open_obj (op->c, &op->info, "v3b", SIZE);
  return NULL;
}

static void *
reader_thread (void *arg)
{
  read_all (arg);
  return NULL;
}

/* Read COUNT bytes at OFF with FLAGS; check them; return the upstream
 * bytes it took.
 */
static uint64_t
read_check (struct fsc_object *o, uint32_t count, uint64_t off,
            unsigned flags)
{
  static unsigned char got[SIZE];
  up_bytes = 0;
  CHECK (fsc_object_read (o, got, count, off, &up, flags) == 0);
  CHECK (memcmp (got, upstream + off, count) == 0);
  return up_bytes;
}

/* Close O and its cache C (cleanly), then open both again with P. */
static void
reopen (struct fsc_cache **c, struct fsc_object **o,
        const struct fsc_object_params *p, struct fsc_open_info *info)
{
  fsc_object_close (*o);
  fsc_cache_close (*c);
  *c = open_cache (NULL);
  CHECK (fsc_object_open (*c, p, o, info) == 0);
}

/* Blocks held in pieces (64K blocks, 4K pieces): a random read fetches
 * only the pieces it covers, later reads add pieces, the pieces
 * persist and are verified, streams and prefetches take whole blocks,
 * and an index of format version 1 is read and upgraded.
 */
static void
test_pieces (void)
{
  const uint64_t B = 65536, P = 4096;
  struct fsc_object_params pp = {
    .key = "kp", .key_len = 2, .block_size = B, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE,
  };
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], pd[512], pi[512];
  struct fsc_cache *c;
  struct fsc_object *o;
  struct fsc_open_info info;
  struct fsc_stats st;

  fsc_key_encode ("kp", 2, name, fan);
  snprintf (pd, sizeof pd, "%s/objects/%s/%s.data", dir, fan, name);
  snprintf (pi, sizeof pi, "%s/objects/%s/%s.idx", dir, fan, name);

  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pp, &o, &info) == 0);
  /* One piece, then again (hit), then part of it (hit). */
  CHECK_EQ (read_check (o, P, 3 * B + 5 * P, 0), P);
  CHECK_EQ (read_check (o, P, 3 * B + 5 * P, 0), 0);
  CHECK_EQ (read_check (o, 100, 3 * B + 5 * P + 7, 0), 0);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.piece_fills, 1);
  /* The next piece is added to the block; both hit together. */
  CHECK_EQ (read_check (o, P, 3 * B + 6 * P, 0), P);
  CHECK_EQ (read_check (o, 2 * P, 3 * B + 5 * P, 0), 0);
  /* A read needing pieces 4..7 fetches them (4K-aligned, 16K). */
  CHECK_EQ (read_check (o, 3 * P + 10, 3 * B + 4 * P + 5, 0), 4 * P);
  CHECK_EQ (read_check (o, 4 * P, 3 * B + 4 * P, 0), 0);
  /* A miss spanning two blocks: the pieces of each it covers. */
  CHECK_EQ (read_check (o, 2 * P, 5 * B - P, 0), 2 * P);
  CHECK_EQ (read_check (o, P, 4 * B + 15 * P, 0), 0);
  CHECK_EQ (read_check (o, P, 5 * B, 0), 0);
  /* Near the last read: the rest of the block from the window on,
   * after the pieces held (not those again); the pieces before them
   * stay absent until read.
   */
  CHECK_EQ (read_check (o, P, 3 * B + 9 * P, FSC_READ_NEAR), 8 * P);
  CHECK_EQ (read_check (o, 4 * P, 3 * B, 0), 4 * P);
  CHECK_EQ (read_check (o, B, 3 * B, 0), 0);
  /* A sequential read too. */
  CHECK_EQ (read_check (o, P, 6 * B, FSC_READ_SEQUENTIAL), B);
  /* A prefetch completes a block held in pieces, without the pieces
   * it holds at its start.
   */
  CHECK_EQ (read_check (o, P, 7 * B, 0), P);
  up_bytes = 0;
  CHECK (fsc_object_prefetch (o, 7 * B, B, &up, 0) == 0);
  CHECK_EQ (up_bytes, B - P);
  CHECK_EQ (read_check (o, B, 7 * B, 0), 0);
  /* An exact prefetch (NBD_CMD_CACHE) fetches only the pieces it
   * covers, then hits; a second one of the same range fetches nothing.
   */
  up_bytes = 0;
  CHECK (fsc_object_prefetch (o, 9 * B + 3 * P + 100, 2 * P,
                              &up, FSC_PREFETCH_EXACT) == 0);
  CHECK_EQ (up_bytes, 3 * P);
  up_bytes = 0;
  CHECK (fsc_object_prefetch (o, 9 * B + 3 * P, 3 * P, &up,
                              FSC_PREFETCH_EXACT) == 0);
  CHECK_EQ (up_bytes, 0);
  CHECK_EQ (read_check (o, 3 * P, 9 * B + 3 * P, 0), 0);
  CHECK_EQ (read_check (o, P, 9 * B + 6 * P, 0), P);
  /* So does a stream starting after them: a random read of a block's
   * first piece, then reads continuing from it.
   */
  CHECK_EQ (read_check (o, P, 11 * B, 0), P);
  CHECK_EQ (read_check (o, P, 11 * B + P, FSC_READ_SEQUENTIAL), B - P);
  CHECK_EQ (read_check (o, B, 11 * B, 0), 0);
  /* And one ending before the last pieces held. */
  CHECK_EQ (read_check (o, 2 * P, 12 * B + 14 * P, 0), 2 * P);
  CHECK_EQ (read_check (o, P, 12 * B + 13 * P, FSC_READ_NEAR), 14 * P);
  CHECK_EQ (read_check (o, B, 12 * B, 0), 0);
  /* A stream meeting a piece held mid-block (its requests overtook
   * each other) never fetches it again: it stops before it, and goes
   * on after it.
   */
  CHECK_EQ (read_check (o, P, 14 * B + 5 * P, 0), P);
  CHECK_EQ (read_check (o, P, 14 * B, FSC_READ_NEAR), 5 * P);
  CHECK_EQ (read_check (o, P, 14 * B + 8 * P, FSC_READ_NEAR), 10 * P);
  CHECK_EQ (read_check (o, B, 14 * B, 0), 0);
  CHECK (fsc_object_block_present (o, 14));
  /* The last block is short (12345 bytes): its last piece too. */
  CHECK_EQ (read_check (o, 10, SIZE - 10, 0), SIZE - 16 * B - 3 * P);
  CHECK_EQ (read_check (o, SIZE - 16 * B, 16 * B, 0), SIZE - 16 * B);
  /* A write over a block held in pieces drops it. */
  CHECK_EQ (read_check (o, P, 9 * B, 0), P);
  CHECK (fsc_object_block_present (o, 9));
  struct fsc_write w;
  CHECK (fsc_object_write_begin (o, 9 * B + 8 * P, P, true, &w) == 0);
  CHECK (!fsc_object_block_present (o, 9));
  fsc_object_write_end (o, &w, upstream + 9 * B + 8 * P, true);
  CHECK_EQ (read_check (o, P, 9 * B, 0), P);
  /* Once a block's hashes are kept in memory (after a first partial
   * hit), what is served is still checked: damage to the data file of
   * a running object is caught on the next hit.
   */
  CHECK_EQ (read_check (o, P, 13 * B + 2 * P, 0), P);
  CHECK_EQ (read_check (o, 100, 13 * B + 2 * P + 50, 0), 0);
  fsc_cache_stats (c, &st);
  uint64_t vf = st.verify_failures;
  {
    int dfd = open (pd, O_RDWR);
    CHECK (dfd >= 0);
    CHECK (pwrite (dfd, "Q", 1, 13 * B + 2 * P + 60) == 1);
    close (dfd);
  }
  CHECK_EQ (read_check (o, 100, 13 * B + 2 * P + 50, 0), P);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.verify_failures, vf + 1);
  CHECK_EQ (read_check (o, P, 13 * B + 2 * P, 0), 0);
  /* Pieces of block 10, to find after a restart. */
  CHECK_EQ (read_check (o, P, 10 * B, 0), P);
  CHECK_EQ (read_check (o, P, 10 * B + 8 * P, 0), P);
  reopen (&c, &o, &pp, &info);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK_EQ (info.old_version, 0);
  CHECK_EQ (read_check (o, P, 10 * B, 0), 0);
  CHECK_EQ (read_check (o, P, 10 * B + 8 * P, 0), 0);
  CHECK_EQ (read_check (o, P, 10 * B + P, 0), P);
  CHECK_EQ (read_check (o, 4 * P, 3 * B + 4 * P, 0), 0);
  CHECK_EQ (read_check (o, B, 3 * B, 0), 0);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* A damaged held piece is detected and fetched again. */
  int fd = open (pd, O_RDWR);
  CHECK (fd >= 0);
  CHECK (pwrite (fd, "Z", 1, 10 * B + 8 * P + 99) == 1);
  close (fd);
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pp, &o, &info) == 0);
  CHECK_EQ (read_check (o, P, 10 * B, 0), 0);
  CHECK_EQ (read_check (o, 200, 10 * B + 8 * P + 50, 0), P);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.verify_failures, 1);
  CHECK_EQ (read_check (o, P, 10 * B + 8 * P, 0), 0);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* Format version 1: an index of whole blocks only. */
  CHECK (unlink (pi) == 0);
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pp, &o, &info) == 0);
  CHECK_EQ (read_check (o, 4 * B, 0, FSC_READ_SEQUENTIAL), 4 * B);
  fsc_object_close (o);
  fsc_cache_close (c);
  CHECK (set_index_version (pi, 1) == 0);
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pp, &o, &info) == 0);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK_EQ (info.old_version, 1);
  CHECK_EQ (info.present_blocks, 4);
  CHECK_EQ (read_check (o, 4 * B, 0, 0), 0);
  CHECK_EQ (read_check (o, P, 5 * B, 0), P);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.objects_upgraded, 1);
  reopen (&c, &o, &pp, &info);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK_EQ (info.old_version, 0);
  CHECK_EQ (read_check (o, 4 * B, 0, 0), 0);
  CHECK_EQ (read_check (o, P, 5 * B, 0), 0);
  fsc_object_close (o);
  fsc_cache_close (c);
  /* A version no reader knows starts cold, saying so. */
  CHECK (set_index_version (pi, FSC_INDEX_VERSION + 1) == 0);
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pp, &o, &info) == 0);
  CHECK_EQ (info.reason, FSC_REJ_VERSION);
  CHECK_EQ (read_check (o, P, 5 * B, 0), P);
  fsc_object_close (o);
  fsc_cache_close (c);
}

/* The object's own counters: exact for what was done, saved with the
 * index across a clean close, carried over (with an invalidation and
 * its reason) when a coherency change discards the data, published in
 * NAME.stats, and taken from there when the index is lost.
 */
/* The bytes FILE allocates, as du counts them. */
static uint64_t
allocated (const char *file)
{
  struct stat sb;
  CHECK (stat (file, &sb) == 0);
  return (uint64_t) sb.st_blocks * 512;
}

/* Zero requests in writethrough (docs/format.md, "Zero blocks"): the
 * whole blocks they cover become zero blocks, present without data
 * (their space punched), served as zeroes without any read, kept
 * across a restart; a partly covered end block held whole takes the
 * zeroes like a write, one not held stays absent; writearound only
 * drops.  The object starts from an index of version 2, read as it is
 * and written as version 3.
 */
static void
test_zero (void)
{
  const uint64_t B = 65536;             /* 17 blocks, the last 12345 bytes */
  struct fsc_object_params pz = {
    .key = "kz", .key_len = 2, .block_size = B, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE,
  };
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], pd[512], pi[512];
  struct fsc_cache *c;
  struct fsc_object *o;
  struct fsc_open_info info;
  struct fsc_stats st;
  struct fsc_write w;

  fsc_key_encode ("kz", 2, name, fan);
  snprintf (pd, sizeof pd, "%s/objects/%s/%s.data", dir, fan, name);
  snprintf (pi, sizeof pi, "%s/objects/%s/%s.idx", dir, fan, name);
  static unsigned char saved[SIZE];
  memcpy (saved, upstream, SIZE);
  for (uint64_t i = 0; i < SIZE; ++i)
    upstream[i] = 1 + i * 7 % 251;

  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pz, &o, &info) == 0);
  /* Blocks 0..8 cached whole, in an index of version 2 (before zero
   * blocks), which is read as it is.
   */
  CHECK_EQ (read_check (o, 9 * B, 0, FSC_READ_SEQUENTIAL), 9 * B);
  fsc_object_close (o);
  fsc_cache_close (c);
  CHECK (set_index_version (pi, 2) == 0);
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pz, &o, &info) == 0);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK_EQ (info.old_version, 2);
  CHECK_EQ (info.present_blocks, 9);
  CHECK_EQ (allocated (pd), 9 * B);

  /* Zero [B + 1000, 6B + 3000): block 1 and 6 held whole take the
   * zeroes merged in, blocks 2..5 become zero blocks.
   */
  const uint64_t z0 = B + 1000, z1 = 6 * B + 3000;
  CHECK (fsc_object_write_begin (o, z0, z1 - z0, true, &w) == 0);
  for (uint64_t b = 1; b <= 6; ++b)
    CHECK (!fsc_object_block_present (o, b));
  memset (upstream + z0, 0, z1 - z0);
  fsc_object_write_end (o, &w, NULL, true);
  for (uint64_t b = 1; b <= 6; ++b)
    CHECK (fsc_object_block_present (o, b));
  /* Their space is gone; 0, 1, 6, 7, 8 keep theirs. */
  CHECK_EQ (allocated (pd), 5 * B);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.zero_blocks, 4);

  /* Over absent blocks: 10..13, 15 and the short last block become
   * zero blocks, allocating nothing; the partly covered 14 stays
   * absent.
   */
  CHECK (fsc_object_write_begin (o, 10 * B, 4 * B, true, &w) == 0);
  memset (upstream + 10 * B, 0, 4 * B);
  fsc_object_write_end (o, &w, NULL, true);
  CHECK (fsc_object_write_begin (o, 14 * B + 5, SIZE - 14 * B - 5, true,
                                 &w) == 0);
  memset (upstream + 14 * B + 5, 0, SIZE - 14 * B - 5);
  fsc_object_write_end (o, &w, NULL, true);
  for (uint64_t b = 10; b <= 13; ++b)
    CHECK (fsc_object_block_present (o, b));
  CHECK (!fsc_object_block_present (o, 14));
  CHECK (fsc_object_block_present (o, 15));
  CHECK (fsc_object_block_present (o, 16));
  CHECK_EQ (allocated (pd), 5 * B);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.zero_blocks, 10);

  /* Hits: nothing from upstream, zeroes, whole or in part. */
  uint64_t hits = st.hit_bytes;
  CHECK_EQ (read_check (o, 6 * B, B, 0), 0);
  CHECK_EQ (read_check (o, 100, 3 * B + 7, 0), 0);
  CHECK_EQ (read_check (o, 4 * B, 10 * B, 0), 0);
  CHECK_EQ (read_check (o, 12345, 16 * B, 0), 0);
  CHECK_EQ (read_check (o, 4096, 16 * B + 4000, 0), 0);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.hit_bytes - hits, 6 * B + 100 + 4 * B + 12345 + 4096);
  CHECK_EQ (st.verify_failures, 0);
  /* The zero blocks really are not read: garbage under one is never
   * served (and a hit on it fails no check).
   */
  {
    int fd = open (pd, O_RDWR);
    CHECK (fd >= 0);
    CHECK (pwrite (fd, "garbage", 7, 3 * B + 10) == 7);
    close (fd);
  }
  CHECK_EQ (read_check (o, B, 3 * B, 0), 0);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.verify_failures, 0);
  {
    int fd = open (pd, O_RDWR);
    CHECK (fd >= 0);
    CHECK (fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      3 * B, B) == 0);
    close (fd);
  }
  /* The absent blocks, 14 and 9, come from upstream. */
  CHECK_EQ (read_check (o, 3 * B, 13 * B, 0), B);
  CHECK_EQ (read_check (o, B, 9 * B, 0), B);

  /* A write into a zero block merges into its zeroes: stored whole. */
  {
    unsigned char wb[100];
    memset (wb, 0x77, sizeof wb);
    CHECK (fsc_object_write_begin (o, 3 * B + 500, sizeof wb, true, &w) == 0);
    memcpy (upstream + 3 * B + 500, wb, sizeof wb);
    fsc_object_write_end (o, &w, wb, true);
    CHECK (fsc_object_block_present (o, 3));
    CHECK_EQ (read_check (o, B, 3 * B, 0), 0);
  }
  /* A zero request partly over a zero block: it stays one. */
  CHECK (fsc_object_write_begin (o, 4 * B + 10, 20, true, &w) == 0);
  fsc_object_write_end (o, &w, NULL, true);
  CHECK (fsc_object_block_present (o, 4));
  CHECK_EQ (read_check (o, B, 4 * B, 0), 0);
  /* Writearound (keep false) and a trim only drop. */
  CHECK (fsc_object_write_begin (o, 5 * B, B, false, &w) == 0);
  fsc_object_write_end (o, &w, NULL, true);
  CHECK (!fsc_object_block_present (o, 5));
  CHECK_EQ (read_check (o, B, 5 * B, 0), B);
  /* A failed zero request leaves its blocks absent. */
  CHECK (fsc_object_write_begin (o, 11 * B, B, true, &w) == 0);
  fsc_object_write_end (o, &w, NULL, false);
  CHECK (!fsc_object_block_present (o, 11));
  CHECK_EQ (read_check (o, B, 11 * B, 0), B);
  CHECK (fsc_object_write_begin (o, 11 * B, B, true, &w) == 0);
  fsc_object_write_end (o, &w, NULL, true);

  /* Across a restart: still zero blocks, still no space, no reads.
   * (The fills the reads above queued are written first: the close
   * would write them after BEFORE was taken.)
   */
  fsc_object_drain (o);
  uint64_t npresent = fsc_object_present_blocks (o);
  uint64_t before = allocated (pd);
  reopen (&c, &o, &pz, &info);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK_EQ (info.old_version, 0);
  CHECK_EQ (info.present_blocks, npresent);
  CHECK_EQ (allocated (pd), before);
  up_bytes = 0;
  read_all (o);
  CHECK_EQ (up_bytes, 0);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.verify_failures, 0);
  /* Its counters count the data only. */
  struct fsc_ostats ost;
  fsc_object_counters (o, &ost);
  CHECK_EQ (ost.v[FSC_OSTAT_present_blocks], npresent);
  CHECK_EQ (ost.v[FSC_OSTAT_cached_bytes], before);
  fsc_object_close (o);
  fsc_cache_close (c);

  CHECK (unlink (pi) == 0);
  memcpy (upstream, saved, SIZE);
}

static void
test_counters (void)
{
  struct fsc_object_params pc = {
    .key = "counted", .key_len = 7, .block_size = BS, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE, .generation = "g1",
  };
  struct fsc_open_info info;
  struct fsc_ostats s;
  struct fsc_object *o;
  static unsigned char got[SIZE];
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], live[512], cidx[512];
  fsc_key_encode ("counted", 7, name, fan);
  snprintf (live, sizeof live, "%s/objects/%s/%s.stats", dir, fan, name);
  snprintf (cidx, sizeof cidx, "%s/objects/%s/%s.idx", dir, fan, name);

  struct fsc_cache *c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pc, &o, &info) == 0);
  /* 10 blocks cold, the same 10 warm, one 3-block read half cached. */
  CHECK (fsc_object_read (o, got, 10 * BS, 0, &up, 0) == 0);
  CHECK (fsc_object_read (o, got, 10 * BS, 0, &up, 0) == 0);
  CHECK (fsc_object_read (o, got, 3 * BS, 9 * BS, &up, 0) == 0);
  fsc_object_counters (o, &s);
  CHECK_EQ (s.v[FSC_OSTAT_opens], 1);
  CHECK_EQ (s.v[FSC_OSTAT_hit_requests], 1);
  CHECK_EQ (s.v[FSC_OSTAT_miss_requests], 2);
  CHECK_EQ (s.v[FSC_OSTAT_hit_bytes], 11 * BS);
  CHECK_EQ (s.v[FSC_OSTAT_miss_bytes], 12 * BS);
  CHECK_EQ (s.v[FSC_OSTAT_upstream_bytes], 12 * BS);
  CHECK_EQ (s.v[FSC_OSTAT_present_blocks], 12);
  CHECK_EQ (s.v[FSC_OSTAT_cached_bytes], 12 * BS);
  CHECK (s.v[FSC_OSTAT_last_use] >= (uint64_t) time (NULL) - 5);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* NAME.stats says the same, closed. */
  FILE *fp = fopen (live, "r");
  CHECK (fp != NULL);
  char line[256];
  bool saw_open0 = false, saw_hits = false;
  while (fgets (line, sizeof line, fp)) {
    saw_open0 |= strcmp (line, "open 0\n") == 0;
    saw_hits |= strcmp (line, "hit_bytes 45056\n") == 0;
  }
  fclose (fp);
  CHECK (saw_open0 && saw_hits);

  /* Reopened: the counters go on from the superblock. */
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pc, &o, &info) == 0);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK (fsc_object_read (o, got, BS, 0, &up, 0) == 0);
  fsc_object_counters (o, &s);
  CHECK_EQ (s.v[FSC_OSTAT_opens], 2);
  CHECK_EQ (s.v[FSC_OSTAT_hit_requests], 2);
  CHECK_EQ (s.v[FSC_OSTAT_hit_bytes], 12 * BS);
  CHECK_EQ (s.v[FSC_OSTAT_invalidations], 0);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* A new generation discards the data, not the history. */
  pc.generation = "g2";
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pc, &o, &info) == 0);
  CHECK_EQ (info.reason, FSC_REJ_GENERATION);
  fsc_object_counters (o, &s);
  CHECK_EQ (s.v[FSC_OSTAT_opens], 3);
  CHECK_EQ (s.v[FSC_OSTAT_hit_bytes], 12 * BS);
  CHECK_EQ (s.v[FSC_OSTAT_invalidations], 1);
  CHECK_EQ (s.last_reason, FSC_REJ_GENERATION);
  CHECK_EQ (s.v[FSC_OSTAT_present_blocks], 0);
  CHECK (s.v[FSC_OSTAT_last_invalidation] > 0);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* A garbled index: the history comes from NAME.stats. */
  int fd = open (cidx, O_WRONLY);
  CHECK (fd >= 0);
  static unsigned char zero[2 * 4096];
  CHECK (pwrite (fd, zero, sizeof zero, 0) == (ssize_t) sizeof zero);
  close (fd);
  c = open_cache (NULL);
  CHECK (fsc_object_open (c, &pc, &o, &info) == 0);
  CHECK (info.reason != FSC_OK && info.reason != FSC_REJ_NEW);
  fsc_object_counters (o, &s);
  CHECK_EQ (s.v[FSC_OSTAT_opens], 4);
  CHECK_EQ (s.v[FSC_OSTAT_hit_bytes], 12 * BS);
  CHECK_EQ (s.v[FSC_OSTAT_invalidations], 2);
  CHECK_EQ (s.last_reason, (uint32_t) info.reason);
  fsc_object_close (o);
  fsc_cache_close (c);
}

/* Paging (core/disk/groups.c): a cache of blocks scattered over many groups
 * opens lazily, reading only its superblock, and a hit on a group not
 * in memory costs one index read; with 64 groups resident, 2000 groups
 * are served by paging them in and out, and the gauges stay right,
 * across a clean close and a crash (the census).
 */
#define PG_SIZE (UINT64_C (1) << 30)            /* 4096 groups of 4K */
#define PG_GROUPS 2000
static uint64_t pg_bytes;

static void
pg_fill (uint64_t offset, unsigned char *p, uint32_t count)
{
  for (uint32_t i = 0; i < count; i += 8) {
    uint64_t v = (offset + i) * UINT64_C (0x9E3779B97F4A7C15);
    memcpy (p + i, &v, 8);
  }
}

static int
pg_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  pg_fill (offset, buf, count);
  __atomic_add_fetch (&pg_bytes, count, __ATOMIC_RELAXED);
  return 0;
}

static const struct fsc_upstream pg_up = { .pread = pg_pread };

static struct fsc_object *
pg_open (struct fsc_cache *c, struct fsc_open_info *info, uint64_t resident)
{
  struct fsc_object *o;
  struct fsc_object_params p = {
    .key = "paging", .key_len = 6, .block_size = BS, .size = PG_SIZE,
    .validate = FSC_VALIDATE_SIZE, .resident_groups = resident,
  };
  CHECK (fsc_object_open (c, &p, &o, info) == 0);
  CHECK_EQ (info->state, FSC_OBJ_AVAILABLE);
  return o;
}

/* Block I of the test: one in group 2*I, at a varying place in it. */
static uint64_t
pg_block (unsigned i)
{
  return (uint64_t) 2 * i * FSC_GROUP_BLOCKS + i % FSC_GROUP_BLOCKS;
}

/* Read blocks FROM..TO-1 of the test and check them; returns the index
 * reads that cost.
 */
static uint64_t
pg_read (struct fsc_cache *c, struct fsc_object *o, unsigned from,
         unsigned to)
{
  unsigned char got[BS], want[BS];
  uint64_t r0 = fsc_cache_io_calls (c, FSC_OP_READ, FSC_FILE_INDEX);
  for (unsigned i = from; i < to; ++i) {
    CHECK (fsc_object_read (o, got, BS, pg_block (i) * BS, &pg_up, 0) == 0);
    pg_fill (pg_block (i) * BS, want, BS);
    CHECK (memcmp (got, want, BS) == 0);
  }
  return fsc_cache_io_calls (c, FSC_OP_READ, FSC_FILE_INDEX) - r0;
}

static void
test_paging (void)
{
  struct fsc_open_info info;

  /* Cached, closed cleanly: 2000 blocks in 2000 groups. */
  struct fsc_cache *c = open_cache (NULL);
  struct fsc_object *o = pg_open (c, &info, 0);
  pg_read (c, o, 0, PG_GROUPS);
  CHECK_EQ (pg_bytes, (uint64_t) PG_GROUPS * BS);
  CHECK_EQ (fsc_object_present_blocks (o), PG_GROUPS);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* Reopened: the open reads the superblocks only, not 2000 records. */
  c = open_cache (NULL);
  uint64_t r0 = fsc_cache_io_calls (c, FSC_OP_READ, FSC_FILE_INDEX);
  o = pg_open (c, &info, 64);
  uint64_t at_open = fsc_cache_io_calls (c, FSC_OP_READ, FSC_FILE_INDEX) - r0;
  printf ("paging: %" PRIu64 " index reads at open\n", at_open);
  CHECK (at_open <= 2);
  CHECK_EQ (info.present_blocks, PG_GROUPS);
  CHECK (!info.unclean);

  /* First hits: one index read per group, nothing upstream. */
  pg_bytes = 0;
  uint64_t first = pg_read (c, o, 0, 10);
  CHECK_EQ (first, 10);
  CHECK_EQ (pg_bytes, 0);
  /* Resident again: no read. */
  CHECK_EQ (pg_read (c, o, 0, 10), 0);
  /* All of them, 64 resident at a time: each costs its record once
   * more, the gauges do not move, nothing goes upstream.
   */
  uint64_t all = pg_read (c, o, 0, PG_GROUPS);
  printf ("paging: %" PRIu64 " index reads for %u groups, 64 resident\n",
          all, PG_GROUPS);
  CHECK (all >= PG_GROUPS - 64 && all <= PG_GROUPS);
  CHECK_EQ (pg_bytes, 0);
  CHECK_EQ (fsc_object_present_blocks (o), PG_GROUPS);

  /* Writes drop blocks in groups paged out: the drop must reach the
   * index (read back after a reopen), and the gauge follow.
   */
  for (unsigned i = 0; i < 100; ++i) {
    struct fsc_write w;
    unsigned char buf[BS];
    pg_fill (pg_block (i) * BS, buf, BS);
    CHECK (fsc_object_write_begin (o, pg_block (i) * BS, BS, false, &w) == 0);
    fsc_object_write_end (o, &w, buf, true);
  }
  CHECK_EQ (fsc_object_present_blocks (o), PG_GROUPS - 100);
  fsc_object_close (o);
  fsc_cache_close (c);

  c = open_cache (NULL);
  o = pg_open (c, &info, 64);
  CHECK_EQ (info.present_blocks, PG_GROUPS - 100);
  pg_bytes = 0;
  pg_read (c, o, 100, PG_GROUPS);
  CHECK_EQ (pg_bytes, 0);
  CHECK_EQ (fsc_object_present_blocks (o), PG_GROUPS - 100);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* A crash after filling the 100 again: the census counts them all. */
  pid_t pid = fork ();
  CHECK (pid >= 0);
  if (pid == 0) {
    c = open_cache (NULL);
    o = pg_open (c, &info, 64);
    pg_read (c, o, 0, 100);
    fsc_object_drain (o);       /* the fills in the commit */
    if (fsc_object_commit (o) == -1)
      _exit (1);
    _exit (0);
  }
  int wst;
  CHECK (waitpid (pid, &wst, 0) == pid && WIFEXITED (wst) &&
         WEXITSTATUS (wst) == 0);
  /* The census runs in the reclaimer's thread once the object is open:
   * held back by the gate until the open's own reads are counted (it
   * raced the count on a loaded machine, and failed the test in CI).
   */
  char gate[128];
  snprintf (gate, sizeof gate, "%s/reclaim-gate", dir);
  CHECK (setenv ("NBD_FSCACHE_TEST_RECLAIM_GATE", gate, 1) == 0);
  c = open_cache (NULL);
  r0 = fsc_cache_io_calls (c, FSC_OP_READ, FSC_FILE_INDEX);
  o = pg_open (c, &info, 64);
  CHECK (info.unclean);
  CHECK (fsc_cache_io_calls (c, FSC_OP_READ, FSC_FILE_INDEX) - r0 <= 2);
  int gfd = open (gate, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  CHECK (gfd >= 0);
  close (gfd);
  CHECK (unsetenv ("NBD_FSCACHE_TEST_RECLAIM_GATE") == 0);
  pg_bytes = 0;
  pg_read (c, o, 0, 10);                        /* served meanwhile */
  CHECK_EQ (pg_bytes, 0);
  fsc_object_wait_reclaim (o);
  CHECK_EQ (fsc_object_present_blocks (o), PG_GROUPS);
  pg_read (c, o, 0, PG_GROUPS);
  CHECK_EQ (pg_bytes, 0);
  CHECK_EQ (fsc_object_present_blocks (o), PG_GROUPS);
  fsc_object_close (o);
  fsc_cache_close (c);
}

/* Two caches on one directory stand for two processes (the index's
 * flock is per open file, so the second finds the object held): the
 * second joins the first's object (share-joiner.c).  Its reads are served by
 * the owner and filled once, its writes drop the owner's blocks, a
 * block size of its own is refused, and when the owner's cache closes
 * the joiner takes the object over, still warm.
 */
static void
test_share (void)
{
  struct fsc_open_info info;
  struct fsc_stats st;
  static unsigned char got[SIZE];

  struct fsc_cache *c1 = open_cache (NULL), *c2 = open_cache (NULL);
  struct fsc_object *o1 = open_obj (c1, &info, "share", SIZE);
  CHECK (!info.joined);
  struct fsc_object *o2 = open_obj (c2, &info, "share", SIZE);
  CHECK (info.joined);
  CHECK_EQ (info.owner_pid, (int) getpid ());
  CHECK_EQ (fsc_object_state (o2), FSC_OBJ_AVAILABLE);

  /* Cold through the joiner: fetched once, stored in the owner's. */
  up_bytes = 0;
  read_all (o2);
  CHECK_EQ (up_bytes, SIZE);
  fsc_object_drain (o1);                /* the fills queued are done */
  CHECK_EQ (fsc_object_present_blocks (o1), (SIZE + BS - 1) / BS);
  up_bytes = 0;
  read_all (o1);
  read_all (o2);
  CHECK_EQ (up_bytes, 0);
  fsc_cache_stats (c2, &st);
  CHECK_EQ (st.share_joins, 1);
  /* Aligned hits of the joiner come from the files themselves, and
   * are reported to the owner (its counters, its policy's references)
   * in batches.
   */
  struct fsc_ostats os0, os1;
  fsc_object_counters (o1, &os0);
  for (uint64_t off = 0; off < SIZE; off += 4 * BS) {
    uint32_t n = SIZE - off < 4 * BS ? SIZE - off : 4 * BS;
    CHECK (fsc_object_read (o2, got, n, off, &up, 0) == 0);
    CHECK (memcmp (got, upstream + off, n) == 0);
  }
  CHECK_EQ (up_bytes, 0);
  fsc_cache_stats (c2, &st);
  CHECK (st.share_direct_bytes >= SIZE);
  fsc_object_counters (o1, &os1);
  CHECK (os1.v[FSC_OSTAT_hit_requests] - os0.v[FSC_OSTAT_hit_requests]
         >= 60);
  fsc_cache_stats (c1, &st);
  CHECK (st.share_served > 0);

  /* A write through the owner, with the joiner's maps of the block
   * taken: the joiner's next read sees the new data, not its map's.
   */
  {
    struct fsc_write w1;
    unsigned char n1[BS];
    CHECK (fsc_object_read (o2, got, BS, 9 * BS, &up, 0) == 0);
    memset (n1, 0x3d, BS);
    CHECK (fsc_object_write_begin (o1, 9 * BS, BS, true, &w1) == 0);
    memcpy (upstream + 9 * BS, n1, BS);
    fsc_object_write_end (o1, &w1, n1, true);
    CHECK (fsc_object_read (o2, got, BS, 9 * BS, &up, 0) == 0);
    CHECK (memcmp (got, n1, BS) == 0);
    /* And a write that fails upstream leaves nothing to serve. */
    CHECK (fsc_object_write_begin (o1, 9 * BS, BS, true, &w1) == 0);
    memset (upstream + 9 * BS, 0x4e, BS);
    fsc_object_write_end (o1, &w1, NULL, false);
    up_bytes = 0;
    CHECK (fsc_object_read (o2, got, BS, 9 * BS, &up, 0) == 0);
    CHECK (memcmp (got, upstream + 9 * BS, BS) == 0);
    CHECK_EQ (up_bytes, BS);
  }

  /* A write through the joiner drops the owner's block before it goes
   * upstream, and stores the new data after.
   */
  struct fsc_write w;
  unsigned char nb[BS];
  memset (nb, 0x5c, BS);
  CHECK (fsc_object_write_begin (o2, 7 * BS, BS, true, &w) == 0);
  CHECK (!fsc_object_block_present (o1, 7));
  memcpy (upstream + 7 * BS, nb, BS);
  fsc_object_write_end (o2, &w, nb, true);
  CHECK (fsc_object_block_present (o1, 7));
  up_bytes = 0;
  CHECK (fsc_object_read (o1, got, BS, 7 * BS, &up, 0) == 0);
  CHECK (memcmp (got, nb, BS) == 0);
  CHECK (fsc_object_read (o2, got, BS, 7 * BS, &up, 0) == 0);
  CHECK (memcmp (got, nb, BS) == 0);
  CHECK_EQ (up_bytes, 0);
  CHECK (fsc_object_commit (o2) == 0);

  /* Another block size: refused, not discarded under the owner. */
  struct fsc_cache *c3 = open_cache (NULL);
  struct fsc_object *o3 = NULL;
  struct fsc_object_params p3 = {
    .key = "key\0export=", .key_len = 11, .block_size = 2 * BS,
    .size = SIZE, .verify = true, .validate = FSC_VALIDATE_SIZE,
    .generation = "share",
  };
  errno = 0;
  CHECK (fsc_object_open (c3, &p3, &o3, &info) == -1);
  CHECK_EQ (errno, EPERM);
  CHECK (info.refused);
  CHECK_EQ (info.reason, FSC_REJ_BLOCK_SIZE);
  CHECK_EQ (info.owner_block_size, BS);
  fsc_cache_close (c3);
  CHECK_EQ (fsc_object_present_blocks (o1), (SIZE + BS - 1) / BS);

  /* The owner goes away (its joiner's sockets kept the object open
   * after its own last close): the joiner takes over, warm.
   */
  fsc_object_close (o1);
  fsc_cache_close (c1);
  up_bytes = 0;
  read_all (o2);
  CHECK_EQ (up_bytes, 0);
  fsc_cache_stats (c2, &st);
  CHECK_EQ (st.share_takeovers, 1);
  CHECK_EQ (st.share_fallbacks, 0);
  fsc_object_close (o2);
  fsc_cache_close (c2);
}

/* A joiner's direct hit on part of a block (64K blocks): the
 * sub-blocks it serves are checked with the owner's sums file, as the
 * owner's own partial hits are (sums.c, fsc_sums_read and
 * fsc_sums_check_subs).  Served from the files, right; and a sub-block
 * damaged on disk is not served from them: the read goes to the
 * owner, which finds the damage and fetches the block again.
 */
static void
test_share_partial (void)
{
  const uint64_t B = 65536, S = 1024 * 1024;
  struct fsc_object_params pq = {
    .key = "kq", .key_len = 2, .block_size = B, .size = S,
    .verify = true, .validate = FSC_VALIDATE_SIZE,
  };
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], pd[512];
  struct fsc_open_info info;
  struct fsc_stats st0, st1;
  unsigned char got[4096];

  alarm (120);                          /* its end once hung: fail */
  fsc_key_encode ("kq", 2, name, fan);
  snprintf (pd, sizeof pd, "%s/objects/%s/%s.data", dir, fan, name);
  struct fsc_cache *c1 = open_cache (NULL), *c2 = open_cache (NULL);
  struct fsc_object *o1, *o2;
  CHECK (fsc_object_open (c1, &pq, &o1, &info) == 0);
  CHECK (!info.joined);
  /* Whole blocks, as a stream takes them. */
  static unsigned char whole[65536];
  for (uint64_t off = 0; off < S; off += B)
    CHECK (fsc_object_read (o1, whole, B, off, &up,
                            FSC_READ_SEQUENTIAL) == 0);
  fsc_object_drain (o1);
  CHECK (fsc_object_commit (o1) == 0);
  CHECK_EQ (fsc_object_present_blocks (o1), S / B);
  CHECK (fsc_object_open (c2, &pq, &o2, &info) == 0);
  CHECK (info.joined);

  /* Parts of blocks, sub-block aligned: from the files, right. */
  fsc_cache_stats (c2, &st0);
  up_bytes = 0;
  for (uint64_t blk = 0; blk < S / B; ++blk) {
    uint64_t off = blk * B + 8192;
    CHECK (fsc_object_read (o2, got, 4096, off, &up, 0) == 0);
    CHECK (memcmp (got, upstream + off, 4096) == 0);
  }
  CHECK_EQ (up_bytes, 0);
  fsc_cache_stats (c2, &st1);
  CHECK_EQ (st1.share_direct_bytes - st0.share_direct_bytes,
            (S / B) * 4096);

  /* A sub-block damaged on disk: not served from the files. */
  int fd = open (pd, O_WRONLY);
  CHECK (fd >= 0);
  unsigned char bad[16];
  memset (bad, 0xa5, sizeof bad);
  CHECK (pwrite (fd, bad, sizeof bad, 3 * B + 8192 + 100) == sizeof bad);
  CHECK (fsync (fd) == 0);
  close (fd);
  fsc_cache_stats (c2, &st0);
  up_bytes = 0;
  CHECK (fsc_object_read (o2, got, 4096, 3 * B + 8192, &up, 0) == 0);
  CHECK (memcmp (got, upstream + 3 * B + 8192, 4096) == 0);
  CHECK (up_bytes > 0);                 /* the owner fetched it again */
  fsc_cache_stats (c2, &st1);
  CHECK_EQ (st1.share_direct_bytes, st0.share_direct_bytes);

  fsc_object_close (o2);
  fsc_cache_close (c2);
  fsc_object_close (o1);
  fsc_cache_close (c1);
  alarm (0);
}

/* The owner's cache closes as a joiner's connection ends: the owner's
 * connection thread may drop the object's last other reference just
 * as the cache's close stops the object's server.  It then closed the
 * object itself and stopped the server a second time, joining a
 * listener already joined (a hang, or a server already freed).  Many
 * rounds, with an alarm: a hang fails the test instead of stalling
 * the suite.
 */
static void
test_share_close_race (void)
{
  struct fsc_open_info info;
  unsigned char b[BS];
  unsigned joined = 0;
  alarm (120);
  for (int i = 0; i < 200; ++i) {
    struct fsc_cache *c1 = open_cache (NULL), *c2 = open_cache (NULL);
    struct fsc_object *o1 = open_obj (c1, &info, "race", SIZE);
    struct fsc_object *o2 = open_obj (c2, &info, "race", SIZE);
    /* A round whose join gave up does not run the race (seen once in
     * 200 rounds in a CI run, under load, the cause not found: an owner
     * slower than the 2 s hello would do it); most rounds must run it.
     */
    joined += info.joined;
    CHECK (fsc_object_read (o2, b, BS, (uint64_t) (i % 16) * BS, &up, 0) == 0);
    CHECK (memcmp (b, upstream + (i % 16) * BS, BS) == 0);
    fsc_object_close (o2);
    fsc_cache_close (c2);
    fsc_object_close (o1);
    fsc_cache_close (c1);
  }
  alarm (0);
  CHECK (joined >= 150);
}

int
main (void)
{
  struct fsc_open_info info;
  struct fsc_stats st;
  char idx[512], data[512];

  srand (1);
  for (size_t i = 0; i < SIZE; ++i)
    upstream[i] = rand ();
  snprintf (dir, sizeof dir, "/tmp/unit-object-XXXXXX");
  CHECK (mkdtemp (dir) != NULL);
  strcat (dir, "/cache");               /* created by fsc_cache_open */
  path_of (idx, sizeof idx, ".idx");
  path_of (data, sizeof data, ".data");

  /* Cold, then warm: the second read fetches nothing. */
  struct fsc_cache *c = open_cache (NULL);
  struct stat sst;
  CHECK (stat (dir, &sst) == 0 && (sst.st_mode & 0777) == 0700);
  struct fsc_object *o = open_obj (c, &info, NULL, SIZE);
  CHECK_EQ (info.state, FSC_OBJ_AVAILABLE);
  CHECK_EQ (info.reason, FSC_REJ_NEW);
  read_all (o);
  CHECK_EQ (up_bytes, SIZE);
  CHECK_EQ (fsc_object_present_blocks (o), (SIZE + BS - 1) / BS);
  up_bytes = 0;
  read_all (o);
  CHECK_EQ (up_bytes, 0);
  CHECK (stat (data, &sst) == 0 && (sst.st_mode & 0777) == 0600);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* Reopen: still cached, clean. */
  c = open_cache (NULL);
  o = open_obj (c, &info, NULL, SIZE);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK (!info.unclean);
  CHECK_EQ (info.present_blocks, (SIZE + BS - 1) / BS);
  read_all (o);
  CHECK_EQ (up_bytes, 0);

  /* A second open in the same process shares the object. */
  struct fsc_object *o2 = open_obj (c, &info, NULL, SIZE);
  CHECK (o2 == o && info.shared);
  fsc_object_close (o2);

  /* Corrupt a block in the data file: detected, refetched, counted. */
  int fd = open (data, O_RDWR);
  CHECK (fd >= 0);
  CHECK (pwrite (fd, "garbage", 7, 5 * BS + 100) == 7);
  close (fd);
  read_all (o);
  CHECK_EQ (up_bytes, BS);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.verify_failures, 1);

  /* Writes: begin drops the blocks durably, end stores whole blocks
   * and partial ones that were present (read-modify-write).
   */
  struct fsc_write w;
  unsigned char wbuf[3 * BS];
  memset (wbuf, 0xab, sizeof wbuf);
  uint64_t woff = 10 * BS + 100;
  CHECK (fsc_object_write_begin (o, woff, sizeof wbuf, true, &w) == 0);
  CHECK (!fsc_object_block_present (o, 10));
  CHECK (!fsc_object_block_present (o, 12));
  memcpy (upstream + woff, wbuf, sizeof wbuf);    /* the upstream write */
  fsc_object_write_end (o, &w, wbuf, true);
  CHECK (fsc_object_block_present (o, 10));
  CHECK (fsc_object_block_present (o, 11));
  CHECK (fsc_object_block_present (o, 13));
  up_bytes = 0;
  read_all (o);
  CHECK_EQ (up_bytes, 0);

  /* A failed upstream write leaves the blocks absent. */
  CHECK (fsc_object_write_begin (o, 20 * BS, BS, true, &w) == 0);
  fsc_object_write_end (o, &w, wbuf, false);
  CHECK (!fsc_object_block_present (o, 20));
  read_all (o);
  CHECK_EQ (up_bytes, BS);

  /* A fill racing with a write in flight upstream must not store what
   * the upstream held before the write.
   */
  {
    struct fsc_write wa, wb;
    unsigned char nb[BS], got[BS];
    uint64_t off = 40 * BS;
    CHECK (fsc_object_read (o, got, BS, off, &up, 0) == 0);       /* cached */
    memset (nb, 0xa1, BS);
    CHECK (fsc_object_write_begin (o, off, BS, true, &wa) == 0);
    CHECK (fsc_object_read (o, got, BS, off, &up, 0) == 0);       /* old data */
    CHECK (!fsc_object_block_present (o, 40));
    memcpy (upstream + off, nb, BS);
    fsc_object_write_end (o, &wa, nb, true);
    CHECK (fsc_object_read (o, got, BS, off, &up, 0) == 0);
    CHECK (memcmp (got, nb, BS) == 0);

    /* Overlapping writes: B ends first but A lands upstream last:
     * neither may store.
     */
    unsigned char na[BS];
    memset (na, 0xaa, BS);
    memset (nb, 0xbb, BS);
    CHECK (fsc_object_write_begin (o, off, BS, true, &wa) == 0);
    CHECK (fsc_object_write_begin (o, off, BS, true, &wb) == 0);
    memcpy (upstream + off, nb, BS);
    fsc_object_write_end (o, &wb, nb, true);
    CHECK (!fsc_object_block_present (o, 40));
    memcpy (upstream + off, na, BS);
    fsc_object_write_end (o, &wa, na, true);
    CHECK (!fsc_object_block_present (o, 40));
    CHECK (fsc_object_read (o, got, BS, off, &up, 0) == 0);
    CHECK (memcmp (got, na, BS) == 0);
  }

  /* Writearound (keep=false) drops without storing. */
  CHECK (fsc_object_write_begin (o, 30 * BS, BS, false, &w) == 0);
  fsc_object_write_end (o, &w, wbuf, true);
  CHECK (!fsc_object_block_present (o, 30));
  CHECK (fsc_object_commit (o) == 0);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* Coherency: a new generation or size discards the object. */
  c = open_cache (NULL);
  o = open_obj (c, &info, "v2", SIZE);
  CHECK_EQ (info.reason, FSC_REJ_GENERATION);
  CHECK_EQ (info.present_blocks, 0);
  read_all (o);
  fsc_object_close (o);
  o = open_obj (c, &info, "v2", SIZE);
  CHECK_EQ (info.reason, FSC_OK);
  fsc_object_close (o);
  o = open_obj (c, &info, "v2", SIZE - 1);
  CHECK_EQ (info.reason, FSC_REJ_UPSTREAM_SIZE);
  fsc_object_close (o);
  o = open_obj (c, &info, "v2", SIZE);
  CHECK_EQ (info.reason, FSC_REJ_UPSTREAM_SIZE);
  read_all (o);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* A truncated index starts the object cold, never trusted. */
  CHECK (truncate (idx, 100) == 0);
  c = open_cache (NULL);
  o = open_obj (c, &info, "v2", SIZE);
  CHECK_EQ (info.reason, FSC_REJ_SHORT);
  CHECK_EQ (info.present_blocks, 0);
  up_bytes = 0;
  read_all (o);
  CHECK_EQ (up_bytes, SIZE);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* A garbled superblock likewise. */
  fd = open (idx, O_RDWR);
  CHECK (fd >= 0);
  CHECK (pwrite (fd, "XXXXXXXXXXXXXXXX", 16, 20) == 16);
  CHECK (pwrite (fd, "XXXXXXXXXXXXXXXX", 16, 4096 + 20) == 16);
  close (fd);
  c = open_cache (NULL);
  o = open_obj (c, &info, "v2", SIZE);
  CHECK_EQ (info.reason, FSC_REJ_CHECKSUM);
  read_all (o);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* Parallel readers of a cold object: same data, and concurrent
   * misses of one block fetch it once (each byte exactly once).
   */
  c = open_cache (NULL);
  o = open_obj (c, &info, "v3", SIZE);
  up_bytes = 0;
  pthread_t t[8];
  for (int i = 0; i < 8; ++i)
    CHECK (pthread_create (&t[i], NULL, reader_thread, o) == 0);
  for (int i = 0; i < 8; ++i)
    pthread_join (t[i], NULL);
  CHECK_EQ (up_bytes, SIZE);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* With the cache's threads running, misses fill in the background:
   * parallel readers still fetch each byte once, and everything is
   * cached once the fills are drained.
   */
  c = open_cache (NULL);
  CHECK (fsc_cache_start (c) == 0);
  o = open_obj (c, &info, "v3b", SIZE);
  up_bytes = 0;
  for (int i = 0; i < 8; ++i)
    CHECK (pthread_create (&t[i], NULL, reader_thread, o) == 0);
  for (int i = 0; i < 8; ++i)
    pthread_join (t[i], NULL);
  CHECK_EQ (up_bytes, SIZE);
  fsc_object_drain (o);
  CHECK_EQ (fsc_object_present_blocks (o), (SIZE + BS - 1) / BS);
  fsc_object_close (o);
  fsc_cache_close (c);
  c = open_cache (NULL);
  o = open_obj (c, &info, "v3b", SIZE);
  CHECK_EQ (info.reason, FSC_OK);
  CHECK_EQ (info.present_blocks, (SIZE + BS - 1) / BS);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* An open racing with the close of the same object's last reference
   * waits for the close instead of finding the index locked (which
   * would make it uncached, and writes through it would then leave
   * the closed index stale).
   */
  c = open_cache (NULL);
  o = open_obj (c, &info, "v3b", SIZE);
  for (int i = 0; i < 100; ++i) {
    unsigned char b1[100];
    struct opener op = { .c = c, .spin = (i * 7919) % 200000 };
    CHECK (fsc_object_read (o, b1, sizeof b1, i * 1000, &up, 0) == 0);
    pthread_t opener;
    CHECK (pthread_create (&opener, NULL, open_thread, &op) == 0);
    fsc_object_close (o);
    pthread_join (opener, NULL);
    o = op.o;
    CHECK (!op.info.busy);
    CHECK_EQ (op.info.state, FSC_OBJ_AVAILABLE);
  }
  fsc_object_close (o);
  fsc_cache_close (c);

  /* The cache's own I/O fails: reads still return upstream's data. */
  c = open_cache ("read:data:1+:EIO");
  o = open_obj (c, &info, "v3b", SIZE);
  CHECK_EQ (info.reason, FSC_OK);
  read_all (o);
  CHECK_EQ (fsc_object_state (o), FSC_OBJ_WITHDRAWN);
  read_all (o);
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.withdrawals, 1);
  fsc_object_close (o);
  fsc_cache_close (c);

  c = open_cache ("write:data:3+:ENOSPC");
  o = open_obj (c, &info, "v4", SIZE);
  read_all (o);
  read_all (o);
  CHECK_EQ (fsc_object_state (o), FSC_OBJ_AVAILABLE);
  fsc_cache_stats (c, &st);
  CHECK (st.nofill_events >= 1);
  fsc_object_close (o);
  fsc_cache_close (c);

  c = open_cache ("sync:index:2+:EIO");
  o = open_obj (c, &info, "v5", SIZE);
  read_all (o);
  CHECK (fsc_object_commit (o) == -1);
  read_all (o);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* An upstream error reaches the caller. */
  c = open_cache (NULL);
  o = open_obj (c, &info, "v6", SIZE);
  up_fail = 1;
  unsigned char b1[100];
  CHECK (fsc_object_read (o, b1, sizeof b1, 0, &up, 0) == -1 && errno == EIO);
  up_fail = 0;
  CHECK (fsc_object_read (o, b1, sizeof b1, 0, &up, 0) == 0);
  CHECK (memcmp (b1, upstream, sizeof b1) == 0);
  /* Out of range. */
  CHECK (fsc_object_read (o, b1, 2, SIZE - 1, &up, 0) == -1 && errno == EINVAL);
  fsc_object_close (o);
  fsc_cache_close (c);

  /* 64K blocks: partial hits check only the 4K sub-blocks they serve,
   * against the sums file, which is itself checked against the index.
   */
  {
    struct fsc_object_params p64 = {
      .key = "k64", .key_len = 3, .block_size = 65536, .size = SIZE,
      .verify = true, .validate = FSC_VALIDATE_SIZE,
    };
    char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], d64[512], s64[512];
    fsc_key_encode ("k64", 3, name, fan);
    snprintf (d64, sizeof d64, "%s/objects/%s/%s.data", dir, fan, name);
    snprintf (s64, sizeof s64, "%s/objects/%s/%s.sums", dir, fan, name);
    unsigned char got[8192];

    c = open_cache (NULL);
    CHECK (fsc_object_open (c, &p64, &o, &info) == 0);
    read_all (o);
    fsc_object_close (o);
    fsc_cache_close (c);

    /* Corrupt sub-block 3 of block 2 (bytes 2*64K + 3*4K + 10). */
    fd = open (d64, O_RDWR);
    CHECK (fd >= 0);
    CHECK (pwrite (fd, "X", 1, 2 * 65536 + 3 * 4096 + 10) == 1);
    close (fd);
    c = open_cache (NULL);
    CHECK (fsc_object_open (c, &p64, &o, &info) == 0);
    CHECK_EQ (info.reason, FSC_OK);
    up_bytes = 0;
    /* A read of sub-block 1 of that block is served from the cache. */
    CHECK (fsc_object_read (o, got, 4096, 2 * 65536 + 4096, &up, 0) == 0);
    CHECK (memcmp (got, upstream + 2 * 65536 + 4096, 4096) == 0);
    CHECK_EQ (up_bytes, 0);
    /* A read touching sub-block 3 detects the damage and refetches:
     * a random read, so only the piece it needs.
     */
    CHECK (fsc_object_read (o, got, 100, 2 * 65536 + 3 * 4096, &up, 0) == 0);
    CHECK (memcmp (got, upstream + 2 * 65536 + 3 * 4096, 100) == 0);
    CHECK_EQ (up_bytes, 4096);
    fsc_cache_stats (c, &st);
    CHECK_EQ (st.verify_failures, 1);
    fsc_object_close (o);
    fsc_cache_close (c);

    /* Corrupt the sums of block 4: a partial read of it refetches. */
    fd = open (s64, O_RDWR);
    CHECK (fd >= 0);
    CHECK (pwrite (fd, "Y", 1, 4 * 16 * 8 + 5) == 1);
    close (fd);
    c = open_cache (NULL);
    CHECK (fsc_object_open (c, &p64, &o, &info) == 0);
    up_bytes = 0;
    CHECK (fsc_object_read (o, got, 8192, 4 * 65536 + 100, &up, 0) == 0);
    CHECK (memcmp (got, upstream + 4 * 65536 + 100, 8192) == 0);
    CHECK_EQ (up_bytes, 3 * 4096);      /* the three pieces it touches */
    /* The last, short block (12345 bytes past the last full 64K). */
    up_bytes = 0;
    CHECK (fsc_object_read (o, got, 5000, SIZE - 5000, &up, 0) == 0);
    CHECK (memcmp (got, upstream + SIZE - 5000, 5000) == 0);
    CHECK_EQ (up_bytes, 0);
    fsc_object_close (o);
    fsc_cache_close (c);
  }

  /* A capped object (evict.c): reads stay identical while blocks are
   * evicted, never more than the cap is present, and a reopen reads
   * the same bytes (evictions were committed before their punch).
   */
  {
    const uint64_t cap = 256 * 1024;
    struct fsc_object_params pc = {
      .key = "capped", .key_len = 6, .block_size = BS, .size = SIZE,
      .verify = true, .validate = FSC_VALIDATE_SIZE, .max_size = cap,
    };
    for (int pass = 0; pass < 2; ++pass) {
      c = open_cache (NULL);
      CHECK (fsc_object_open (c, &pc, &o, &info) == 0);
      CHECK_EQ (info.state, FSC_OBJ_AVAILABLE);
      for (int rep = 0; rep < 2; ++rep) {
        read_all (o);
        CHECK (fsc_object_present_blocks (o) * BS <= cap);
      }
      /* Random small reads: some hit, some evict. */
      static unsigned char got[8192];
      for (int i = 0; i < 2000; ++i) {
        uint64_t off = (uint64_t) rand () % (SIZE - sizeof got);
        uint32_t n = 1 + rand () % sizeof got;
        CHECK (fsc_object_read (o, got, n, off, &up, 0) == 0);
        CHECK (memcmp (got, upstream + off, n) == 0);
      }
      fsc_cache_stats (c, &st);
      CHECK (st.evicted_blocks > 0 && st.eviction_rounds > 0);
      fsc_object_close (o);
      fsc_cache_close (c);
    }
  }

  /* After a crash, space no index names (an eviction committed but
   * not punched, a fill written but never committed) is punched when
   * the object opens again; what the index names stays.
   */
  {
    struct fsc_object_params pu = {
      .key = "unnamed", .key_len = 7, .block_size = BS, .size = SIZE,
      .verify = true, .validate = FSC_VALIDATE_SIZE,
    };
    char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1], udata[512];
    static unsigned char got[4 * BS], junk[8 * BS];
    struct stat sb;
    fsc_key_encode ("unnamed", 7, name, fan);
    snprintf (udata, sizeof udata, "%s/objects/%s/%s.data", dir, fan, name);

    /* A process that reads four blocks, commits, and dies without
     * closing (so the index is not marked clean).
     */
    pid_t pid = fork ();
    CHECK (pid >= 0);
    if (pid == 0) {
      c = open_cache (NULL);
      if (fsc_object_open (c, &pu, &o, &info) == -1 ||
          fsc_object_read (o, got, sizeof got, 0, &up, 0) == -1 ||
          fsc_object_commit (o) == -1)
        _exit (1);
      _exit (0);
    }
    int wst;
    CHECK (waitpid (pid, &wst, 0) == pid && WIFEXITED (wst) &&
           WEXITSTATUS (wst) == 0);
    /* Eight blocks of data at blocks 16..23, which no index names. */
    memset (junk, 0xa5, sizeof junk);
    int jfd = open (udata, O_WRONLY);
    CHECK (jfd >= 0);
    CHECK (pwrite (jfd, junk, sizeof junk, 16 * BS) == (ssize_t) sizeof junk);
    CHECK (fsync (jfd) == 0 && fstat (jfd, &sb) == 0);
    CHECK (sb.st_blocks * 512 >= 12 * BS);
    close (jfd);

    c = open_cache (NULL);
    CHECK (fsc_object_open (c, &pu, &o, &info) == 0);
    CHECK (info.unclean);
    /* The walk runs in the background: the named blocks hit meanwhile. */
    up_bytes = 0;
    CHECK (fsc_object_read (o, got, sizeof got, 0, &up, 0) == 0);
    CHECK (memcmp (got, upstream, sizeof got) == 0);
    CHECK_EQ (up_bytes, 0);
    fsc_object_wait_reclaim (o);
    /* After a crash the census counts the blocks in the background. */
    CHECK_EQ (fsc_object_present_blocks (o), 4);
    fsc_cache_stats (c, &st);
    CHECK_EQ (st.reclaimed_bytes, 8 * BS);
    CHECK (stat (udata, &sb) == 0);
    CHECK (sb.st_blocks * 512 <= 4 * BS);
    /* The named blocks hit, the reclaimed ones come from upstream. */
    up_bytes = 0;
    CHECK (fsc_object_read (o, got, sizeof got, 0, &up, 0) == 0);
    CHECK (memcmp (got, upstream, sizeof got) == 0);
    CHECK_EQ (up_bytes, 0);
    CHECK (fsc_object_read (o, got, BS, 16 * BS, &up, 0) == 0);
    CHECK (memcmp (got, upstream + 16 * BS, BS) == 0);
    CHECK (up_bytes > 0);
    fsc_object_close (o);
    fsc_cache_close (c);

    /* After a clean close too, if the data files hold much more than
     * the blocks do (space an older build leaked): 32 blocks of junk
     * at 32..63 are punched at the next open, the 5 blocks stay.
     */
    static unsigned char junk32[32 * BS];
    memset (junk32, 0x5a, sizeof junk32);
    jfd = open (udata, O_WRONLY);
    CHECK (jfd >= 0);
    CHECK (pwrite (jfd, junk32, sizeof junk32, 32 * BS) ==
           (ssize_t) sizeof junk32);
    CHECK (fsync (jfd) == 0);
    close (jfd);
    c = open_cache (NULL);
    CHECK (fsc_object_open (c, &pu, &o, &info) == 0);
    CHECK (!info.unclean);
    CHECK_EQ (info.present_blocks, 5);
    fsc_object_wait_reclaim (o);
    fsc_cache_stats (c, &st);
    CHECK_EQ (st.reclaimed_bytes, 32 * BS);
    CHECK (stat (udata, &sb) == 0);
    CHECK (sb.st_blocks * 512 <= 5 * BS);
    up_bytes = 0;
    CHECK (fsc_object_read (o, got, BS, 16 * BS, &up, 0) == 0);
    CHECK (memcmp (got, upstream + 16 * BS, BS) == 0);
    CHECK_EQ (up_bytes, 0);
    fsc_object_close (o);
    fsc_cache_close (c);

    /* After a clean close the not-clean mark is written before the
     * first change, not at open: an open and its hits write and sync
     * nothing of the index, and a process that only hit and died
     * leaves it clean.
     */
    pid = fork ();
    CHECK (pid >= 0);
    if (pid == 0) {
      c = open_cache (NULL);
      if (fsc_object_open (c, &pu, &o, &info) == -1 || info.unclean ||
          fsc_object_read (o, got, sizeof got, 0, &up, 0) == -1 ||
          fsc_cache_io_calls (c, FSC_OP_WRITE, FSC_FILE_INDEX) != 0 ||
          fsc_cache_io_calls (c, FSC_OP_SYNC, FSC_FILE_INDEX) != 0)
        _exit (1);
      _exit (0);
    }
    CHECK (waitpid (pid, &wst, 0) == pid && WIFEXITED (wst) &&
           WEXITSTATUS (wst) == 0);
    /* A process that fills a block (block 8: its data written, never
     * committed) and dies: the mark went first, so the next open sees
     * the crash and reclaims the block's space.  (Written after the
     * data, or not at all, the index would say clean and the space
     * would never be reclaimed.)
     */
    pid = fork ();
    CHECK (pid >= 0);
    if (pid == 0) {
      c = open_cache (NULL);
      if (fsc_object_open (c, &pu, &o, &info) == -1 || info.unclean ||
          fsc_object_read (o, got, BS, 8 * BS, &up, 0) == -1)
        _exit (1);
      fsc_object_drain (o);     /* the fill written (or dropped) */
      if (fsc_cache_io_calls (c, FSC_OP_SYNC, FSC_FILE_INDEX) != 1)
        _exit (2);
      _exit (0);
    }
    CHECK (waitpid (pid, &wst, 0) == pid && WIFEXITED (wst) &&
           WEXITSTATUS (wst) == 0);
    CHECK (stat (udata, &sb) == 0);
    CHECK (sb.st_blocks * 512 >= 6 * BS);
    c = open_cache (NULL);
    CHECK (fsc_object_open (c, &pu, &o, &info) == 0);
    CHECK (info.unclean);
    fsc_object_wait_reclaim (o);
    fsc_cache_stats (c, &st);
    CHECK_EQ (st.reclaimed_bytes, BS);
    CHECK (stat (udata, &sb) == 0);
    CHECK (sb.st_blocks * 512 <= 5 * BS);
    CHECK_EQ (fsc_object_present_blocks (o), 5);
    fsc_object_close (o);
    fsc_cache_close (c);
  }

  test_pieces ();
  test_zero ();
  test_counters ();
  test_paging ();
  test_share ();
  test_share_partial ();
  test_share_close_race ();

  /* A world-writable cache directory is refused. */
  CHECK (chmod (dir, 0777) == 0);
  struct fsc_cache_config cfg = { .dir = dir };
  CHECK (fsc_cache_open (&cfg, &c) == -1 && errno == EPERM);
  CHECK (chmod (dir, 0700) == 0);

  char cmd[128];
  snprintf (cmd, sizeof cmd, "rm -rf %.*s", (int) (strlen (dir) - 6), dir);
  CHECK (system (cmd) == 0);
  return 0;
}
