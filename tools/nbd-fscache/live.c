/* nbd-fscache: an object's counters, from NAME.stats or the superblock.
 *
 * Two copies exist (docs/format.md, "Object counters" and "Live
 * statistics"): the superblock's, written at open, at every commit
 * that changed something and at close, and NAME.stats, rewritten by
 * the proxy using the object every 2 seconds and once at close.  The
 * file is taken as live when the object is locked (in use, per
 * /proc/locks) and it says "open 1"; otherwise the newer of the two
 * wins ("updated" against the superblock's counters_time), so that
 * the last rewrite at close is not lost to an older superblock.  A
 * stats file of another incarnation (the object was recreated since)
 * is ignored.
 *
 * The file is read whole (it is small), lines of "name value"; lines
 * not known are skipped, as the format allows.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd-fscache.h"

#define STATS_MAX 65536         /* a stats file is far smaller */

/* Kinds and sentences, by counter name; names not here are counters. */
static const struct {
  const char *name;
  char kind;
  const char *help;
} about[] = {
  { "opens", 'c', "Times the object was opened." },
  { "hit_requests", 'c', "Client reads served wholly from the cache." },
  { "hit_bytes", 'c', "Bytes served from the cache." },
  { "miss_requests", 'c', "Client reads that needed the upstream." },
  { "miss_bytes", 'c', "Bytes of reads served from the upstream." },
  { "upstream_reads", 'c', "Read requests sent upstream." },
  { "upstream_bytes", 'c', "Bytes read upstream (misses and prefetches)." },
  { "prefetch_bytes", 'c', "Bytes read upstream ahead of clients." },
  { "stored_blocks", 'c', "Blocks (or pieces of them) stored." },
  { "stored_bytes", 'c', "Bytes written into the data files." },
  { "evicted_blocks", 'c', "Blocks evicted to keep a cap or quota." },
  { "evicted_bytes", 'c', "Bytes of the blocks evicted." },
  { "invalidations", 'c', "Times the cached data was discarded." },
  { "invalidated_blocks", 'c', "Blocks dropped by writes." },
  { "write_requests", 'c', "Client writes, trims and zeroes." },
  { "write_bytes", 'c', "Bytes of client writes, trims and zeroes." },
  { "verify_failures", 'c', "Hits whose checksum did not match." },
  { "io_errors", 'c', "Failed cache file reads, writes and syncs." },
  { "withdrawals", 'c', "Times the object was withdrawn." },
  { "last_use", 't', "Time of the last client read." },
  { "last_invalidation", 't', "Time of the last invalidation." },
  { "present_blocks", 'g', "Blocks cached, whole or in pieces." },
  { "cached_bytes", 'g', "Bytes the cached blocks hold." },
};

static int
about_of (unsigned i)
{
  const char *name = fsc_ostat_name (i);
  for (size_t j = 0; name && j < sizeof about / sizeof about[0]; ++j)
    if (strcmp (about[j].name, name) == 0)
      return (int) j;
  return -1;
}

char
tool_ostat_kind (unsigned i)
{
  int j = about_of (i);
  return j >= 0 ? about[j].kind : 'c';
}

const char *
tool_ostat_help (unsigned i)
{
  int j = about_of (i);
  return j >= 0 ? about[j].help : "An object counter.";
}

const char *
tool_source_name (enum counters_source s)
{
  switch (s) {
  case SRC_SUPERBLOCK: return "superblock";
  case SRC_STATS: return "stats file";
  case SRC_LIVE: return "live";
  default: return "none";
  }
}

struct stats_file {
  bool open;
  double updated;
  uint64_t incarnation;
  bool have_incarnation;
  struct fsc_ostats ctr;
};

/* Read FANFD/NAME.stats.  0, or -1 if absent or not a stats file. */
static int
read_stats (int fanfd, const char *name, struct stats_file *sf)
{
  char path[FSC_NAME_MAX + 16];
  CLEANUP_FREE char *buf = malloc (STATS_MAX + 1);
  bool format_ok = false;

  memset (sf, 0, sizeof *sf);
  if (buf == NULL)
    return -1;
  snprintf (path, sizeof path, "%s.stats", name);
  int fd = openat (fanfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  if (fd == -1)
    return -1;
  ssize_t n = read (fd, buf, STATS_MAX);
  close (fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  for (char *line = strtok (buf, "\n"); line; line = strtok (NULL, "\n")) {
    char key[64], val[128];
    if (line[0] == '#' || sscanf (line, "%63s %127s", key, val) != 2)
      continue;
    int i;
    if (strcmp (key, "format") == 0)
      format_ok = strcmp (val, "1") == 0;
    else if (strcmp (key, "open") == 0)
      sf->open = strcmp (val, "1") == 0;
    else if (strcmp (key, "updated") == 0)
      sf->updated = strtod (val, NULL);
    else if (strcmp (key, "incarnation") == 0) {
      sf->incarnation = strtoull (val, NULL, 16);
      sf->have_incarnation = true;
    }
    else if (strcmp (key, "last_reason") == 0) {
      for (int r = 0; r < FSC_REASONS; ++r)
        if (strcmp (fsc_reason_name (r), val) == 0)
          sf->ctr.last_reason = r;
    }
    else if ((i = fsc_ostat_index (key)) >= 0)
      sf->ctr.v[i] = strtoull (val, NULL, 10);
  }
  return format_ok ? 0 : -1;
}

void
tool_load_counters (int fanfd, struct tool_object *o)
{
  struct stats_file sf;
  bool sb_ok = o->err == 0 && o->info.reason == FSC_OK;
  bool have = read_stats (fanfd, o->f.name, &sf) == 0 &&
    (!sb_ok || !sf.have_incarnation ||
     sf.incarnation == o->info.sb.incarnation);

  memset (&o->ctr, 0, sizeof o->ctr);
  o->src = SRC_NONE;
  o->ctr_time = 0;
  if (have && o->f.locked && sf.open) {
    o->ctr = sf.ctr;
    o->src = SRC_LIVE;
    o->ctr_time = sf.updated;
  }
  else if (have && (!sb_ok || sf.updated > (double) o->info.sb.counters_time)) {
    o->ctr = sf.ctr;
    o->src = SRC_STATS;
    o->ctr_time = sf.updated;
  }
  else if (sb_ok) {
    o->ctr = o->info.sb.ostats;
    o->src = SRC_SUPERBLOCK;
    o->ctr_time = o->info.sb.counters_time;
  }
}
