/* Unit test: allocation failures in the write log (core/wlog/wlog.c) and
 * its writer never cost a stale read, a use of freed memory or a lost
 * write: the operation fails (ENOMEM or EIO) or is retried, and what
 * was acknowledged before reads back.
 *
 * Fault injection: this program defines malloc, calloc and realloc
 * (over glibc's __libc_* functions), so every allocation of the core
 * comes here.  Armed with N, the Nth allocation from now fails; only
 * the threads chosen (the test's own, or the others: the writer) count.
 *
 *  1. Client operations (aligned writes, zeroes, trims over each other,
 *     no writer): each but the first 20 (they make a map with extents
 *     to split) is tried with the 1st, 2nd, ... allocation
 *     failing until it succeeds.  After every failure all bytes outside
 *     the operation's range read as acknowledged (through the log), and
 *     inside it each byte is the old or the new one.  An operation must
 *     succeed once nothing fails any more.  Before the map nodes were
 *     allocated with the record, a failed insert had already cut the
 *     extent it split: the bytes after the range read as the
 *     upstream's old ones, and the log refused everything after.
 *  2. The writer's retire: records are written back with the Nth
 *     allocation of the writer's thread failing, N = 1, 2, ... until a
 *     drain passes with nothing failing.  The writer retries what
 *     failed: every drain ends with the upstream equal to the model,
 *     reads after it equal the model, and the log never fails for want
 *     of memory.  Before, a failed retire list or map removal freed
 *     records still in the map, and the next read through the log used
 *     them (it failed its checks); a failed insert into the writer's
 *     private batch map, or the header's buffer, failed the whole log
 *     for good.
 *
 * Under valgrind, whose malloc replaces ours, nothing can fail: the
 * test says so and is skipped (77).
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fscache.h"
#include "wlog.h"
#include "unit.h"
#include "utils.h"

/* ---- the allocator ---------------------------------------------------- */

extern void *__libc_malloc (size_t);
extern void *__libc_calloc (size_t, size_t);
extern void *__libc_realloc (void *, size_t);

static pthread_t main_thread;
static long fail_at;            /* 0: off; else countdown */
static bool others;             /* count the other threads, not main */
static long failures;

static bool
should_fail (void)
{
  if (__atomic_load_n (&fail_at, __ATOMIC_RELAXED) == 0)
    return false;
  if (pthread_equal (pthread_self (), main_thread) == others)
    return false;
  if (__atomic_sub_fetch (&fail_at, 1, __ATOMIC_RELAXED) == 0) {
    __atomic_add_fetch (&failures, 1, __ATOMIC_RELAXED);
    return true;
  }
  return false;
}

