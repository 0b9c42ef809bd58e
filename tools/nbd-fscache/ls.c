/* nbd-fscache ls: one line per object.
 *
 * What is cached comes from the index itself (core/inspect/inspect.h: the
 * present blocks and the bytes they hold, as the filter would load
 * them), the hit ratio and last use from the counters (live.c), the
 * state from the lock, the write log and the index's flags
 * (tool_state).  DIRTY is what the object's write log (fscache-mode=
 * writeback) holds not yet written back, read with fsc_wlog_inspect
 * without its lock: "-" without a log.  Sizes are rounded in the table
 * and exact in --json.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nbd-fscache.h"

#define LS_USAGE "ls [--dir DIR] [--json]"

static int
ls_opt (int c, const char *arg, void *opaque)
{
  bool *json = opaque;
  (void) arg;
  if (c != 'j')
    return -1;
  *json = true;
  return 0;
}

/* Hit ratio in [0, 1], or -1 if nothing was read. */
static double
hit_ratio (const struct tool_object *o)
{
  uint64_t h = o->ctr.v[FSC_OSTAT_hit_bytes], m = o->ctr.v[FSC_OSTAT_miss_bytes];
  return h + m ? (double) h / ((double) h + (double) m) : -1;
}

static double
cached_pct (const struct tool_object *o)
{
  return o->info.sb.size ? 100.0 * o->info.cached_bytes / o->info.sb.size : 0;
}

/* Last use: the counter, else the index's mtime (the contract with the
 * daemon, docs/format.md "Last use").
 */
static uint64_t
last_use (const struct tool_object *o)
{
  uint64_t t = o->ctr.v[FSC_OSTAT_last_use];
  return t ? t : (uint64_t) o->f.mtime.tv_sec;
}

static void
print_json (const struct tool_cache *c)
{
  printf ("{\n  \"dir\": ");
  json_str (stdout, c->dir);
  printf (",\n  \"objects\": [");
  for (size_t i = 0; i < c->n; ++i) {
    const struct tool_object *o = &c->v[i];
    bool ok = o->err == 0 && o->info.reason == FSC_OK;
    printf ("%s\n    {\n      \"name\": ", i ? "," : "");
    json_str (stdout, o->f.name);
    printf (",\n      \"fan\": \"@%02x\",\n      \"key\": ", o->f.fan);
    json_str (stdout, o->key);
    if (o->info.sb.label[0]) {
      printf (",\n      \"label\": ");
      json_str (stdout, o->info.sb.label);
    }
    if (o->identity) {
      printf (",\n      \"identity\": ");
      json_str (stdout, o->identity);
    }
    if (o->export) {
      printf (",\n      \"export\": ");
      json_str (stdout, o->export);
    }
    printf (",\n      \"state\": ");
    json_str (stdout, tool_state (o));
    printf (",\n      \"index\": ");
    json_str (stdout, o->err ? "unreadable" : fsc_reason_name (o->info.reason));
    if (ok)
      printf (",\n      \"size\": %" PRIu64
              ",\n      \"block_size\": %" PRIu32
              ",\n      \"present_blocks\": %" PRIu64
              ",\n      \"cached_bytes\": %" PRIu64
              ",\n      \"cached_percent\": %.3f",
              o->info.sb.size, o->info.sb.block_size,
              o->info.present_blocks, o->info.cached_bytes, cached_pct (o));
    printf (",\n      \"allocated_bytes\": %" PRIu64
            ",\n      \"hit_bytes\": %" PRIu64
            ",\n      \"miss_bytes\": %" PRIu64,
            o->f.bytes, o->ctr.v[FSC_OSTAT_hit_bytes],
            o->ctr.v[FSC_OSTAT_miss_bytes]);
    double r = hit_ratio (o);
    if (r >= 0)
      printf (",\n      \"hit_ratio\": %.6f", r);
    else
      printf (",\n      \"hit_ratio\": null");
    printf (",\n      \"last_use\": %" PRIu64, last_use (o));
    tool_json_dirty (stdout, o, "      ");
    printf ("\n    }");
  }
  printf ("%s]\n}\n", c->n ? "\n  " : "");
}

static void
print_table (const struct tool_cache *c)
{
  size_t w = 3;
  for (size_t i = 0; i < c->n; ++i)
    w = MAX (w, strlen (c->v[i].key));
  printf ("%-*s %8s %8s %6s %6s %8s  %-19s  %s\n", (int) w, "KEY", "SIZE",
          "CACHED", "%", "HIT%", "DIRTY", "LAST USE", "STATE");
  for (size_t i = 0; i < c->n; ++i) {
    const struct tool_object *o = &c->v[i];
    char s1[16], s2[16], s3[16], t[32], pct[16], hit[16];
    bool ok = o->err == 0 && o->info.reason == FSC_OK;
    double r = hit_ratio (o);
    snprintf (pct, sizeof pct, ok ? "%.1f" : "-", cached_pct (o));
    snprintf (hit, sizeof hit, r >= 0 ? "%.1f" : "-", 100 * r);
    printf ("%-*s %8s %8s %6s %6s %8s  %-19s  %s\n", (int) w, o->key,
            ok ? fmt_size (o->info.sb.size, s1) : "-",
            ok ? fmt_size (o->info.cached_bytes, s2) : "-",
            pct, hit,
            o->wlog_err == ENOENT ? "-" : tool_wlog_damaged (o) ? "damaged"
            : o->wlog_err ? "?"
            : fmt_size (o->wlog.dirty_bytes, s3),
            fmt_time (last_use (o), t), tool_state (o));
  }
}

int
fscache_cmd_ls (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { "json", no_argument, NULL, 'j' },
    { NULL, 0, NULL, 0 },
  };
  bool json = false;
  struct tool_cache c;

  int i = tool_getopt ("ls", LS_USAGE, argc, argv, "d:hj", longopts,
                       ls_opt, &json);
  if (i < argc) {
    tool_error ("ls: %s: unexpected argument", argv[i]);
    fprintf (stderr, "usage: " PROG " " LS_USAGE "\n");
    return EXIT_USAGE;
  }
  if (tool_cache_open ("ls", tool_dir (), &c) == -1) {
    tool_error ("ls: %s: %m", tool_dir ());
    return EXIT_USAGE;
  }
  if (json)
    print_json (&c);
  else
    print_table (&c);
  tool_cache_close (&c);
  return EXIT_SUCCESS;
}
