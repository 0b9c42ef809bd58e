/* tools/common: culling one object, and the graveyard.
 *
 * The invariant (docs/format.md, "Culling"): no proxy ever opens a
 * half-deleted object.  It holds by three rules, in this order:
 *
 *   1. Lock first.  NAME.idx is opened (O_NOFOLLOW, never created) and
 *      locked with flock(LOCK_EX | LOCK_NB); if that fails the object
 *      is in use and is left alone.  After the lock, NAME.idx must
 *      still name the inode we locked and its mtime must be the one
 *      the scan saw: otherwise the object was withdrawn, recreated or
 *      used since, and is skipped (cachefilesd skips objects whose
 *      atime changed).  A proxy opening the object from now on finds
 *      it locked and serves that connection uncached.
 *      The write log NAME.wlog (fscache-mode=writeback), if there is
 *      one, is locked too (it has its own lock: a writeback proxy
 *      whose object was withdrawn, or nbd-fscache writeback, holds
 *      only that one): if that fails the object is in use.  Under the
 *      lock the log is read (fsc_wlog_inspect): one that holds data
 *      not yet written back, or that cannot be read, is the only copy
 *      of what a client wrote, and keeps the whole object
 *      (FSCD_CULL_DIRTY) unless the caller forces it (nbd-fscache
 *      invalidate --force).  A log that was not there when we looked
 *      is never removed: one created since is a proxy's.
 *   2. Index last.  Its files are renamed into DIR/graveyard under
 *      unique names, NAME.wlog (clean, or forced), NAME.data,
 *      NAME.sums, NAME.stale, NAME.quota and any other NAME.* first
 *      and NAME.idx last.  A proxy opening the
 *      object after the index has moved creates a new, empty object.
 *      A crash in between leaves an index without its data file: the
 *      filter discards such an object (data-file-size) and the next
 *      scan culls it first.
 *   3. Unlink, then unlock.  The renamed files are unlinked in the
 *      graveyard while the lock is still held.  Whatever is left in
 *      the graveyard is garbage: it is emptied at start.
 *
 * Files without any NAME.idx (left by a crash in the middle of a
 * withdrawal) have no lock to take; they are culled the same way once
 * NAME.idx is checked to be absent.
 *
 * For tests, NBD_FSCACHED_TEST_PAUSE_MS makes every rename and the
 * unlinks wait that long first, so that a test can kill the daemon in
 * the middle of a cull.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "objects.h"

#define GRAVEYARD "graveyard"
#define MAX_FILES 1100          /* NAME.* files handled per object: the
                                 * data segments of a 1 PiB export, and more */

static void
test_pause (const struct fscd_grave *g)
{
  if (g->pause_ms > 0) {
    struct timespec ts = { g->pause_ms / 1000,
                           (long) (g->pause_ms % 1000) * 1000000 };
    while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
      ;
  }
}

/* Remove everything inside directory FD (not FD itself). */
static int
remove_inside (int fd, unsigned depth)
{
  int ret = 0;
  int dfd = openat (fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd == -1)
    return -1;
  DIR *dir = fdopendir (dfd);
  if (dir == NULL) {
    close (dfd);
    return -1;
  }
  struct dirent *d;
  while ((d = readdir (dir)) != NULL) {
    if (strcmp (d->d_name, ".") == 0 || strcmp (d->d_name, "..") == 0)
      continue;
    if (unlinkat (fd, d->d_name, 0) == 0 || errno == ENOENT)
      continue;
    if ((errno == EISDIR || errno == EPERM) && depth < 8) {
      int sub = openat (fd, d->d_name,
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        if (remove_inside (sub, depth + 1) == -1)
          ret = -1;
        close (sub);
        if (unlinkat (fd, d->d_name, AT_REMOVEDIR) == 0)
          continue;
      }
    }
    fscd_log (LOG_WARNING, "graveyard: cannot remove %s: %s",
              d->d_name, strerror (errno));
    ret = -1;
  }
  closedir (dir);
  return ret;
}

