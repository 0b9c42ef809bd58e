/* Unit test: when a client's miss, or a readahead's prefetch, may fill
 * the cache (core/ops/fill.c, fsc_fill_budget and fsc_fill_budgeted).
 *
 * The rule depends on two rates, the fills' and the upstream's peak,
 * which the meters measure as data moves.  Here they are set by hand,
 * so that each case of the rule is checked whatever this machine's
 * disk and CPUs do:
 *
 *   rates not known yet      the first bucket (64 MiB) admits client
 *                            misses and speculative prefetches alike,
 *                            with no refill, then neither;
 *   fills faster than the    everything is admitted, and charged to
 *   upstream                 the bucket down to empty: the burst is
 *                            one, whatever the budget did meanwhile;
 *   fills slower             client misses spend from the bucket,
 *                            refilled at a fiftieth of the fills'
 *                            rate; a speculative prefetch is not
 *                            charged (readahead asks fsc_fill_budgeted
 *                            and pauses instead).
 *
 * A burst smaller than the meters' first window still gets a rate to
 * refill it by (the partial window, fsc_meter_first).
 *
 * And the fill queue's bound (fsc_fill_bound), from the fills' peak:
 * a quarter second of it, within 16 and 128 MiB.
 *
 * And what a probe of the fills' cost held in the queue (probe.c,
 * fsc_fill_held): stored if the verdict stays "free"; if the probe
 * found the fills costly, released unstored, counted skipped and noted
 * for the catch-up (fill.c, drop).
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fscache.h"
#include "internal.h"
#include "unit.h"

#define MiB ((uint64_t) 1 << 20)

static void
set_rates (struct fsc_cache *c, uint64_t fill, uint64_t up_peak)
{
  __atomic_store_n (&c->fill_meter.rate, fill, __ATOMIC_RELAXED);
  __atomic_store_n (&c->up_meter.peak, up_peak, __ATOMIC_RELAXED);
}

#define BS 4096u
#define SIZE (1024u * 1024u)
static unsigned char image[SIZE];
static uint64_t up_bytes;

static int
up_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  CHECK (offset + count <= SIZE);
  memcpy (buf, image + offset, count);
  up_bytes += count;
  return 0;
}

static const struct fsc_upstream up = { .pread = up_pread };

/* Read 64 KiB at OFF from O, check it; the bytes read upstream. */
static uint64_t
read64k (struct fsc_object *o, uint64_t off)
{
  static unsigned char got[65536];
  up_bytes = 0;
  CHECK (fsc_object_read (o, got, sizeof got, off, &up, 0) == 0);
  CHECK (memcmp (got, image + off, sizeof got) == 0);
  return up_bytes;
}

/* A probe holds the fills while the client reads 64 KiB at OFF; then
 * the verdict is COSTLY, the hold ends and the queue drains.  The
 * bytes skipped meanwhile.
 */
static uint64_t
held_read (struct fsc_cache *c, struct fsc_object *o, uint64_t off,
           bool costly)
{
  struct fsc_stats st;
  fsc_cache_stats (c, &st);
  const uint64_t skipped = st.fill_skipped_bytes;
  __atomic_store_n (&c->fill_hold_until,
                    fsc_mono_ns () + UINT64_C (60000000000),
                    __ATOMIC_RELAXED);
  CHECK (fsc_fill_held (c));
  CHECK (read64k (o, off) == 65536);
  __atomic_store_n (&c->cost.costly, costly, __ATOMIC_RELAXED);
  fsc_fill_unhold (c);
  fsc_cache_drain (c);
  fsc_cache_stats (c, &st);
  return st.fill_skipped_bytes - skipped;
}

static void
test_held (const char *dir)
{
  struct fsc_cache_config cfg = { .dir = dir, .create = true };
  struct fsc_cache *c;
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  CHECK (fsc_cache_start (c) == 0);     /* the fill threads */
  /* The probes are set by hand here: the measure itself stays still. */
  c->cost.enabled = false;
  struct fsc_object *o;
  struct fsc_open_info info;
  struct fsc_object_params p = {
    .key = "held", .key_len = 4, .block_size = BS, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE, .generation = "g1",
  };
  CHECK (fsc_object_open (c, &p, &o, &info) == 0);
  fsc_catchup_enable (o, true);
  for (size_t i = 0; i < SIZE; ++i)
    image[i] = rand ();

  /* "Free": what the probe held is stored; read again, it is a hit. */
  CHECK_EQ (held_read (c, o, 0, false), 0);
  CHECK_EQ (read64k (o, 0), 0);
  /* "Costly": skipped, and read upstream again; noted for the
   * catch-up.  (Written, as it was, a stream from an NBD server next
   * door stored what its probe held at the moment its fills were
   * found to slow it.)
   */
  CHECK_EQ (held_read (c, o, 65536, true), 65536);
  struct fsc_stats st;
  fsc_cache_stats (c, &st);
  CHECK (st.catchup_noted_bytes >= 65536);
  CHECK_EQ (read64k (o, 65536), 65536);
  fsc_object_close (o);
  fsc_cache_close (c);
}

