/* Shared by the fuzz targets tests/fuzz-index.c and tests/fuzz-wlog.c.
 *
 * What it holds: the parts of a target that do not depend on the
 * format it fuzzes: the deterministic pseudo-random numbers (splitmix64)
 * and little-endian helpers the mutators are written with, rm_rf for the
 * private cache directory, and the standalone driver (corpus loading in
 * name order, the crash handler, mutation K of a seed, --dump, the run
 * loop, save for --make-corpus).  What it does not hold: each format's
 * mutators (mutate_once, mutate, fix_checksums), the target itself
 * (LLVMFuzzerTestOneInput), its corpus maker, usage and summary line.
 *
 * Why: the two targets were written one from the other and carried
 * some 300 lines of this in identical copies; one copy keeps the
 * driver's contract the same for both: mutation K of a run depends only
 * on the seed, K and the corpus (make_mutation), so any mutation can be
 * regenerated with --dump.
 *
 * Static functions in a header, included once by each target after its
 * own constants.  The including file defines, before the #include:
 *   FUZZ_NAME   its name as a string, the prefix of every message;
 *   INPUT_MAX   the largest input (an int), loaded or produced;
 * and, anywhere in the file, the format's mutator
 *   static size_t mutate (uint64_t *s, unsigned char *p, size_t n,
 *                         size_t cap, const unsigned char *other,
 *                         size_t other_n);
 * which draws all its choices from *S.  Under -DFUZZ_LIBFUZZER only the
 * first half (numbers, byte helpers, cache directory) is compiled.
 */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#if !defined (FUZZ_NAME) || !defined (INPUT_MAX)
#error "define FUZZ_NAME and INPUT_MAX before including fuzz-common.h"
#endif

#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

/* The including target's mutator (see above). */
static size_t mutate (uint64_t *s, unsigned char *p, size_t n, size_t cap,
                      const unsigned char *other, size_t other_n);

/*----------------------------------------------------------------------
 * Deterministic pseudo-random numbers (splitmix64).
 */
