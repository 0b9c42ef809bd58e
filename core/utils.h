/* libfscache: small helpers used everywhere in core/ and plugin/.
 *
 * Written once here so that every file rounds, aligns, frees and
 * encodes little-endian integers the same way.  Everything is inline
 * or a macro; there is no state.
 */
#ifndef FSC_UTILS_H
#define FSC_UTILS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <endian.h>
#include <pthread.h>
#include <time.h>

/* Round X up/down to a multiple of N; N must be a power of 2. */
#define ROUND_UP(x, n) (((x) + (n) - 1) & ~((__typeof__ (x)) (n) - 1))
#define ROUND_DOWN(x, n) ((x) & ~((__typeof__ (x)) (n) - 1))
#define DIV_ROUND_UP(x, n) (((x) + (n) - 1) / (n))
#define IS_ALIGNED(x, n) (((x) & ((n) - 1)) == 0)
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static inline bool
is_power_of_2 (uint64_t v)
{
  return v != 0 && (v & (v - 1)) == 0;
}

/* Checked arithmetic: return true on overflow. */
#define ADD_OVERFLOW(a, b, r) __builtin_add_overflow ((a), (b), (r))
#define MUL_OVERFLOW(a, b, r) __builtin_mul_overflow ((a), (b), (r))

/* Cleanup attributes, as in nbdkit's common/utils/cleanup.h. */
static inline void
fsc_cleanup_free (void *ptr)
{
  free (*(void **) ptr);
}
#define CLEANUP_FREE __attribute__ ((cleanup (fsc_cleanup_free)))

static inline void
fsc_cleanup_unlock (pthread_mutex_t **ptr)
{
  pthread_mutex_unlock (*ptr);
}
#define FSC_CONCAT_(a, b) a##b
#define FSC_CONCAT(a, b) FSC_CONCAT_ (a, b)
/* Hold MUTEX until the end of the enclosing scope. */
#define SCOPED_LOCK(mutex)                                              \
  pthread_mutex_t *FSC_CONCAT (scoped_lock_, __LINE__)                  \
    __attribute__ ((cleanup (fsc_cleanup_unlock))) = (mutex);           \
  pthread_mutex_lock (FSC_CONCAT (scoped_lock_, __LINE__))

/* Explicit little-endian encoding of on-disk fields. */
static inline void
put_le16 (unsigned char *p, uint16_t v)
{
  v = htole16 (v);
  memcpy (p, &v, 2);
}
static inline uint16_t
get_le16 (const unsigned char *p)
{
  uint16_t v;
  memcpy (&v, p, 2);
  return le16toh (v);
}
static inline void
put_le32 (unsigned char *p, uint32_t v)
{
  v = htole32 (v);
  memcpy (p, &v, 4);
}
static inline void
put_le64 (unsigned char *p, uint64_t v)
{
  v = htole64 (v);
  memcpy (p, &v, 8);
}
static inline uint32_t
get_le32 (const unsigned char *p)
{
  uint32_t v;
  memcpy (&v, p, 4);
  return le32toh (v);
}
static inline uint64_t
get_le64 (const unsigned char *p)
{
  uint64_t v;
  memcpy (&v, p, 8);
  return le64toh (v);
}

/* *TS = MS milliseconds from now on CLOCK_REALTIME, the clock of a
 * condition variable's timed wait.
 */
static inline void
deadline_ms (struct timespec *ts, uint64_t ms)
{
  clock_gettime (CLOCK_REALTIME, ts);
  ts->tv_sec += (time_t) (ms / 1000);
  ts->tv_nsec += (long) (ms % 1000) * 1000000;
  if (ts->tv_nsec >= 1000000000) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000;
  }
}

/* Milliseconds on the monotonic clock (deadlines, intervals, rates)
 * and on the wall clock (times written to disk or shown to people):
 * one helper each, so that no file picks the wrong clock by accident.
 */
static inline uint64_t
fsc_mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Milliseconds on the monotonic clock at the tick's resolution (1 to
 * 10 ms): for a time taken on every request whose use is that coarse
 * (the catch-up's 100 ms of idleness), at a few nanoseconds where
 * fsc_mono_ms reads the clock source (tens on a virtual machine: the
 * hit path read it four times a request, issue 44).  Compare only with
 * itself: it lags fsc_mono_ms by up to a tick.
 */
static inline uint64_t
fsc_mono_coarse_ms (void)
{
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  clock_gettime (CLOCK_MONOTONIC_COARSE, &ts);
#else
  clock_gettime (CLOCK_MONOTONIC, &ts);
#endif
  return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Nanoseconds on the monotonic clock (rates: fill.c, meter.c). */
static inline uint64_t
fsc_mono_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + (uint64_t) ts.tv_nsec;
}

static inline uint64_t
fsc_wall_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Name the calling thread (at most 15 bytes; longer is cut), so that
 * top -H, perf sched, gdb's "info threads" and /proc/PID/task/TID/comm
 * tell the cache's own threads from nbdkit's workers: every thread of
 * the process was "nbdkit", and a profile of the hits' waits could
 * only tell them apart by their thread ids (docs/benchmarks.md, stop
 * 63).  A thread started from one of ours inherits its name (Linux
 * copies it), such as a plugin's own thread started while one of ours
 * opens a context.  Best effort: a name is never worth a failure.
 */
static inline void
fsc_thread_name (const char *name)
{
#ifdef __GLIBC__
  char n[16];
  size_t len = strlen (name);
  if (len > sizeof n - 1)
    len = sizeof n - 1;
  memcpy (n, name, len);
  n[len] = '\0';
  (void) pthread_setname_np (pthread_self (), n);
#else
  (void) name;
#endif
}

#endif /* FSC_UTILS_H */
