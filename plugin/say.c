/* nbdkit-fscache-filter: warnings and notes, which are not errors.
 *
 * nbdkit 1.32 gives a filter nbdkit_error, printed as "error:" on
 * every line, and nbdkit_debug, printed only with -v.  A cache that
 * starts cold, serves a refused export uncached or runs without one of
 * its helpers has nothing an operator must fix, and a line saying
 * "error" makes them think it does (issue 40).  So warnings and notes
 * go where nbdkit's own messages go, in nbdkit's shape, with their
 * kind instead of "error":
 *
 *   nbdkit: fscache: warning: export "a": ...
 *
 * Where nbdkit logs is not told to a filter.  It follows --log=
 * (stderr, syslog, null) on nbdkit's command line; by default nbdkit
 * logs to stderr in the foreground and to syslog once it has forked
 * into the background, when stderr becomes /dev/null, which is how
 * that case is told apart here.  Decided once, at the first message.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "say.h"

enum sink { SINK_STDERR, SINK_SYSLOG, SINK_NULL };

static pthread_once_t sink_once = PTHREAD_ONCE_INIT;
static enum sink sink = SINK_STDERR;

/* nbdkit's --log=X (or "--log X") on its command line, or NULL. */
static const char *
log_option (char *args, size_t len)
{
  const char *prev = "";
  for (size_t i = 0; i < len; i += strlen (args + i) + 1) {
    const char *a = args + i;
    if (strncmp (a, "--log=", 6) == 0)
      return a + 6;
    if (strcmp (prev, "--log") == 0)
      return a;
    if (strcmp (a, "--") == 0)
      break;
    prev = a;
  }
  return NULL;
}

static bool
stderr_is_devnull (void)
{
  struct stat se, dn;
  return fstat (STDERR_FILENO, &se) == 0 && S_ISCHR (se.st_mode) &&
    stat ("/dev/null", &dn) == 0 && se.st_rdev == dn.st_rdev;
}

static void
choose_sink (void)
{
  char args[8192];
  size_t len = 0;
  int fd = open ("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read (fd, args, sizeof args - 1);
    close (fd);
    if (n > 0)
      len = n;
  }
  args[len] = 0;
  const char *opt = log_option (args, len);
  if (opt && strcmp (opt, "syslog") == 0)
    sink = SINK_SYSLOG;
  else if (opt && strcmp (opt, "null") == 0)
    sink = SINK_NULL;
  else if (opt && strcmp (opt, "stderr") == 0)
    sink = SINK_STDERR;
  else
    sink = stderr_is_devnull () ? SINK_SYSLOG : SINK_STDERR;
}

static void
say (int priority, const char *kind, const char *fs, va_list args)
{
  int err = errno;
  pthread_once (&sink_once, choose_sink);
  switch (sink) {
  case SINK_STDERR:
    flockfile (stderr);
    fprintf (stderr, "nbdkit: fscache: %s: ", kind);
    errno = err;                /* for %m */
    vfprintf (stderr, fs, args);
    fputc ('\n', stderr);
    funlockfile (stderr);
    break;
  case SINK_SYSLOG: {
    char *msg = NULL;
    errno = err;
    if (vasprintf (&msg, fs, args) >= 0) {
      syslog (priority, "fscache: %s: %s", kind, msg);
      free (msg);
    }
    break;
  }
  case SINK_NULL:
    break;
  }
  errno = err;
}

bool
say_to_stderr (void)
{
  pthread_once (&sink_once, choose_sink);
  return sink == SINK_STDERR;
}

void
say_warning (const char *fs, ...)
{
  va_list args;
  va_start (args, fs);
  say (LOG_WARNING, "warning", fs, args);
  va_end (args);
}

void
say_note (const char *fs, ...)
{
  va_list args;
  va_start (args, fs);
  say (LOG_NOTICE, "note", fs, args);
  va_end (args);
}
