/* nbd-fscache manifest: read an image once and write its manifest (a
 * SHA-256 per block, core/base/manifest.c), which the fleet's nodes are
 * given as fscache-manifest= so that no peer's data enters a cache
 * unchecked (issue 43).  Published beside the image, by whoever
 * publishes the image: it pins that image, and its root, printed on
 * stderr, names it.
 *
 * A plain NBD client (libnbd): the image is read from URI (an nbdkit
 * serving the file, qemu-nbd, the origin itself) in chunks of whole
 * blocks (1 MiB, or the block size if larger), DEPTH reads in flight
 * on one connection, each chunk's blocks hashed as it arrives (in
 * libnbd's completion callback, in this one thread).
 *
 * The manifest goes to -o FILE (written beside it and renamed over it,
 * so that a node never reads half of one) or to stdout.
 *
 * Exit status: 0 written, 1 a failure (connection, read, write),
 * 2 a usage error.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libnbd.h>

#include "utils.h"
#include "manifest.h"

#include "nbd-fscache.h"

#define PROG "nbd-fscache"
#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define DEPTH 16
#define CHUNK (1024 * 1024)
/* The filter's default fscache-block-size: fills come in whole cache
 * blocks, so peers are asked for no more than a fill needs (at 1 MiB,
 * a fleet of three moved 1.5 times the bytes between peers).  32 MiB
 * of manifest per TiB of image at 1 MiB, 512 MiB at 64 KiB.
 */
#define DEFAULT_BLOCK (64 * 1024)

struct job {
  struct fsc_manifest_writer *w;
  uint64_t size, bs, chunk;
  uint64_t next;                        /* the next chunk's offset */
  unsigned inflight;
  int err;                              /* the first read error */
};

struct piece {
  struct job *j;
  uint64_t offset;
  uint64_t len;
  char *buf;
};

static int
piece_done (void *opaque, int *error)
{
  struct piece *p = opaque;
  struct job *j = p->j;
  j->inflight--;
  if (*error) {
    if (!j->err)
      j->err = *error;
  }
  else
    for (uint64_t o = 0; o < p->len; o += j->bs) {
      uint64_t n = MIN (j->bs, p->len - o);
      if (fsc_manifest_writer_add (j->w, (p->offset + o) / j->bs,
                                   p->buf + o, n) == -1 && !j->err)
        j->err = errno;
    }
  return 1;
}

/* libnbd's .free: after the callback, or at nbd_close for a read still
 * in flight.
 */
static void
piece_free (void *opaque)
{
  struct piece *p = opaque;
  free (p->buf);
  free (p);
}

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: " PROG " manifest [--block-size SIZE] [--generation GEN]\n"
           "                           [-o FILE] URI\n"
           "\n"
           "Read the image at the NBD URI once and write its manifest (a\n"
           "SHA-256 per block) to FILE or stdout, for the filter's\n"
           "fscache-manifest=FILE.  Its root is printed on stderr.\n"
           "\n"
           "  --block-size SIZE  a power of 2 from 4K to 32M (default 64K,\n"
           "                     the filter's fscache-block-size: a peer is\n"
           "                     asked for whole blocks, so a larger one\n"
           "                     costs peer bytes; 32 bytes per block)\n"
           "  --generation GEN   the image's version, as fscache-generation\n"
           "                     (nodes refuse a manifest of another one)\n"
           "  -o, --output FILE  write FILE (through a temporary file and\n"
           "                     a rename), not stdout\n");
}

/* Read the image at URI into W. 0, or -1 having said why. */
static int
read_image (struct nbd_handle *nbd, struct job *j)
{
  while (j->next < j->size || j->inflight) {
    while (j->next < j->size && j->inflight < DEPTH) {
      struct piece *p = calloc (1, sizeof *p);
      uint64_t len = MIN (j->chunk, j->size - j->next);
      if (p == NULL || (p->buf = malloc (len)) == NULL) {
        free (p);
        tool_error ("manifest: %s", strerror (ENOMEM));
        return -1;
      }
      *p = (struct piece) { .j = j, .offset = j->next, .len = len,
                            .buf = p->buf };
      if (nbd_aio_pread (nbd, p->buf, len, p->offset,
                         (nbd_completion_callback) { .callback = piece_done,
                                                     .user_data = p,
                                                     .free = piece_free }, 0)
          == -1) {
        /* (libnbd called .free) */
        tool_error ("manifest: reading at %" PRIu64 ": %s", j->next,
                    nbd_get_error ());
        return -1;
      }
      j->inflight++;
      j->next += len;
    }
    if (nbd_poll (nbd, -1) == -1) {
      tool_error ("manifest: %s", nbd_get_error ());
      return -1;
    }
    if (j->err) {
      tool_error ("manifest: reading the image: %s", strerror (j->err));
      return -1;
    }
  }
  return 0;
}

