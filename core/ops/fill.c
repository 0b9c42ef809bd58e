/* libfscache: the fill threads, which write what misses fetched into
 * the cache files, so that a miss is answered as soon as the upstream
 * answers.
 *
 * A fill job (struct fsc_fill, internal.h) holds claimed blocks of one
 * object, their bytes and the epochs of their claim, and a reference on
 * the object.  A miss takes its job before it reads upstream (the read
 * lands in the job's buffer) and offers it to the queue once the data
 * is there (fsc_fill_submit).  Jobs wait in a FIFO under
 * cache->fill_lock, at most fsc_fill_bound of them.  That bound is the
 * cache disk's backlog, bytes fetched and not yet written, so it is
 * checked when the data has arrived, not when the fetch starts: a slow
 * link with many large reads in flight has much being fetched and
 * nothing behind.  Others that miss on those blocks wait for the fill
 * as for a fetch, since the blocks stay claimed until it is done.  The
 * threads run from fsc_fill_start to fsc_fill_stop, which finishes
 * every queued job.
 *
 * FSC_FILLERS (4) threads take jobs from the queue, so that the cache
 * disk has that many writes in flight.  Fills of a single 64 KiB block
 * are direct writes (data.c), each a device round trip: one thread
 * wrote them one at a time, and behind a slow device (a throttled loop
 * device, tests/filter/test-fscache-slow-disk.sh) the fill meter took
 * that one-at-a-time pace for the disk's speed.  Jobs hold disjoint
 * claims, so they may be written in any order; a reader whose job the
 * queue refused already wrote beside the one thread, as one more writer
 * (fsc_fill_blocks and the meters take concurrent writers).
 *
 * When to skip a fill.  A full queue means the disk is behind, not
 * that it is the bottleneck: a stall (a commit's fsync behind another
 * program's writeback), a burst from a fast upstream, or a machine
 * whose CPUs are busy elsewhere and which schedules the one fill
 * thread less often than the many threads reading upstream, all fill
 * it for a moment.  Skipping there loses data that the disk would have
 * taken a moment later, and every skipped byte is read upstream again
 * by the next reader: the very cost the cache is there to save.  So a
 * fill is skipped only when the cache disk is the bottleneck, in the
 * utilisation sense: for the same bytes, the fill path is busy much
 * longer than the upstream.  Two meters (struct fsc_meter) measure
 * the rates, each in bytes per second of its own busy time, busy
 * meaning at least one operation in progress (overlapping ones count
 * once, idle time not at all), as moving averages over windows of
 * METER_WINDOW_NS of busy time or METER_WINDOW_BYTES, whichever ends
 * first:
 *
 *   up_meter    every upstream read (retrieve.c: misses, bypasses,
 *               prefetches);
 *   fill_meter  every fill written: by the fill threads, and inline by
 *               a reader whose job the full queue refused (one more
 *               writer, which the rate then includes); and the
 *               commit's sync of the data files (commit.c), where the
 *               kernel writes back what the fills left in the page
 *               cache, with no bytes of its own: a fill's cost is both
 *               halves, and a meter of the first alone saw the page
 *               cache's speed, not the disk's.
 *
 * The rule: a client's read skips its fill only if the queue is full
 * AND fills are written at less than SLOWER_PCT (a third) of the
 * upstream's rate (fsc_fill_slower); with the queue over half full and
 * that same condition, a client's read bypasses the cache (claims
 * nothing, fetches just its bytes), and readahead pauses while the
 * queue is over half full or that condition holds.  Otherwise a read
 * whose job the queue refuses fills inline, as before the queue
 * existed: it waits for the disk, and nothing is lost.  A prefetch
 * (readahead, NBD_CMD_CACHE) always fills inline when refused: its
 * bytes have no other reader, and skipping would fetch them twice.
 *
 * When the upstream is faster than the disk, a queue with room is no
 * reason to fill either: the reads keep it from ever emptying, and
 * the fills then take a whole CPU (writing into the page cache, and
 * the kernel's writeback after it) from the reads on the same CPUs.
 * On 2 CPUs that halved cold reads from nbdkit null or a page-cached
 * file while caching most of them.  So when fills (both halves) run
 * at under BUDGET_SLOWER_PCT (all) of the upstream's rate, a client's
 * read is admitted to fill only within a budget (fsc_fill_budget, a
 * token bucket of DUTY_PCT of the fills' own rate: the fills may keep
 * the disk busy a fiftieth of the time); past it the read bypasses
 * the cache, counted as skipped, whether the queue is full or not,
 * and readahead pauses (its bytes would come from the upstream faster
 * than from the cache).  The
 * bucket holds BUDGET_BURST (64 MiB) at most and starts full, so that
 * a small working set (what a boot reads, a test's image) is cached
 * whole even from a fast upstream, and only a long stream is thinned
 * out.  The upstream's rate here is its meter's peak (the best
 * window's rate, decaying by half in about a second), not its moving
 * average: the fills slow the upstream's reads down too when they take
 * the CPUs both need, and rates measured in that state say that fills
 * keep up.  From an NBD server over a socket, the average said
 * 0.57 GB/s against fills at 0.50, all of it was cached, and cold
 * reads ran at 0.17-0.24 of no cache while a proxy with no filter ran
 * at 0.39-0.57; with the peak, 0.36-0.65 (0.92 of the bare proxy).
 * The share cached falls to what the budget allows (3 to 6% of
 * 4 GiB in docs/benchmarks.md, the burst and the meters' first windows
 * included), and cold reads from nbdkit null and a page-cached file
 * rose to 0.93-0.98 of no cache there (a twentieth: 0.79-1.02, the
 * fills' CPU a third higher in the sequential runs).  A slower rule
 * did less: a budget of a fifth of the fills' rate left them at
 * 0.58-0.78 of no cache, and engaging only below a tenth of the
 * upstream's rate, with a meter that saw the page cache's speed,
 * missed the runs whose first windows showed fills at a third of the
 * upstream's rate (0.43-0.62 of no cache, 85% cached).
 *
 * The burst is one.  Every fill a client's read or a prefetch makes
 * is charged to the bucket, engaged or not (down to empty: a fill the
 * rates admit is never refused for it), and the bucket refills at
 * DUTY_PCT of the fills' rate all the while.  Charged only while
 * engaged, it was full again whenever the budget engaged: a stream
 * from an NBD server next door filled its first 64 MiB window with
 * the budget off (cost.c's first guess), was then found "costly" and
 * filled the whole burst again in the 0.3 s that followed (a scratch
 * trace of the cost measure, issue 44).  A working set under the
 * burst is still cached whole, whatever engages when.
 *
 * Over a link (an upstream whose reads average 1 ms or more,
 * fsc_upstream_remote), the budget also wants the average to say the
 * fills are slower: a rate-limited link's bursts made its peak exceed
 * fills that were three times its average (budget_engaged).
 *
 * So a slow upstream (a link) never has a fill skipped, however loaded
 * the machine: its rate per busy second is the link's, while the
 * disk's, with stalls and a starved thread, is many times more.  Even
 * a local file as the upstream stays clear of the factor: on the 2-CPU
 * VM of docs/benchmarks.md, under two busy loops, two write loops and
 * two cold copies at once, the fill rate fell to 0.53 of the
 * upstream's whenever the queue was over half full, never lower (the
 * tests' upstreams are such local files and servers, and they expect
 * every byte cached: the budget may engage for them, but their images
 * fit in its burst).  A fast upstream is another matter: over
 * whole runs of tools/bench/fastup.sh, nbdkit null ran at 9 to 29 GB/s
 * per busy second and a page-cached file at 1.2 to 3.7, against fills
 * at 0.08 to 1.7 GB/s: 5 to 380 times the disk from null, 1.3 to 16
 * from the file, and those skip whenever the disk is three times
 * slower.  Until both meters have a window (the first 20 ms of busy
 * time or 32 MiB of each), the full queue's rule skips nothing, and
 * the budget's first bucket alone admits fills (fsc_fill_budget).
 * The margin keeps the comparison of two noisy rates of the same
 * order from deciding anything: between a third and all of the
 * upstream's rate, a cold read may be paced by the disk (at worst a
 * third of the upstream's speed) rather than lose what it read.
 * Without the thread (unit tests) every fill is inline.
 *
 * A read that finds a block claimed waits for the claim, as for a fetch
 * (dedup), unless the claim is a fill waiting here or being written:
 * then the bytes are in memory, and fsc_fill_copy serves them from the
 * job rather than make the reader wait for the disk (a readahead that
 * ran ahead of a stream would otherwise pace the stream at the disk's
 * speed).  A job being read is freed by the last of its readers.
 *
 * Big buffers (fsc_buf_get) are bufs.c's; the meters' mechanics,
 * meter.c's.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "internal.h"
#include "utils.h"

/* The fill queue's bound (fsc_fill_bound): FILL_QUEUE_MS of the
 * fills' best rate, their meter's peak, within [FILL_MIN_BYTES,
 * FILL_MAX_BYTES].  The queue is what lets a client be served from
 * memory while the file system stalls its writers: a commit's
 * fdatasync makes ext4 allocate the blocks that delayed allocation
 * left, under the inode's data lock, reading block bitmaps as it goes,
 * and every fill's pwrite waits for it; so does any writer behind a
 * journal commit or another program's fsync.  Those stalls lasted up
 * to 250 ms on the VM of docs/benchmarks.md (issue 27, stop 39).  With
 * 16 MiB at most, a cold stream from a link of 750 MiB/s filled the
 * queue within 21 ms of a stall; readahead paused, prefetches and
 * client misses wrote inline and held their claims, and the stream
 * waited on the disk.  tools/bench/serial-cold.sh, pool of 16: 506
 * MiB/s in one process and 605 through the split, against 749 and 868
 * with this bound (a fixed 256 MiB did no better than 128).  A disk that
 * is slow for good, not for a moment, gets a small queue back: once the
 * kernel throttles the fills' pwrites (dirty pages at their limit, or a
 * cgroup's, as in test-fscache-slow-disk.sh), their windows are slow
 * and the peak decays to them, halving in under a second of busy time
 * (meter.c, PEAK_DECAY); there a bigger queue would only hold more
 * memory and put off the skip of a disk that is the bottleneck.
 * Before the fills are measured: the minimum.
 */
