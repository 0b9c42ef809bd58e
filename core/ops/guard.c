/* libfscache: the latency guard (issue 44).  A hit is supposed to be
 * the fast path; but a cache disk saturated by fills, eviction, another
 * tenant or a failing drive can take longer to read a block than the
 * upstream takes to send it, and then the cache makes a client slower
 * than no cache.  bcache routes reads around its cache device once the
 * device's latency passes a threshold (2 ms for reads); so does this,
 * comparing the two paths' measured latencies instead of one fixed
 * figure.
 *
 * The measures: a moving average (1/8 per sample) of a small hit's
 * time, per cache (one disk), and of a small upstream read's time, per
 * object (each its own upstream: an HTTP origin at 20 ms, an nbd server
 * at 100 us).  Small: at most FSC_GUARD_MAX_BYTES; bigger reads are
 * bandwidth, not latency.  A hit the page cache served counts as 0:
 * its time is the CPU's (base/io.h, fsc_io_disk_touched).  On 2 busy
 * cores hits from memory took over 2 ms often enough to reroute them,
 * to a link the cold stream beside them kept busy (stop 54: 260,000
 * hits rerouted in tools/bench/latency.sh, whose hits are all in the
 * page cache).
 *
 * The route, per object:
 *   - to the disk while hits are fast (under HIT_SLOW_NS): nothing
 *     else is done, nothing upstream is spent;
 *   - hits slow (their average, and most of them: SLOW_SHARE) and the
 *     upstream not measured yet: one hit in PROBE_EVERY (2) goes
 *     upstream, to measure it (then misses keep measuring it);
 *   - hits slow and over twice the upstream's time: reroute.  Hits go
 *     upstream, but one every PROBE_DISK_MS still reads the disk, so
 *     that the route comes back when the disk recovers
 *     (RECOVER_PROBES probes in a row under HIT_SLOW_NS / 2, or under
 *     the upstream's average: one alone may have found its page in
 *     the page cache, and a return too early costs a second of slow
 *     hits before the route may change again).  One probe in 8 hits,
 *     as first written, put a slow disk read in the clients' p99 (57
 *     ms against the upstream's 2 ms, tools/bench/guard.sh).
 *
 * Invariants:
 *   G1  a rerouted hit returns the upstream's bytes for blocks the
 *       cache holds clean: only where the upstream holds the same
 *       (the filter enables the guard for writethrough and writearound
 *       caches, never for one with write-back data, whose only copy is
 *       the cache).  Broken by tests/filter/test-fscache-guard.sh, which
 *       compares every read with the image (cmp).
 *   G2  no oscillation: an object's route changes at most once per
 *       DWELL_MS, whatever the samples say, so route changes per second
 *       are bounded by construction (guard_switches counts them).
 *       Broken by the same test, which bounds guard_switches by the
 *       seconds the reads took.
 *
 * Off with fscache-latency-guard=false.  No lock: the averages and the
 * route are relaxed atomics, and a race between two samples loses one
 * of them, which a moving average does not notice.
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "guard.h"
#include "utils.h"

#define HIT_SLOW_NS 2000000     /* 2 ms: bcache's read threshold */
#define PROBE_EVERY 2           /* slow hits, the upstream unmeasured:
                                 * every other goes upstream (each slow
                                 * one costs a client tens of ms) */
#define DWELL_MS 1000
#define MIN_SAMPLES 4           /* of each side, before a switch */
#define SLOW_SHARE 128          /* of 1024: an eighth of the recent hits
                                 * over HIT_SLOW_NS before anything is
                                 * done: a loaded machine's scheduling
                                 * makes a rare hit slow, and the
                                 * average with it; a slow disk makes
                                 * slow every hit its page cache does
                                 * not hold (half of them, past 50 ms,
                                 * in tools/bench/guard.sh; half is too
                                 * many: there the guard never acted) */
#define RECOVER_PROBES 3        /* fast disk probes in a row that end
                                 * a reroute */
#define PROBE_DISK_MS 2000      /* rerouted, a disk probe this often: a
                                 * client's read that waits on the slow
                                 * disk, so rare enough to stay out of
                                 * the p99.9 at hundreds of reads a
                                 * second */

static void
average (uint64_t *avg, uint64_t *n, uint64_t ns)
{
  uint64_t a = __atomic_load_n (avg, __ATOMIC_RELAXED);
  uint64_t k = __atomic_add_fetch (n, 1, __ATOMIC_RELAXED);
  a = k == 1 ? ns : a - a / 8 + ns / 8;
  __atomic_store_n (avg, a, __ATOMIC_RELAXED);
}

/* Whether a hit from the page cache (NS 0) would leave the guard as it
 * is: the averages too small to move (a - a/8 is a for a < 8), the
 * last hit fast, enough hits counted, and no reroute watching the
 * count for probes.  Then nothing is written: the guard is the
 * cache's, and four stores a hit took its line from the other CPU's
 * cache on every hit of an idle proxy's 4 KiB reads (issue 44).
 */
static bool
hit_changes_nothing (const struct fsc_object *o, const struct fsc_guard *g,
                     uint64_t ns)
{
  return ns == 0 &&
    __atomic_load_n (&g->hit_ns, __ATOMIC_RELAXED) < 8 &&
    __atomic_load_n (&g->slow_share, __ATOMIC_RELAXED) < 16 &&
    __atomic_load_n (&g->last_hit_ns, __ATOMIC_RELAXED) == 0 &&
    __atomic_load_n (&g->hit_n, __ATOMIC_RELAXED) >= MIN_SAMPLES &&
    !__atomic_load_n (&o->guard.rerouting, __ATOMIC_RELAXED);
}

