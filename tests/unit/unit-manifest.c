/* Unit test of core/base/manifest.c: an image's manifest.
 *
 *  known    the digest of a known block equals SHA-256's test vector
 *           ("abc": ba7816bf...), so the table holds real SHA-256.
 *  round    a manifest written and read back: size, block size,
 *           generation; every block of the image checks; the last,
 *           short block too.
 *  bad      a flipped byte in a block: EBADMSG, at that block's offset.
 *  align    a check not on whole blocks: EINVAL.
 *  root     (M1) one digest or one header field changed in the file:
 *           the open refuses it (EBADMSG for the digest, which the
 *           root covers; EINVAL or EBADMSG for the field).
 *  shape    a file cut short, another magic: EINVAL.
 *  missing  a writer finished without every block: EINVAL.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "manifest.h"
#include "unit.h"

static char path[] = "/tmp/unit-manifest.XXXXXX";

static void
write_manifest (const uint8_t *img, uint64_t size, unsigned shift,
                const char *gen)
{
  struct fsc_manifest_writer *w;
  CHECK (fsc_manifest_writer_new (size, shift, gen, &w) == 0);
  uint64_t bs = UINT64_C (1) << shift;
  /* In reverse: the writer takes the blocks in any order. */
  uint64_t n = (size + bs - 1) / bs;
  for (uint64_t i = n; i-- > 0; ) {
    uint64_t len = size - i * bs < bs ? size - i * bs : bs;
    CHECK (fsc_manifest_writer_add (w, i, img + i * bs, len) == 0);
  }
  int fd = open (path, O_WRONLY | O_TRUNC);
  CHECK (fd >= 0);
  char root[65];
  CHECK (fsc_manifest_writer_finish (w, fd, root) == 0);
  CHECK (strlen (root) == 64);
  close (fd);
}

static void
patch (off_t at, uint8_t xor)
{
  int fd = open (path, O_RDWR);
  uint8_t b;
  CHECK (pread (fd, &b, 1, at) == 1);
  b ^= xor;
  CHECK (pwrite (fd, &b, 1, at) == 1);
  close (fd);
}

int
main (void)
{
  int fd = mkstemp (path);
  CHECK (fd >= 0);
  close (fd);

  /* known: one block of "abc" (a 3-byte image). */
  write_manifest ((const uint8_t *) "abc", 3, 12, "");
  struct fsc_manifest *m;
  CHECK (fsc_manifest_open (path, &m) == 0);
  fd = open (path, O_RDONLY);
  uint8_t d[32];
  CHECK (pread (fd, d, 32, FSC_MANIFEST_HEADER) == 32);
  close (fd);
  static const uint8_t abc[32] = {
    0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde,
    0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
    0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad,
  };
  CHECK (memcmp (d, abc, 32) == 0);
  uint64_t bad = 0;
  CHECK (fsc_manifest_check (m, 0, "abc", 3, &bad) == 0);
  CHECK (fsc_manifest_check (m, 0, "abd", 3, &bad) == -1 && errno == EBADMSG);
  fsc_manifest_close (m);

  /* round: 10 blocks of 4 KiB and a short one. */
  uint64_t size = 10 * 4096 + 1000;
  uint8_t *img = malloc (size);
  for (uint64_t i = 0; i < size; ++i)
    img[i] = (uint8_t) (i * 2654435761u >> 13);
  write_manifest (img, size, 12, "v7");
  CHECK (fsc_manifest_open (path, &m) == 0);
  CHECK_EQ (fsc_manifest_size (m), size);
  CHECK_EQ (fsc_manifest_block_size (m), 4096);
  CHECK (strcmp (fsc_manifest_generation (m), "v7") == 0);
  CHECK (fsc_manifest_check (m, 0, img, size, &bad) == 0);
  CHECK (fsc_manifest_check (m, 4096 * 10, img + 4096 * 10, 1000, &bad) == 0);
  CHECK (fsc_manifest_check (m, 4096 * 3, img + 4096 * 3, 8192, &bad) == 0);

  /* bad */
  img[4096 * 5 + 17] ^= 1;
  CHECK (fsc_manifest_check (m, 0, img, size, &bad) == -1);
  CHECK_EQ (errno, EBADMSG);
  CHECK_EQ (bad, 4096 * 5);
  img[4096 * 5 + 17] ^= 1;

  /* align */
  CHECK (fsc_manifest_check (m, 100, img + 100, 4096, &bad) == -1);
  CHECK_EQ (errno, EINVAL);
  CHECK (fsc_manifest_check (m, 0, img, 4000, &bad) == -1);
  CHECK_EQ (errno, EINVAL);
  CHECK (fsc_manifest_check (m, 4096 * 10, img, 4096, &bad) == -1);
  CHECK_EQ (errno, EINVAL);                       /* past the end */
  fsc_manifest_close (m);

  /* root (M1): a digest, then the size field. */
  patch (FSC_MANIFEST_HEADER + 32 * 4 + 9, 0x40);
  CHECK (fsc_manifest_open (path, &m) == -1 && errno == EBADMSG);
  patch (FSC_MANIFEST_HEADER + 32 * 4 + 9, 0x40);
  CHECK (fsc_manifest_open (path, &m) == 0);
  fsc_manifest_close (m);
  patch (40, 0x01);                               /* the generation */
  CHECK (fsc_manifest_open (path, &m) == -1 && errno == EBADMSG);
  patch (40, 0x01);
  patch (16, 0x01);                               /* the size: count */
  CHECK (fsc_manifest_open (path, &m) == -1 &&
         (errno == EINVAL || errno == EBADMSG));
  patch (16, 0x01);

  /* shape */
  CHECK (truncate (path, FSC_MANIFEST_HEADER + 32) == 0);
  CHECK (fsc_manifest_open (path, &m) == -1 && errno == EINVAL);
  write_manifest (img, size, 12, "");
  patch (0, 0x20);
  CHECK (fsc_manifest_open (path, &m) == -1 && errno == EINVAL);

  /* missing */
  struct fsc_manifest_writer *w;
  CHECK (fsc_manifest_writer_new (size, 12, "", &w) == 0);
  CHECK (fsc_manifest_writer_add (w, 0, img, 4096) == 0);
  CHECK (fsc_manifest_writer_add (w, 10, img, 4096) == -1);  /* length */
  fd = open (path, O_WRONLY | O_TRUNC);
  CHECK (fsc_manifest_writer_finish (w, fd, NULL) == -1 && errno == EINVAL);
  close (fd);

  free (img);
  unlink (path);
  printf ("unit-manifest: OK\n");
  return 0;
}