#define FILL_MIN_BYTES ((uint64_t) 16 << 20)
#define FILL_MAX_BYTES ((uint64_t) 128 << 20)
#define FILL_QUEUE_MS 250

/* The cache disk is the bottleneck when fills are written at less
 * than this share of the upstream's rate (see the comment at the top).
 */
#define SLOWER_PCT 33

/* When fills run at under BUDGET_SLOWER_PCT of the upstream's rate,
 * client reads are admitted to fill at most DUTY_PCT of the fills' own
 * rate (fsc_fill_budget), with a burst of BUDGET_BURST bytes.
 */
#define DUTY_PCT 2
#define BUDGET_SLOWER_PCT 100   /* ... when fills are slower than the
                                 * upstream */

/* Over a link (fsc_upstream_remote), the share follows how much faster
 * the link is than the fills (issue 44): at most twice as fast, fills
 * are admitted at LINK_DUTY_PCT of their own rate; four times or more,
 * DUTY_PCT, as for a local upstream; in between, in proportion.  The
 * cliff it replaces: fills at 212 MB/s per busy second against a
 * 1.6 Gbit/s link (237 MB/s) were admitted at 2% of their rate, and
 * 97% of a 4 GiB random read went uncached (fill_skipped_bytes
 * 4,155,703,296), where the disk was only a tenth slower than the
 * link.  Fills admitted are queued, not waited for (the queue's bound
 * is the fill path's 250 ms), so a share under the fills' own rate
 * keeps the client at the link's pace.  A local upstream keeps
 * DUTY_PCT: there the fills' cost is the CPU's, which the client's
 * reads share (see the top of this file).
 */
