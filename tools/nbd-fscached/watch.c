/* nbd-fscached: inotify on the cache directory, to tick early.
 *
 * The timer alone would notice a cache that grows only at the next
 * tick (a second later when idle), and a proxy filling at disk speed
 * writes hundreds of MiB in a second.  So the event loop also watches
 * DIR/objects (for new fan-out directories) and every fan-out
 * directory in it (for objects created, written, renamed, removed):
 * any event brings the next tick forward to at most the daemon's
 * minimum gap between ticks (main.c).
 *
 * The watch is only a hint.  The tick re-samples and re-scans
 * everything, so lost events (IN_Q_OVERFLOW, a fan-out directory
 * created between two reads) cost latency, never correctness, and the
 * daemon runs on timers alone where inotify is not available.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "fscached.h"

#define FAN_EVENTS (IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | \
                    IN_MOVED_FROM | IN_DELETE | IN_ONLYDIR)

static void
add_fan (struct fscd_watch *w, const char *fan)
{
  char path[PATH_MAX];

  if (fan[0] != '@' || strlen (fan) != 3)
    return;
  if (snprintf (path, sizeof path, "%s/objects/%s", w->dir, fan) >=
      (int) sizeof path)
    return;
  if (inotify_add_watch (w->fd, path, FAN_EVENTS) == -1)
    fscd_debug (1, "inotify %s: %s", path, strerror (errno));
}

int
fscd_watch_open (struct fscd_watch *w, const char *dir)
{
  char path[PATH_MAX];

  w->fd = -1;
  w->dir = strdup (dir);
  if (w->dir == NULL)
    return -1;
  if (snprintf (path, sizeof path, "%s/objects", dir) >= (int) sizeof path) {
    errno = ENAMETOOLONG;
    goto err;
  }
  w->fd = inotify_init1 (IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd == -1)
    goto err;
  w->objwd = inotify_add_watch (w->fd, path,
                                IN_CREATE | IN_MOVED_TO | IN_ONLYDIR);
  if (w->objwd == -1)
    goto err;
  for (unsigned fan = 0; fan < 256; ++fan) {
    char name[4];
    snprintf (name, sizeof name, "@%02x", fan);
    if (snprintf (path, sizeof path, "%s/objects/%s", dir, name) <
        (int) sizeof path && access (path, F_OK) == 0)
      add_fan (w, name);
  }
  return 0;

 err:;
  int e = errno;
  fscd_watch_close (w);
  errno = e;
  return -1;
}

void
fscd_watch_close (struct fscd_watch *w)
{
  if (w->fd >= 0)
    close (w->fd);
  w->fd = -1;
  free (w->dir);
  w->dir = NULL;
}

unsigned
fscd_watch_drain (struct fscd_watch *w)
{
  char buf[16 * 1024] __attribute__ ((aligned (__alignof__ (struct inotify_event))));
  unsigned events = 0;
  ssize_t n;

  while ((n = read (w->fd, buf, sizeof buf)) > 0) {
    for (char *p = buf; p < buf + n; ) {
      const struct inotify_event *ev = (const struct inotify_event *) p;
      events++;
      if (ev->wd == w->objwd && (ev->mask & IN_ISDIR) && ev->len > 0)
        add_fan (w, ev->name);
      p += sizeof *ev + ev->len;
    }
  }
  return events;
}
