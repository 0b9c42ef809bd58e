/* libfscache: an image's manifest (issue 43).
 *
 * A fleet's node used to store whatever a peer sent it, and computed
 * its checksums from those bytes: one node with bad memory, a bug, or
 * the fleet's key could poison every asker's cache for good.  The
 * manifest pins the image instead, as BitTorrent's piece hashes,
 * Dragonfly's piece digests and dm-verity's tree do: a SHA-256 of each
 * block, written once by whoever publishes the image
 * (`nbd-fscache manifest`), read by every node, and every block from a
 * peer is checked against it before it enters the cache.
 *
 * The file (docs/format.md, "Image manifest"), little-endian:
 *
 *   header, 512 bytes: magic "FSCMNFST", version 1, the block size's
 *     log2, the image's size, the block count, the generation's
 *     length and the generation (up to 255 bytes, NUL-padded), the
 *     root, zeros;
 *   then a SHA-256 per block, in order (the last block's over its
 *     bytes only).
 *
 * The root is the SHA-256 of the header's first 296 bytes (its fields)
 * and the digests: it alone names the whole manifest, and a manifest
 * whose root does not match is refused whole (invariant M1: no block
 * is checked against a digest the root does not cover; unit-manifest
 * breaks a digest and a field and expects EBADMSG).
 *
 * SHA-256 from nettle, which uses the CPU's SHA extensions where it
 * has them.  Plain C, no nbdkit: -1 with errno, no printing.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nettle/sha2.h>

#include "utils.h"
#include "manifest.h"

#define MAGIC "FSCMNFST"
#define MANIFEST_VERSION 1
#define GEN_MAX 255
/* Header offsets. */
#define H_MAGIC 0
#define H_VERSION 8
#define H_SHIFT 12
#define H_SIZE 16
#define H_COUNT 24
#define H_GENLEN 32
#define H_GEN 40
#define H_ROOT (H_GEN + 256)            /* 296: the fields end here */

struct fsc_manifest {
  uint64_t size, count;
  unsigned shift;
  char gen[GEN_MAX + 1];
  uint8_t root[FSC_MANIFEST_DIGEST];
  uint8_t *digests;                     /* count * 32 */
};

struct fsc_manifest_writer {
  uint64_t size, count;
  unsigned shift;
  char gen[GEN_MAX + 1];
  uint8_t *digests;
  uint8_t *have;                        /* a bitmap of the blocks added */
};

static void
sha256 (const void *data, size_t len, uint8_t out[FSC_MANIFEST_DIGEST])
{
  struct sha256_ctx c;
  sha256_init (&c);
  sha256_update (&c, len, data);
  sha256_digest (&c, FSC_MANIFEST_DIGEST, out);
}

/* The block count of SIZE bytes in blocks of 2^SHIFT; false on a bad
 * shift.
 */
static bool
block_count (uint64_t size, unsigned shift, uint64_t *count)
{
  if (shift < FSC_MANIFEST_MIN_SHIFT || shift > FSC_MANIFEST_MAX_SHIFT)
    return false;
  *count = (size >> shift) + ((size & ((UINT64_C (1) << shift) - 1)) != 0);
  return true;
}

static void
root_of (const uint8_t *header, const uint8_t *digests, uint64_t count,
         uint8_t out[FSC_MANIFEST_DIGEST])
{
  struct sha256_ctx c;
  sha256_init (&c);
  sha256_update (&c, H_ROOT, header);
  /* In pieces: nettle's length is a size_t, the table may be large. */
  for (uint64_t done = 0; done < count; ) {
    uint64_t n = MIN (count - done, UINT64_C (1) << 20);
    sha256_update (&c, n * FSC_MANIFEST_DIGEST,
                   digests + done * FSC_MANIFEST_DIGEST);
    done += n;
  }
  sha256_digest (&c, FSC_MANIFEST_DIGEST, out);
}