#define LINK_DUTY_PCT 90
#define BUDGET_BURST ((uint64_t) 64 << 20)

/* Are fills written at less than PCT percent of the upstream's rate,
 * its moving average, or if PEAK its peak?  Not known yet (a meter at
 * 0): no.  *FILL gets the fills' rate.  The skip of a full queue's
 * fills compares with the average: a skip or a bypass claims nothing,
 * so that readahead and other readers may fetch the same blocks again,
 * and the peak made that happen on local upstreams (a half-filled
 * object read by nbdcopy fetched 1.4 times its missing half).  The
 * budget compares with the peak (see the top of this file).
 */
static bool
fill_under (struct fsc_cache *c, unsigned pct, bool peak, uint64_t *fill)
{
  const uint64_t up = peak
    ? __atomic_load_n (&c->up_meter.peak, __ATOMIC_RELAXED)
    : __atomic_load_n (&c->up_meter.rate, __ATOMIC_RELAXED);
  *fill = __atomic_load_n (&c->fill_meter.rate, __ATOMIC_RELAXED);
  return *fill != 0 && *fill < up / 100 * pct;
}

bool
fsc_fill_slower (struct fsc_cache *c)
{
  uint64_t fill;
  /* A probe's hold: the full queue is the probe's, not the disk's, and
   * its misses skip rather than write inline (fsc_fill_held).
   */
  if (fsc_fill_held (c))
    return true;
  /* The test knob, either way, takes the rates out of it. */
  return c->test_budget < 0 && fill_under (c, SLOWER_PCT, false, &fill);
}