void *
malloc (size_t n)
{
  if (should_fail ()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_malloc (n);
}

void *
calloc (size_t a, size_t b)
{
  if (should_fail ()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_calloc (a, b);
}

void *
realloc (void *p, size_t n)
{
  if (should_fail ()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_realloc (p, n);
}

static void
arm (long n, bool other_threads)
{
  others = other_threads;
  __atomic_store_n (&fail_at, n, __ATOMIC_SEQ_CST);
}

static void
disarm (void)
{
  __atomic_store_n (&fail_at, 0, __ATOMIC_SEQ_CST);
}

/* ---- the upstream and the client's model ------------------------------ */

#define BS 4096u
#define SIZE (256u * 1024u)

static unsigned char upstream[SIZE], model[SIZE];
static pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *key = "nomem\0export=";
static const size_t key_len = 13;
static char dir[64];

static int
up_pread (void *o, void *buf, uint32_t count, uint64_t offset)
{
  pthread_mutex_lock (&up_lock);
  memcpy (buf, upstream + offset, count);
  pthread_mutex_unlock (&up_lock);
  return 0;
}
static int
wb_pwrite (void *o, const void *buf, uint32_t count, uint64_t offset)
{
  pthread_mutex_lock (&up_lock);
  memcpy (upstream + offset, buf, count);
  pthread_mutex_unlock (&up_lock);
  return 0;
}
static int
wb_zero (void *o, uint32_t count, uint64_t offset)
{
  pthread_mutex_lock (&up_lock);
  memset (upstream + offset, 0, count);
  pthread_mutex_unlock (&up_lock);
  return 0;
}
static int
wb_flush (void *o)
{
  return 0;
}

static struct fsc_wb_upstream wbup = {
  .pwrite = wb_pwrite, .zero = wb_zero, .trim = wb_zero, .flush = wb_flush,
  .pread = up_pread, .nparallel = 2, .can_trim = true, .can_zero = true,
  .can_flush = true,
};
static const struct fsc_upstream up = { .pread = up_pread };

static struct fsc_wlog *
open_log (struct fsc_cache *c)
{
  struct fsc_wlog *wl;
  struct fsc_wlog_info info;
  struct fsc_wlog_params p = {
    .key = key, .key_len = key_len, .size = SIZE, .generation = "g1",
    .dirty_max = 64 << 20,
  };
  CHECK (fsc_wlog_open (c, &p, FSC_WLOG_CREATE, &wl, &info) == 0);
  return wl;
}

static uint64_t
rnd (uint64_t n)
{
  return ((uint64_t) rand () << 31 ^ rand ()) % n;
}

/* Read everything through the log (nothing armed): outside [A, B) it
 * must be the model, inside either the model or NEW (NULL: zeroes).
 */
static void
check (struct fsc_wlog *wl, struct fsc_object *o, uint64_t a, uint64_t b,
       const unsigned char *new, const char *what)
{
  static unsigned char got[SIZE];
  CHECK (fsc_wlog_read (wl, o, got, SIZE, 0, &up, 0) == 0);
  for (uint64_t i = 0; i < SIZE; ++i) {
    if (got[i] == model[i])
      continue;
    if (i >= a && i < b && got[i] == (new ? new[i - a] : 0))
      continue;
    fprintf (stderr, "%s: byte %llu reads %s (failed operation over "
             "[%llu, %llu))\n", what, (unsigned long long) i,
             got[i] == upstream[i] ? "the upstream's old byte" : "wrong",
             (unsigned long long) a, (unsigned long long) b);
    exit (1);
  }
}

int
main (void)
{
  main_thread = pthread_self ();
  /* Under valgrind (make check-valgrind) its own malloc replaces ours:
   * nothing could fail, and the test would prove nothing.
   */
  arm (1, false);
  void *probe = malloc (16);
  disarm ();
  if (probe != NULL) {
    free (probe);
    printf ("SKIP: allocation failures cannot be injected here "
            "(valgrind?)\n");
    return 77;
  }
  failures = 0;
  srand (25);
  for (size_t i = 0; i < SIZE; ++i)
    upstream[i] = model[i] = rand ();
  snprintf (dir, sizeof dir, "/tmp/unit-wlog-nomem-XXXXXX");
  CHECK (mkdtemp (dir) != NULL);
  strcat (dir, "/cache");

  struct fsc_cache *c;
  struct fsc_cache_config cfg = { .dir = dir, .create = true };
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  struct fsc_object *o;
  struct fsc_open_info oinfo;
  struct fsc_object_params op = {
    .key = key, .key_len = key_len, .block_size = 65536, .size = SIZE,
    .verify = true, .validate = FSC_VALIDATE_SIZE,
  };
  CHECK (fsc_object_open (c, &op, &o, &oinfo) == 0);
  struct fsc_wlog *wl = open_log (c);

  /* 1. Client operations. */
  static unsigned char buf[16 * BS];
  unsigned long tries = 0;
  for (int i = 0; i < 200; ++i) {
    unsigned k = rnd (10);
    uint64_t off = rnd (SIZE / BS) * BS;
    uint64_t want = (1 + rnd (16)) * BS;  /* MIN evaluates twice */
    uint64_t n = MIN (want, SIZE - off);
    for (uint64_t j = 0; j < n; ++j)
      buf[j] = rand ();
    /* The first 20 unarmed: a map with extents to split. */
    for (long at = i < 20 ? 0 : 1;; ++at) {
      CHECK (at < 100);         /* it must succeed once nothing fails */
      arm (at, false);
      int r;
      if (k < 6)
        r = fsc_wlog_pwrite (wl, o, &up, buf, n, off, rnd (8) == 0);
      else if (k < 9)
        r = fsc_wlog_zero (wl, o, &up, n, off, false);
      else
        r = fsc_wlog_trim (wl, n, off, false);
      int err = errno;
      disarm ();
      tries++;
      if (r == 0) {
        if (k < 6)
          memcpy (model + off, buf, n);
        else
          memset (model + off, 0, n);  /* trims here: whole units */
        check (wl, o, 0, 0, NULL, "after a success");
        break;
      }
      CHECK (err == ENOMEM || err == EIO);
      check (wl, o, off, off + n, k < 6 ? buf : NULL, "after a failure");
    }
  }
  printf ("1. %d operations, %lu tries, %ld allocations failed\n",
          200, tries, failures);
  CHECK (fsc_wlog_flush (wl) == 0);

  /* 2. The writer's retire, its Nth allocation failing. */
  long before = failures;
  unsigned rounds = 0;
  for (long at = 1;; ++at) {
    CHECK (at < 200);
    /* Three overlapping records, written back in one batch. */
    for (int j = 0; j < 3; ++j) {
      uint64_t off = (uint64_t) j * BS, n = 3 * BS;
      for (uint64_t b = 0; b < n; ++b)
        buf[b] = rand ();
      CHECK (fsc_wlog_pwrite (wl, o, &up, buf, n, off, false) == 0);
      memcpy (model + off, buf, n);
    }
    CHECK (fsc_wlog_flush (wl) == 0);
    arm (at, true);
    CHECK (fsc_wlog_start_writer (wl, o, &wbup) == 0);
    /* The writer retries what failed (after 100 ms): the log drains,
     * and never fails for want of memory.
     */
    uint64_t left = fsc_wlog_drain (wl, 10000);
    disarm ();
    rounds++;
    check (wl, o, 0, 0, NULL, "after a writer's round");
    int err = 0;
    uint64_t noff;
    unsigned notices = fsc_wlog_take_notices (wl, &err, &noff);
    if (notices & FSC_WLOG_NOTICE_FAILED) {
      fprintf (stderr, "allocation %ld of the writer failed the log: %s\n",
               at, strerror (err));
      exit (1);
    }
    CHECK_EQ (left, 0);
    bool clean = __atomic_load_n (&failures, __ATOMIC_SEQ_CST) == before;
    fsc_wlog_close (wl);
    wl = open_log (c);
    check (wl, o, 0, 0, NULL, "after reopening");
    CHECK (memcmp (upstream, model, SIZE) == 0);
    if (clean)
      break;                    /* the Nth allocation was never made */
    before = failures;
  }
  printf ("2. %u writer rounds\n", rounds);

  fsc_wlog_close (wl);
  fsc_object_close (o);
  fsc_cache_close (c);
  char cmd[128];
  snprintf (cmd, sizeof cmd, "rm -rf %.60s", dir);
  dir[strlen (dir) - 6] = 0;
  snprintf (cmd, sizeof cmd, "rm -rf %.60s", dir);
  if (system (cmd)) { /* best effort */ }
  return 0;
}
