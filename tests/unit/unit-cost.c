/* Unit test: what fills cost the clients (core/base/cost.c), the
 * comparison of windows with fills and without, driven by a simulated
 * stream: a clock in milliseconds, and a client served at one rate
 * while fills are on and at another while they are off, each with the
 * noise of a loaded machine (a factor drawn per 100 ms).  Its
 * invariants:
 *
 *   K3  fills that cost a fifth are found (costly after two samples)
 *       and the verdict holds for a minute;
 *   K2  fills that cost nothing are kept: equal rates with noise
 *       never give "costly", and the bare windows take a bounded share
 *       of the time;
 *   K1  rates noisy around the thresholds change the verdict seldom,
 *       and a fast stream's short windows while learning (64 MiB) do
 *       not give a verdict by noise;
 *   K4  a fast stream whose fills cost half is found on its first
 *       sample, within 150 ms; a link's is not (its windows are not
 *       big); one whose fills cost a fifth on its second, its fills
 *       on for under 300 MiB before;
 *   a light load (the upstream idle half the time) is never probed,
 *   and a disabled comparison never leaves the fill mode.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cost.h"
#include "unit.h"

#define MS ((uint64_t) 1000000)

struct sim {
  uint64_t now, served, busy_us;
  unsigned seed;
  double noise;                 /* this 100 ms's factor */
  uint64_t bare_ms, ms;         /* time with fills off; in all */
  uint64_t fill_served;         /* bytes served with fills on */
  bool prior;                   /* the caller's guess */
};

/* Run MS milliseconds of a stream served at FILL or BARE MiB/s by
 * mode, with noise +-NOISE (a share), the upstream busy BUSY_PCT of
 * each 100 ms.
 */
static void
run_ms (struct fsc_cost *k, struct sim *s, unsigned ms, double fill,
        double bare, double noise, unsigned busy_pct)
{
  for (unsigned i = 0; i < ms; ++i) {
    if (s->ms % 100 == 0)
      s->noise = 1.0 + noise * (2.0 * rand_r (&s->seed) / RAND_MAX - 1.0);
    const bool loaded = s->ms % 100 < busy_pct;
    const bool b = fsc_cost_step (k, s->now, s->served, s->busy_us, s->prior);
    if (loaded) {
      const uint64_t n = (uint64_t) ((b ? bare : fill) * s->noise * 1048.576);
      s->served += n;
      s->fill_served += b ? 0 : n;
      s->busy_us += 1000;
    }
    s->bare_ms += b;
    s->ms++;
    s->now += MS;
  }
}

static void
run (struct fsc_cost *k, struct sim *s, unsigned seconds, double fill,
     double bare, double noise, unsigned busy_pct)
{
  run_ms (k, s, seconds * 1000, fill, bare, noise, busy_pct);
}

static void
fresh (struct fsc_cost *k, struct sim *s, bool on, unsigned seed)
{
  fsc_cost_init (k, on);
  *s = (struct sim) { .now = 1000 * MS, .seed = seed, .noise = 1.0 };
}

