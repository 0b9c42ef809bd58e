/* nbd-fscached: writing quota records (NAME.quota), and the fair share.
 *
 * A quota record caps the allocated bytes of an object in use; its
 * format and codec are core/base/quota.h, shared with the filter that
 * reads it (docs/format.md, "Quota records").
 *
 * Written with fscd_write_atomic (NAME.quota.tmp.PID in the object's
 * fan-out directory, synced, renamed over NAME.quota), so that the
 * filter reads either the old record or the new one, never a part.
 *
 * The fair share (fscd_fair_level) is max-min fairness: the largest
 * level L such that the demands, each capped at L, fit in the budget.
 * Small objects keep what they use, the large ones are all cut to the
 * same L.  policy.c decides the demands and the budget.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fscached.h"
#include "quota.h"
#include "safeopen.h"

static int
open_fan (int objdirfd, const struct fscd_object *o)
{
  char fanname[4];
  return fscd_open_fan (objdirfd, o->fan, fanname);
}

int
fscd_quota_read (int objdirfd, const struct fscd_object *o, uint64_t *budget)
{
  char file[300];
  unsigned char buf[FSC_QUOTA_SIZE + 1];
  int fanfd = open_fan (objdirfd, o);

  if (fanfd == -1)
    return -1;
  snprintf (file, sizeof file, "%s.quota", o->name);
  int fd = fsc_open_regular (fanfd, file, O_RDONLY, 0);   /* no FIFO */
  close (fanfd);
  if (fd == -1)
    return -1;
  ssize_t n = pread (fd, buf, sizeof buf, 0);
  close (fd);
  if (n < 0)
    return -1;
  return fsc_quota_decode (buf, (size_t) n, budget);
}

int
fscd_quota_write (int objdirfd, const struct fscd_object *o, uint64_t budget)
{
  char file[300];
  unsigned char buf[FSC_QUOTA_SIZE];
  int fanfd = open_fan (objdirfd, o);

  if (fanfd == -1)
    return -1;
  snprintf (file, sizeof file, "%s.quota", o->name);
  fsc_quota_encode (buf, budget);
  int r = fscd_write_atomic (fanfd, file, buf, sizeof buf, true);
  int e = errno;
  close (fanfd);
  errno = e;
  return r;
}

static int
u64_cmp (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? -1 : x > y;
}

uint64_t
fscd_fair_level (uint64_t *d, size_t n, uint64_t budget)
{
  uint64_t left = budget;

  qsort (d, n, sizeof *d, u64_cmp);
  for (size_t i = 0; i < n; ++i) {
    uint64_t share = left / (n - i);
    if (d[i] > share)
      return share;
    left -= d[i];
  }
  return UINT64_MAX;
}
