/* libfscache: what fills cost the clients, measured (issue 44).
 *
 * A cache that stores what a fast upstream sends costs the stream
 * something that no rate shows.  On the 2-CPU machine of
 * docs/benchmarks.md, fio reading an NBD server next door through the
 * filter ran at 0.76-0.83 of the bare proxy while storing, and at 1.03
 * while storing nothing (DIR/fscache.stop); the fills' direct writes
 * ran faster than the upstream, so the budget's rule (fill.c: fills
 * slower than the upstream) did not engage, and the CPUs were not all
 * busy (vmstat: 6-14% idle, 11-28% in I/O wait), so a rule on idle
 * CPU did not engage either.  What the fills take is the moments the
 * stream's requests need a CPU: the copy to the client from the job,
 * checksums, the fill thread's wakeups and the direct writes' page
 * pinning, on the same two CPUs as the client and the upstream.
 *
 * So this measures the effect itself, as an A/B test on the live
 * stream: clients' bytes served per second with fills, and without
 * (bare: a client's miss bypasses the cache as past the fill budget,
 * and readahead pauses, as when fills are slower than the upstream).
 * If the bare windows serve clients COSTLY_PM per mille of the fill
 * windows' rate or more, on average over the last COST_N samples, the
 * fills slow the clients: the verdict is "costly", and fill.c engages
 * the budget until the samples say the fills cost nothing any more
 * (FREE_PM).  What is skipped is noted for the catch-up, which stores
 * it once the clients are idle.
 *
 * The schedule: a stretch in the verdict's mode (cycle_ns), whose last
 * WINDOW_NS is measured; if that window counts (below), SETTLE_NS in
 * the other mode, not measured (the fill queue drains, readahead stops
 * or starts), then WINDOW_NS in it, measured; then the verdict's mode
 * again.  One window's rate is noisy: a stream of 1 MiB reads from an
 * NBD server next door served 1.0 to 1.25 GB/s from one 200 ms window
 * to the next with nothing changed, so a verdict wants the mean of
 * COST_N samples.  Until a stream has them the stretch stays at
 * CYCLE_MIN_NS (a sample every 0.8 s); then it doubles up to
 * CYCLE_MAX_NS while the samples leave the verdict as it is, so that
 * a stable stream spends (SETTLE_NS + WINDOW_NS) / (CYCLE_MAX_NS +
 * SETTLE_NS + WINDOW_NS), 4%, of its time in the other mode, and goes
 * back to CYCLE_MIN_NS when the verdict changes.
 *
 * A window counts only if the clients kept the upstream busy
 * (BUSY_PCT of it with a read in flight) and were served MIN_BYTES:
 * the rates of a stream limited by the path, not by what the client
 * asked for.  A client that reads, thinks and reads again gives two
 * windows of its own pace, a ratio near 1, and keeps its fills; a
 * stretch whose window does not count has no probe.  A gap of REST_NS
 * between steps (no miss) starts a new stream: the samples go.
 *
 * The samples take seconds, and a stream of 4 GiB from a fast server
 * lasts three.  So a stream starts from a guess, taken at its first
 * window that counts (a stream's first stretch is that window alone,
 * 0.2 s): the caller's PRIOR, "costly" when the upstream is local and
 * the fills run faster than it but not twice as fast (fill.c), an
 * upstream about as fast as the cache disk, where storing gains the
 * client nothing now and the catch-up can store later; "free"
 * otherwise.  The samples then confirm or overturn it.  While the
 * verdict is "costly" every probe costs the clients, so the stretch
 * grows from the first sample on, learning or not (a wrong guess is
 * overturned in about 9 s instead of 3.2).
 *
 * What "without fills" means is the caller's (fill.c): in a stretch
 * of the verdict "costly", the fill budget engaged; in a probe of the
 * verdict "free", the fills held in their queue, so that a link whose
 * fills are free has nothing of its probes left unstored (issue 44
 * wants 95% of an 8 GiB read at 1.6 Gbit/s cached at a clean stop
 * right after it).
 *
 * Invariants:
 *   K1  no oscillation: the verdict changes only on the mean of
 *       COST_N samples past a threshold, with a gap between the
 *       thresholds (FREE_PM < COSTLY_PM), or while learning on the
 *       mean of two or three past STRONG_PM (or under 2 - STRONG_PM,
 *       back), and at most once per sample,
 *       so at most once per CYCLE_MIN_NS + SETTLE_NS + WINDOW_NS.
 *       Broken by tests/unit/unit-cost.c, which feeds it rates that
 *       are noisy around the thresholds and counts the changes.
 *   K2  a stream whose fills cost it nothing keeps them: no verdict
 *       "costly" on equal rates with this machine's noise, and bare
 *       windows a bounded share of the time.  Broken by unit-cost.c.
 *   K3  a stream that fills slow down is found: with the fills costing
 *       a fifth, the verdict is "costly" once it has COST_N samples
 *       (3.4 s) whatever the guess, and stays; a wrong guess of
 *       "costly" is overturned within 10 s.  Broken by unit-cost.c.
 */