/* Is the budget engaged?  *FILL gets the fills' rate.  The test knob
 * (NBD_FSCACHE_TEST_BUDGET) takes the rates out of every skip: set to
 * 1 it engages the budget whatever the rates, so that a test shows
 * what it does on any machine (the rates decide only when it engages);
 * set to 0 it never engages; either way the full queue's skip
 * (fsc_fill_slower) is off, and engaged its share is DUTY_PCT, over a
 * link too (duty_pct).  So a test of what the cache keeps
 * (eviction, what a read fetches) does not depend on how loaded the
 * machine's disk is: under a writer's fdatasync loop beside them, the
 * fills measured slower than a page-cached upstream, nearly every read
 * bypassed the cache, and test-fscache-max-size's hot set was never
 * cached at all.
 */
static bool
budget_engaged (struct fsc_cache *c, uint64_t *fill)
{
  if (c->test_budget >= 0) {
    *fill = __atomic_load_n (&c->fill_meter.rate, __ATOMIC_RELAXED);
    return c->test_budget;
  }
  /* Over a link (fsc_upstream_remote), the average must say so too: a
   * rate-limited link's reads come in bursts, whose best window said
   * the upstream was faster than fills at 353 MiB/s while it averaged
   * 111 (800 Mbit/s), and the budget left 36% of a cold read uncached
   * (tools/bench/fill.sh).  A local upstream keeps the peak alone (see
   * the top of this file for why the average misled there).
   */
  const bool remote = fsc_upstream_remote (c);
  /* Where no rate says it, the fills may still slow the clients: ask
   * the live comparison (cost.c), stepped on every call so that its
   * windows follow the stream whatever the rates say.
   */
  const bool costly = fsc_fill_cost_engaged (c);
  return (fill_under (c, BUDGET_SLOWER_PCT, true, fill) &&
          (!remote || fill_under (c, BUDGET_SLOWER_PCT, false, fill))) ||
    costly;
}

/* An upstream whose reads take this long each is a link: requests in
 * flight at once (readahead) are what covers its round trip.
 */
#define REMOTE_NS 1000000

void
fsc_upstream_latency (struct fsc_cache *c, uint64_t ns)
{
  uint64_t old = __atomic_load_n (&c->up_latency_ns, __ATOMIC_RELAXED);
  __atomic_store_n (&c->up_latency_ns, old ? old - old / 8 + ns / 8 : ns,
                    __ATOMIC_RELAXED);
}

