/* Unit test of core/base/io.c's note of reads that needed the disk
 * (fsc_io_disk_touched) and of their time (fsc_io_disk_ns), which the
 * latency guard uses to tell a slow disk from a busy CPU and to time
 * the disk (core/ops/guard.c).
 *
 * Truth: the page cache itself.  Pages just written are there; after
 * fdatasync and POSIX_FADV_DONTNEED they are not (on a file system
 * with a page cache: the test's file is in the build tree, and on
 * tmpfs, whose pages cannot be dropped, it skips); readahead is off
 * for the file (POSIX_FADV_RANDOM), so that a read brings in only its
 * own pages.  Every read's bytes are compared with what was written.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "io.h"
#include "unit.h"

#define SIZE (1024 * 1024)
#define TMPFS_MAGIC 0x01021994

static unsigned char data[SIZE], buf[SIZE];

static void
drop (int fd)
{
  CHECK (fdatasync (fd) == 0);
  CHECK (posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
}

/* Whether all of [OFF, OFF+N) is in the page cache now (mincore). */
static bool
in_core (int fd, uint64_t off, size_t n)
{
  const size_t pg = (size_t) sysconf (_SC_PAGESIZE);
  void *p = mmap (NULL, SIZE, PROT_READ, MAP_SHARED, fd, 0);
  CHECK (p != MAP_FAILED);
  unsigned char vec[SIZE / 4096 + 1];
  CHECK (mincore (p, SIZE, vec) == 0);
  bool all = true;
  for (uint64_t a = off / pg; a < (off + n + pg - 1) / pg; ++a)
    all = all && (vec[a] & 1);
  CHECK (munmap (p, SIZE) == 0);
  return all;
}

/* Read N bytes at OFF as a data file; returns whether the disk was
 * needed, having checked the bytes.
 */
static bool
read_data (struct fsc_io *io, int kind, int fd, size_t n, uint64_t off)
{
  fsc_io_disk_mark ();
  CHECK_EQ (fsc_io_pread (io, kind, fd, buf, n, off), n);
  CHECK (memcmp (buf, data + off, n) == 0);
  /* The time of the disk's reads is kept for those alone (the guard
   * times a hit by them): some for a read of the disk, none else.
   */
  CHECK ((fsc_io_disk_ns () > 0) == fsc_io_disk_touched ());
  return fsc_io_disk_touched ();
}

int
main (void)
{
  char path[] = "unit-io.XXXXXX";
  int fd = mkstemp (path);
  CHECK (fd >= 0);
  unlink (path);
  struct statfs sf;
  CHECK (fstatfs (fd, &sf) == 0);
  if (sf.f_type == TMPFS_MAGIC) {
    printf ("unit-io: on tmpfs, whose pages cannot be dropped: skip\n");
    return 77;
  }
  for (size_t i = 0; i < SIZE; ++i)
    data[i] = (unsigned char) (i * 2654435761u >> 13);
  CHECK_EQ (pwrite (fd, data, SIZE, 0), SIZE);
  CHECK (posix_fadvise (fd, 0, 0, POSIX_FADV_RANDOM) == 0);
  struct fsc_io io;
  CHECK (fsc_io_init (&io, NULL) == 0);

  /* 1. Just written: in the page cache, the disk not needed. */
  CHECK (!read_data (&io, FSC_FILE_DATA, fd, 65536, 0));
  CHECK (!read_data (&io, FSC_FILE_DATA, fd, SIZE, 0));

  /* 2. Dropped: the disk needed, the bytes right. */
  drop (fd);
  CHECK (read_data (&io, FSC_FILE_DATA, fd, 65536, 131072));
  /* ... and now there again. */
  CHECK (!read_data (&io, FSC_FILE_DATA, fd, 65536, 131072));

  /* 3. Half there: the first 32 KiB read in, the next 32 not.  The
   * kernel may read more than asked (a large folio): then the next 32
   * are there too, which the page cache says, and the disk is not
   * needed (seen once in seven runs, stop 59).
   */
  drop (fd);
  CHECK (read_data (&io, FSC_FILE_DATA, fd, 32768, 262144));
  bool rest_there = in_core (fd, 262144 + 32768, 32768);
  if (rest_there)
    printf ("unit-io: the kernel read the second half with the first\n");
  CHECK (read_data (&io, FSC_FILE_DATA, fd, 65536, 262144) == !rest_there);
  CHECK (!read_data (&io, FSC_FILE_DATA, fd, 65536, 262144));

  /* 4. The mark is per read: a later read from memory is not the
   * disk's because an earlier one was.
   */
  drop (fd);
  CHECK (read_data (&io, FSC_FILE_DATA, fd, 4096, 524288));
  CHECK (!read_data (&io, FSC_FILE_DATA, fd, 4096, 524288));

  /* 5. Other files than data are read plainly and never noted. */
  drop (fd);
  CHECK (!read_data (&io, FSC_FILE_INDEX, fd, 4096, 655360));

  /* 6. The end of the file: a short read, as before. */
  fsc_io_disk_mark ();
  CHECK_EQ (fsc_io_pread (&io, FSC_FILE_DATA, fd, buf, 8192, SIZE - 4096),
            4096);
  CHECK (memcmp (buf, data + SIZE - 4096, 4096) == 0);

  close (fd);
  printf ("unit-io: OK\n");
  return 0;
}