int
fscd_grave_open (int dirfd, struct fscd_grave *g)
{
  struct stat st;
  const char *pause = getenv ("NBD_FSCACHED_TEST_PAUSE_MS");

  g->fd = -1;
  g->seq = 0;
  g->pause_ms = pause ? (unsigned) strtoul (pause, NULL, 10) : 0;
  if (mkdirat (dirfd, GRAVEYARD, 0700) == -1 && errno != EEXIST)
    return -1;
  g->fd = openat (dirfd, GRAVEYARD,
                  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (g->fd == -1)
    return -1;
  if (fstat (g->fd, &st) == -1)
    goto err;
  if (st.st_uid != geteuid () || (st.st_mode & S_IWOTH)) {
    errno = EPERM;
    goto err;
  }
  if (remove_inside (g->fd, 0) == -1)
    fscd_log (LOG_WARNING, "graveyard: could not be emptied entirely");
  return 0;

 err:;
  int e = errno;
  close (g->fd);
  g->fd = -1;
  errno = e;
  return -1;
}

void
fscd_grave_close (struct fscd_grave *g)
{
  if (g->fd >= 0)
    close (g->fd);
  g->fd = -1;
}

static bool
same_time (const struct timespec *a, const struct timespec *b)
{
  return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* The files of NAME in FANFD, in cull order, index last (the write
 * log only WITH_WLOG, first).  Returns the count, or -1.
 */
static int
list_files (int fanfd, const char *name, bool with_idx, bool with_wlog,
            char *files[MAX_FILES])
{
  static const char *const fixed[] = { ".data", ".sums", ".stale", ".quota" };
  size_t len = strlen (name);
  int n = 0;

  if (with_wlog) {
    if (asprintf (&files[n], "%s.wlog", name) == -1)
      goto err;
    n++;
  }
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; ++i) {
    if (asprintf (&files[n], "%s%s", name, fixed[i]) == -1)
      goto err;
    n++;
  }
  /* Any other NAME.* (a quota record's temporary file, say). */
  int dfd = openat (fanfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *dir = dfd >= 0 ? fdopendir (dfd) : NULL;
  if (dir == NULL) {
    if (dfd >= 0)
      close (dfd);
    goto err;
  }
  struct dirent *d;
  while ((d = readdir (dir)) != NULL && n < MAX_FILES - 1) {
    const char *suffix = d->d_name + len;
    if (strncmp (d->d_name, name, len) != 0 || *suffix != '.')
      continue;
    bool known = strcmp (suffix, ".idx") == 0 ||
      strcmp (suffix, ".wlog") == 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; ++i)
      known = known || strcmp (suffix, fixed[i]) == 0;
    if (known)
      continue;
    if ((files[n] = strdup (d->d_name)) == NULL) {
      closedir (dir);
      goto err;
    }
    n++;
  }
  closedir (dir);
  if (with_idx) {
    if (asprintf (&files[n], "%s.idx", name) == -1)
      goto err;
    n++;
  }
  return n;

 err:
  while (n > 0)
    free (files[--n]);
  return -1;
}

/* Rule 1 for the write log of NAME: lock it, look at it.  *WFD gets
 * the locked descriptor (kept until the files are unlinked), or -1;
 * *TAKE says whether NAME.wlog goes with the object.
 */
static enum fscd_cull_result
lock_wlog (int fanfd, const char *fanname, const char *name, unsigned flags,
           int *wfd, bool *take)
{
  char file[300];
  struct stat st;
  uint64_t bytes;

  *wfd = -1;
  *take = false;
  if (flags & FSCD_CULL_KEEP_WLOG)
    return FSCD_CULLED;
  snprintf (file, sizeof file, "%s.wlog", name);
  /* O_NONBLOCK: a FIFO planted as the log is never waited on (its type
   * is checked below).
   */
  int fd = openat (fanfd, file,
                   O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd == -1) {
    if (errno == ENOENT)
      return FSCD_CULLED;       /* none: none will be taken */
    if (errno == ELOOP) {
      *take = true;             /* a link: no log of the filter's */
      return FSCD_CULLED;
    }
    fscd_log (LOG_ERR, "%s/%s: %s", fanname, file, strerror (errno));
    return FSCD_CULL_ERROR;
  }
  if (fstat (fd, &st) == -1) {
    fscd_log (LOG_ERR, "%s/%s: %s", fanname, file, strerror (errno));
    close (fd);
    return FSCD_CULL_ERROR;
  }
  if (!S_ISREG (st.st_mode)) {
    close (fd);
    *take = true;
    return FSCD_CULLED;
  }
  if (flock (fd, LOCK_EX | LOCK_NB) == -1) {
    int e = errno;
    close (fd);
    if (e == EWOULDBLOCK)
      return FSCD_CULL_BUSY;
    fscd_log (LOG_ERR, "%s/%s: flock: %s", fanname, file, strerror (e));
    return FSCD_CULL_ERROR;
  }
  if (fscd_wlog_dirty (fanfd, name, &bytes, NULL) &&
      !(flags & FSCD_CULL_FORCE)) {
    fscd_debug (1, "%s/%s: holds dirty data (%" PRIu64 " bytes): kept",
                fanname, file, bytes);
    close (fd);
    return FSCD_CULL_DIRTY;
  }
  *wfd = fd;
  *take = true;
  return FSCD_CULLED;
}

enum fscd_cull_result
fscd_cull (int objdirfd, struct fscd_grave *g, const struct fscd_object *o,
           unsigned flags, uint64_t *freed, unsigned *nfiles)
{
  char fanname[4], idx[300];
  char *files[MAX_FILES];
  char *grave[MAX_FILES];
  int nf = 0, nmoved = 0;
  int ifd = -1, wfd = -1;
  bool take_wlog = false;
  struct stat st, st2;
  enum fscd_cull_result ret = FSCD_CULL_ERROR;
  bool with_idx = (o->files & FSCD_F_IDX) != 0;

  *freed = 0;
  *nfiles = 0;
  snprintf (idx, sizeof idx, "%s.idx", o->name);
  int fanfd = fscd_open_fan (objdirfd, o->fan, fanname);
  if (fanfd == -1) {
    if (errno == ENOENT)
      return FSCD_CULL_CHANGED;
    fscd_log (LOG_ERR, "objects/%s: %s", fanname, strerror (errno));
    return FSCD_CULL_ERROR;
  }

  /* Rule 1: lock, then check it is still the object we scanned. */
  if (with_idx) {
    ifd = openat (fanfd, idx, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
                  O_NOCTTY);
    if (ifd == -1) {
      ret = errno == ENOENT || errno == ELOOP ? FSCD_CULL_CHANGED
                                              : FSCD_CULL_ERROR;
      if (ret == FSCD_CULL_ERROR)
        fscd_log (LOG_ERR, "%s/%s: %s", fanname, idx, strerror (errno));
      goto out;
    }
    if (fstat (ifd, &st) == -1 || !S_ISREG (st.st_mode) ||
        st.st_dev != o->dev || st.st_ino != o->ino ||
        !same_time (&st.st_mtim, &o->mtime)) {
      ret = FSCD_CULL_CHANGED;
      goto out;
    }
    if (flock (ifd, LOCK_EX | LOCK_NB) == -1) {
      if (errno == EWOULDBLOCK)
        ret = FSCD_CULL_BUSY;
      else
        fscd_log (LOG_ERR, "%s/%s: flock: %s", fanname, idx, strerror (errno));
      goto out;
    }
    if (fstat (ifd, &st) == -1 || st.st_nlink == 0 ||
        !same_time (&st.st_mtim, &o->mtime) ||
        fstatat (fanfd, idx, &st2, AT_SYMLINK_NOFOLLOW) == -1 ||
        st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
      ret = FSCD_CULL_CHANGED;
      goto out;
    }
  }
  else if (faccessat (fanfd, idx, F_OK, AT_SYMLINK_NOFOLLOW) == 0 ||
           errno != ENOENT) {
    ret = FSCD_CULL_CHANGED;    /* an index appeared: a proxy's now */
    goto out;
  }
  /* The write log: locked, and clean (or forced). */
  ret = lock_wlog (fanfd, fanname, o->name, flags, &wfd, &take_wlog);
  if (ret != FSCD_CULLED)
    goto out;
  ret = FSCD_CULL_ERROR;

  /* Rule 2: into the graveyard, index last. */
  nf = list_files (fanfd, o->name, with_idx, take_wlog, files);
  if (nf == -1) {
    fscd_log (LOG_ERR, "%s/%s: %s", fanname, o->name, strerror (errno));
    nf = 0;
    goto out;
  }
  for (int i = 0; i < nf; ++i) {
    struct stat fst;
    if (fstatat (fanfd, files[i], &fst, AT_SYMLINK_NOFOLLOW) == -1) {
      if (errno == ENOENT)
        continue;
      fscd_log (LOG_ERR, "%s/%s: %s", fanname, files[i], strerror (errno));
      goto unlink;
    }
    const char *suffix = files[i] + strlen (o->name);
    char *gname;
    for (;;) {
      if (asprintf (&gname, "%jd.%" PRIu64 "%s", (intmax_t) getpid (),
                    g->seq++, suffix) == -1) {
        fscd_log (LOG_ERR, "%s", strerror (errno));
        goto unlink;
      }
      test_pause (g);
      int r = renameat2 (fanfd, files[i], g->fd, gname, RENAME_NOREPLACE);
      if (r == -1 && errno == EINVAL) {
        /* No RENAME_NOREPLACE here: check by hand (we are the only
         * writer of the graveyard).
         */
        if (faccessat (g->fd, gname, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
          errno = EEXIST;
        else
          r = renameat (fanfd, files[i], g->fd, gname);
      }
      if (r == 0)
        break;
      int e = errno;
      free (gname);
      if (e == EEXIST)
        continue;
      if (e == ENOENT)
        goto next;
      fscd_log (LOG_ERR, "%s/%s: rename into the graveyard: %s",
                fanname, files[i], strerror (e));
      goto unlink;
    }
    fscd_debug (3, "%s/%s -> graveyard/%s", fanname, files[i], gname);
    grave[nmoved++] = gname;
    {
      uint64_t b = 0;
      if (fst.st_blocks > 0 &&
          __builtin_mul_overflow ((uint64_t) fst.st_blocks, 512, &b))
        b = UINT64_MAX;
      if (__builtin_add_overflow (*freed, b, freed))
        *freed = UINT64_MAX;
    }
  next:;
  }
  ret = FSCD_CULLED;

  /* Rule 3: unlink, and only then unlock (close). */
 unlink:
  if (nmoved > 0)
    test_pause (g);
  for (int i = 0; i < nmoved; ++i) {
    if (unlinkat (g->fd, grave[i], 0) == -1 && errno != ENOENT)
      fscd_log (LOG_WARNING, "graveyard/%s: %s", grave[i], strerror (errno));
    free (grave[i]);
  }
  *nfiles = (unsigned) nmoved;
 out:
  for (int i = 0; i < nf; ++i)
    free (files[i]);
  if (wfd >= 0)
    close (wfd);
  if (ifd >= 0)
    close (ifd);
  close (fanfd);
  return ret;
}
