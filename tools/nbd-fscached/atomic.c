/* nbd-fscached: writing a small file atomically.
 *
 * Readers (the filter reading a quota record, a tool reading the
 * stats file) must see the old contents or the new, never a part: the
 * bytes go to NAME.tmp.PID in the same directory (O_EXCL; a leftover
 * of ours from an earlier failure is removed first), optionally synced,
 * and are renamed over NAME.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "fscached.h"

int
fscd_write_atomic (int dirfd, const char *name, const void *buf, size_t len,
                   bool sync)
{
  char tmp[320];
  int fd, e;

  if (snprintf (tmp, sizeof tmp, "%s.tmp.%ld", name, (long) getpid ()) >=
      (int) sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  unlinkat (dirfd, tmp, 0);
  fd = openat (dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
               0600);
  if (fd == -1)
    return -1;
  ssize_t n = write (fd, buf, len);
  if (n != (ssize_t) len) {
    if (n >= 0)
      errno = ENOSPC;
    goto err;
  }
  if ((sync && fdatasync (fd) == -1))
    goto err;
  if (close (fd) == -1) {
    fd = -1;
    goto err;
  }
  fd = -1;
  if (renameat (dirfd, tmp, dirfd, name) == -1)
    goto err;
  return 0;

 err:
  e = errno;
  if (fd >= 0)
    close (fd);
  unlinkat (dirfd, tmp, 0);
  errno = e;
  return -1;
}
