/* nbd-fscached: messages.
 *
 * To syslog (facility LOG_DAEMON, ident "nbd-fscached", with the pid)
 * by default, or to stderr with -s as "nbd-fscached: message", like
 * cachefilesd.  With "tag NAME" every message starts "NAME: ".  Debug
 * messages have a level 1..3 and are kept only up to the configured
 * level (-d options plus "debug N").
 *
 * This is the one module with file-scope state: messages come from
 * everywhere, and threading a logger through every call would only
 * add noise.  The state is three fields set once at start and on each
 * reload, in the one thread.
 */
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>

#include "fscached.h"

static struct {
  bool to_stderr;
  bool opened;
  unsigned level;
  char tag[256];
} log_state = { .to_stderr = true };

void
fscd_log_setup (bool to_stderr, unsigned level, const char *tag)
{
  log_state.to_stderr = to_stderr;
  log_state.level = level;
  snprintf (log_state.tag, sizeof log_state.tag, "%s", tag ? tag : "");
  if (!to_stderr && !log_state.opened) {
    openlog (PROG, LOG_PID | LOG_NDELAY, LOG_DAEMON);
    log_state.opened = true;
  }
}

unsigned
fscd_log_level (void)
{
  return log_state.level;
}

static void
vlog (int prio, const char *fmt, va_list ap)
{
  char msg[2048];
  int e = errno;                /* so that callers may use %m-free errno */

  vsnprintf (msg, sizeof msg, fmt, ap);
  if (log_state.to_stderr) {
    if (log_state.tag[0])
      fprintf (stderr, "%s: %s: %s\n", PROG, log_state.tag, msg);
    else
      fprintf (stderr, "%s: %s\n", PROG, msg);
  }
  else if (log_state.tag[0])
    syslog (prio, "%s: %s", log_state.tag, msg);
  else
    syslog (prio, "%s", msg);
  errno = e;
}

void
fscd_log (int prio, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  vlog (prio, fmt, ap);
  va_end (ap);
}

void
fscd_debug (unsigned level, const char *fmt, ...)
{
  va_list ap;
  if (level > log_state.level)
    return;
  va_start (ap, fmt);
  vlog (LOG_DEBUG, fmt, ap);
  va_end (ap);
}
