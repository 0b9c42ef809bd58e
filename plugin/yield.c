/* nbdkit-fscache-filter: a worker that has served requests back to
 * back for a budget of time (fscache-worker-yield, 25 µs) without
 * sleeping offers its CPU once (sched_yield), as a kernel loop calls
 * cond_resched.
 *
 * Why (issue 44): hits cost the server's CPU a little more than the
 * file plugin's pread (the index, the checksum, the miss-ratio curve:
 * about 0.7 µs of 13 µs a 4 KiB request, docs/benchmarks.md).  On a
 * host whose CPUs are all busy, a client keeping 8 requests in flight
 * then always finds one waiting: nbdkit's worker threads never sleep,
 * and the client's thread, woken on a CPU one of them holds, waits for
 * the end of the worker's slice, up to a scheduler tick (4 ms at
 * HZ=250).  The 1 in 1,000 slowest hits of an idle proxy took 3 to 4
 * ms where the local file's took 0.6 to 1.  A worker that offers the
 * CPU after 25 µs of back-to-back requests lets the client in within
 * about that.  Measured in docs/benchmarks.md ("A worker's budget"),
 * with what it costs: fewer requests a second when the CPUs are
 * saturated, since every yield is a switch.
 *
 * What "without sleeping" means: the thread's voluntary context
 * switches (getrusage RUSAGE_THREAD) did not move since its budget
 * started.  A worker waiting for the next request, an upstream read
 * or a lock sleeps, and its budget starts again; only a thread that
 * never gave the CPU away yields.  The clock is read once a request;
 * getrusage, a system call, only once a budget has passed, so at most
 * once per 25 µs of a thread's time.  A thread with nothing else to
 * run beside it gets the CPU straight back from sched_yield.
 *
 * The upstream's work.  A request that read the upstream (a miss, a
 * bypass) starts a new budget, and does not yield: what its worker
 * did without sleeping was the plugin's, and the plugin alone would not
 * have yielded.  A plugin in the same process that does not sleep (a
 * page-cached file, memory, null) otherwise had its workers yield after
 * nearly every 64 KiB read, two system calls and a switch each: random
 * 64 KiB reads from the file plugin ran at 0.75 to 0.79 of the plugin
 * alone, cached or not (fastup.sh; a debugger's samples of the
 * workers found a fifth of them in sched_yield).  Hits keep their
 * budget: their extra CPU is the cache's, which is what the yield
 * gives back.
 *
 * Per-thread state only (nbdkit's workers), no lock.
 */
#include <config.h>

#include <sched.h>
#include <stdint.h>
#include <sys/resource.h>

#include "utils.h"

#include "yield.h"

static uint64_t budget_ns = 25 * 1000;  /* set before the workers start */

static __thread uint64_t started_ns;    /* this thread's budget began */
static __thread long slept;             /* its voluntary switches then */
static __thread bool upstream;          /* this request read upstream */

void
yield_set_budget_us (uint64_t us)
{
  budget_ns = us * 1000;
}

bool
yield_after_request (void)
{
  if (budget_ns == 0)
    return false;
  const uint64_t now = fsc_mono_ns ();
  if (upstream) {
    upstream = false;           /* the plugin's work: a new budget */
    started_ns = now;
    return false;
  }
  if (now - started_ns < budget_ns)
    return false;
#ifdef RUSAGE_THREAD
  struct rusage ru;
  if (getrusage (RUSAGE_THREAD, &ru) == -1) {
    started_ns = now;           /* cannot tell: no yield */
    return false;
  }
  if (ru.ru_nvcsw != slept) {
    slept = ru.ru_nvcsw;        /* it slept since: a new budget */
    started_ns = now;
    return false;
  }
  sched_yield ();
  started_ns = fsc_mono_ns ();
  return true;
#else
  return false;                 /* no way to tell a sleep: never */
#endif
}

void
yield_note_upstream (void)
{
  upstream = true;
}