bool
fsc_upstream_remote (struct fsc_cache *c)
{
  return __atomic_load_n (&c->up_latency_ns, __ATOMIC_RELAXED) >= REMOTE_NS;
}

bool
fsc_fill_budgeted (struct fsc_cache *c)
{
  uint64_t fill;
  return budget_engaged (c, &fill) || fsc_fill_held (c);
}

/* Until both meters have a window, the rates say nothing, and the
 * bucket alone admits fills, a client's misses and readahead's
 * prefetches alike (SPECULATIVE: readahead, which once the rates are
 * known pauses instead while the budget is engaged), with no refill:
 * the fills' rate is not known either.  Without that, everything read
 * before the first windows was filled, inline once the queue was
 * full: 50 to 170 MB from nbdkit null on top of the burst, a fifth of
 * the time of a 4 GiB read.  A slow upstream has its windows long
 * before it has read the burst, and is then not budgeted at all.
 */
static bool
rates_known (struct fsc_cache *c, uint64_t fill)
{
  return fill != 0 && __atomic_load_n (&c->up_meter.peak, __ATOMIC_RELAXED);
}

/* The share of the fills' rate FILL admitted while the budget is
 * engaged (LINK_DUTY_PCT above).
 */
static uint64_t
duty_pct (struct fsc_cache *c, uint64_t fill)
{
  const uint64_t up = __atomic_load_n (&c->up_meter.rate, __ATOMIC_RELAXED);
  /* The test knob engaging the budget takes the rates out of its share
   * too: under a loaded machine's CPU a local file's reads can average
   * a millisecond, the upstream then counts as a link, the share rises
   * to LINK_DUTY_PCT, and a test that forced the budget on to see fills
   * skipped sees none (likely test-fscache-any-plugin.sh's failure in a
   * fresh clone; test-fscache-catchup.sh part 3 breaks it with a slow
   * upstream).
   */
  if (c->test_budget == 1 || !fsc_upstream_remote (c) || fill == 0 ||
      up / 4 >= fill || __atomic_load_n (&c->cost.costly, __ATOMIC_RELAXED))
    return DUTY_PCT;
  if (up / 2 <= fill)
    return LINK_DUTY_PCT;
  /* up in (2 fill, 4 fill): from LINK_DUTY_PCT down to DUTY_PCT. */
  const double x = ((double) up / (double) fill - 2.0) / 2.0;
  return (uint64_t) (LINK_DUTY_PCT - x * (LINK_DUTY_PCT - DUTY_PCT));
}

bool
fsc_fill_budget (struct fsc_cache *c, uint64_t len, bool speculative)
{
  uint64_t fill;
  if (c->test_budget == 0)
    return true;
  /* The burst spent before the fills' rate is known: it is known from
   * what the burst filled (meter.c, fsc_meter_first), or nothing would
   * ever refill the bucket.  (The upstream's rate needs no such help:
   * misses past the budget still fetch, and so keep its meter going.)
   * Asked before the budget is weighed, so that it is weighed (and the
   * cost measure stepped) once.
   */
  if (__atomic_load_n (&c->fill_meter.rate, __ATOMIC_RELAXED) == 0 &&
      __atomic_load_n (&c->budget_ns, __ATOMIC_RELAXED) != 0 &&
      __atomic_load_n (&c->budget_bytes, __ATOMIC_RELAXED) < len)
    (void) fsc_meter_first (&c->fill_meter);
  const bool engaged = budget_engaged (c, &fill);
  /* Admitted whatever the bucket holds.  With the budget off, it is
   * still charged, down to empty ("The burst is one" above); a
   * speculative prefetch while it is engaged is not (readahead pauses
   * instead, or over a link keeps its requests in flight, whose
   * prefetches would otherwise take the client's own misses' share).
   */
  const bool known = rates_known (c, fill);
  if (known && engaged && speculative)
    return true;
  const bool free = known && !engaged;
  const uint64_t rate = !known ? 0
    : fill / 100 * (engaged ? duty_pct (c, fill) : DUTY_PCT);
  const uint64_t now = fsc_mono_ns ();
  SCOPED_LOCK (&c->budget_lock);
  const uint64_t burst = c->budget_burst ? c->budget_burst : BUDGET_BURST;
  if (c->budget_ns == 0) {              /* the first time: full */
    c->budget_bytes = burst;
    c->budget_ns = now;
  }
  else if (now > c->budget_ns) {
    const double add = (double) (now - c->budget_ns) * (double) rate / 1e9;
    c->budget_bytes = add >= (double) burst ? burst
      : MIN (burst, c->budget_bytes + (uint64_t) add);
    c->budget_ns = now;
  }
  if (free) {
    c->budget_bytes -= MIN (len, c->budget_bytes);
    return true;
  }
  if (c->budget_bytes < len)
    return false;
  c->budget_bytes -= len;
  return true;
}

