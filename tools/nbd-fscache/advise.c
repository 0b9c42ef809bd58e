/* nbd-fscache advise: how big should the cache be?  A sentence per
 * object, from the miss-ratio curve the filter gathers while the
 * object is open (core/base/mrc.c, SHARDS sampling; NAME.stats's "mrc"
 * lines), issue 45.
 *
 * For each object with a curve: the hit ratio predicted at what it
 * holds now, at twice and four times that, and at half; then one line
 * of advice:
 *   - "N more would raise hits from X% to Y%" when doubling gains at
 *     least a point;
 *   - "half of it would keep hits within a point (X% to Y%)" when
 *     halving loses less than one;
 *   - otherwise "about right".
 * The curve is an LRU cache's, measured since the object was opened
 * (said); the filter's own policy is within a few points of it
 * (docs/benchmarks.md).  Exit status: 0; 1 if an OBJECT named is not
 * there; 2 a usage error or a cache that cannot be read.
 */
#include <config.h>

#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fscache.h"
#include "nbd-fscache.h"

#define PROG "nbd-fscache"

#define ADVISE_USAGE "advise [--dir DIR] [OBJECT...]"

static int
advise_opt (int c, const char *arg, void *opaque)
{
  return -1;
}

static void
advise_one (const struct tool_object *o)
{
  char a[16], b[16], t[32];
  uint64_t c = o->info.cached_bytes;
  printf ("%s\n", o->key);
  if (o->mrc_n == 0 || c == 0) {
    printf ("  no curve yet: it is gathered while a proxy has the object "
            "open and clients read it\n");
    return;
  }
  double h1 = tool_mrc_at (o, c), h2 = tool_mrc_at (o, 2 * c);
  double h4 = tool_mrc_at (o, 4 * c), hh = tool_mrc_at (o, c / 2);
  printf ("  %" PRIu64 " block reads since %s; holds %s\n", o->mrc_refs,
          fmt_time (o->mrc_since, t), fmt_size (c, a));
  printf ("  predicted hits: %.1f%% at half, %.1f%% now, %.1f%% at twice, "
          "%.1f%% at four times\n", 100 * hh, 100 * h1, 100 * h2, 100 * h4);
  if (h2 - h1 >= 0.01)
    printf ("  %s more would raise hits from %.1f%% to %.1f%% (%s more: "
            "%.1f%%)\n", fmt_size (c, a), 100 * h1, 100 * h2,
            fmt_size (3 * c, b), 100 * h4);
  else if (h1 - hh < 0.01)
    printf ("  half of it would keep hits within a point (%.1f%% to "
            "%.1f%%): %s could go\n", 100 * h1, 100 * hh,
            fmt_size (c - c / 2, a));
  else
    printf ("  about right: twice as much gains under a point, half "
            "loses %.1f\n", 100 * (h1 - hh));
}

int
fscache_cmd_advise (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  struct tool_cache c;
  int i = tool_getopt ("advise", ADVISE_USAGE, argc, argv, "d:h", longopts,
                       advise_opt, NULL);
  if (tool_cache_open ("advise", tool_dir (), &c) == -1) {
    tool_error ("advise: %s: %m", tool_dir ());
    return EXIT_USAGE;
  }
  int status = 0;
  if (i == argc)
    for (size_t k = 0; k < c.n; ++k)
      advise_one (&c.v[k]);
  for (; i < argc; ++i) {
    struct tool_object *o = tool_find ("advise", &c, argv[i]);
    if (o)
      advise_one (o);
    else
      status = 1;
  }
  tool_cache_close (&c);
  return status;
}
