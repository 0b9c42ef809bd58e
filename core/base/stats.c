/* libfscache: statistics snapshot and formatting.  See stats.h. */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>

#include "stats.h"

void
fsc_stats_snapshot (const struct fsc_stats *st, struct fsc_stats *out)
{
#define FSC_STATS_COPY(name) \
  out->name = __atomic_load_n (&st->name, __ATOMIC_RELAXED);
  FSC_STATS_FIELDS (FSC_STATS_COPY)
#undef FSC_STATS_COPY
}

size_t
fsc_stats_format (const struct fsc_stats *st, char *buf, size_t size)
{
  size_t len = 0;
#define FSC_STATS_PRINT(name)                                           \
  {                                                                     \
    int n = snprintf (len < size ? buf + len : NULL,                    \
                      len < size ? size - len : 0,                      \
                      "%s %" PRIu64 "\n", #name, st->name);             \
    if (n > 0)                                                          \
      len += n;                                                         \
  }
  FSC_STATS_FIELDS (FSC_STATS_PRINT)
#undef FSC_STATS_PRINT
  return len;
}