size_t
fsc_fill_bound (struct fsc_cache *c)
{
  const uint64_t peak = __atomic_load_n (&c->fill_meter.peak,
                                         __ATOMIC_RELAXED);
  /* peak / 1000 * MS, not peak * MS / 1000: no overflow at any rate. */
  const uint64_t b = peak / 1000 * FILL_QUEUE_MS;
  /* A probe's hold takes what the probe's length brings, up to the
   * most the queue ever holds.
   */
  if (__atomic_load_n (&c->fill_hold_until, __ATOMIC_RELAXED) != 0)
    return (size_t) FILL_MAX_BYTES;
  return (size_t) MIN (FILL_MAX_BYTES, MAX (FILL_MIN_BYTES, b));
}

size_t
fsc_fill_room (struct fsc_cache *c)
{
  SCOPED_LOCK (&c->fill_lock);
  if (!c->filler_running || c->fill_stopping)
    return 0;
  const size_t bound = fsc_fill_bound (c);
  return c->fill_bytes >= bound ? 0 : bound - c->fill_bytes;
}

struct fsc_fill *
fsc_fill_new (struct fsc_cache *c, size_t len)
{
  pthread_mutex_lock (&c->fill_lock);
  bool ok = c->filler_running && !c->fill_stopping;
  pthread_mutex_unlock (&c->fill_lock);
  if (!ok) {
    errno = ENOTSUP;
    return NULL;
  }
  struct fsc_fill *f = malloc (sizeof *f);
  if (f == NULL)
    return NULL;
  f->data = fsc_buf_get (c, len, &f->cap);
  if (f->data == NULL) {
    free (f);
    errno = ENOMEM;
    return NULL;
  }
  f->next = NULL;
  f->obj = NULL;
  f->len = len;
  f->readers = 0;
  f->done = false;
  f->held = false;
  return f;
}

void
fsc_fill_free (struct fsc_cache *c, struct fsc_fill *f)
{
  fsc_buf_put (c, f->data, f->cap);
  free (f);
}

/* Does job F hold the bytes [LO, HI) of block B of O, claimed at
 * EPOCH?  Caller holds c->fill_lock.
 */
static bool
job_holds (const struct fsc_fill *f, const struct fsc_object *o, uint64_t b,
           uint64_t epoch, uint64_t lo, uint64_t hi)
{
  return f->obj == o && b >= f->block && b < f->block + f->nblocks &&
    lo >= f->start && hi <= f->start + f->len &&
    f->epochs[GROUP_OF (b) - GROUP_OF (f->block)] == epoch;
}

bool
fsc_fill_copy (struct fsc_cache *c, struct fsc_object *o, uint64_t b,
               uint64_t epoch, uint64_t lo, uint64_t hi, void *dst)
{
  pthread_mutex_lock (&c->fill_lock);
  struct fsc_fill *f = NULL;
  for (unsigned i = 0; i < FSC_FILLERS && f == NULL; ++i)
    if (c->fill_current[i] &&
        job_holds (c->fill_current[i], o, b, epoch, lo, hi))
      f = c->fill_current[i];
  if (f == NULL)
    for (f = c->fill_head; f && !job_holds (f, o, b, epoch, lo, hi);
         f = f->next)
      ;
  if (f)
    f->readers++;
  pthread_mutex_unlock (&c->fill_lock);
  if (f == NULL)
    return false;

  memcpy (dst, f->data + (lo - f->start), hi - lo);
  pthread_mutex_lock (&c->fill_lock);
  bool last = --f->readers == 0 && f->done;
  pthread_mutex_unlock (&c->fill_lock);
  if (last)
    fsc_fill_free (c, f);
  return true;
}

