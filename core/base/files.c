/* libfscache: the object's file names, and opening and unlinking its
 * files (files.h).  The ground floor: nothing here calls another file
 * of libfscache but safeopen.c, so that the data segments, lookup,
 * eviction, withdrawal and sharing all name files the same way.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "files.h"
#include "safeopen.h"
#include "utils.h"

/* The name of the object's file with SUFFIX (".idx", ".data", ".sums",
 * ".stale") in its fan-out directory, in BUF.
 */
const char *
fsc_file_name (const struct fsc_files *f, const char *suffix,
               char buf[FILE_NAME_MAX])
{
  snprintf (buf, FILE_NAME_MAX, "%s%s", f->name, suffix);
  return buf;
}

void
fsc_unlink_file (const struct fsc_files *f, const char *suffix)
{
  char buf[FILE_NAME_MAX];
  unlinkat (f->fandirfd, fsc_file_name (f, suffix, buf), 0);
}

/* Does the stale mark exist? */
bool
fsc_stale_marked (const struct fsc_files *f)
{
  char buf[FILE_NAME_MAX];
  return f->fandirfd >= 0 &&
    faccessat (f->fandirfd, fsc_file_name (f, ".stale", buf), F_OK,
               AT_SYMLINK_NOFOLLOW) == 0;
}

/* We write upstream while another process holds this object: tell it
 * its copy is stale.  Best effort (if we cannot, its fingerprint check
 * at the next open is what is left).
 */
void
fsc_mark_stale (const struct fsc_files *f)
{
  char buf[FILE_NAME_MAX];
  int fd = fsc_open_regular (f->fandirfd, fsc_file_name (f, ".stale", buf),
                             O_WRONLY | O_CREAT, 0600);
  if (fd >= 0) {
    fsync (fd);
    close (fd);
    fsync (f->fandirfd);
  }
}

/* Open one of the object's files (internal.h). */
int
fsc_open_file_flags (const struct fsc_files *f, const char *suffix,
                     int flags)
{
  char buf[FILE_NAME_MAX];
  return fsc_openat_own (f->fandirfd, fsc_file_name (f, suffix, buf), flags);
}

int
fsc_openat_own (int dirfd, const char *name, int flags)
{
  struct stat st;

  /* Never a symlink, never waiting on a FIFO (safeopen.c rule 3). */
  int fd = fsc_open_regular (dirfd, name, flags, 0600);
  if (fd == -1)
    return -1;
  if (fstat (fd, &st) == -1 ||
      st.st_uid != geteuid () || st.st_nlink != 1) {
    close (fd);
    errno = EPERM;
    return -1;
  }
  /* Rule 4 of safeopen.c: 0600 whatever the umask was. */
  if ((flags & O_CREAT) && (st.st_mode & 07777) != 0600)
    (void) fchmod (fd, 0600);
  return fd;
}

int
fsc_open_file (const struct fsc_files *f, const char *suffix)
{
  return fsc_open_file_flags (f, suffix, O_RDWR | O_CREAT);
}

void
fsc_seg_suffix (uint64_t i, char buf[FSC_SEG_SUFFIX_MAX])
{
  if (i == 0)
    snprintf (buf, FSC_SEG_SUFFIX_MAX, ".data");
  else
    snprintf (buf, FSC_SEG_SUFFIX_MAX, ".data.%" PRIu64, i);
}

void
fsc_data_unlink (const struct fsc_object *o)
{
  uint64_t n = fsc_seg_count (o->geom.size);
  for (uint64_t i = 0; i < n; ++i) {
    char suffix[FSC_SEG_SUFFIX_MAX], name[FILE_NAME_MAX];
    fsc_seg_suffix (i, suffix);
    unlinkat (o->files.fandirfd, fsc_file_name (&o->files, suffix, name), 0);
  }
}

