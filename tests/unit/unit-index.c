/* Unit test: index superblocks and group records encode, decode,
 * reject damage, and reload picks the newest valid slot.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "index.h"
#include "unit.h"
#include "utils.h"
#include "xxh.h"

static struct fsc_sb
sample_sb (uint64_t seq)
{
  struct fsc_sb sb = {
    .version = FSC_INDEX_VERSION, .seq = seq, .block_size = 65536,
    .flags = FSC_SB_CLEAN, .size = 64 * 1024 * 1024 + 12345,
    .incarnation = 0x1234, .key_hash_lo = 1, .key_hash_hi = 2,
    .key_len = 5, .validate = FSC_VALIDATE_SAMPLE, .fingerprint = 99,
    .gen_len = 3, .generation = "abc", .key_prefix_len = 5,
  };
  sb.nblocks = (sb.size + sb.block_size - 1) / sb.block_size;
  memcpy (sb.key_prefix, "hello", 5);
  return sb;
}

static int ngroups_seen;
static int
count_group (void *opaque, const struct fsc_grec *g, int slot)
{
  struct fsc_grec *want = opaque;
  CHECK_EQ (g->group, want[ngroups_seen].group);
  CHECK_EQ (g->seq, want[ngroups_seen].seq);
  CHECK_EQ (g->present, want[ngroups_seen].present);
  CHECK_EQ (g->csum[3], want[ngroups_seen].csum[3]);
  ngroups_seen++;
  return 0;
}

int
main (void)
{
  unsigned char buf[FSC_SB_SIZE], rec[FSC_GREC_SIZE];
  struct fsc_sb sb = sample_sb (7), out;
  struct fsc_io io;
  CHECK (fsc_io_init (&io, NULL) == 0);

  /* Round trip. */
  fsc_sb_encode (&sb, buf);
  CHECK_EQ (fsc_sb_decode (buf, &out), FSC_OK);
  CHECK_EQ (out.seq, 7);
  CHECK_EQ (out.size, sb.size);
  CHECK (strcmp (out.generation, "abc") == 0);
  CHECK (memcmp (out.key_prefix, "hello", 5) == 0);
  CHECK (out.label[0] == '\0');

  /* The label (issue 45): read back as written; a long key's prefix
   * cut to leave it room; a label field an older build's long key
   * reached into (not text, or no room) read as none.
   */
  {
    struct fsc_sb l = sample_sb (3);
    strcpy (l.label, "curl url=https://images.example.com/ci.img");
    fsc_sb_encode (&l, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_OK);
    CHECK (strcmp (out.label, l.label) == 0);
    CHECK (memcmp (out.key_prefix, "hello", 5) == 0);
    l.key_len = 5000;
    l.key_prefix_len = FSC_SB_KEY_PREFIX;
    memset (l.key_prefix, 'k', FSC_SB_KEY_PREFIX);
    fsc_sb_encode (&l, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_OK);
    CHECK (strcmp (out.label, l.label) == 0);
    CHECK_EQ (out.key_prefix_len,
              FSC_SB_KEY_PREFIX - 4 - strlen (l.label));
    /* An older build: the whole field is key, no label written. */
    l.label[0] = '\0';
    fsc_sb_encode (&l, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_OK);
    CHECK_EQ (out.key_prefix_len, FSC_SB_KEY_PREFIX);
    CHECK (out.label[0] == '\0');
  }
  fsc_sb_encode (&sb, buf);

  /* Any flipped bit is detected. */
  for (size_t i = 0; i < FSC_SB_SIZE; i += 7) {
    unsigned char bad[FSC_SB_SIZE];
    memcpy (bad, buf, sizeof bad);
    bad[i] ^= 0x10;
    CHECK (fsc_sb_decode (bad, &out) != FSC_OK);
  }
  /* A future version is named as such. */
  {
    unsigned char bad[FSC_SB_SIZE];
    memcpy (bad, buf, sizeof bad);
    bad[8] = FSC_INDEX_VERSION + 1;
    CHECK_EQ (fsc_sb_decode (bad, &out), FSC_REJ_VERSION);
    bad[8] = 0;
    CHECK_EQ (fsc_sb_decode (bad, &out), FSC_REJ_VERSION);
  }
  /* Impossible geometry with a valid checksum is still refused. */
  {
    struct fsc_sb g = sample_sb (1);
    g.nblocks = 3;
    fsc_sb_encode (&g, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_REJ_GEOMETRY);
    g = sample_sb (1);
    g.block_size = 3000;
    fsc_sb_encode (&g, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_REJ_GEOMETRY);
    /* Larger than the sums code holds (and the filter takes). */
    g = sample_sb (1);
    g.block_size = 8u << 20;
    g.nblocks = (g.size + g.block_size - 1) / g.block_size;
    fsc_sb_encode (&g, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_REJ_GEOMETRY);
    g.block_size = 4u << 20;
    g.nblocks = (g.size + g.block_size - 1) / g.block_size;
    fsc_sb_encode (&g, buf);
    CHECK_EQ (fsc_sb_decode (buf, &out), FSC_OK);
  }

  /* Older versions are read as they are (a version 2 index is a
   * version 3 one without zero blocks), and written as the current one.
   */
  for (uint32_t v = FSC_INDEX_VERSION_MIN; v < FSC_INDEX_VERSION; ++v) {
    unsigned char old[FSC_SB_SIZE];
    struct fsc_sb o2 = sample_sb (3);
    fsc_sb_encode (&o2, old);
    put_le32 (old + 8, v);
    put_le64 (old + FSC_SB_SIZE - 8, XXH3_64bits (old, FSC_SB_SIZE - 8));
    CHECK_EQ (fsc_sb_decode (old, &out), FSC_OK);
    CHECK_EQ (out.version, v);
    fsc_sb_encode (&out, old);
    CHECK_EQ (get_le32 (old + 8), FSC_INDEX_VERSION);
  }
  CHECK_EQ (FSC_INDEX_VERSION, 3);

  /* Group records. */
  struct fsc_grec g = { .group = 5, .seq = 9, .incarnation = 0x1234,
                        .present = 0x8000000000000001ull,
                        .zero = 0x8000000000000000ull };
  g.csum[0] = 111;
  g.csum[63] = 222;
  g.pieces[0] = 0x00f0;
  fsc_grec_encode (&g, rec);
  struct fsc_grec gout;
  CHECK (fsc_grec_decode (rec, &gout));
  CHECK_EQ (gout.present, g.present);
  CHECK_EQ (gout.csum[63], 222);
  CHECK_EQ (gout.pieces[0], 0x00f0);
  CHECK_EQ (gout.zero, g.zero);
  /* The zero bitmap is the 64-bit word at byte 680 (docs/format.md),
   * after the pieces and before the zero padding.
   */
  CHECK_EQ (get_le64 (rec + 680), 0x8000000000000000ull);
  CHECK_EQ (get_le16 (rec + 552), 0x00f0);
  for (size_t i = 688; i < FSC_GREC_SIZE - 8; ++i)
    CHECK_EQ (rec[i], 0);
  /* A record of version 2 (zeroes at 680) decodes without zero blocks. */
  {
    struct fsc_grec v2 = g;
    v2.zero = 0;
    unsigned char r2[FSC_GREC_SIZE];
    fsc_grec_encode (&v2, r2);
    CHECK_EQ (get_le64 (r2 + 680), 0);
    CHECK (fsc_grec_decode (r2, &gout));
    CHECK_EQ (gout.zero, 0);
    CHECK_EQ (gout.present, g.present);
  }
  CHECK (fsc_grec_decode (rec, &gout));
  for (size_t i = 0; i < FSC_GREC_SIZE; i += 3) {
    unsigned char bad[FSC_GREC_SIZE];
    memcpy (bad, rec, sizeof bad);
    bad[i] ^= 1;
    CHECK (!fsc_grec_decode (bad, &gout));
  }
  memset (rec, 0, sizeof rec);
  CHECK (!fsc_grec_decode (rec, &gout));     /* a hole is not a record */

  /* A file: two superblock slots, newest valid wins. */
  char path[] = "/tmp/unit-index-XXXXXX";
  int fd = mkstemp (path);
  CHECK (fd >= 0);
  unlink (path);
  int slot;
  CHECK_EQ (fsc_sb_load (&io, fd, &out, &slot), FSC_REJ_SHORT);
  struct fsc_sb a = sample_sb (10), b = sample_sb (11);
  fsc_sb_encode (&a, buf);
  CHECK (pwrite (fd, buf, FSC_SB_SIZE, 0) == FSC_SB_SIZE);
  CHECK_EQ (fsc_sb_load (&io, fd, &out, &slot), FSC_OK);
  CHECK_EQ (slot, 0);
  fsc_sb_encode (&b, buf);
  CHECK (pwrite (fd, buf, FSC_SB_SIZE, FSC_SB_SIZE) == FSC_SB_SIZE);
  CHECK_EQ (fsc_sb_load (&io, fd, &out, &slot), FSC_OK);
  CHECK_EQ (slot, 1);
  CHECK_EQ (out.seq, 11);
  /* Tear the newer slot at 512 bytes: the older one is used. */
  memset (buf + 512, 0xff, 512);
  CHECK (pwrite (fd, buf, FSC_SB_SIZE, FSC_SB_SIZE) == FSC_SB_SIZE);
  CHECK_EQ (fsc_sb_load (&io, fd, &out, &slot), FSC_OK);
  CHECK_EQ (out.seq, 10);
  /* Both bad: rejected with the checksum reason. */
  CHECK (pwrite (fd, buf, FSC_SB_SIZE, 0) == FSC_SB_SIZE);
  CHECK_EQ (fsc_sb_load (&io, fd, &out, &slot), FSC_REJ_CHECKSUM);

  /* Group scan: holes skipped, newest valid slot chosen, records of
   * another incarnation or misplaced records ignored.
   */
  struct fsc_grec want[3];
  memset (want, 0, sizeof want);
  uint64_t groups[3] = { 0, 700, 1999 };
  for (int i = 0; i < 3; ++i) {
    struct fsc_grec r = { .group = groups[i], .seq = 20 + i,
                          .incarnation = 0x1234, .present = 1ull << i };
    r.csum[3] = 1000 + i;
    fsc_grec_encode (&r, rec);
    CHECK (pwrite (fd, rec, FSC_GREC_SIZE, fsc_grec_offset (groups[i], 0))
           == FSC_GREC_SIZE);
    /* A newer record in slot 1 for group 700. */
    if (i == 1) {
      r.seq = 30;
      r.present = 0xff;
      fsc_grec_encode (&r, rec);
      CHECK (pwrite (fd, rec, FSC_GREC_SIZE, fsc_grec_offset (700, 1))
             == FSC_GREC_SIZE);
    }
    want[i] = r;
  }
  /* Another incarnation's record for group 5, and group 6's record
   * copied into group 7's place: both ignored.
   */
  struct fsc_grec other = { .group = 5, .seq = 99, .incarnation = 1 };
  fsc_grec_encode (&other, rec);
  CHECK (pwrite (fd, rec, FSC_GREC_SIZE, fsc_grec_offset (5, 0))
         == FSC_GREC_SIZE);
  other.group = 6;
  other.incarnation = 0x1234;
  fsc_grec_encode (&other, rec);
  CHECK (pwrite (fd, rec, FSC_GREC_SIZE, fsc_grec_offset (7, 0))
         == FSC_GREC_SIZE);
  ngroups_seen = 0;
  CHECK (fsc_grec_scan (&io, fd, 2000, 0x1234, count_group, want) == 0);
  CHECK_EQ (ngroups_seen, 3);
  /* Only the first 701 groups: the last record is out of range. */
  ngroups_seen = 0;
  CHECK (fsc_grec_scan (&io, fd, 701, 0x1234, count_group, want) == 0);
  CHECK_EQ (ngroups_seen, 2);

  /* Injected read errors surface as errors. */
  struct fsc_io bad;
  CHECK (fsc_io_init (&bad, "read:index:1+:EIO") == 0);
  CHECK_EQ (fsc_sb_load (&bad, fd, &out, &slot), FSC_REJ_IO);
  CHECK (fsc_grec_scan (&bad, fd, 2000, 0x1234, count_group, want) == -1);
  CHECK (fsc_io_init (&bad, "bogus") == -1 && errno == EINVAL);
  CHECK (fsc_io_init (&bad, "write:data:0:EIO") == -1);

  close (fd);
  return 0;
}