bool
fsc_fill_congested (struct fsc_cache *c)
{
  return __atomic_load_n (&c->fill_bytes, __ATOMIC_RELAXED) >
    fsc_fill_bound (c) / 2;
}

int
fsc_fill_submit (struct fsc_cache *c, struct fsc_object *obj,
                 struct fsc_fill *f)
{
  /* An empty queue takes any job, so that a job larger than the bound
   * (there are none today: a fetch is at most 4 MiB) would not be
   * refused forever.
   */
  pthread_mutex_lock (&c->fill_lock);
  const size_t queued = c->fill_bytes;
  bool ok = !c->fill_stopping &&
    (queued == 0 || queued + f->len <= fsc_fill_bound (c));
  if (ok)
    __atomic_store_n (&c->fill_bytes, queued + f->len, __ATOMIC_RELAXED);
  pthread_mutex_unlock (&c->fill_lock);
  if (!ok) {
    errno = EAGAIN;
    return -1;
  }

  pthread_mutex_lock (&c->lock);
  obj->refs++;
  pthread_mutex_unlock (&c->lock);
  pthread_mutex_lock (&obj->lock);
  obj->pending_fills++;
  pthread_mutex_unlock (&obj->lock);
  f->obj = obj;
  pthread_mutex_lock (&c->fill_lock);
  f->next = NULL;
  *c->fill_tail = f;
  c->fill_tail = &f->next;
  pthread_cond_signal (&c->fill_cond);
  pthread_mutex_unlock (&c->fill_lock);
  /* Reads waiting for these blocks' claim can take them from here. */
  pthread_mutex_lock (&obj->lock);
  if (f->nblocks)
    fsc_claim_wake (obj, f->block, f->block + f->nblocks - 1);
  pthread_mutex_unlock (&obj->lock);
  return 0;
}

/* Is a job queued or being written?  Caller holds c->fill_lock. */
static bool
fill_busy (const struct fsc_cache *c)
{
  for (unsigned i = 0; i < FSC_FILLERS; ++i)
    if (c->fill_current[i])
      return true;
  return c->fill_head != NULL;
}

void
fsc_fill_skipped (struct fsc_object *o, uint64_t start, uint64_t len)
{
  struct fsc_stats *st = &o->cache->stats;
  FSC_STAT_ADD (st, fill_skipped, 1);
  FSC_STAT_ADD (st, fill_skipped_bytes, len);
  FSC_OSTAT_ADD (o, fill_skipped_bytes, len);
  fsc_catchup_note (o, start, len);
}

/* A client's job held by a probe whose sample found the fills costly
 * (cost.c): skipped as the budget would have skipped it, its blocks
 * released unstored and noted for the catch-up.  Written, a stream
 * from an NBD server next door filled what its probe had held, up to
 * FILL_MAX_BYTES, at the very moment it was found that fills slow it
 * (a scratch trace of the cost measure, issue 44).
 */
static void
drop (struct fsc_object *o, struct fsc_fill *f)
{
  fsc_fill_skipped (o, f->start, f->len);
  FSC_NOTICE (o, FSC_NOTICE_SKIPPED);
  fsc_fill_blocks (o, f->block, f->nblocks, NULL, f->start, f->len,
                   f->epochs, f->flags);
}