#include <config.h>

#include <string.h>

#include "cost.h"

#define WINDOW_NS FSC_COST_WINDOW_NS
#define SETTLE_NS FSC_COST_SETTLE_NS
#define CYCLE_MIN_NS ((uint64_t) 500 * 1000 * 1000)
#define CYCLE_MAX_NS ((uint64_t) 8000 * 1000 * 1000)
#define COST_N 4                /* samples averaged (last_pm) */
#define REST_NS ((uint64_t) 1000 * 1000 * 1000)
#define BUSY_PCT 75
#define MIN_BYTES ((uint64_t) 1 << 20)
#define COSTLY_PM 1100          /* fills cost a tenth of the rate or more */
#define FREE_PM 1040            /* ... under 4%: this machine's noise */
#define STRONG_PM 1200          /* a fifth: decides on two samples */

enum { COST_IDLE, COST_NORMAL, COST_SETTLE, COST_PROBE };

void
fsc_cost_init (struct fsc_cost *k, bool on)
{
  memset (k, 0, sizeof *k);
  pthread_mutex_init (&k->lock, NULL);
  k->enabled = on;
  k->phase = COST_IDLE;
  k->cycle_ns = CYCLE_MIN_NS;
}

void
fsc_cost_destroy (struct fsc_cost *k)
{
  pthread_mutex_destroy (&k->lock);
}

static void
set_bare (struct fsc_cost *k, bool bare)
{
  __atomic_store_n (&k->bare, bare, __ATOMIC_RELAXED);
}

static void
set_next (struct fsc_cost *k, uint64_t t)
{
  __atomic_store_n (&k->next_ns, t, __ATOMIC_RELAXED);
}

/* A new stream: the verdict stays, the windows and samples restart. */
static void
rest_locked (struct fsc_cost *k, uint64_t now)
{
  k->phase = COST_IDLE;
  k->w_ns = 0;
  k->normal_rate = 0;
  k->nlast = 0;
  k->guessed = false;
  k->cycle_ns = CYCLE_MIN_NS;
  set_bare (k, k->costly);
  set_next (k, now);
}

static void
mark (struct fsc_cost *k, uint64_t now, uint64_t served, uint64_t busy_us)
{
  k->w_ns = now;
  k->w_served = served;
  k->w_busy_us = busy_us;
}

/* The window marked, closed at NOW: its rate in bytes/s, or 0 if it
 * does not count (see the top of this file).
 */
static uint64_t
window_rate (struct fsc_cost *k, uint64_t now, uint64_t served,
             uint64_t busy_us)
{
  if (k->w_ns == 0 || now <= k->w_ns || served < k->w_served ||
      busy_us < k->w_busy_us)
    return 0;
  const uint64_t ns = now - k->w_ns;
  const uint64_t bytes = served - k->w_served;
  const uint64_t busy_ns = (busy_us - k->w_busy_us) * 1000;
  k->w_ns = 0;
  if (bytes < MIN_BYTES || busy_ns < ns / 100 * BUSY_PCT)
    return 0;
  return (uint64_t) ((double) bytes * 1e9 / (double) ns);
}

/* The verdict changes: back to short stretches. */
static void
flip (struct fsc_cost *k, bool costly)
{
  __atomic_store_n (&k->costly, costly, __ATOMIC_RELAXED);
  __atomic_add_fetch (&k->changes, 1, __ATOMIC_RELAXED);
  k->cycle_ns = CYCLE_MIN_NS;
}