int
fscache_cmd_manifest (int argc, char **argv)
{
  static const struct option long_opts[] = {
    { "block-size", required_argument, NULL, 'b' },
    { "generation", required_argument, NULL, 'g' },
    { "output", required_argument, NULL, 'o' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 }
  };
  uint64_t bs = DEFAULT_BLOCK;
  const char *gen = "", *out = NULL;
  int c;
  optind = 1;
  while ((c = getopt_long (argc, argv, "b:g:o:h", long_opts, NULL)) != -1) {
    switch (c) {
    case 'b':
      if (tool_parse_size (optarg, &bs) == -1 || bs < 4096 ||
          bs > (UINT64_C (1) << FSC_MANIFEST_MAX_SHIFT) || (bs & (bs - 1))) {
        fprintf (stderr, PROG ": manifest: --block-size %s: a power of 2 "
                 "from 4K to 32M\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'g':
      if (strlen (optarg) > 255) {
        fprintf (stderr, PROG ": manifest: --generation: longer than 255 "
                 "bytes\n");
        return EXIT_USAGE;
      }
      gen = optarg;
      break;
    case 'o':
      out = optarg;
      break;
    case 'h':
      usage (stdout);
      return 0;
    default:
      usage (stderr);
      return EXIT_USAGE;
    }
  }
  if (optind != argc - 1) {
    usage (stderr);
    return EXIT_USAGE;
  }
  const char *uri = argv[optind];
  unsigned shift = (unsigned) __builtin_ctzll (bs);

  int status = EXIT_FAILED, fd = -1;
  char *tmp = NULL;
  struct job j = { .bs = bs, .chunk = MAX (bs, (uint64_t) CHUNK) };
  struct nbd_handle *nbd = nbd_create ();
  if (nbd == NULL || nbd_connect_uri (nbd, uri) == -1) {
    tool_error ("manifest: %s: %s", uri, nbd_get_error ());
    goto out;
  }
  int64_t size = nbd_get_size (nbd);
  if (size == -1) {
    tool_error ("manifest: %s: %s", uri, nbd_get_error ());
    goto out;
  }
  j.size = (uint64_t) size;
  if (fsc_manifest_writer_new (j.size, shift, gen, &j.w) == -1) {
    tool_error ("manifest: %s", strerror (errno));
    goto out;
  }
  if (read_image (nbd, &j) == -1)
    goto out;
  if (out) {
    if (asprintf (&tmp, "%s.tmp.%ld", out, (long) getpid ()) == -1) {
      tmp = NULL;
      tool_error ("manifest: %s", strerror (ENOMEM));
      goto out;
    }
    fd = open (tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd == -1) {
      tool_error ("manifest: %s: %s", tmp, strerror (errno));
      goto out;
    }
  }
  char root[65];
  struct fsc_manifest_writer *w = j.w;
  j.w = NULL;
  if (fsc_manifest_writer_finish (w, out ? fd : STDOUT_FILENO, root) == -1 ||
      (out && (fsync (fd) == -1 || close (fd) == -1))) {
    tool_error ("manifest: writing %s: %s", out ? tmp : "stdout",
                strerror (errno));
    goto out;
  }
  fd = -1;
  if (out && rename (tmp, out) == -1) {
    tool_error ("manifest: %s: %s", out, strerror (errno));
    goto out;
  }
  fprintf (stderr, "%s: manifest of %s: %" PRIu64 " bytes in blocks of %"
           PRIu64 ", root %s\n", PROG, uri, j.size, bs, root);
  status = 0;
 out:
  if (fd >= 0)
    close (fd);
  if (status != 0 && tmp)
    unlink (tmp);
  free (tmp);
  fsc_manifest_writer_free (j.w);
  if (nbd)
    nbd_close (nbd);
  return status;
}
