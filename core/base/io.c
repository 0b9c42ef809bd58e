/* libfscache: the cache's file I/O, with fault injection for tests.
 * See io.h for the fault spec.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "io.h"
#include "utils.h"

static int
parse_errno (const char *s)
{
  if (strcmp (s, "EIO") == 0) return EIO;
  if (strcmp (s, "ENOSPC") == 0) return ENOSPC;
  if (strcmp (s, "EROFS") == 0) return EROFS;
  if (strcmp (s, "EDQUOT") == 0) return EDQUOT;
  if (strcmp (s, "ENOMEM") == 0) return ENOMEM;
  if (strcmp (s, "EINVAL") == 0) return EINVAL;
  return -1;
}

int
fsc_io_init (struct fsc_io *io, const char *spec)
{
  memset (io, 0, sizeof *io);
  io->trace = NULL;
  io->trace_opaque = NULL;
  if (spec == NULL || *spec == '\0')
    return 0;

  char *copy = strdup (spec);
  if (copy == NULL)
    return -1;
  char *save = NULL;
  for (char *item = strtok_r (copy, ",", &save); item != NULL;
       item = strtok_r (NULL, ",", &save)) {
    char op[16], kind[16], nth[32], err[16] = "EIO";
    struct fsc_fault f = { 0 };
    int n = sscanf (item, "%15[^:]:%15[^:]:%31[^:]:%15s", op, kind, nth, err);
    if (n < 3 || io->nfaults >= FSC_IO_MAX_FAULTS)
      goto bad;
    if (strcmp (op, "read") == 0) f.op = FSC_OP_READ;
    else if (strcmp (op, "write") == 0) f.op = FSC_OP_WRITE;
    else if (strcmp (op, "sync") == 0) f.op = FSC_OP_SYNC;
    else goto bad;
    if (strcmp (kind, "data") == 0) f.kind = FSC_FILE_DATA;
    else if (strcmp (kind, "index") == 0) f.kind = FSC_FILE_INDEX;
    else if (strcmp (kind, "sums") == 0) f.kind = FSC_FILE_SUMS;
    else if (strcmp (kind, "wlog") == 0) f.kind = FSC_FILE_WLOG;
    else if (strcmp (kind, "any") == 0) f.kind = -1;
    else goto bad;
    char *end;
    errno = 0;
    f.nth = strtoull (nth, &end, 10);
    if (errno != 0 || end == nth || f.nth == 0)
      goto bad;
    if (*end == '+') { f.sticky = true; end++; }
    if (*end != '\0')
      goto bad;
    f.err = parse_errno (err);
    if (f.err < 0)
      goto bad;
    io->faults[io->nfaults++] = f;
  }
  free (copy);
  return 0;

 bad:
  free (copy);
  memset (io, 0, sizeof *io);
  io->trace = NULL;
  errno = EINVAL;
  return -1;
}

/* Count one call of OP on KIND and return the errno to inject, or 0. */
static int
fault (struct fsc_io *io, int op, int kind)
{
  uint64_t nkind = __atomic_add_fetch (&io->calls[op][kind], 1,
                                       __ATOMIC_RELAXED);
  if (io->nfaults == 0)
    return 0;
  uint64_t nany = 0;
  for (int k = 0; k < FSC_FILE_KINDS; ++k)
    nany += __atomic_load_n (&io->calls[op][k], __ATOMIC_RELAXED);
  for (unsigned i = 0; i < io->nfaults; ++i) {
    const struct fsc_fault *f = &io->faults[i];
    if (f->op != op || (f->kind != -1 && f->kind != kind))
      continue;
    uint64_t n = f->kind == -1 ? nany : nkind;
    if (n == f->nth || (f->sticky && n > f->nth)) {
      __atomic_add_fetch (&io->injected, 1, __ATOMIC_RELAXED);
      return f->err;
    }
  }
  return 0;
}

static __thread bool disk_touched;
static __thread uint64_t disk_ns;
static bool nowait_off;         /* atomic: RWF_NOWAIT refused once */

void
fsc_io_disk_mark (void)
{
  disk_touched = false;
  disk_ns = 0;
}

bool
fsc_io_disk_touched (void)
{
  return disk_touched;
}

uint64_t
fsc_io_disk_ns (void)
{
  return disk_ns;
}

/* pread of a data file: up to N bytes at OFF into BUF from the page
 * cache alone, and if none of them is there, from the disk (noted in
 * disk_touched, its time added to disk_ns: the clock is read for a
 * read that goes to the disk, not twice for every hit).  Where
 * RWF_NOWAIT is refused, a plain pread, counted as the disk's.
 */
static ssize_t
data_pread (int fd, void *buf, size_t n, uint64_t off)
{
#ifdef RWF_NOWAIT
  if (!__atomic_load_n (&nowait_off, __ATOMIC_RELAXED)) {
    struct iovec iov = { .iov_base = buf, .iov_len = n };
    ssize_t r = preadv2 (fd, &iov, 1, off, RWF_NOWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EOPNOTSUPP &&
                   errno != EINVAL && errno != ENOSYS))
      return r;         /* a short read: the rest next round; EINTR and
                         * real errors: the caller's */
    if (errno != EAGAIN)
      __atomic_store_n (&nowait_off, true, __ATOMIC_RELAXED);
  }
#endif
  disk_touched = true;
  const uint64_t t0 = fsc_mono_ns ();
  ssize_t r = pread (fd, buf, n, off);
  disk_ns += fsc_mono_ns () - t0;
  return r;
}

ssize_t
fsc_io_pread (struct fsc_io *io, int kind, int fd,
              void *buf, size_t n, uint64_t off)
{
  int e = fault (io, FSC_OP_READ, kind);
  if (e) {
    errno = e;
    return -1;
  }
  size_t done = 0;
  while (done < n) {
    char *p = (char *) buf + done;
    ssize_t r = kind == FSC_FILE_DATA
      ? data_pread (fd, p, n - done, off + done)
      : pread (fd, p, n - done, off + done);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0)
      break;
    done += r;
  }
  return done;
}

int
fsc_io_pwrite (struct fsc_io *io, int kind, int fd,
               const void *buf, size_t n, uint64_t off)
{
  int e = fault (io, FSC_OP_WRITE, kind);
  if (e) {
    errno = e;
    return -1;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t r = pwrite (fd, (const char *) buf + done, n - done, off + done);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0) {
      errno = ENOSPC;
      return -1;
    }
    done += r;
  }
  if (io->trace)
    io->trace (io->trace_opaque, FSC_OP_WRITE, kind, buf, n, off);
  return 0;
}

int
fsc_io_sync (struct fsc_io *io, int kind, int fd)
{
  int e = fault (io, FSC_OP_SYNC, kind);
  if (e) {
    errno = e;
    return -1;
  }
  if (fdatasync (fd) == -1)
    return -1;
  if (io->trace)
    io->trace (io->trace_opaque, FSC_OP_SYNC, kind, NULL, 0, 0);
  return 0;
}
