/* Unit test: access traces (core/base/trace.c).  Overlapping reads record
 * only what is new, in order, rounded out to 4 KiB; the limit stops
 * the trace; a second object is not traced; the file parses as
 * docs/format.md says, checksums included.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace.h"
#include "unit.h"
#include "utils.h"
#include "xxh.h"

struct entry { uint64_t off; uint32_t len, ms; };

/* Parse PATH: the header's size, and up to MAX entries. */
static size_t
parse (const char *path, uint64_t *size, struct entry *e, size_t max)
{
  static unsigned char d[1 << 20];
  FILE *fp = fopen (path, "rb");
  CHECK (fp != NULL);
  size_t n = fread (d, 1, sizeof d, fp);
  fclose (fp);
  CHECK (n >= 64 && memcmp (d, "NBDFSTRC", 8) == 0);
  CHECK_EQ (get_le32 (d + 8), 1);
  CHECK_EQ (get_le32 (d + 12), 64);
  CHECK_EQ (get_le32 (d + 28), 4096);
  CHECK_EQ (get_le64 (d + 56), XXH3_64bits (d, 56));
  *size = get_le64 (d + 16);
  size_t k = 0, p = 64;
  while (p + 8 <= n) {
    CHECK (memcmp (d + p, "FTRC", 4) == 0);
    uint32_t c = get_le32 (d + p + 4);
    CHECK (c >= 1 && c <= 4096 && p + 16 + 16 * (size_t) c <= n);
    CHECK_EQ (get_le64 (d + p + 8 + 16 * c), XXH3_64bits (d + p, 8 + 16 * c));
    for (uint32_t i = 0; i < c && k < max; ++i, ++k) {
      e[k].off = get_le64 (d + p + 8 + 16 * i);
      e[k].len = get_le32 (d + p + 16 + 16 * i);
      e[k].ms = get_le32 (d + p + 20 + 16 * i);
    }
    p += 16 + 16 * (size_t) c;
  }
  CHECK_EQ (p, n);
  return k;
}

/* Threads noting disjoint ranges at once (chunks fill and flush
 * under them): every range is recorded once, in one piece.
 */
#define NTHREADS 4
#define PER_THREAD 6000
static struct fsc_trace *shared;
static void *
noter (void *arg)
{
  uint64_t k = (uintptr_t) arg;
  for (uint64_t i = 0; i < PER_THREAD; ++i)
    fsc_trace_note (shared, ((i * NTHREADS + k) * 2) * 4096, 4096);
  return NULL;
}

int
main (void)
{
  char path[] = "/tmp/unit-trace-XXXXXX";
  int fd = mkstemp (path);
  CHECK (fd >= 0);
  close (fd);

  struct fsc_trace *t;
  struct entry e[64];
  uint64_t size, rec;
  const uint64_t S = 1 << 20;
  CHECK (fsc_trace_open (path, 64 * 1024, &t) == 0);
  fsc_trace_note (t, 0, 4096);                  /* before bind: ignored */
  CHECK_EQ (fsc_trace_bind (t, 1, 2, S, 65536), 1);
  CHECK_EQ (fsc_trace_bind (t, 3, 4, S, 65536), 0);    /* another key */
  CHECK_EQ (fsc_trace_bind (t, 1, 2, S, 65536), 1);
  fsc_trace_note (t, 100, 10);                  /* [0, 4K) */
  fsc_trace_note (t, 8192, 10000);              /* [8K, 20K) */
  fsc_trace_note (t, 0, 24576);                 /* new: [4K,8K), [20K,24K) */
  fsc_trace_note (t, 0, 24576);                 /* nothing new */
  fsc_trace_note (t, S - 100, 500);             /* clipped at the end */
  fsc_trace_note (t, S, 4096);                  /* beyond: ignored */
  fsc_trace_note (t, 512 * 1024, 64 * 1024);    /* over the limit: cut */
  fsc_trace_note (t, 256 * 1024, 4096);         /* after the limit: none */
  CHECK (fsc_trace_close (t, &rec) == 0);
  size_t n = parse (path, &size, e, 64);
  CHECK_EQ (size, S);
  const struct entry want[] = {
    { 0, 4096, 0 }, { 8192, 12288, 0 }, { 4096, 4096, 0 },
    { 20480, 4096, 0 }, { S - 4096, 4096, 0 },
    { 512 * 1024, 64 * 1024 - 7 * 4096, 0 },
  };
  for (size_t i = 0; i < n; ++i)
    fprintf (stderr, "entry %zu: %" PRIu64 " +%" PRIu32 "\n", i, e[i].off, e[i].len);
  CHECK_EQ (n, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < n; ++i) {
    CHECK_EQ (e[i].off, want[i].off);
    CHECK_EQ (e[i].len, want[i].len);
    CHECK (e[i].ms < 60000);
  }
  CHECK_EQ (rec, 64 * 1024);

  /* Many entries: several chunks (4096 entries each), all in order. */
  CHECK (fsc_trace_open (path, 1 << 30, &t) == 0);
  CHECK_EQ (fsc_trace_bind (t, 1, 2, 1 << 30, 65536), 1);
  for (uint64_t i = 0; i < 10000; ++i)
    fsc_trace_note (t, (i * 7919 % 100000) * 8192, 4096);
  CHECK (fsc_trace_close (t, &rec) == 0);
  static struct entry big[10000];
  n = parse (path, &size, big, 10000);
  CHECK_EQ (n, 10000);
  for (uint64_t i = 0; i < n; ++i)
    CHECK_EQ (big[i].off, (i * 7919 % 100000) * 8192);

  CHECK (fsc_trace_open (path, 1 << 30, &shared) == 0);
  CHECK_EQ (fsc_trace_bind (shared, 1, 2, 1 << 30, 65536), 1);
  pthread_t th[NTHREADS];
  for (uintptr_t k = 0; k < NTHREADS; ++k)
    CHECK (pthread_create (&th[k], NULL, noter, (void *) k) == 0);
  for (int k = 0; k < NTHREADS; ++k)
    pthread_join (th[k], NULL);
  CHECK (fsc_trace_close (shared, &rec) == 0);
  static struct entry par[NTHREADS * PER_THREAD + 1];
  n = parse (path, &size, par, NTHREADS * PER_THREAD + 1);
  CHECK_EQ (n, NTHREADS * PER_THREAD);
  CHECK_EQ (rec, (uint64_t) NTHREADS * PER_THREAD * 4096);
  static unsigned char seen[NTHREADS * PER_THREAD];
  for (size_t i = 0; i < n; ++i) {
    CHECK_EQ (par[i].len, 4096);
    CHECK (par[i].off % 8192 == 0 && par[i].off / 8192 < n);
    CHECK (!seen[par[i].off / 8192]);
    seen[par[i].off / 8192] = 1;
  }

  /* An unwritable path is an error at open. */
  CHECK (fsc_trace_open ("/nonexistent/dir/t", 4096, &t) == -1 &&
         errno == ENOENT);
  unlink (path);
  printf ("unit-trace: ok\n");
  return 0;
}