int
main (void)
{
  struct fsc_cost k;
  struct sim s;

  /* K3: fills at 0.8 of the bare rate, the machine noisy (+-10% per
   * 100 ms).  A sample every 0.8 s (a 0.5 s stretch, the probe's
   * 0.3 s; the first stretch 0.2 s); the verdict on the fourth.
   */
  fresh (&k, &s, true, 1);
  run (&k, &s, 4, 1200, 1500, 0.10, 100);
  CHECK (k.costly);
  CHECK (k.changes == 1);
  const uint64_t fill_before = s.ms - s.bare_ms;
  run (&k, &s, 60, 1200, 1500, 0.10, 100);
  CHECK (k.costly);
  CHECK (k.changes == 1);
  /* Costly, fills are on only in the probes: under 12% of the time. */
  const uint64_t fill_ms = s.ms - s.bare_ms - fill_before;
  printf ("costly: %u samples, fills on %.1f%% of the minute\n",
          (unsigned) k.samples, 100.0 * fill_ms / 60000);
  CHECK (fill_ms < 60000 / 100 * 12);
  fsc_cost_destroy (&k);

  /* Strong evidence, fills costing a quarter: decided on the second
   * sample, not the fourth (nor on the first: under SURE_PM).
   */
  fresh (&k, &s, true, 9);
  while (k.samples < 1)
    run_ms (&k, &s, 1, 1125, 1500, 0.10, 100);
  CHECK (!k.costly && k.changes == 0);
  while (k.samples < 2)
    run_ms (&k, &s, 1, 1125, 1500, 0.10, 100);
  CHECK (k.costly && k.changes == 1);
  fsc_cost_destroy (&k);

  /* A fast stream whose fills cost half (an NBD server next door, 3
   * GiB/s bare): its windows end by bytes (64 MiB), so the first
   * sample comes within a tenth of a second, and being that strong,
   * over two big windows, decides alone.  With 200 ms windows it took
   * 0.5 s and a second sample (1.3 s): the 4 GiB stream of
   * tools/bench/fastup.sh lasts 2.
   */
  fresh (&k, &s, true, 11);
  run_ms (&k, &s, 150, 1500, 3000, 0.10, 100);
  printf ("fast stream: %u samples, costly %d after 150 ms\n",
          (unsigned) k.samples, k.costly);
  CHECK (k.samples == 1 && k.costly && k.changes == 1);
  fsc_cost_destroy (&k);
  /* A fast stream whose fills cost a fifth (2 GB/s bare): samples of
   * about 1.25, under SURE_PM, so the verdict comes on the second.
   * Between the two, its stretch with the fills on ends after 64 MiB,
   * not after 0.3 s: with the stretch by time alone it served 606 MiB
   * with its fills on before the verdict, 193 with this (fastup.sh:
   * 1.1 GB of 4 GiB stored, two rounds of five).
   */
  fresh (&k, &s, true, 14);
  while (!k.costly && s.ms < 5000)
    run_ms (&k, &s, 1, 1600, 2000, 0.05, 100);
  printf ("fast stream, fills a fifth: costly after %u samples, %u ms, "
          "%u MiB served with fills on\n", (unsigned) k.samples,
          (unsigned) s.ms, (unsigned) (s.fill_served >> 20));
  CHECK (k.costly && k.samples == 2);
  CHECK (s.fill_served < (uint64_t) 300 << 20);
  fsc_cost_destroy (&k);
  /* A window that has its 64 MiB before its 20 ms (10 GB/s) waits
   * for the time alone: waiting on the bytes too, every step until
   * then would have taken the lock.
   */
  fresh (&k, &s, true, 13);
  run_ms (&k, &s, 10, 10000, 10000, 0.0, 100);
  CHECK (k.next_served == UINT64_MAX && k.next_ns == 1020 * MS);
  fsc_cost_destroy (&k);
  /* ... but not a link's (200 MiB/s: 64 MiB outlast the 200 ms
   * window, which is not big): two samples, as before.
   */
  fresh (&k, &s, true, 12);
  while (k.samples < 1)
    run_ms (&k, &s, 1, 100, 200, 0.10, 100);
  CHECK (!k.costly);
  while (k.samples < 2)
    run_ms (&k, &s, 1, 100, 200, 0.10, 100);
  CHECK (k.costly && k.changes == 1);
  fsc_cost_destroy (&k);
  /* ... nor a fast stream whose fills cost nothing, with the noise a
   * short window sees (+-15% per 100 ms): no verdict from its short
   * windows, in ten streams.
   */
  for (unsigned seed = 30; seed < 40; ++seed) {
    fresh (&k, &s, true, seed);
    run (&k, &s, 10, 3000, 3000, 0.15, 100);
    CHECK (!k.costly && k.changes == 0);
    fsc_cost_destroy (&k);
  }

  /* ... and when they stop costing (the upstream slowed to the fills'
   * pace), the verdict goes back.
   */
  fresh (&k, &s, true, 2);
  run (&k, &s, 4, 1200, 1500, 0.03, 100);
  CHECK (k.costly);
  run (&k, &s, 30, 1000, 1000, 0.01, 100);
  CHECK (!k.costly);
  CHECK (k.changes == 2);
  fsc_cost_destroy (&k);

  /* The guess "costly" (an upstream as fast as the disk): taken at
   * the first window that counts (0.2 s), kept by rates that agree ...
   */
  fresh (&k, &s, true, 7);
  s.prior = true;
  run (&k, &s, 1, 1200, 1500, 0.10, 100);
  CHECK (k.costly && k.changes == 1);
  /* While thought costly, the probes (fills on) grow apart from the
   * first: under 16% of the first 10 s, where a probe every 0.8 s
   * would have fills on 39% of it.
   */
  run (&k, &s, 9, 1200, 1500, 0.10, 100);
  printf ("guessed costly: fills on %.1f%% of the first 10 s\n",
          100.0 * (s.ms - s.bare_ms) / 10000);
  CHECK ((s.ms - s.bare_ms) * 100 < 16 * s.ms);
  run (&k, &s, 30, 1200, 1500, 0.10, 100);
  CHECK (k.costly && k.changes == 1);
  fsc_cost_destroy (&k);
  /* ... and overturned by rates that do not, within 10 s. */
  fresh (&k, &s, true, 8);
  s.prior = true;
  run (&k, &s, 1, 1500, 1500, 0.10, 100);
  CHECK (k.costly);
  run (&k, &s, 9, 1500, 1500, 0.10, 100);
  CHECK (!k.costly && k.changes == 2);
  run (&k, &s, 30, 1500, 1500, 0.10, 100);
  CHECK (!k.costly && k.changes == 2);
  fsc_cost_destroy (&k);

  /* K2: fills free, the machine noisy (+-10% per 100 ms). */
  for (unsigned seed = 10; seed < 20; ++seed) {
    fresh (&k, &s, true, seed);
    run (&k, &s, 60, 1500, 1500, 0.10, 100);
    CHECK (!k.costly);
    CHECK (k.changes == 0);
    CHECK (k.samples >= 10);
    CHECK (s.bare_ms < 60000 / 100 * 12);
    if (seed == 10)
      printf ("free: %u samples, fills off %.1f%% of the minute\n",
              (unsigned) k.samples, 100.0 * s.bare_ms / 60000);
    fsc_cost_destroy (&k);
  }

  /* K1: fills costing 7% (between the thresholds), noise of +-15%:
   * samples fall on both sides of both thresholds, and the verdict
   * still changes in under a tenth of them.
   */
  uint64_t changes = 0, samples = 0;
  for (unsigned seed = 20; seed < 30; ++seed) {
    fresh (&k, &s, true, seed);
    run (&k, &s, 120, 1400, 1500, 0.15, 100);
    changes += k.changes;
    samples += k.samples;
    fsc_cost_destroy (&k);
  }
  printf ("between the thresholds: %u changes in %u samples\n",
          (unsigned) changes, (unsigned) samples);
  CHECK (samples >= 100);
  CHECK (changes * 10 < samples);

  /* A light load: the upstream busy half of each 100 ms.  No sample,
   * and no bare window.
   */
  fresh (&k, &s, true, 3);
  run (&k, &s, 30, 1000, 2000, 0.0, 50);
  CHECK (k.samples == 0);
  CHECK (s.bare_ms == 0);
  fsc_cost_destroy (&k);

  /* A pause starts a new stream and keeps the verdict. */
  fresh (&k, &s, true, 4);
  run (&k, &s, 4, 1200, 1500, 0.0, 100);
  CHECK (k.costly);
  s.now += 5000 * MS;
  CHECK (fsc_cost_step (&k, s.now, s.served, s.busy_us, false));
  CHECK (k.costly);
  fsc_cost_destroy (&k);

  /* Off: fills always on. */
  fresh (&k, &s, false, 5);
  run (&k, &s, 10, 1000, 2000, 0.0, 100);
  CHECK (s.bare_ms == 0 && k.samples == 0);
  fsc_cost_destroy (&k);

  printf ("unit-cost: ok\n");
  return 0;
}
