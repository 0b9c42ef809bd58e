/* Unit test of core/base/safeopen.c: the walk to the cache directory (rule
 * 2), the directory checks (rule 1), the type check of files (rule 3)
 * and the modes whatever the umask (rule 4).
 *
 * Truth: the file system itself (stat of what was opened or created,
 * compared with what the path names), and the errno of each refusal.
 * Ownership by another user needs chown: those cases run only as root
 * (as the suite does); the rest run as anyone.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safeopen.h"
#include "unit.h"

static char top[PATH_MAX];

static void
path (char *out, const char *rel)
{
  CHECK (snprintf (out, PATH_MAX, "%s/%s", top, rel) < PATH_MAX);
}

/* Does FD refer to the directory at REL (under TOP)? */
static bool
same_dir (int fd, const char *rel)
{
  char p[PATH_MAX];
  struct stat a, b;
  path (p, rel);
  return fd >= 0 && fstat (fd, &a) == 0 && stat (p, &b) == 0 &&
    a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int
open_rel (const char *rel, bool create, char *why, size_t len)
{
  char p[PATH_MAX];
  path (p, rel);
  return fsc_safe_open_dir (p, create, why, len);
}

int
main (void)
{
  char why[512], p[PATH_MAX], q[PATH_MAX];
  int fd;
  const bool root = geteuid () == 0;

  snprintf (top, sizeof top, "/tmp/unit-safeopen.XXXXXX");
  CHECK (mkdtemp (top) != NULL);

  /* Created with missing parents, 0700 even under umask 0777 (rule 4). */
  mode_t old = umask (0777);
  fd = open_rel ("a/b/cache", true, why, sizeof why);
  umask (old);
  CHECK (fd >= 0);
  CHECK (same_dir (fd, "a/b/cache"));
  close (fd);
  struct stat st;
  path (p, "a");
  CHECK (stat (p, &st) == 0 && (st.st_mode & 07777) == 0700);
  path (p, "a/b/cache");
  CHECK (stat (p, &st) == 0 && (st.st_mode & 07777) == 0700);

  /* Relative paths, "." and "..", repeated slashes. */
  CHECK (chdir (top) == 0);
  fd = fsc_safe_open_dir ("a/./b//../b/cache/", false, why, sizeof why);
  CHECK (same_dir (fd, "a/b/cache"));
  close (fd);

  /* Our own symlinks are followed: absolute, relative, chained. */
  path (p, "a/b/cache");
  path (q, "abs");
  CHECK (symlink (p, q) == 0);
  fd = open_rel ("abs", false, why, sizeof why);
  CHECK (same_dir (fd, "a/b/cache"));
  close (fd);
  path (q, "a/rel");
  CHECK (symlink ("b/cache", q) == 0);
  fd = open_rel ("a/rel", false, why, sizeof why);
  CHECK (same_dir (fd, "a/b/cache"));
  close (fd);
  path (q, "chain");
  CHECK (symlink ("a/rel", q) == 0);
  fd = open_rel ("chain", false, why, sizeof why);
  CHECK (same_dir (fd, "a/b/cache"));
  close (fd);
  /* ".." after a link is the link target's parent, as the kernel has it
   * (the link is resolved first: "rel/.." is a/b, not a).
   */
  path (q, "a/b/x");
  CHECK (mkdir (q, 0700) == 0);
  path (q, "up");
  CHECK (symlink ("a/b/cache", q) == 0);
  fd = open_rel ("up/../x", false, why, sizeof why);
  CHECK (same_dir (fd, "a/b/x"));
  close (fd);

  /* A loop ends in ELOOP, a missing directory in ENOENT (nothing made). */
  path (q, "loop1");
  CHECK (symlink ("loop2", q) == 0);
  path (q, "loop2");
  CHECK (symlink ("loop1", q) == 0);
  errno = 0;
  CHECK (open_rel ("loop1/cache", false, why, sizeof why) == -1);
  CHECK_EQ (errno, ELOOP);
  CHECK (open_rel ("nope/cache", false, why, sizeof why) == -1);
  CHECK_EQ (errno, ENOENT);
  path (q, "nope");
  CHECK (access (q, F_OK) == -1);

  /* Rule 1: group or other write on the directory itself: refused, with
   * the mode in the reason.
   */
  path (q, "a/b/cache");
  CHECK (chmod (q, 0770) == 0);
  CHECK (open_rel ("a/b/cache", false, why, sizeof why) == -1);
  CHECK_EQ (errno, EPERM);
  CHECK (strstr (why, "writable by others") && strstr (why, "0770"));
  CHECK (chmod (q, 0700) == 0);

  /* Rule 2: a directory on the way others may write: refused unless
   * sticky.
   */
  path (q, "gw");
  CHECK (mkdir (q, 0700) == 0 && chmod (q, 0777) == 0);
  CHECK (open_rel ("gw/cache", true, why, sizeof why) == -1);
  CHECK_EQ (errno, EPERM);
  CHECK (strstr (why, "others may write"));
  path (p, "gw/cache");
  CHECK (access (p, F_OK) == -1);
  CHECK (chmod (q, 01777) == 0);
  fd = open_rel ("gw/cache", true, why, sizeof why);
  CHECK (same_dir (fd, "gw/cache"));
  close (fd);

  /* Rule 3: a FIFO is refused without waiting, a symlink with ELOOP, a
   * regular file opens and is blocking again.
   */
  int dfd = open_rel ("a/b/cache", false, why, sizeof why);
  CHECK (dfd >= 0);
  CHECK (mkfifoat (dfd, "fifo", 0600) == 0);
  CHECK (fsc_open_regular (dfd, "fifo", O_RDONLY, 0) == -1);
  CHECK_EQ (errno, EPERM);
  CHECK (fsc_open_regular (dfd, "fifo", O_RDWR | O_CREAT, 0600) == -1);
  CHECK_EQ (errno, EPERM);
  CHECK (symlinkat ("/etc/passwd", dfd, "link") == 0);
  CHECK (fsc_open_regular (dfd, "link", O_RDONLY, 0) == -1);
  CHECK_EQ (errno, ELOOP);
  fd = fsc_open_regular (dfd, "file", O_RDWR | O_CREAT, 0600);
  CHECK (fd >= 0);
  CHECK ((fcntl (fd, F_GETFL) & O_NONBLOCK) == 0);
  close (fd);
  /* A subdirectory: a symlink in its place is not followed. */
  CHECK (symlinkat ("/tmp", dfd, "sub") == 0);
  CHECK (fsc_own_subdir (dfd, "sub", true, "sub", why, sizeof why) == -1);
  CHECK_EQ (errno, ENOTDIR);
  old = umask (0777);
  fd = fsc_own_subdir (dfd, "sub2", true, "sub2", why, sizeof why);
  umask (old);
  CHECK (fd >= 0);
  CHECK (fstat (fd, &st) == 0 && (st.st_mode & 07777) == 0700);
  close (fd);

  if (root) {
    /* Another user's symlink in a sticky directory, another user's
     * directory on the way, another user's cache directory: refused.
     */
    const uid_t other = 12345;
    path (q, "gw/theirs");
    path (p, "a/b/cache");
    CHECK (symlink (p, q) == 0 && lchown (q, other, other) == 0);
    CHECK (open_rel ("gw/theirs", false, why, sizeof why) == -1);
    CHECK_EQ (errno, EPERM);
    CHECK (strstr (why, "symlink owned by another user"));
    path (q, "a/b/x");
    CHECK (chown (q, other, other) == 0);
    CHECK (open_rel ("a/b/x/cache", true, why, sizeof why) == -1);
    CHECK_EQ (errno, EPERM);
    CHECK (strstr (why, "a directory owned by another user"));
    path (p, "a/b/x/cache");
    CHECK (access (p, F_OK) == -1);
    CHECK (open_rel ("a/b/x", false, why, sizeof why) == -1);
    CHECK_EQ (errno, EPERM);
    CHECK (strstr (why, "owned by another user"));
    CHECK (fchownat (dfd, "sub2", other, other, 0) == 0);
    CHECK (fsc_own_subdir (dfd, "sub2", false, "sub2", why, sizeof why) == -1);
    CHECK_EQ (errno, EPERM);
  }
  else
    printf ("not root: the other-user cases were not run\n");
  close (dfd);

  char cmd[PATH_MAX + 16];
  snprintf (cmd, sizeof cmd, "rm -rf '%s'", top);
  CHECK (system (cmd) == 0);
  printf ("unit-safeopen: ok\n");
  return 0;
}