/* A sample: BARE and FILL, the two windows' rates. */
static void
sample (struct fsc_cost *k, uint64_t bare, uint64_t fill)
{
  const uint64_t pm = (uint64_t) ((double) bare * 1000.0 / (double) fill);
  __atomic_store_n (&k->ratio_pm, pm, __ATOMIC_RELAXED);
  __atomic_add_fetch (&k->samples, 1, __ATOMIC_RELAXED);
  k->last_pm[k->ring] = pm;
  k->ring = (k->ring + 1) % COST_N;
  if (k->nlast < COST_N)
    k->nlast++;
  uint64_t sum = 0;
  for (unsigned i = 0; i < k->nlast; ++i)
    sum += k->last_pm[(k->ring + COST_N - 1 - i) % COST_N];
  const uint64_t mean = sum / k->nlast;
  /* Learning (fewer than COST_N samples this stream): strong evidence
   * needs fewer, and from two on a mean past STRONG_PM (or under its
   * mirror) decides.  A 4 GiB stream from an NBD server next door
   * lasts about 3 s and gave two samples of 1.22 to 1.55; four would
   * have come after its end.
   */
  const bool learning = k->nlast < COST_N;
  bool change;
  if (learning)
    change = k->nlast >= 2 &&
      (k->costly ? mean <= 2000 - STRONG_PM : mean >= STRONG_PM);
  else
    change = k->costly ? mean <= FREE_PM : mean >= COSTLY_PM;
  if (change)
    flip (k, !k->costly);
  /* Learning, the stretch stays short, unless the fills are thought
   * to cost: then each probe costs the clients, and the stretch grows
   * as once the verdict holds.
   */
  else if ((!learning || k->costly) && k->cycle_ns < CYCLE_MAX_NS)
    k->cycle_ns *= 2;
}

bool
fsc_cost_step (struct fsc_cost *k, uint64_t now, uint64_t served,
               uint64_t busy_us, bool prior)
{
  if (!k->enabled)
    return false;
  if (now < __atomic_load_n (&k->next_ns, __ATOMIC_RELAXED))
    return __atomic_load_n (&k->bare, __ATOMIC_RELAXED);

  pthread_mutex_lock (&k->lock);
  /* A gap: the stream stopped, or this step came late (the windows
   * would hold the gap).  A new stream.
   */
  if (k->phase != COST_IDLE && now > k->next_ns + REST_NS)
    rest_locked (k, now);
  switch (k->phase) {
  case COST_IDLE:
    /* A stream's first stretch is its measured window alone: the guess
     * is taken at its end, 0.2 s in.
     */
    k->phase = COST_NORMAL;
    k->phase_ns = now - (k->cycle_ns - WINDOW_NS);
    set_bare (k, k->costly);
    mark (k, now, served, busy_us);
    set_next (k, now + WINDOW_NS);
    break;
  case COST_NORMAL:
    if (k->w_ns == 0 && now < k->phase_ns + k->cycle_ns) {
      mark (k, now, served, busy_us);        /* its last window */
      set_next (k, k->phase_ns + k->cycle_ns);
    }
    else if ((k->normal_rate = window_rate (k, now, served, busy_us)) == 0) {
      /* Not a stream the path limits: nothing to compare it with.
       * No probe (its bare window would skip fills for nothing);
       * another stretch.
       */
      k->phase_ns = now;
      set_next (k, now + k->cycle_ns - WINDOW_NS);
    }
    else if (!k->guessed && (k->guessed = true, prior != k->costly)) {
      /* The stream's first window that counts: start from the rates'
       * guess (the top of this file), a new stretch in its mode.
       */
      flip (k, prior);
      k->phase_ns = now;
      set_bare (k, k->costly);
      set_next (k, now + k->cycle_ns - WINDOW_NS);
    }
    else {
      k->phase = COST_SETTLE;
      k->phase_ns = now;
      set_bare (k, !k->costly);
      set_next (k, now + SETTLE_NS);
    }
    break;
  case COST_SETTLE:
    k->phase = COST_PROBE;
    k->phase_ns = now;
    mark (k, now, served, busy_us);
    set_next (k, now + WINDOW_NS);
    break;
  case COST_PROBE: {
    const uint64_t probe = window_rate (k, now, served, busy_us);
    if (probe && k->normal_rate) {
      if (k->costly)
        sample (k, k->normal_rate, probe);
      else
        sample (k, probe, k->normal_rate);
    }
    k->normal_rate = 0;
    k->phase = COST_NORMAL;
    k->phase_ns = now;
    set_bare (k, k->costly);
    set_next (k, now + k->cycle_ns - WINDOW_NS);
    break;
  }
  }
  const bool bare = k->bare;
  pthread_mutex_unlock (&k->lock);
  return bare;
}
