/* nbdkit-fscache-filter: what the filter tells its operator: the log
 * lines a cache object wants said once (withdrawal, a full disk,
 * skipped fills, a refused joiner), and the stats file.
 *
 * Apart from fscache.c, whose callbacks they serve, because connect.c
 * says them too (at a connection's end), and a file of callbacks that
 * its helpers call back into is a circle (tools/layers.py).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "utils.h"

#include "params.h"
#include "peerhealth.h"
#include "handle.h"
#include "say.h"

static pthread_mutex_t skips_lock = PTHREAD_MUTEX_INITIALIZER;

/* Skipped fills are logged at most once in this many seconds. */
#define SKIP_LOG_SECONDS 60

/* Is the stats file a symlink (or other non-regular file)?  Then it is
 * refused: a link planted there must not redirect our writes, and a
 * rename over it would silently replace someone's link.
 */
bool
stats_file_refused (void)
{
  struct stat st;
  return lstat (params.stats_file, &st) == 0 && !S_ISREG (st.st_mode);
}

/* Write the counters to a fresh file with an unpredictable name in
 * FILE's directory (mkostemp: O_CREAT | O_EXCL, so never through a
 * planted link or FIFO), mode 0644 whatever the umask, and rename it
 * over FILE.
 */
void
write_stats (void)
{
  if (!params.stats_file || !state.cache)
    return;
  struct fsc_stats st;
  char buf[4096];
  CLEANUP_FREE char *tmp = NULL;

  if (stats_file_refused ()) {
    nbdkit_error ("fscache-stats=%s: not a regular file (a symlink?): "
                  "not written", params.stats_file);
    return;
  }
  fsc_cache_stats (state.cache, &st);
  size_t len = fsc_stats_format (&st, buf, sizeof buf);
  /* The fleet's members set aside now, one line each (issue 41), if
   * they fit (the gauge peers_aside counts them all).
   */
  char pbuf[1024];
  size_t plen = peer_health_format (pbuf, sizeof pbuf);
  if (plen < sizeof pbuf && len + plen < sizeof buf) {
    memcpy (buf + len, pbuf, plen);
    len += plen;
  }
  if (len >= sizeof buf ||
      asprintf (&tmp, "%s.XXXXXX", params.stats_file) == -1) {
    tmp = NULL;
    return;
  }
  int fd = mkostemp (tmp, O_CLOEXEC);
  if (fd == -1) {
    nbdkit_debug ("fscache-stats=%s: %m", params.stats_file);
    return;
  }
  bool ok = write (fd, buf, len) == (ssize_t) len && fchmod (fd, 0644) == 0;
  if (close (fd) == -1)
    ok = false;
  if (!ok || rename (tmp, params.stats_file) == -1) {
    nbdkit_debug ("fscache-stats=%s: %m", params.stats_file);
    unlink (tmp);
  }
}

/* Say that the cache disk could not keep up and fills were skipped
 * (core/ops/fill.c, FSC_NOTICE_SKIPPED): at once the first time, then at
 * most once a minute for the process, with the bytes skipped since.
 */
static void
log_skipped_fills (struct handle *h)
{
  time_t now = time (NULL);
  time_t said = __atomic_load_n (&state.skips_said_at, __ATOMIC_RELAXED);
  if (said != 0 && now - said < SKIP_LOG_SECONDS)
    return;                     /* the usual case: no lock */
  pthread_mutex_lock (&skips_lock);
  if (state.skips_said_at == 0 ||
      now - state.skips_said_at >= SKIP_LOG_SECONDS) {
    struct fsc_stats st;
    fsc_cache_stats (state.cache, &st);
    say_note ("export \"%s\": the cache disk is slower "
              "than the upstream: reads do not wait for it, and %" PRIu64
              " bytes read %s were not cached (fill_skipped_bytes)",
              h->exportname, st.fill_skipped_bytes - state.skips_said,
              state.skips_said_at ? "since the last note" : "so far");
    state.skips_said = st.fill_skipped_bytes;
    __atomic_store_n (&state.skips_said_at, now, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock (&skips_lock);
}

/* Log what the cache object wants said once: withdrawal, full disk. */
void
log_notices (struct handle *h)
{
  int err;
  unsigned n = fsc_object_take_notices (h->obj, &err);
  if ((n & FSC_NOTICE_WITHDRAWN) && err == ESTALE)
    say_warning ("export \"%s\": cache withdrawn, serving from upstream: "
                 "the upstream was replaced, or the object marked stale, "
                 "under it", h->exportname);
  else if (n & FSC_NOTICE_WITHDRAWN)
    say_warning ("export \"%s\": cache I/O error (%s); "
                 "cache withdrawn, serving from upstream", h->exportname,
                 strerror (err));
  if (n & FSC_NOTICE_BADQUOTA)
    say_warning ("export \"%s\": its quota record "
                 "(.quota) is malformed; ignored", h->exportname);
  if (n & FSC_NOTICE_NOFILL)
    say_warning ("export \"%s\": cache directory full; "
                 "not caching new blocks for a while", h->exportname);
  if (n & FSC_NOTICE_SKIPPED)
    log_skipped_fills (h);
  if (n & FSC_NOTICE_PEER)
    say_warning ("export \"%s\": refused a process of "
                 "uid %ld on the object's share socket: only processes of "
                 "uid %ld (ours) or root may join it", h->exportname,
                 fsc_share_refused_uid (h->obj), (long) geteuid ());
}

