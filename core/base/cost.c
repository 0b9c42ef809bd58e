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
 * Windows by bytes (issue 44).  While a stream learns (fewer than
 * COST_N samples), a window also ends once it has served WINDOW_BYTES
 * (64 MiB; not before WINDOW_MIN_NS) and a settling SETTLE_BYTES; and
 * a first sample of SURE_PM or more over two such big windows decides
 * alone.  A 4 GiB stream from an NBD server next door (fastup.sh) runs
 * at 2 GB/s: its first sample came 0.5 s in, its second after 1.3 s,
 * and until then the fills took a fifth to a quarter of what it read
 * (the budget's bucket at a link's share: at iodepth 8 its reads wait
 * over 1 ms in the server's queue, so fill.c counts it as a link), at
 * 0.64 to 0.92 of the bare proxy's speed.  With windows of 64 MiB the
 * first sample comes within a tenth of a second, 8% of the stream is
 * filled, and it runs at 0.86 to 0.96 (docs/benchmarks.md, stop 60).
 * A link's windows are unchanged: at 200 MB/s, 64 MiB outlast 200 ms,
 * and a window that ends by time is not big, so the link's verdicts
 * still want two samples.  Once the stream has COST_N samples its
 * windows are the full 200 ms again: short windows are noisier, and a
 * verdict that holds no longer needs to be quick (unit-cost's K1 test
 * had 31 changes in 297 samples with byte windows throughout, 20 in
 * 242 with none).
 *
 * What "without fills" means is the caller's (fill.c): in a stretch
 * of the verdict "costly", the fill budget engaged; in a probe of the
 * verdict "free", the fills held in their queue, so that a link whose
 * fills are free has nothing of its probes left unstored (issue 44
 * wants 95% of an 8 GiB read at 1.6 Gbit/s cached at a clean stop
 * right after it); if the probe's sample turns the verdict "costly",
 * what it held is skipped and noted for the catch-up (fill.c, drop).
 *
 * Invariants:
 *   K1  no oscillation: the verdict changes only on the mean of
 *       COST_N samples past a threshold, with a gap between the
 *       thresholds (FREE_PM < COSTLY_PM), or while learning on the
 *       mean of two or three past STRONG_PM (or under 2 - STRONG_PM,
 *       back), or on a first sample over two big windows past SURE_PM
 *       (or under 2 - SURE_PM), and at most once per sample,
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
 *   K4  a fast stream whose fills cost half is found on its first
 *       sample, within 150 ms of its start; a link's stream (windows
 *       that end by time) is not decided on one sample; a fast stream
 *       whose fills cost a fifth is found on its second, having served
 *       under 300 MiB with its fills on (stretch()).  Broken by
 *       unit-cost.c (the first, without windows by bytes; the last,
 *       with stretches by time alone: 606 MiB).
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
#define SURE_PM 1500            /* a half, two big windows: on one */
/* A window (and a settling) ends early once it has served this much,
 * but not before WINDOW_MIN_NS: see "Windows by bytes" above.
 */
#define WINDOW_BYTES ((uint64_t) 64 << 20)
#define SETTLE_BYTES ((uint64_t) 32 << 20)
#define WINDOW_MIN_NS ((uint64_t) 20 * 1000 * 1000)

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

/* Nothing to do before T, unless SERVED reaches BYTES first. */
static void
set_next_or (struct fsc_cost *k, uint64_t t, uint64_t bytes)
{
  __atomic_store_n (&k->next_ns, t, __ATOMIC_RELAXED);
  __atomic_store_n (&k->next_served, bytes, __ATOMIC_RELAXED);
}

static void
set_next (struct fsc_cost *k, uint64_t t)
{
  set_next_or (k, t, UINT64_MAX);
}

/* Has the stream fewer than COST_N samples? */
static bool
learning (const struct fsc_cost *k)
{
  return k->nlast < COST_N;
}

/* Nothing to do before T; while the stream learns, unless FROM + BYTES
 * were served first ("Windows by bytes" above).
 */
