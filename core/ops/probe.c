/* libfscache: the fills' cost measure (cost.c) in the fill path: its
 * steps, taken as clients' reads ask whether to fill, and its probes'
 * holds of the fill queue (issue 44).
 *
 * cost.c is the measure itself, a state machine fed with numbers; here
 * it is fed from the cache's counters and meters, and its mode is made
 * real.  "Without fills" is one of two things: in the stretch of a
 * verdict "costly", the budget engaged (fill.c, budget_engaged: fills
 * admitted at a fiftieth of their rate, readahead paused); in a probe
 * of a verdict "free", the fills held in their queue (fsc_fill_held):
 * the fill threads write nothing until the hold's end (fill.c,
 * filler), and what the hold kept is written if the verdict stays
 * "free", dropped if the probe made it "costly" (fill.c, drop).
 *
 * No lock of its own: the measure's state is cost.c's, under its
 * lock; the hold is one atomic deadline, ended under fill_lock so that
 * the fill threads waiting for it wake.
 */
#include <config.h>

#include <pthread.h>
#include <stdint.h>

#include "internal.h"
#include "utils.h"

/* Is a probe of cost.c holding the fills?  The fill threads write
 * nothing until the hold's end, the queue may grow to its most
 * (fill.c, FILL_MAX_BYTES), and once it is full a client's miss skips
 * its fill rather than write it inline (fsc_fill_slower).  So a probe
 * of a stream whose fills are free leaves nothing uncached that fits
 * in the queue (300 ms of a link at 3 Gbit/s), where skipping every
 * fill for the probe's length would leave a few percent of a long read
 * to the catch-up.  A probe that finds them costly has what it held
 * dropped instead (fill.c, drop): the skip the budget, engaged from
 * then on, would have made.
 */
bool
fsc_fill_held (struct fsc_cache *c)
{
  const uint64_t until = __atomic_load_n (&c->fill_hold_until,
                                          __ATOMIC_RELAXED);
  return until != 0 && fsc_mono_ns () < until;
}

/* End a probe's hold now.  A reader waiting for a held job's claim
 * (another piece of its block, which the job does not hold) would
 * otherwise wait for the probe: random 4 KiB reads over a 2 ms link
 * fell from 0.93 to 0.75 of no cache (tools/bench/compare.sh
 * cold-rand-4k-bw), the probes' windows serving 0.39 of the others.
 * The probe then measures fills that were not held, a ratio near 1:
 * the fills of such a stream cost it nothing that a hold could show.
 */
void
fsc_fill_unhold (struct fsc_cache *c)
{
  if (__atomic_load_n (&c->fill_hold_until, __ATOMIC_RELAXED) == 0)
    return;
  pthread_mutex_lock (&c->fill_lock);
  __atomic_store_n (&c->fill_hold_until, 0, __ATOMIC_RELAXED);
  pthread_cond_broadcast (&c->fill_cond);
  pthread_mutex_unlock (&c->fill_lock);
}

/* Bytes served to clients so far, cost.c's measure. */
static uint64_t
served_bytes (struct fsc_stats *st)
{
  return __atomic_load_n (&st->hit_bytes, __ATOMIC_RELAXED) +
    __atomic_load_n (&st->miss_bytes, __ATOMIC_RELAXED) +
    __atomic_load_n (&st->hits_rerouted_bytes, __ATOMIC_RELAXED);
}

/* Step the comparison of windows with fills and without (cost.c).  Its
 * mode "without" is one of two things: in the stretch of a verdict
 * "costly", the budget engaged (the return value: fills admitted at
 * DUTY_PCT of their rate, readahead paused); in a probe of a verdict
 * "free", the fills held (fsc_fill_held).  Its figures go to the stats
 * when a comparison was made.
 */
bool
fsc_fill_cost_engaged (struct fsc_cache *c)
{
  struct fsc_cost *k = &c->cost;
  /* Nothing can be stored (fscache-min-free, the stop mark): no fills
   * to weigh.
   */
  if (!k->enabled || fsc_space_low (c))
    return false;
  const uint64_t now = fsc_mono_ns ();
  struct fsc_stats *st = &c->stats;
  /* Its windows end by time, or while a stream learns by bytes served
   * too (cost.c): the counters, which every request moves, are read
   * only then.
   */
  const uint64_t next_served = __atomic_load_n (&k->next_served,
                                                __ATOMIC_RELAXED);
  bool bare;
  if (now < __atomic_load_n (&k->next_ns, __ATOMIC_RELAXED) &&
      (next_served == UINT64_MAX || served_bytes (st) < next_served))
    bare = __atomic_load_n (&k->bare, __ATOMIC_RELAXED);
  else {
    /* The guess: a local upstream, and fills faster than it but not
     * twice as fast.  An upstream faster still than the fills has the
     * rates' rules (budget_engaged, the full queue's skip); one far
     * slower, its fills; a link paces its clients itself (a 6 MiB/s
     * link guessed "costly" had two thirds of a read through it
     * unstored before the samples overturned the guess:
     * test-fscache-slow-disk.sh).
     */
    const uint64_t up = __atomic_load_n (&c->up_meter.rate,
                                         __ATOMIC_RELAXED);
    const uint64_t fill = __atomic_load_n (&c->fill_meter.rate,
                                           __ATOMIC_RELAXED);
    bare = fsc_cost_step (k, now, served_bytes (st),
                          __atomic_load_n (&st->upstream_busy_us,
                                           __ATOMIC_RELAXED),
                          !fsc_upstream_remote (c) && fill != 0 &&
                          up >= fill / 2 && up < fill);
    const uint64_t n = __atomic_load_n (&k->samples, __ATOMIC_RELAXED);
    if (n != __atomic_load_n (&st->fill_cost_samples, __ATOMIC_RELAXED)) {
      __atomic_store_n (&st->fill_cost_samples, n, __ATOMIC_RELAXED);
      __atomic_store_n (&st->fill_cost_changes,
                        __atomic_load_n (&k->changes, __ATOMIC_RELAXED),
                        __ATOMIC_RELAXED);
      __atomic_store_n (&st->fill_cost_pm,
                        __atomic_load_n (&k->ratio_pm, __ATOMIC_RELAXED),
                        __ATOMIC_RELAXED);
      __atomic_store_n (&st->fill_costly,
                        __atomic_load_n (&k->costly, __ATOMIC_RELAXED),
                        __ATOMIC_RELAXED);
    }
  }
  const bool costly = __atomic_load_n (&k->costly, __ATOMIC_RELAXED);
  const bool hold = bare && !costly;
  const uint64_t until = __atomic_load_n (&c->fill_hold_until,
                                          __ATOMIC_RELAXED);
  if (hold && until <= now)     /* a probe begins (or a stale hold) */
    __atomic_store_n (&c->fill_hold_until, now + FSC_COST_PROBE_NS,
                      __ATOMIC_RELAXED);
  else if (!hold)
    fsc_fill_unhold (c);
  return bare && costly;
}

bool
fsc_fill_cost_off (struct fsc_cache *c)
{
  return fsc_fill_cost_engaged (c) || fsc_fill_held (c);
}
