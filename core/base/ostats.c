/* libfscache: names of the object counters (ostats.h).  The counting
 * is where the events happen; publishing NAME.stats is in live.c.  The
 * fleet's counters (fsc_object_count_peer, fsc_cache_count_peer), which
 * the filter's peer code reports, are counted here, in the object's
 * counters and the cache's both: a ground-floor call, so that the
 * object core need not call up into cache.c for them.
 */
#include <config.h>

#include <string.h>

#include "internal.h"
#include "ostats.h"

static const char *const names[FSC_OSTATS_COUNT] = {
#define FSC_OSTATS_NAME(name) #name,
  FSC_OSTATS_FIELDS (FSC_OSTATS_NAME)
#undef FSC_OSTATS_NAME
};

const char *
fsc_ostat_name (unsigned i)
{
  return i < FSC_OSTATS_COUNT ? names[i] : NULL;
}

int
fsc_ostat_index (const char *name)
{
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    if (strcmp (names[i], name) == 0)
      return (int) i;
  return -1;
}

void
fsc_cache_count_yield (struct fsc_cache *cache)
{
  FSC_STAT_ADD (&cache->stats, worker_yields, 1);
}

void
fsc_cache_count_peer (struct fsc_cache *cache, enum fsc_peer_stat which,
                      uint64_t delta)
{
  struct fsc_stats *st = &cache->stats;
  switch (which) {
  case FSC_PEER_READS: FSC_STAT_ADD (st, peer_reads, delta); break;
  case FSC_PEER_READ_BYTES: FSC_STAT_ADD (st, peer_read_bytes, delta); break;
  case FSC_PEER_ERRORS: FSC_STAT_ADD (st, peer_errors, delta); break;
  case FSC_PEER_BACKOFFS: FSC_STAT_ADD (st, peer_backoffs, delta); break;
  case FSC_PEER_SERVED: FSC_STAT_ADD (st, peer_served, delta); break;
  case FSC_PEER_SERVED_BYTES:
    FSC_STAT_ADD (st, peer_served_bytes, delta);
    break;
  case FSC_PEER_REFUSED: FSC_STAT_ADD (st, peer_refused, delta); break;
  case FSC_PEER_FALLBACKS: FSC_STAT_ADD (st, peer_fallbacks, delta); break;
  case FSC_PEER_BUSY: FSC_STAT_ADD (st, peer_busy, delta); break;
  case FSC_PEER_PROBES: FSC_STAT_ADD (st, peer_probes, delta); break;
  case FSC_PEER_PROBES_FAILED:
    FSC_STAT_ADD (st, peer_probes_failed, delta);
    break;
  case FSC_PEER_BAD_DATA: FSC_STAT_ADD (st, peer_bad_data, delta); break;
  case FSC_PEER_HOPS: FSC_STAT_ADD (st, peer_hops, delta); break;
  case FSC_PEER_FALLBACKS_WAITED:
    FSC_STAT_ADD (st, peer_fallbacks_waited, delta);
    break;
  }
}

void
fsc_object_count_peer (struct fsc_object *o, enum fsc_peer_stat which,
                       uint64_t delta)
{
  fsc_cache_count_peer (o->cache, which, delta);
  switch (which) {
  case FSC_PEER_READ_BYTES: FSC_OSTAT_ADD (o, peer_bytes, delta); break;
  case FSC_PEER_ERRORS: FSC_OSTAT_ADD (o, peer_errors, delta); break;
  case FSC_PEER_SERVED_BYTES:
    FSC_OSTAT_ADD (o, peer_served_bytes, delta);
    break;
  default: break;
  }
}