static void
put_header (uint8_t *h, uint64_t size, uint64_t count, unsigned shift,
            const char *gen)
{
  memset (h, 0, FSC_MANIFEST_HEADER);
  memcpy (h + H_MAGIC, MAGIC, 8);
  put_le32 (h + H_VERSION, MANIFEST_VERSION);
  put_le32 (h + H_SHIFT, shift);
  put_le64 (h + H_SIZE, size);
  put_le64 (h + H_COUNT, count);
  size_t gl = strlen (gen);
  put_le32 (h + H_GENLEN, (uint32_t) gl);
  memcpy (h + H_GEN, gen, gl);
}

static int
read_all (int fd, void *buf, size_t len)
{
  for (size_t done = 0; done < len; ) {
    ssize_t r = read (fd, (char *) buf + done, len - done);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -1;
    if (r == 0) {
      errno = EINVAL;                   /* shorter than it says */
      return -1;
    }
    done += (size_t) r;
  }
  return 0;
}

static int
write_all (int fd, const void *buf, size_t len)
{
  for (size_t done = 0; done < len; ) {
    ssize_t r = write (fd, (const char *) buf + done, len - done);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -1;
    done += (size_t) r;
  }
  return 0;
}

int
fsc_manifest_open (const char *path, struct fsc_manifest **out)
{
  uint8_t h[FSC_MANIFEST_HEADER];
  struct fsc_manifest *m = NULL;
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return -1;
  struct stat st;
  if (fstat (fd, &st) == -1 || read_all (fd, h, sizeof h) == -1)
    goto fail;
  errno = EINVAL;
  if (memcmp (h + H_MAGIC, MAGIC, 8) != 0 ||
      get_le32 (h + H_VERSION) != MANIFEST_VERSION)
    goto fail;
  uint64_t count, bytes;
  unsigned shift = get_le32 (h + H_SHIFT);
  uint32_t gl = get_le32 (h + H_GENLEN);
  if (!block_count (get_le64 (h + H_SIZE), shift, &count) ||
      count != get_le64 (h + H_COUNT) || gl > GEN_MAX ||
      memchr (h + H_GEN, 0, gl) != NULL ||
      __builtin_mul_overflow (count, FSC_MANIFEST_DIGEST, &bytes) ||
      bytes > SIZE_MAX - FSC_MANIFEST_HEADER ||
      (uint64_t) st.st_size != FSC_MANIFEST_HEADER + bytes)
    goto fail;
  for (size_t i = H_GEN + gl; i < H_ROOT; ++i)
    if (h[i])
      goto fail;
  for (size_t i = H_ROOT + FSC_MANIFEST_DIGEST; i < sizeof h; ++i)
    if (h[i])
      goto fail;
  m = calloc (1, sizeof *m);
  if (m == NULL || (m->digests = malloc (bytes ? bytes : 1)) == NULL)
    goto fail;
  if (read_all (fd, m->digests, bytes) == -1)
    goto fail;
  m->size = get_le64 (h + H_SIZE);
  m->count = count;
  m->shift = shift;
  memcpy (m->gen, h + H_GEN, gl);
  memcpy (m->root, h + H_ROOT, FSC_MANIFEST_DIGEST);
  uint8_t root[FSC_MANIFEST_DIGEST];
  root_of (h, m->digests, count, root);
  if (memcmp (root, m->root, sizeof root) != 0) {     /* M1 */
    errno = EBADMSG;
    goto fail;
  }
  close (fd);
  *out = m;
  return 0;
 fail:;
  int e = errno;
  if (m)
    free (m->digests);
  free (m);
  close (fd);
  errno = e;
  return -1;
}

void
fsc_manifest_close (struct fsc_manifest *m)
{
  if (m) {
    free (m->digests);
    free (m);
  }
}

uint64_t
fsc_manifest_size (const struct fsc_manifest *m)
{
  return m->size;
}

uint32_t
fsc_manifest_block_size (const struct fsc_manifest *m)
{
  return UINT32_C (1) << m->shift;
}

const char *
fsc_manifest_generation (const struct fsc_manifest *m)
{
  return m->gen;
}

static void
hex (const uint8_t *d, size_t n, char *out)
{
  static const char x[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = x[d[i] >> 4];
    out[2 * i + 1] = x[d[i] & 15];
  }
  out[2 * n] = 0;
}

