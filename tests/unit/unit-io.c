/* Unit test of core/base/io.c's note of reads that needed the disk
 * (fsc_io_disk_touched), which the latency guard uses to tell a slow
 * disk from a busy CPU (core/ops/guard.c).
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

/* Read N bytes at OFF as a data file; returns whether the disk was
 * needed, having checked the bytes.
 */
static bool
read_data (struct fsc_io *io, int kind, int fd, size_t n, uint64_t off)
{
  fsc_io_disk_mark ();
  CHECK_EQ (fsc_io_pread (io, kind, fd, buf, n, off), n);
  CHECK (memcmp (buf, data + off, n) == 0);
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

  /* 3. Half there: the first 32 KiB read in, the next 32 not. */
  drop (fd);
  CHECK (read_data (&io, FSC_FILE_DATA, fd, 32768, 262144));
  CHECK (read_data (&io, FSC_FILE_DATA, fd, 65536, 262144));
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
