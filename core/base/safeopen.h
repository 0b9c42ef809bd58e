/* libfscache: opening the cache's directories and files so that no
 * other local user can redirect or replace them (the rules are atop
 * safeopen.c).  Shared by the filter's core, nbd-fscache(1) and
 * nbd-fscached(8).
 */
#ifndef FSC_SAFEOPEN_H
#define FSC_SAFEOPEN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Check that directory FD (named WHAT in messages) is owned by the
 * effective user and writable by nobody else.  Returns 0, or -1 with
 * errno (ENOTDIR, EPERM) and the reason in WHY (LEN bytes; WHY may be
 * NULL).
 */
extern int fsc_own_dir_check (int fd, const char *what,
                              char *why, size_t len);

/* Open subdirectory NAME of DIRFD without following a symlink, with
 * CREATE making it first (mode 0700 whatever the umask), and check it
 * as fsc_own_dir_check does.  Returns the descriptor (O_RDONLY) or -1
 * with errno and WHY.
 */
extern int fsc_own_subdir (int dirfd, const char *name, bool create,
                           const char *what, char *why, size_t len);

/* Open directory PATH (relative to the current directory if not
 * absolute), walking it one component at a time so that nobody but
 * root and us can redirect it (rule 2), with CREATE making missing
 * components (0700).  The directory itself must pass
 * fsc_own_dir_check.  Returns the descriptor (O_RDONLY) or -1 with
 * errno (EPERM: refused; WHY says which component and why).
 */
extern int fsc_safe_open_dir (const char *path, bool create,
                              char *why, size_t len);

/* Open regular file NAME in DIRFD with FLAGS (and MODE if O_CREAT)
 * without following a symlink (ELOOP) or waiting on a FIFO or a device
 * (refused with EPERM, a device never opened at all).  Returns the
 * descriptor (blocking again) or -1 with errno.
 */
extern int fsc_open_regular (int dirfd, const char *name, int flags,
                             mode_t mode);

#endif /* FSC_SAFEOPEN_H */
