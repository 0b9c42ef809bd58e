/* nbd-fscached: the counters, and DIR/nbd-fscached.stats.
 *
 * The counters (FSCD_COUNTERS in fscached.h) only grow; the gauges
 * (FSCD_GAUGES) are the last tick's view.  Both are printed as
 * "name value" lines, names stable (tests and monitoring parse them),
 * to DIR/nbd-fscached.stats: written to nbd-fscached.stats.tmp.PID
 * then renamed, so a reader sees a whole file, old or new.  The file
 * is outside objects/ and so not counted against max-size.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fscached.h"

#define STATS_FILE "nbd-fscached.stats"

size_t
fscd_counters_format (const struct fscd_counters *c, char *buf, size_t size)
{
  size_t len = 0;
  int n;

#define FSCD_FMT(name)                                                  \
  n = snprintf (buf + (len < size ? len : size),                        \
                len < size ? size - len : 0,                            \
                "%s %" PRIu64 "\n", #name, c->name);                    \
  if (n > 0)                                                            \
    len += (size_t) n;
  FSCD_COUNTERS (FSCD_FMT)
  FSCD_GAUGES (FSCD_FMT)
#undef FSCD_FMT
  return len;
}

int
fscd_counters_write (int dirfd, const struct fscd_counters *c)
{
  char buf[4096];
  size_t len = fscd_counters_format (c, buf, sizeof buf);

  if (len >= sizeof buf) {
    errno = ENOBUFS;
    return -1;
  }
  return fscd_write_atomic (dirfd, STATS_FILE, buf, len, false);
}

void
fscd_counters_log (int prio, const struct fscd_counters *c)
{
  char buf[4096];
  size_t len = fscd_counters_format (c, buf, sizeof buf);

  if (len >= sizeof buf)
    len = sizeof buf - 1;
  buf[len] = '\0';
  /* One line: "name=value name=value ...". */
  for (char *p = buf; *p; ++p) {
    if (*p == '\n')
      *p = ' ';
    else if (*p == ' ')
      *p = '=';
  }
  if (len > 0 && buf[len - 1] == ' ')
    buf[len - 1] = '\0';
  if (prio == LOG_DEBUG)
    fscd_debug (2, "counters: %s", buf);
  else
    fscd_log (prio, "counters: %s", buf);
}