void
fsc_manifest_root_hex (const struct fsc_manifest *m, char out[65])
{
  hex (m->root, FSC_MANIFEST_DIGEST, out);
}

uint64_t
fsc_manifest_root64 (const struct fsc_manifest *m)
{
  return get_le64 (m->root);
}

int
fsc_manifest_check (const struct fsc_manifest *m, uint64_t offset,
                    const void *buf, uint64_t len, uint64_t *bad)
{
  uint64_t bs = UINT64_C (1) << m->shift, end;
  if ((offset & (bs - 1)) != 0 ||
      __builtin_add_overflow (offset, len, &end) || end > m->size ||
      ((end & (bs - 1)) != 0 && end != m->size)) {
    errno = EINVAL;
    return -1;
  }
  const uint8_t *p = buf;
  for (uint64_t o = offset; o < end; o += bs) {
    uint64_t n = MIN (bs, end - o);
    uint8_t d[FSC_MANIFEST_DIGEST];
    sha256 (p + (o - offset), n, d);
    if (memcmp (d, m->digests + (o >> m->shift) * FSC_MANIFEST_DIGEST,
                sizeof d) != 0) {
      *bad = o;
      errno = EBADMSG;
      return -1;
    }
  }
  return 0;
}

int
fsc_manifest_writer_new (uint64_t size, unsigned shift, const char *gen,
                         struct fsc_manifest_writer **out)
{
  uint64_t count, bytes;
  if (gen == NULL)
    gen = "";
  if (!block_count (size, shift, &count) || strlen (gen) > GEN_MAX ||
      __builtin_mul_overflow (count, FSC_MANIFEST_DIGEST, &bytes) ||
      bytes > SIZE_MAX - FSC_MANIFEST_HEADER) {
    errno = EINVAL;
    return -1;
  }
  struct fsc_manifest_writer *w = calloc (1, sizeof *w);
  if (w == NULL)
    return -1;
  w->size = size;
  w->count = count;
  w->shift = shift;
  strcpy (w->gen, gen);
  w->digests = malloc (bytes ? bytes : 1);
  w->have = calloc (count / 8 + 1, 1);
  if (w->digests == NULL || w->have == NULL) {
    fsc_manifest_writer_free (w);
    errno = ENOMEM;
    return -1;
  }
  *out = w;
  return 0;
}

int
fsc_manifest_writer_add (struct fsc_manifest_writer *w, uint64_t index,
                         const void *data, size_t len)
{
  uint64_t bs = UINT64_C (1) << w->shift;
  if (index >= w->count ||
      len != MIN (bs, w->size - (index << w->shift))) {
    errno = EINVAL;
    return -1;
  }
  sha256 (data, len, w->digests + index * FSC_MANIFEST_DIGEST);
  w->have[index / 8] |= (uint8_t) (1u << (index % 8));
  return 0;
}

int
fsc_manifest_writer_finish (struct fsc_manifest_writer *w, int fd,
                            char root_hex[65])
{
  int r = -1;
  for (uint64_t i = 0; i < w->count; ++i)
    if (!(w->have[i / 8] & (1u << (i % 8)))) {
      errno = EINVAL;
      goto out;
    }
  uint8_t h[FSC_MANIFEST_HEADER];
  put_header (h, w->size, w->count, w->shift, w->gen);
  uint8_t root[FSC_MANIFEST_DIGEST];
  root_of (h, w->digests, w->count, root);
  memcpy (h + H_ROOT, root, sizeof root);
  if (write_all (fd, h, sizeof h) == -1 ||
      write_all (fd, w->digests, w->count * FSC_MANIFEST_DIGEST) == -1)
    goto out;
  if (root_hex)
    hex (root, sizeof root, root_hex);
  r = 0;
 out:
  fsc_manifest_writer_free (w);
  return r;
}

void
fsc_manifest_writer_free (struct fsc_manifest_writer *w)
{
  if (w) {
    free (w->digests);
    free (w->have);
    free (w);
  }
}
