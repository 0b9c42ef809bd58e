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
 * The file is read by core/disk/live.c (fsc_live_read), as the filter reads
 * it back.
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd-fscache.h"

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
  { "fill_skipped_bytes", 'c',
    "Bytes read upstream and not cached: the cache disk was the bottleneck." },
  { "peer_bytes", 'c',
    "Of upstream_bytes, those fetched from fleet peers, not the origin." },
  { "peer_served_bytes", 'c', "Bytes served to other nodes' proxies." },
  { "peer_errors", 'c', "Failed reads from and connections to peers." },
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
  struct fsc_live_head h;
  struct fsc_ostats ctr;
};

const double tool_mrc_scales[TOOL_MRC_SCALES] = { 0.25, 0.5, 1, 2, 4, 8 };

double
tool_mrc_at (const struct tool_object *o, uint64_t bytes)
{
  if (o->mrc_n == 0)
    return -1;
  if (bytes <= o->mrc_bytes[0])
    return o->mrc_hit[0] * bytes / (double) (o->mrc_bytes[0] ? o->mrc_bytes[0] : 1);
  for (unsigned i = 1; i < o->mrc_n; ++i)
    if (bytes <= o->mrc_bytes[i]) {
      /* Between two points, in the logarithm of the size. */
      double a = log ((double) o->mrc_bytes[i - 1]), b = log ((double) o->mrc_bytes[i]);
      double t = b > a ? (log ((double) bytes) - a) / (b - a) : 1;
      return o->mrc_hit[i - 1] + t * (o->mrc_hit[i] - o->mrc_hit[i - 1]);
    }
  return o->mrc_hit[o->mrc_n - 1];        /* the whole export */
}

void
tool_load_counters (int fanfd, struct tool_object *o)
{
  struct stats_file sf = { .h.open = false };
  bool sb_ok = o->err == 0 && o->info.reason == FSC_OK;
  bool have = fsc_live_read (fanfd, o->f.name, &sf.h, &sf.ctr) == 0 &&
    (!sb_ok || sf.h.incarnation == o->info.sb.incarnation);
  double updated = sf.h.updated_ms / 1000.0;

  memset (&o->ctr, 0, sizeof o->ctr);
  o->mrc_n = have ? sf.h.mrc_n : 0;
  o->cap = have ? sf.h.cap : 0;
  if (o->mrc_n) {
    o->mrc_since = sf.h.mrc_since;
    o->mrc_refs = sf.h.mrc_refs;
    memcpy (o->mrc_bytes, sf.h.mrc_bytes, sizeof o->mrc_bytes);
    memcpy (o->mrc_hit, sf.h.mrc_hit, sizeof o->mrc_hit);
  }
  o->src = SRC_NONE;
  o->ctr_time = 0;
  if (have && o->f.locked && sf.h.open) {
    o->ctr = sf.ctr;
    o->src = SRC_LIVE;
    o->ctr_time = updated;
  }
  else if (have && (!sb_ok || updated > (double) o->info.sb.counters_time)) {
    o->ctr = sf.ctr;
    o->src = SRC_STATS;
    o->ctr_time = updated;
  }
  else if (sb_ok) {
    o->ctr = o->info.sb.ostats;
    o->src = SRC_SUPERBLOCK;
    o->ctr_time = o->info.sb.counters_time;
  }
}
