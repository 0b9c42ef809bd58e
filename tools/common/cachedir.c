/* tools/common: is this directory a cache?  Both programs refuse a
 * directory that is not one with the same words, before they touch
 * anything in it.  The opening itself is libfscache's (with
 * .existing, it creates and rewrites nothing), so the answer is the
 * filter's.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fscache.h"
#include "objects.h"

int
fscd_check_dir (const char *dir, char *why, size_t whylen)
{
  struct stat st;
  struct fsc_cache *cache;
  char refused[512] = "";
  struct fsc_cache_config cc = { .dir = dir, .existing = true,
                                 .why = refused, .why_len = sizeof refused };

  if (stat (dir, &st) == -1) {
    snprintf (why, whylen, "%s: %s", dir, strerror (errno));
    return -1;
  }
  if (!S_ISDIR (st.st_mode)) {
    snprintf (why, whylen, "%s: not a directory", dir);
    return -1;
  }
  if (fsc_cache_open (&cc, &cache) == -1) {
    int e = errno;
    switch (e) {
    case ENOENT:
      snprintf (why, whylen, "%s: not a cache directory "
                "(no fscache.hdr or no objects/)", dir);
      break;
    case EBADMSG:
      snprintf (why, whylen, "%s: not a cache directory "
                "(fscache.hdr is damaged or not a cache header)", dir);
      break;
    case EPERM:
      if (refused[0]) {
        snprintf (why, whylen, "%s", refused);
        break;
      }
      snprintf (why, whylen, "%s: refused: the directory or its objects/ "
                "is owned by another user or writable by others", dir);
      break;
    case EPROTONOSUPPORT:
      snprintf (why, whylen, "%s: the cache was written by a newer "
                "version of nbd-fscache", dir);
      break;
    default:
      snprintf (why, whylen, "%s: %s", dir, strerror (e));
      break;
    }
    errno = e;
    return -1;
  }
  fsc_cache_close (cache);
  return 0;
}