void
fsc_guard_hit_time (struct fsc_object *o, uint64_t bytes, uint64_t ns)
{
  struct fsc_guard *g = &o->cache->guard;
  if (g->enabled && bytes <= FSC_GUARD_MAX_BYTES &&
      !hit_changes_nothing (o, g, ns)) {
    average (&g->hit_ns, &g->hit_n, ns);
    __atomic_store_n (&g->last_hit_ns, ns, __ATOMIC_RELAXED);
    /* The share of slow hits, in 1/1024, moving by 1/16 a hit. */
    int64_t sh = (int64_t) __atomic_load_n (&g->slow_share, __ATOMIC_RELAXED);
    sh += ((ns >= HIT_SLOW_NS ? 1024 : 0) - sh) / 16;
    __atomic_store_n (&g->slow_share, (uint64_t) sh, __ATOMIC_RELAXED);
  }
}

void
fsc_guard_up_time (struct fsc_object *o, uint64_t bytes, uint64_t ns)
{
  if (o->cache->guard.enabled && bytes <= FSC_GUARD_MAX_BYTES)
    average (&o->guard.up_ns, &o->guard.up_n, ns);
}

/* Switch O's route to ON if DWELL_MS have passed since the last (G2). */
static void
maybe_switch (struct fsc_object *o, bool on)
{
  struct fsc_guard_obj *go = &o->guard;
  uint64_t now = fsc_mono_ms ();
  uint64_t last = __atomic_load_n (&go->switched_ms, __ATOMIC_RELAXED);
  if (last != 0 && now - last < DWELL_MS)
    return;
  if (!__atomic_compare_exchange_n (&go->switched_ms, &last, now, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return;                     /* another thread switched it */
  __atomic_store_n (&go->rerouting, on, __ATOMIC_RELAXED);
  FSC_STAT_ADD (&o->cache->stats, guard_switches, 1);
}

bool
fsc_guard_reroute (struct fsc_object *o, uint64_t bytes)
{
  struct fsc_guard *g = &o->cache->guard;
  struct fsc_guard_obj *go = &o->guard;
  if (!g->enabled || bytes > FSC_GUARD_MAX_BYTES)
    return false;
  uint64_t hit = __atomic_load_n (&g->hit_ns, __ATOMIC_RELAXED);
  uint64_t hn = __atomic_load_n (&g->hit_n, __ATOMIC_RELAXED);
  uint64_t up = __atomic_load_n (&go->up_ns, __ATOMIC_RELAXED);
  uint64_t un = __atomic_load_n (&go->up_n, __ATOMIC_RELAXED);
  bool on = __atomic_load_n (&go->rerouting, __ATOMIC_RELAXED);

  if (on) {
    /* The disk's recovery is judged by its last probe, not the
     * average, which would take tens of them to come down.
     */
    uint64_t last_hit = __atomic_load_n (&g->last_hit_ns, __ATOMIC_RELAXED);
    uint64_t seen = __atomic_load_n (&go->seen_hit_n, __ATOMIC_RELAXED);
    if (seen != hn &&
        __atomic_compare_exchange_n (&go->seen_hit_n, &seen, hn, false,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      /* A new probe: RECOVER_PROBES fast ones in a row (one may find
       * its page in the page cache) bring the route back.
       */
      if (last_hit < HIT_SLOW_NS / 2 || last_hit < up)
        __atomic_add_fetch (&go->fast_probes, 1, __ATOMIC_RELAXED);
      else
        __atomic_store_n (&go->fast_probes, 0, __ATOMIC_RELAXED);
    }
    if (__atomic_load_n (&go->fast_probes, __ATOMIC_RELAXED) >=
        RECOVER_PROBES) {
      __atomic_store_n (&go->fast_probes, 0, __ATOMIC_RELAXED);
      __atomic_store_n (&g->hit_ns, last_hit, __ATOMIC_RELAXED);
      maybe_switch (o, false);
      return false;
    }
    uint64_t now = fsc_mono_ms ();
    uint64_t last = __atomic_load_n (&go->probed_disk_ms, __ATOMIC_RELAXED);
    if (now - last >= PROBE_DISK_MS &&
        __atomic_compare_exchange_n (&go->probed_disk_ms, &last, now, false,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return false;             /* a probe of the disk */
    goto reroute;
  }
  if (hit < HIT_SLOW_NS || hn < MIN_SAMPLES ||
      __atomic_load_n (&g->slow_share, __ATOMIC_RELAXED) < SLOW_SHARE)
    return false;               /* the common case: hits are fast */
  if (un >= MIN_SAMPLES && hit > 2 * up) {
    maybe_switch (o, true);
    if (__atomic_load_n (&go->rerouting, __ATOMIC_RELAXED))
      goto reroute;
  }
  /* A probe of the upstream (its time is measured by the read) while
   * it is unmeasured, one hit in PROBE_EVERY.  Measured, misses keep
   * measuring it; a periodic probe on top read the upstream during a
   * warm pass on a loaded machine (test-fscache-clients.sh: 4 KiB
   * upstream where none was due).
   */
  if (un >= MIN_SAMPLES ||
      __atomic_add_fetch (&go->tick, 1, __ATOMIC_RELAXED) % PROBE_EVERY != 0)
    return false;
 reroute:
  FSC_STAT_ADD (&o->cache->stats, hits_rerouted, 1);
  FSC_STAT_ADD (&o->cache->stats, hits_rerouted_bytes, bytes);
  return true;
}