static uint64_t
rng_next (uint64_t *s)
{
  uint64_t z = (*s += UINT64_C (0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static uint64_t
rng_below (uint64_t *s, uint64_t n)
{
  return n ? rng_next (s) % n : 0;
}

static void
rng_fill (uint64_t *s, unsigned char *p, size_t n)
{
  while (n > 0) {
    uint64_t v = rng_next (s);
    size_t k = n < 8 ? n : 8;
    memcpy (p, &v, k);
    p += k;
    n -= k;
  }
}

static void
le32_put (unsigned char *p, uint32_t v)
{
  v = htole32 (v);
  memcpy (p, &v, 4);
}

static void
le64_put (unsigned char *p, uint64_t v)
{
  v = htole64 (v);
  memcpy (p, &v, 8);
}

static uint32_t
le32_get (const unsigned char *p)
{
  uint32_t v;
  memcpy (&v, p, 4);
  return le32toh (v);
}

/*----------------------------------------------------------------------
 * The private cache directory (the target makes it; the crash handler
 * names it).
 */
static char cache_dir[256];

static void
rm_rf (const char *path)
{
  struct stat st;
  if (lstat (path, &st) == -1)
    return;
  if (S_ISDIR (st.st_mode)) {
    DIR *d = opendir (path);
    if (d) {
      struct dirent *e;
      while ((e = readdir (d)) != NULL) {
        if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0)
          continue;
        char sub[1024];
        snprintf (sub, sizeof sub, "%s/%s", path, e->d_name);
        rm_rf (sub);
      }
      closedir (d);
    }
    rmdir (path);
  }
  else
    unlink (path);
}

#ifndef FUZZ_LIBFUZZER

/*----------------------------------------------------------------------
 * Standalone driver.
 */

struct input {
  char *name;
  unsigned char *data;
  size_t size;
};

static struct input *corpus;
static size_t ncorpus, corpus_cap;

/* The input being run, saved by the crash handler. */
static const char *crash_file;
static const unsigned char *cur_data;
static size_t cur_size;

static void
crash_handler (int sig)
{
  if (crash_file && cur_data) {
    int fd = open (crash_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      size_t done = 0;
      while (done < cur_size) {
        ssize_t r = write (fd, cur_data + done, cur_size - done);
        if (r <= 0)
          break;
        done += r;
      }
      close (fd);
      static const char msg[] = FUZZ_NAME ": crashing input saved to ";
      if (write (2, msg, sizeof msg - 1) < 0 ||
          write (2, crash_file, strlen (crash_file)) < 0 ||
          write (2, "\n", 1) < 0)
        {}
    }
  }
  if (cache_dir[0]) {
    static const char msg[] = FUZZ_NAME ": cache directory left in ";
    if (write (2, msg, sizeof msg - 1) < 0 ||
        write (2, cache_dir, strlen (cache_dir)) < 0 ||
        write (2, "\n", 1) < 0)
      {}
  }
  signal (sig, SIG_DFL);
  raise (sig);
}

static void
add_input (const char *name, unsigned char *data, size_t size)
{
  if (ncorpus == corpus_cap) {
    corpus_cap = corpus_cap ? corpus_cap * 2 : 16;
    corpus = realloc (corpus, corpus_cap * sizeof *corpus);
    if (!corpus)
      abort ();
  }
  corpus[ncorpus].name = strdup (name);
  corpus[ncorpus].data = data;
  corpus[ncorpus].size = size;
  ncorpus++;
}

static int
load_file (const char *path)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd == -1 || fstat (fd, &st) == -1) {
    perror (path);
    return -1;
  }
  if (st.st_size > INPUT_MAX) {
    fprintf (stderr, FUZZ_NAME ": %s: larger than %d bytes\n", path,
             INPUT_MAX);
    close (fd);
    return -1;
  }
  unsigned char *data = malloc (st.st_size ? st.st_size : 1);
  if (!data)
    abort ();
  if (read (fd, data, st.st_size) != st.st_size) {
    perror (path);
    close (fd);
    free (data);
    return -1;
  }
  close (fd);
  add_input (path, data, st.st_size);
  return 0;
}

static int
cmp_str (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* A directory's regular files in name order (readdir's order is not
 * deterministic).
 */
static int
load_path (const char *path)
{
  struct stat st;
  if (stat (path, &st) == -1) {
    perror (path);
    return -1;
  }
  if (!S_ISDIR (st.st_mode))
    return load_file (path);

  DIR *d = opendir (path);
  if (!d) {
    perror (path);
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir (d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      names = realloc (names, cap * sizeof *names);
      if (!names)
        abort ();
    }
    names[n++] = strdup (e->d_name);
  }
  closedir (d);
  qsort (names, n, sizeof *names, cmp_str);
  int r = 0;
  for (size_t i = 0; i < n; ++i) {
    char sub[4096];
    snprintf (sub, sizeof sub, "%s/%s", path, names[i]);
    if (stat (sub, &st) == 0 && S_ISREG (st.st_mode) && load_file (sub) == -1)
      r = -1;
    free (names[i]);
  }
  free (names);
  return r;
}

/* Mutation number K (from 0) of a run with SEED: depends on nothing
 * else, so any one can be regenerated with --dump.
 */
static size_t
make_mutation (uint64_t seed, uint64_t k, unsigned char *buf, size_t *from)
{
  uint64_t s = seed * UINT64_C (0x9e3779b97f4a7c15) + k;
  rng_next (&s);
  size_t a = rng_below (&s, ncorpus), b = rng_below (&s, ncorpus);
  size_t n = corpus[a].size;
  memcpy (buf, corpus[a].data, n);
  *from = a;
  return mutate (&s, buf, n, INPUT_MAX, corpus[b].data, corpus[b].size);
}