static void
set_next_learning (struct fsc_cost *k, uint64_t t, uint64_t from,
                   uint64_t bytes)
{
  set_next_or (k, t, learning (k) ? from + bytes : UINT64_MAX);
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

/* A measured window begins at NOW: it ends after WINDOW_NS, or once
 * WINDOW_BYTES were served (window_ended).
 */
static void
window_start (struct fsc_cost *k, uint64_t now, uint64_t served,
              uint64_t busy_us)
{
  mark (k, now, served, busy_us);
  set_next_learning (k, now + WINDOW_NS, served, WINDOW_BYTES);
}

/* The stretch from NOW to the next measured window: the cycle less
 * the window.  While a stream learns with its fills on (the verdict
 * "free"), it also ends once WINDOW_BYTES were served: the 0.3 s
 * between two samples of a 2 GB/s stream stored 500 to 600 MB, and
 * streams whose first samples fell between the thresholds (fastup.sh:
 * 1.25 and 1.42, two rounds of five) stored 1.1 GB of their 4 GiB,
 * at 0.75 and 0.73 of the bare proxy.
 * Not while "costly": the stretch is then bare, and a shorter one
 * would bring the next probe's fills sooner.
 */
static void
stretch (struct fsc_cost *k, uint64_t now, uint64_t served)
{
  if (k->costly)
    set_next (k, now + k->cycle_ns - WINDOW_NS);
  else
    set_next_learning (k, now + k->cycle_ns - WINDOW_NS, served,
                       WINDOW_BYTES);
}

/* Has the window marked ended at NOW, by time or by bytes?  A step
 * that came by bytes before WINDOW_MIN_NS waits for that time alone
 * (by bytes, every step until then would take the lock).
 */
static bool
window_ended (struct fsc_cost *k, uint64_t now, uint64_t served)
{
  if (now >= k->w_ns + WINDOW_NS)
    return true;
  if (learning (k) && served - k->w_served >= WINDOW_BYTES) {
    if (now >= k->w_ns + WINDOW_MIN_NS)
      return true;
    set_next (k, k->w_ns + WINDOW_MIN_NS);
    return false;
  }
  set_next_learning (k, k->w_ns + WINDOW_NS, k->w_served, WINDOW_BYTES);
  return false;
}

/* The window marked, closed at NOW: its rate in bytes/s, or 0 if it
 * does not count (see the top of this file).
 */
static uint64_t
window_rate (struct fsc_cost *k, uint64_t now, uint64_t served,
             uint64_t busy_us, bool *big)
{
  *big = false;
  if (k->w_ns == 0 || now <= k->w_ns || served < k->w_served ||
      busy_us < k->w_busy_us)
    return 0;
  const uint64_t ns = now - k->w_ns;
  const uint64_t bytes = served - k->w_served;
  const uint64_t busy_ns = (busy_us - k->w_busy_us) * 1000;
  k->w_ns = 0;
  if (bytes < MIN_BYTES || busy_ns < ns / 100 * BUSY_PCT)
    return 0;
  *big = bytes >= WINDOW_BYTES;
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

/* A sample: BARE and FILL, the two windows' rates; BIG, both windows
 * carried WINDOW_BYTES.
 */
static void
sample (struct fsc_cost *k, uint64_t bare, uint64_t fill, bool big)
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
  bool change;
  if (learning (k))
    change = k->costly
      ? ((k->nlast >= 2 && mean <= 2000 - STRONG_PM) ||
         (big && k->nlast == 1 && mean <= 2000 - SURE_PM))
      : ((k->nlast >= 2 && mean >= STRONG_PM) ||
         (big && k->nlast == 1 && mean >= SURE_PM));
  else
    change = k->costly ? mean <= FREE_PM : mean >= COSTLY_PM;
  if (change)
    flip (k, !k->costly);
  /* Learning, the stretch stays short, unless the fills are thought
   * to cost: then each probe costs the clients, and the stretch grows
   * as once the verdict holds.
   */
  else if ((!learning (k) || k->costly) && k->cycle_ns < CYCLE_MAX_NS)
    k->cycle_ns *= 2;
}

bool
fsc_cost_step (struct fsc_cost *k, uint64_t now, uint64_t served,
               uint64_t busy_us, bool prior)
{
  if (!k->enabled)
    return false;
  if (now < __atomic_load_n (&k->next_ns, __ATOMIC_RELAXED) &&
      served < __atomic_load_n (&k->next_served, __ATOMIC_RELAXED))
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
    window_start (k, now, served, busy_us);
    break;
  case COST_NORMAL:
    if (k->w_ns == 0)
      window_start (k, now, served, busy_us);   /* its last window */
    else if (!window_ended (k, now, served))
      break;
    else if ((k->normal_rate = window_rate (k, now, served, busy_us,
                                            &k->normal_big)) == 0) {
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
      stretch (k, now, served);
    }
    else {
      k->phase = COST_SETTLE;
      k->phase_ns = now;
      set_bare (k, !k->costly);
      set_next_learning (k, now + SETTLE_NS, served, SETTLE_BYTES);
    }
    break;
  case COST_SETTLE:
    k->phase = COST_PROBE;
    k->phase_ns = now;
    window_start (k, now, served, busy_us);
    break;
  case COST_PROBE: {
    if (!window_ended (k, now, served))
      break;
    bool big;
    const uint64_t probe = window_rate (k, now, served, busy_us, &big);
    big = big && k->normal_big;
    if (probe && k->normal_rate) {
      if (k->costly)
        sample (k, k->normal_rate, probe, big);
      else
        sample (k, probe, k->normal_rate, big);
    }
    k->normal_rate = 0;
    k->phase = COST_NORMAL;
    k->phase_ns = now;
    set_bare (k, k->costly);
    stretch (k, now, served);
    break;
  }
  }
  const bool bare = k->bare;
  pthread_mutex_unlock (&k->lock);
  return bare;
}
