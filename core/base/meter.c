/* libfscache: throughput meters (struct fsc_meter, fill.h): bytes per
 * second of busy time, in windows, with a moving average and a slowly
 * decaying peak.  The fill budget (fill.c) compares the fill path's
 * meter with the upstream's; commits and fetches feed them.  The
 * ground floor: nothing here calls another file of libfscache.
 */
#include <config.h>

#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "utils.h"

/* The meters' windows: enough busy time that one window holds many
 * operations of either kind, few enough that a change of speed shows
 * within a tenth of a second of busy time (the average moves a quarter
 * of the way per window).  Or enough bytes, for a meter that moves
 * gigabytes per busy second: 20 ms of nbdkit null's reads were 200 to
 * 300 MB, all of them filled before the budget could engage.
 */
#define METER_WINDOW_NS (20 * 1000 * 1000)
#define METER_WINDOW_BYTES ((uint64_t) 32 << 20)

/* A meter's peak loses 1/PEAK_DECAY of itself per window (half in 44
 * windows: about a second at the rates where it matters).
 */
#define PEAK_DECAY 64

void
fsc_meter_init (struct fsc_meter *m, uint64_t *busy_us)
{
  memset (m, 0, sizeof *m);
  pthread_mutex_init (&m->lock, NULL);
  m->busy_us = busy_us;
}

void
fsc_meter_destroy (struct fsc_meter *m)
{
  pthread_mutex_destroy (&m->lock);
}

/* Count the busy time up to NOW.  Caller holds m->lock. */
static void
meter_account (struct fsc_meter *m, uint64_t now)
{
  if (m->active > 0 && now > m->mark_ns) {
    const uint64_t d = now - m->mark_ns;
    m->win_ns += d;
    __atomic_add_fetch (m->busy_us, (m->total_ns + d) / 1000 -
                        m->total_ns / 1000, __ATOMIC_RELAXED);
    m->total_ns += d;
  }
  m->mark_ns = now;
}

/* Close the window being filled (win_ns > 0): its rate moves the
 * average a quarter of the way (or is the first rate), and the peak.
 * Caller holds m->lock.
 */
static void
close_window (struct fsc_meter *m)
{
  const int64_t sample =
    (int64_t) ((double) m->win_bytes * 1e9 / (double) m->win_ns);
  int64_t rate = __atomic_load_n (&m->rate, __ATOMIC_RELAXED);
  rate = rate == 0 ? sample : rate + (sample - rate) / 4;
  __atomic_store_n (&m->rate, (uint64_t) MAX (rate, 1), __ATOMIC_RELAXED);
  uint64_t peak = __atomic_load_n (&m->peak, __ATOMIC_RELAXED);
  peak = MAX ((uint64_t) MAX (sample, 1), peak - peak / PEAK_DECAY);
  __atomic_store_n (&m->peak, peak, __ATOMIC_RELAXED);
  m->win_ns = m->win_bytes = 0;
}

void
fsc_meter_begin (struct fsc_meter *m)
{
  const uint64_t now = fsc_mono_ns ();
  SCOPED_LOCK (&m->lock);
  meter_account (m, now);
  m->active++;
}

void
fsc_meter_end (struct fsc_meter *m, uint64_t bytes)
{
  const uint64_t now = fsc_mono_ns ();
  SCOPED_LOCK (&m->lock);
  meter_account (m, now);
  m->active--;
  m->win_bytes += bytes;
  if (m->win_ns < METER_WINDOW_NS && m->win_bytes < METER_WINDOW_BYTES)
    return;
  close_window (m);
}

/* Why a partial window may stand for the first: the fill budget admits
 * fills from a bucket that nothing refills until both meters have a
 * rate (fill.c, rates_known), and the fill meter gets one only from
 * fills.  A window closes on 20 ms of busy time or 32 MiB, and the
 * bucket's burst (64 MiB) is larger, so the burst alone always made
 * one.  A smaller burst did not: with NBD_FSCACHE_TEST_BURST at 1 MiB,
 * 16 fills of 64 KiB went to the page cache in 5 ms, the window never
 * closed, the bucket stayed empty, and the fills of the rest of the
 * read were all skipped (test-fscache-slow-disk.sh's link: 1 MiB of 32
 * stored, on a machine whose page cache took the burst that fast).
 * The caller asks only when the bucket is dry and the rate unknown.
 */
bool
fsc_meter_first (struct fsc_meter *m)
{
  SCOPED_LOCK (&m->lock);
  if (__atomic_load_n (&m->rate, __ATOMIC_RELAXED) != 0)
    return true;
  if (m->active > 0 || m->win_bytes == 0 || m->win_ns == 0)
    return false;
  close_window (m);             /* no rate yet: it is the first */
  return true;
}