static void *
filler (void *arg)
{
  struct fsc_cache *c = arg;
  fsc_thread_name ("fsc-fill");
  const unsigned slot = __atomic_fetch_add (&c->filler_slots, 1,
                                            __ATOMIC_RELAXED);

  for (;;) {
    pthread_mutex_lock (&c->fill_lock);
    for (;;) {
      while (c->fill_head == NULL && !c->fill_stopping)
        pthread_cond_wait (&c->fill_cond, &c->fill_lock);
      /* A probe's hold (fsc_fill_held): ended by time, whoever steps. */
      const uint64_t until = __atomic_load_n (&c->fill_hold_until,
                                              __ATOMIC_RELAXED);
      const uint64_t now = fsc_mono_ns ();
      if (c->fill_stopping || until == 0 || now >= until)
        break;
      struct timespec ts;               /* now < until: no wrap */
      deadline_ms (&ts, (until - now + 999999) / 1000000);
      pthread_cond_timedwait (&c->fill_cond, &c->fill_lock, &ts);
    }
    struct fsc_fill *f = c->fill_head;
    if (f) {
      c->fill_head = f->next;
      if (c->fill_head == NULL)
        c->fill_tail = &c->fill_head;
      c->fill_current[slot] = f;
      /* How many are being written, this one among them. */
      unsigned depth = 0;
      for (unsigned i = 0; i < FSC_FILLERS; ++i)
        depth += c->fill_current[i] != NULL;
      FSC_STAT_MAX (&c->stats, fill_depth_max, depth);
    }
    pthread_mutex_unlock (&c->fill_lock);
    if (f == NULL)              /* stopping, and the queue is empty */
      return NULL;

    struct fsc_object *o = f->obj;
    if (f->held && __atomic_load_n (&c->cost.costly, __ATOMIC_RELAXED))
      drop (o, f);
    else {
      fsc_meter_begin (&c->fill_meter);
      fsc_fill_blocks (o, f->block, f->nblocks, f->data, f->start, f->len,
                       f->epochs, f->flags);
      fsc_meter_end (&c->fill_meter, f->len);
    }
    pthread_mutex_lock (&o->lock);
    o->pending_fills--;
    pthread_cond_broadcast (&o->cond);
    pthread_mutex_unlock (&o->lock);
    pthread_mutex_lock (&c->fill_lock);
    c->fill_current[slot] = NULL;
    if (!fill_busy (c))
      pthread_cond_broadcast (&c->fill_idle_cond);
    __atomic_store_n (&c->fill_bytes, c->fill_bytes - f->len,
                      __ATOMIC_RELAXED);
    f->done = true;
    bool last = f->readers == 0;
    pthread_mutex_unlock (&c->fill_lock);
    /* The object's reference last: its close may free it, and a
     * reader's job_holds compares the pointer.
     */
    fsc_object_close (o);
    if (last)
      fsc_fill_free (c, f);
  }
}

void
fsc_cache_drain (struct fsc_cache *c)
{
  /* Whoever waits for the queue does not wait for a probe. */
  fsc_fill_unhold (c);
  SCOPED_LOCK (&c->fill_lock);
  while (c->filler_running && fill_busy (c))
    pthread_cond_wait (&c->fill_idle_cond, &c->fill_lock);
}

int
fsc_fill_start (struct fsc_cache *c)
{
  SCOPED_LOCK (&c->fill_lock);
  if (c->filler_running)
    return 0;
  int e = 0;
  c->filler_slots = 0;
  for (c->fillers = 0; c->fillers < FSC_FILLERS; c->fillers++)
    if ((e = pthread_create (&c->filler[c->fillers], NULL, filler, c)) != 0)
      break;
  if (c->fillers == 0) {
    errno = e;
    return -1;
  }
  c->filler_running = true;
  return 0;
}

void
fsc_fill_stop (struct fsc_cache *c)
{
  pthread_mutex_lock (&c->fill_lock);
  c->fill_stopping = true;
  pthread_cond_broadcast (&c->fill_cond);
  const unsigned n = c->filler_running ? c->fillers : 0;
  pthread_mutex_unlock (&c->fill_lock);
  for (unsigned i = 0; i < n; ++i)
    pthread_join (c->filler[i], NULL);
}
