/* libfscache: opening the cache's directories and files so that no
 * other local user can redirect or replace them.
 *
 * The trust model (docs/design.md, "One cache for the whole host"):
 * only the effective user (root, when we run as root) may write the
 * cache directory, objects/ and every @xx fan-out directory.  Anyone
 * else who can write one of them could plant a file, a socket or a
 * symlink there and make us serve their bytes or scribble over theirs.
 *
 * 1. A directory of the cache (the cache directory, objects/, @xx) is
 *    owned by the effective user and writable by nobody else (no group
 *    or other write bit).  fsc_own_dir_check refuses anything else,
 *    with the reason.
 * 2. The path to the cache directory cannot be redirected: it is
 *    walked one component at a time (fsc_safe_open_dir).  Every
 *    directory on the way is owned by root or by us, and a directory
 *    others may write is passed only if it is sticky (/tmp: then the
 *    next component, which must be root's or ours, cannot be renamed
 *    or removed by them).  A symlink on the way is followed only if it
 *    is root's or ours and lies in a directory nobody else may write
 *    (or a sticky one): a symlink planted by someone else, anywhere on
 *    the path, is refused.  ".." is resolved against the directory the
 *    walk has reached (its symlinks resolved), as the kernel does.
 * 3. Files are opened with O_NOFOLLOW | O_NONBLOCK and their type is
 *    checked with fstat before use (fsc_open_regular): a FIFO, a
 *    device or a socket in place of an object file is refused without
 *    ever waiting on it, a symlink fails with ELOOP.
 * 4. Modes do not depend on the umask: what we create is fchmod'ed to
 *    0700 (directories) or 0600 (files).
 *
 * Functions here return -1 with errno and, where they take a WHY
 * buffer, a one-line reason in it; they never print.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safeopen.h"
#include "utils.h"

#define MAX_SYMLINKS 40

static void __attribute__ ((format (printf, 3, 4)))
say (char *why, size_t len, const char *fmt, ...)
{
  va_list ap;

  if (why == NULL || len == 0)
    return;
  va_start (ap, fmt);
  vsnprintf (why, len, fmt, ap);
  va_end (ap);
}

int
fsc_own_dir_check (int fd, const char *what, char *why, size_t len)
{
  struct stat st;

  if (fstat (fd, &st) == -1) {
    say (why, len, "%s: %s", what, strerror (errno));
    return -1;
  }
  if (!S_ISDIR (st.st_mode)) {
    say (why, len, "%s: not a directory", what);
    errno = ENOTDIR;
    return -1;
  }
  if (st.st_uid != geteuid ()) {
    say (why, len, "%s: refused: owned by another user (uid %d, not uid "
         "%d who runs this)", what, (int) st.st_uid, (int) geteuid ());
    errno = EPERM;
    return -1;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    say (why, len, "%s: refused: writable by others (by %s, mode %04o): "
         "only its owner may write it (chmod go-w)", what,
         (st.st_mode & S_IWOTH) ? "everyone" : "its group",
         (unsigned) (st.st_mode & 07777));
    errno = EPERM;
    return -1;
  }
  return 0;
}

int
fsc_own_subdir (int dirfd, const char *name, bool create, const char *what,
                char *why, size_t len)
{
  bool made = false;

  if (create) {
    if (mkdirat (dirfd, name, 0700) == 0)
      made = true;
    else if (errno != EEXIST) {
      say (why, len, "%s: mkdir: %s", what, strerror (errno));
      return -1;
    }
  }
  int fd = openat (dirfd, name,
                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1) {
    int e = errno;
    if (e == ELOOP || e == ENOTDIR)
      say (why, len, "%s: refused: not a directory (a symlink or "
           "another kind of file)", what);
    else
      say (why, len, "%s: %s", what, strerror (e));
    errno = e == ELOOP ? ENOTDIR : e;
    return -1;
  }
  /* Rule 4: ours is 0700 whatever the umask was. */
  if (made)
    (void) fchmod (fd, 0700);
  if (fsc_own_dir_check (fd, what, why, len) == -1) {
    int e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* May others than root and us write the directory ST?  Then it can be
 * passed only if it is sticky.
 */
static bool
others_write (const struct stat *st)
{
  return (st->st_mode & (S_IWGRP | S_IWOTH)) != 0;
}

static bool
trusted_owner (uid_t uid)
{
  return uid == 0 || uid == geteuid ();
}

/* Normalise PATH (absolute) into OUT: no "." components, no repeated
 * or trailing slashes.  ".." is kept: the walk resolves it against the
 * directory it has reached, as the kernel does after a symlink.
 * Returns 0 or -1 (ENAMETOOLONG).
 */
static int
normalise (const char *path, char *out, size_t outlen)
{
  size_t n = 0;
  const char *p = path;

  out[n++] = '/';
  while (*p) {
    while (*p == '/')
      p++;
    const char *s = p;
    while (*p && *p != '/')
      p++;
    size_t l = p - s;
    if (l == 0 || (l == 1 && s[0] == '.'))
      continue;
    if (n + l + 2 > outlen) {
      errno = ENAMETOOLONG;
      return -1;
    }
    memcpy (out + n, s, l);
    n += l;
    out[n++] = '/';
  }
  if (n > 1)
    n--;
  out[n] = '\0';
  return 0;
}

/* PATH made absolute into FULL (PATH_MAX).  0, or -1 (said in WHY). */
static int
absolute (const char *path, char *full, char *why, size_t len)
{
  if (path == NULL || *path == '\0') {
    say (why, len, "empty cache directory path");
    errno = EINVAL;
    return -1;
  }
  if (*path != '/') {
    CLEANUP_FREE char *cwd = getcwd (NULL, 0);
    if (cwd == NULL) {
      say (why, len, "%s: getcwd: %s", path, strerror (errno));
      return -1;
    }
    if (snprintf (full, PATH_MAX, "%s/%s", cwd, path) >= PATH_MAX) {
      errno = ENAMETOOLONG;
      say (why, len, "%s: %s", path, strerror (errno));
      return -1;
    }
  }
  else if (snprintf (full, PATH_MAX, "%s", path) >= PATH_MAX) {
    errno = ENAMETOOLONG;
    say (why, len, "%s: %s", path, strerror (errno));
    return -1;
  }
  return 0;
}

/* May the walk go on in directory FD (WALKED, "" for /)?  Not if it is
 * another user's, or others may write it and it is not sticky.  0, or
 * -1 with errno (said in WHY).
 */
static int
dir_trusted (int fd, const char *walked, const char *path, char *why,
             size_t len)
{
  struct stat dst;
  const char *dname = *walked ? walked : "/";
  if (fstat (fd, &dst) == -1) {
    int e = errno;
    say (why, len, "%s: %s", *walked ? walked : path, strerror (e));
    errno = e;
    return -1;
  }
  if (!trusted_owner (dst.st_uid)) {
    say (why, len, "%s: refused: the cache path lies in %s, a directory "
         "owned by another user", path, dname);
    errno = EPERM;
    return -1;
  }
  if (others_write (&dst) && !(dst.st_mode & S_ISVTX)) {
    say (why, len, "%s: refused: the cache path lies in %s, a directory "
         "others may write (and not sticky)", path, dname);
    errno = EPERM;
    return -1;
  }
  return 0;
}

/* Stat NAME in FD without following it; if missing and CREATE, create
 * it first, ours, 0700 whatever the umask.  0, or -1 with errno.
 */
static int
stat_or_create (int fd, const char *name, bool create, struct stat *st)
{
  if (fstatat (fd, name, st, AT_SYMLINK_NOFOLLOW) == 0)
    return 0;
  if (errno != ENOENT || !create)
    return -1;
  if (mkdirat (fd, name, 0700) == 0) {
    int nfd = openat (fd, name,
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd >= 0) {
      (void) fchmod (nfd, 0700);
      close (nfd);
    }
  }
  else if (errno != EEXIST)
    return -1;
  return fstatat (fd, name, st, AT_SYMLINK_NOFOLLOW);
}

/* Say errno's error at WALKED (or PATH, if nothing was walked yet). */
static void
say_errno (char *why, size_t len, const char *walked, const char *path)
{
  int e = errno;
  say (why, len, "%s: %s", *walked ? walked : path, strerror (e));
  errno = e;
}

/* Rule 2: follow only a link that nobody else planted or can replace.
 * NAME in FD is a symlink (ST), WALKED its path (the link's directory
 * ends at WL): the path to walk next, its target and then the rest P,
 * into FULL.  0, or -1 with errno (said).
 */
static int
through_link (int fd, const char *name, const struct stat *st, char *walked,
              size_t wl, const char *p, const char *path, char *full,
              int *nlinks, char *why, size_t len)
{
  if (!trusted_owner (st->st_uid)) {
    say (why, len, "%s: refused: %s is a symlink owned by another user",
         path, walked);
    errno = EPERM;
    return -1;
  }
  if (++*nlinks > MAX_SYMLINKS) {
    errno = ELOOP;
    say_errno (why, len, walked, path);
    return -1;
  }
  char target[PATH_MAX];
  ssize_t t = readlinkat (fd, name, target, sizeof target - 1);
  if (t == -1) {
    say_errno (why, len, walked, path);
    return -1;
  }
  target[t] = '\0';
  char next[PATH_MAX];
  int r;
  walked[wl] = '\0';                /* the link's directory */
  if (target[0] == '/')
    r = snprintf (next, sizeof next, "%s/%s", target, p);
  else
    r = snprintf (next, sizeof next, "%s/%s/%s", walked, target, p);
  if (r < 0 || (size_t) r >= sizeof next) {
    errno = ENAMETOOLONG;
    say_errno (why, len, walked, path);
    return -1;
  }
  strcpy (full, next);
  return 0;
}

int
fsc_safe_open_dir (const char *path, bool create, char *why, size_t len)
{
  char full[PATH_MAX], rest[PATH_MAX], walked[PATH_MAX];
  int nlinks = 0, fd = -1;

  if (absolute (path, full, why, len) == -1)
    return -1;

 restart:
  if (normalise (full, rest, sizeof rest) == -1) {
    say (why, len, "%s: %s", path, strerror (errno));
    return -1;
  }
  if (fd >= 0)
    close (fd);
  fd = open ("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd == -1) {
    say (why, len, "/: %s", strerror (errno));
    return -1;
  }
  strcpy (walked, "");

  /* REST is "/a/b/c": take one component at a time. */
  const char *p = rest;
  for (;;) {
    while (*p == '/')
      p++;
    if (*p == '\0')
      break;
    const char *s = p;
    while (*p && *p != '/')
      p++;
    char name[NAME_MAX + 1];
    size_t l = p - s;
    if (l > NAME_MAX) {
      errno = ENAMETOOLONG;
      say (why, len, "%s: %s", path, strerror (errno));
      goto fail;
    }
    memcpy (name, s, l);
    name[l] = '\0';
    bool last = *p == '\0' || (p[0] == '/' && p[1] == '\0');

    /* "..": the parent of the directory reached so far (symlinks on
     * the way already resolved), then the rest; walked again from /.
     */
    if (strcmp (name, "..") == 0) {
      char *slash = strrchr (walked, '/');
      if (slash)
        *slash = '\0';
      char next[PATH_MAX];
      int r = snprintf (next, sizeof next, "%s/%s", walked, p);
      if (r < 0 || (size_t) r >= sizeof next) {
        errno = ENAMETOOLONG;
        goto fail_errno;
      }
      strcpy (full, next);
      goto restart;
    }

    /* The directory FD we stand in (WALKED, "" for /). */
    struct stat st;
    if (dir_trusted (fd, walked, path, why, len) == -1)
      goto fail;
    if (stat_or_create (fd, name, create, &st) == -1)
      goto fail_errno;
    size_t wl = strlen (walked);
    if (wl + l + 2 > sizeof walked) {
      errno = ENAMETOOLONG;
      goto fail_errno;
    }
    walked[wl] = '/';
    memcpy (walked + wl + 1, name, l + 1);

    if (S_ISLNK (st.st_mode)) {
      if (through_link (fd, name, &st, walked, wl, p, path, full, &nlinks,
                        why, len) == -1)
        goto fail;
      goto restart;
    }

    int nfd = openat (fd, name,
                      (last ? O_RDONLY : O_PATH)
                      | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd == -1) {
      if (errno == ELOOP)               /* swapped for a link meanwhile */
        errno = EPERM;
      goto fail_errno;
    }
    close (fd);
    fd = nfd;
  }

  if (fsc_own_dir_check (fd, path, why, len) == -1)
    goto fail;
  return fd;

 fail_errno:
  {
    int e = errno;
    say (why, len, "%s: %s", *walked ? walked : path, strerror (e));
    errno = e;
  }
 fail:
  {
    int e = errno;
    if (fd >= 0)
      close (fd);
    errno = e;
  }
  return -1;
}

int
fsc_open_regular (int dirfd, const char *name, int flags, mode_t mode)
{
  struct stat st;

  /* Look before opening: a device is never opened at all. */
  if (fstatat (dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK (st.st_mode)) {
      errno = ELOOP;
      return -1;
    }
    if (!S_ISREG (st.st_mode)) {
      errno = EPERM;
      return -1;
    }
  }
  else if (errno != ENOENT || !(flags & O_CREAT))
    return -1;

  int fd = openat (dirfd, name,
                   flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                   mode);
  if (fd == -1)
    return -1;
  /* And after: the name may have been swapped in between. */
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode)) {
    close (fd);
    errno = EPERM;
    return -1;
  }
  /* O_NONBLOCK means nothing to a regular file; drop it all the same. */
  int fl = fcntl (fd, F_GETFL);
  if (fl != -1)
    (void) fcntl (fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}