/* For --make-corpus: write P as DIR/NAME (or NAME if DIR is NULL). */
static void
save (const char *dir, const char *name, const unsigned char *p, size_t n)
{
  char path[4096];
  if (dir)
    snprintf (path, sizeof path, "%s/%s", dir, name);
  else
    snprintf (path, sizeof path, "%s", name);
  if (n > INPUT_MAX) {
    fprintf (stderr, FUZZ_NAME ": %s would be %zu bytes\n", path, n);
    exit (1);
  }
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd == -1 || (n && write (fd, p, n) != (ssize_t) n) || close (fd) == -1) {
    perror (path);
    exit (1);
  }
  printf ("%s: %zu bytes\n", path, n);
}

/* The target's main: options, corpus, then every corpus file and
 * MUTATIONS mutations through LLVMFuzzerTestOneInput; SUMMARY prints
 * the target's line at the end.
 */
static int
fuzz_main (int argc, char *argv[], int (*make_corpus) (const char *),
           void (*usage) (FILE *),
           void (*summary) (uint64_t seed, uint64_t mutations, double secs))
{
  uint64_t mutations = 0, seed = 1, dump_k = 0;
  const char *dump_out = NULL;
  bool verbose = false;
  int i;

  for (i = 1; i < argc; ++i) {
    if (strcmp (argv[i], "--mutations") == 0 && i + 1 < argc)
      mutations = strtoull (argv[++i], NULL, 0);
    else if (strcmp (argv[i], "--seed") == 0 && i + 1 < argc)
      seed = strtoull (argv[++i], NULL, 0);
    else if (strcmp (argv[i], "--crash-file") == 0 && i + 1 < argc)
      crash_file = argv[++i];
    else if (strcmp (argv[i], "--dump") == 0 && i + 2 < argc) {
      dump_k = strtoull (argv[++i], NULL, 0);
      dump_out = argv[++i];
    }
    else if (strcmp (argv[i], "--make-corpus") == 0 && i + 1 < argc)
      return make_corpus (argv[i + 1]);
    else if (strcmp (argv[i], "--verbose") == 0)
      verbose = true;
    else if (strcmp (argv[i], "--help") == 0) {
      usage (stdout);
      return 0;
    }
    else if (argv[i][0] == '-' && argv[i][1] == '-') {
      usage (stderr);
      return 2;
    }
    else
      break;
  }
  if (i == argc) {
    usage (stderr);
    return 2;
  }
  for (; i < argc; ++i)
    if (load_path (argv[i]) == -1)
      return 1;
  if (ncorpus == 0) {
    fprintf (stderr, FUZZ_NAME ": empty corpus\n");
    return 1;
  }

  unsigned char *buf = malloc (INPUT_MAX);
  if (!buf)
    abort ();

  if (dump_out) {
    size_t from;
    size_t n = make_mutation (seed, dump_k, buf, &from);
    save (NULL, dump_out, buf, n);
    free (buf);
    return 0;
  }

  signal (SIGABRT, crash_handler);
  signal (SIGSEGV, crash_handler);
  signal (SIGBUS, crash_handler);
  struct timespec t0, t1;
  clock_gettime (CLOCK_MONOTONIC, &t0);

  for (size_t c = 0; c < ncorpus; ++c) {
    if (verbose)
      fprintf (stderr, FUZZ_NAME ": %s\n", corpus[c].name);
    cur_data = corpus[c].data;
    cur_size = corpus[c].size;
    LLVMFuzzerTestOneInput (cur_data, cur_size);
  }
  for (uint64_t k = 0; k < mutations; ++k) {
    size_t from;
    size_t n = make_mutation (seed, k, buf, &from);
    if (verbose)
      fprintf (stderr, FUZZ_NAME ": mutation %" PRIu64 " of %s, %zu bytes\n",
               k, corpus[from].name, n);
    cur_data = buf;
    cur_size = n;
    LLVMFuzzerTestOneInput (buf, n);
  }
  cur_data = NULL;

  clock_gettime (CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  summary (seed, mutations, secs);

  free (buf);
  for (size_t c = 0; c < ncorpus; ++c) {
    free (corpus[c].name);
    free (corpus[c].data);
  }
  free (corpus);
  return 0;
}

#endif /* !FUZZ_LIBFUZZER */

#endif /* FUZZ_COMMON_H */