int
main (void)
{
  char dir[64];
  snprintf (dir, sizeof dir, "/tmp/unit-budget-XXXXXX");
  CHECK (mkdtemp (dir) != NULL);
  strcat (dir, "/cache");
  struct fsc_cache_config cfg = { .dir = dir, .create = true };
  struct fsc_cache *c;
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  CHECK (c->test_budget == -1); /* NBD_FSCACHE_TEST_BUDGET must be unset */

  /* Nothing measured yet: 64 MiB in all, then nothing, whoever asks. */
  CHECK (!fsc_fill_budgeted (c));
  for (unsigned i = 0; i < 48; ++i)
    CHECK (fsc_fill_budget (c, MiB, false));
  for (unsigned i = 0; i < 16; ++i)
    CHECK (fsc_fill_budget (c, MiB, true));
  CHECK (!fsc_fill_budget (c, MiB, false));
  CHECK (!fsc_fill_budget (c, MiB, true));
  /* Only one of the rates known is as good as none. */
  set_rates (c, 0, 1000 * MiB);
  CHECK (!fsc_fill_budget (c, MiB, false));
  set_rates (c, 1000 * MiB, 0);
  CHECK (!fsc_fill_budget (c, MiB, true));

  /* Fills faster than the upstream: no budget at all. */
  set_rates (c, 2000 * MiB, 1000 * MiB);
  CHECK (!fsc_fill_budgeted (c));
  for (unsigned i = 0; i < 256; ++i) {
    CHECK (fsc_fill_budget (c, MiB, false));
    CHECK (fsc_fill_budget (c, MiB, true));
  }

  /* Fills slower: the bucket, still empty, refills at a fiftieth of
   * 100 MiB/s, 2 MiB/s: 64 MiB would take 32 s, which this test does
   * not last.  Readahead is not charged: it pauses (budgeted).
   */
  set_rates (c, 100 * MiB, 4000 * MiB);
  CHECK (fsc_fill_budgeted (c));
  CHECK (!fsc_fill_budget (c, 64 * MiB, false));
  CHECK (fsc_fill_budget (c, 64 * MiB, true));

  /* The fill queue's bound: 16 MiB until the fills are measured, and
   * for a disk slower than 64 MiB/s; a quarter second of their peak
   * above; 128 MiB at most (a stall of a fast disk).
   */
  CHECK (fsc_fill_bound (c) == 16 * MiB);
  __atomic_store_n (&c->fill_meter.peak, 4 * MiB, __ATOMIC_RELAXED);
  CHECK (fsc_fill_bound (c) == 16 * MiB);
  __atomic_store_n (&c->fill_meter.peak, 256 * MiB, __ATOMIC_RELAXED);
  CHECK (fsc_fill_bound (c) >= 63 * MiB && fsc_fill_bound (c) <= 64 * MiB);
  __atomic_store_n (&c->fill_meter.peak, 2000 * MiB, __ATOMIC_RELAXED);
  CHECK (fsc_fill_bound (c) == 128 * MiB);
  __atomic_store_n (&c->fill_meter.peak, UINT64_MAX, __ATOMIC_RELAXED);
  CHECK (fsc_fill_bound (c) == 128 * MiB);

  fsc_cache_close (c);

  /* A burst smaller than a meter's window (NBD_FSCACHE_TEST_BURST, as
   * test-fscache-slow-disk.sh sets): the burst is spent before the
   * fill meter closes a window, so nothing would refill the bucket;
   * the partial window stands for the first rate (meter.c,
   * fsc_meter_first).  Here 1 MiB filled in 2 ms of busy time, 500
   * MiB/s, against an upstream peak of 4,000: the budget engages, and
   * the bucket refills at a fiftieth of the fills' rate, 10 MiB/s, so
   * the next 1 MiB is admitted within about 100 ms.  Without the
   * first rate, never (waited for up to 10 s).
   */
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  c->budget_burst = MiB;
  CHECK (fsc_fill_budget (c, MiB, false));
  fsc_meter_begin (&c->fill_meter);
  const uint64_t t0 = fsc_mono_ns ();
  while (fsc_mono_ns () - t0 < 2000000)
    ;                           /* the fill's busy time */
  fsc_meter_end (&c->fill_meter, MiB);
  CHECK (__atomic_load_n (&c->fill_meter.rate, __ATOMIC_RELAXED) == 0);
  __atomic_store_n (&c->up_meter.peak, 4000 * MiB, __ATOMIC_RELAXED);
  bool admitted = false;
  for (uint64_t t1 = fsc_mono_ns ();
       !admitted && fsc_mono_ns () - t1 < UINT64_C (10000000000); )
    if (!(admitted = fsc_fill_budget (c, MiB, false)))
      usleep (10000);
  CHECK (__atomic_load_n (&c->fill_meter.rate, __ATOMIC_RELAXED) != 0);
  CHECK (admitted);
  fsc_cache_close (c);

  /* The burst is one (fill.c, "The burst is one"): 48 MiB filled
   * while fills were faster than the upstream leave 16 MiB in the
   * bucket when the budget engages, plus a refill at a fiftieth of
   * the fills' rate (40 MiB/s, then 2) over the moments this takes.
   * Charged only while the budget was engaged, as it once was, the
   * bucket held the whole 64 MiB then: a stream from an NBD server
   * next door filled its first 64 MiB window, was found "costly"
   * (cost.c), and filled another 64 MiB of the burst at once.
   */
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  set_rates (c, 2000 * MiB, 1000 * MiB);
  CHECK (!fsc_fill_budgeted (c));
  for (unsigned i = 0; i < 48; ++i)
    CHECK (fsc_fill_budget (c, MiB, false));
  set_rates (c, 100 * MiB, 4000 * MiB);
  CHECK (fsc_fill_budgeted (c));
  CHECK (!fsc_fill_budget (c, 32 * MiB, false));
  CHECK (fsc_fill_budget (c, 8 * MiB, false));
  fsc_cache_close (c);

  test_held (dir);

  char cmd[128];
  snprintf (cmd, sizeof cmd, "rm -rf '%.*s'", (int) (strlen (dir) - 6), dir);
  CHECK (system (cmd) == 0);
  printf ("unit-budget: ok\n");
  return 0;
}
