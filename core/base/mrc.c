/* libfscache: how big should this object's cache be?  A miss-ratio
 * curve gathered live (issue 45), by spatial sampling as SHARDS does
 * (Waldspurger et al., FAST '15).
 *
 * An LRU cache of C blocks hits an access exactly when the access's
 * reuse distance (the distinct blocks touched since the same block's
 * last access) is below C; the histogram of reuse distances is so the
 * whole curve.  Counting them exactly costs memory in the export's
 * working set.  SHARDS keeps only blocks whose hash falls under a
 * threshold T (a rate R = T / 2^64 of them), measures distances among
 * those and scales each by 1/R: a uniform spatial sample sees the same
 * distances, thinned.  Fixed-size: at most MRC_SAMPLES blocks are kept;
 * when one more passes, the one with the largest hash leaves and T
 * drops to it, so memory stays bounded (about 53 bytes a sample, 430
 * KB in all) whatever the export's size, and R adapts to the working
 * set (every block while it has fewer than MRC_SAMPLES).
 *
 * Distances by counting marks: each kept block's last access time (a
 * clock of sampled accesses) is a bit set in a bitmap of the clock, so
 * the blocks touched since a time are the bits set after it: counted
 * per 512-bit stretch (MRC_SPAN) for whole stretches, by popcount
 * within one; the clock is renumbered when it reaches the bitmap's
 * size, in order, which keeps every distance.  It was a Fenwick tree
 * of 32,768 counters (128 KiB, 15 scattered reads a query and 30 more
 * to move a mark), the largest of the filter's own costs per hit while
 * every access is sampled (issue 44): the bitmap and its counts are 4
 * KiB and 256 bytes, a query at most 64 counts and 8 words in a row,
 * a mark moved in two bit operations.  The
 * histogram has 4 buckets an octave of scaled distance, each access
 * weighted 1/R at the time; first accesses count as misses at any size.
 *
 * The curve is LRU's, not the filter's S3-FIFO's: on the shared
 * CloudPhysics trace they are within 3 points at 1-25% of its
 * footprint (docs/benchmarks.md).  It lives with the object, in memory,
 * since the object was opened (NAME.stats says since when).
 *
 * Plain C, a leaf lock of its own; no printing.
 */
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mrc.h"

#define MRC_SAMPLES 8192                /* blocks kept, at most */
#define MRC_TABLE (2 * MRC_SAMPLES)     /* open addressing, power of 2 */
#define MRC_CLOCK (4 * MRC_SAMPLES)     /* the clock's bitmap's size */
#define MRC_SPAN 512                    /* bits per count */
#define MRC_WORDS (MRC_CLOCK / 64 + 1)  /* bits 0..MRC_CLOCK, 0 unused */
#define MRC_SPANS (MRC_CLOCK / MRC_SPAN + 1)
#define MRC_SUB 4                       /* buckets per octave */
#define MRC_BUCKETS (64 * MRC_SUB + 1)  /* the last: first accesses */
#define EMPTY UINT32_MAX

struct fsc_mrc {
  pthread_mutex_t lock;
  uint64_t id;                          /* unique, never 0 (batches) */
  uint64_t threshold;                   /* sampled: hash < threshold, or
                                         * every block while "all" */
  int all;
  uint32_t n;                           /* blocks kept */
  uint32_t table[MRC_TABLE];            /* slot of a kept block, by hash */
  uint64_t block[MRC_SAMPLES], hash[MRC_SAMPLES];
  uint32_t last[MRC_SAMPLES];           /* its last access, 1-based */
  uint32_t heap[MRC_SAMPLES];           /* slots, a max-heap by hash */
  uint32_t pos[MRC_SAMPLES];            /* each slot's place in it */
  uint32_t clock;                       /* sampled accesses, mod renumbering */
  uint64_t mark[MRC_WORDS];             /* last accesses' times */
  uint32_t span[MRC_SPANS];             /* bits set per MRC_SPAN */
  uint32_t at[MRC_CLOCK + 1];           /* renumber's scratch */
  double hist[MRC_BUCKETS];             /* weights by scaled distance */
  double total;
};

static uint64_t
mix (uint64_t x)                        /* splitmix64's finaliser */
{
  x += UINT64_C (0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C (0x94d049bb133111eb);
  return x ^ (x >> 31);
}

/* Bits set in X, without a library call: built for any x86-64, gcc
 * calls libgcc's table-driven __popcountdi2 for __builtin_popcountll.
 */
static inline uint32_t
ones (uint64_t x)
{
  x -= (x >> 1) & UINT64_C (0x5555555555555555);
  x = (x & UINT64_C (0x3333333333333333)) +
    ((x >> 2) & UINT64_C (0x3333333333333333));
  x = (x + (x >> 4)) & UINT64_C (0x0f0f0f0f0f0f0f0f);
  return (uint32_t) ((x * UINT64_C (0x0101010101010101)) >> 56);
}

static void
mark_set (struct fsc_mrc *m, uint32_t t)
{
  m->mark[t / 64] |= UINT64_C (1) << (t % 64);
  m->span[t / MRC_SPAN]++;
}

static void
mark_clear (struct fsc_mrc *m, uint32_t t)
{
  m->mark[t / 64] &= ~(UINT64_C (1) << (t % 64));
  m->span[t / MRC_SPAN]--;
}

/* Marks after time T, up to the clock: the rest of T's word, the rest
 * of its span word by word, then whole spans.
 */
static uint32_t
marks_after (const struct fsc_mrc *m, uint32_t t)
{
  const uint32_t w = t / 64, sp = t / MRC_SPAN;
  const uint32_t wend = (sp + 1) * (MRC_SPAN / 64) < MRC_WORDS
    ? (sp + 1) * (MRC_SPAN / 64) : MRC_WORDS;
  uint32_t n = t % 64 == 63 ? 0 : ones (m->mark[w] >> (t % 64 + 1));
  for (uint32_t i = w + 1; i < wend; ++i)
    n += ones (m->mark[i]);
  for (uint32_t i = sp + 1; i <= m->clock / MRC_SPAN; ++i)
    n += m->span[i];
  return n;
}

struct fsc_mrc *
fsc_mrc_new (void)
{
  struct fsc_mrc *m = calloc (1, sizeof *m);
  if (m == NULL)
    return NULL;
  static uint64_t ids;
  pthread_mutex_init (&m->lock, NULL);
  m->id = __atomic_add_fetch (&ids, 1, __ATOMIC_RELAXED);
  m->all = 1;
  m->threshold = UINT64_MAX;
  for (uint32_t i = 0; i < MRC_TABLE; ++i)
    m->table[i] = EMPTY;
  return m;
}

void
fsc_mrc_free (struct fsc_mrc *m)
{
  if (m) {
    pthread_mutex_destroy (&m->lock);
    free (m);
  }
}

/* The table position holding BLOCK (hash H), or the empty one where it
 * would go.
 */
static uint32_t
probe (const struct fsc_mrc *m, uint64_t block, uint64_t h)
{
  uint32_t i = (uint32_t) h & (MRC_TABLE - 1);
  while (m->table[i] != EMPTY && m->block[m->table[i]] != block)
    i = (i + 1) & (MRC_TABLE - 1);
  return i;
}

/* Remove table position I (linear probing's backward shift). */
static void
table_remove (struct fsc_mrc *m, uint32_t i)
{
  uint32_t j = i;
  for (;;) {
    m->table[i] = EMPTY;
    for (;;) {
      j = (j + 1) & (MRC_TABLE - 1);
      if (m->table[j] == EMPTY)
        return;
      uint32_t k = (uint32_t) m->hash[m->table[j]] & (MRC_TABLE - 1);
      /* Stays if its home lies cyclically in (i, j]. */
      if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
        continue;
      break;
    }
    m->table[i] = m->table[j];
    i = j;
  }
}

/* Renumber the last accesses 1..n in their order: the tree is full.
 * (A counting sort: they are distinct, 1..clock.)
 */
static void
renumber (struct fsc_mrc *m)
{
  memset (m->mark, 0, sizeof m->mark);
  memset (m->span, 0, sizeof m->span);
  memset (m->at, 0, sizeof m->at);
  for (uint32_t s = 0; s < m->n; ++s)
    m->at[m->last[s]] = s + 1;
  uint32_t t = 0;
  for (uint32_t c = 1; c <= m->clock; ++c)
    if (m->at[c]) {
      m->last[m->at[c] - 1] = ++t;
      mark_set (m, t);
    }
  m->clock = t;
}

/* The heap of kept slots by hash, largest on top: evict_max takes the
 * top in O(log n).  A scan of every slot for the largest, as first
 * written, ran at each sampled first access once the table was full:
 * 3.5% of a proxy's CPU on a cold 2 GiB stream from a fast upstream
 * (perf, docs/benchmarks.md), where about 11,000 evictions scanned
 * 8,192 slots each.
 */
static void
heap_set (struct fsc_mrc *m, uint32_t i, uint32_t s)
{
  m->heap[i] = s;
  m->pos[s] = i;
}

static void
heap_up (struct fsc_mrc *m, uint32_t i)
{
  uint32_t s = m->heap[i];
  while (i > 0 && m->hash[m->heap[(i - 1) / 2]] < m->hash[s]) {
    heap_set (m, i, m->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  heap_set (m, i, s);
}

static void
heap_down (struct fsc_mrc *m, uint32_t i, uint32_t n)
{
  uint32_t s = m->heap[i];
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= n)
      break;
    if (c + 1 < n && m->hash[m->heap[c + 1]] > m->hash[m->heap[c]])
      c++;
    if (m->hash[m->heap[c]] <= m->hash[s])
      break;
    heap_set (m, i, m->heap[c]);
    i = c;
  }
  heap_set (m, i, s);
}

/* Drop the kept block with the largest hash; the threshold falls to
 * it, so that no block above it is sampled again.
 */
static void
evict_max (struct fsc_mrc *m)
{
  uint32_t s = m->heap[0];
  /* Off the heap: its last entry to the top, sifted down. */
  heap_set (m, 0, m->heap[m->n - 1]);
  heap_down (m, 0, m->n - 1);
  __atomic_store_n (&m->threshold, m->hash[s], __ATOMIC_RELAXED);
  __atomic_store_n (&m->all, 0, __ATOMIC_RELAXED);
  table_remove (m, probe (m, m->block[s], m->hash[s]));
  mark_clear (m, m->last[s]);
  /* The last slot fills the hole. */
  uint32_t l = --m->n;
  if (s != l) {
    uint32_t p = probe (m, m->block[l], m->hash[l]);
    m->block[s] = m->block[l];
    m->hash[s] = m->hash[l];
    m->last[s] = m->last[l];
    m->table[p] = s;
    heap_set (m, m->pos[l], s);
  }
}

/* floor (log2 (D) * MRC_SUB), by the exponent and three compares of
 * the mantissa with 2^(1/4), 2^(1/2), 2^(3/4): log2 itself was a third
 * of an access's time while every access is sampled (issue 44).
 */
static unsigned
bucket_of (double d)                    /* d >= 1 */
{
  int e;
  const double f = 2.0 * frexp (d, &e);           /* d = f 2^(e-1) */
  const unsigned sub = (f >= 1.189207115002721) + (f >= 1.414213562373095)
    + (f >= 1.681792830507429);
  const unsigned b = (unsigned) (e - 1) * MRC_SUB + sub;
  return b >= MRC_BUCKETS - 1 ? MRC_BUCKETS - 2 : b;
}

/* One sampled access, under the lock: BLOCK's reuse distance into the
 * histogram, its time renewed (or its first access kept).
 */
static void
access_locked (struct fsc_mrc *m, uint64_t block, uint64_t h)
{
  if (!m->all && h >= m->threshold)
    return;                             /* the threshold fell since */
  double r = m->all ? 1.0 : ldexp ((double) m->threshold, -64);
  double w = 1.0 / r;
  if (m->clock == MRC_CLOCK)
    renumber (m);
  uint32_t p = probe (m, block, h);
  if (m->table[p] != EMPTY) {
    uint32_t s = m->table[p];
    /* Distinct kept blocks touched since: marks after its time, and
     * itself (an LRU of d + 1 blocks holds it).  Every kept block has
     * one mark (M1: added with it, moved on each access, removed with
     * it), so the marks after a time are the blocks touched since
     * (unit-mrc's loop test fails if a mark is not moved).
     */
    uint32_t since = marks_after (m, m->last[s]);
    m->hist[bucket_of ((since + 1) * w)] += w;
    mark_clear (m, m->last[s]);
    m->last[s] = ++m->clock;
    mark_set (m, m->last[s]);
  }
  else {
    m->hist[MRC_BUCKETS - 1] += w;      /* a first access: a miss */
    uint32_t s = m->n++;
    m->block[s] = block;
    m->hash[s] = h;
    m->last[s] = ++m->clock;
    mark_set (m, m->last[s]);
    m->table[p] = s;
    heap_set (m, s, s);                 /* slot s is the heap's n-th */
    heap_up (m, s);
    if (m->n > MRC_SAMPLES - 1)
      evict_max (m);
  }
  m->total += w;
}

/* Each thread's sampled accesses, applied MRC_BATCH at a time.  While
 * the export has fewer distinct blocks than MRC_SAMPLES every access
 * is sampled, and the lock taken for each was the largest of the
 * filter's own functions in a profile of an idle proxy's hits at
 * iodepth 8 (2.3% of its CPU, every hit taking the one lock:
 * docs/benchmarks.md, issue 44).  A batch is one thread's accesses in
 * their order; the batches of threads interleave as whole runs, which
 * moves an access by at most a batch per other thread reading the
 * object: with nbdkit's 16 threads, 120 sampled accesses, which at a
 * sampling rate R is 120 / R blocks of distance.  Batches of 32 moved
 * them four times as far: replaying the CloudPhysics sample (210,000
 * blocks, R about 0.04) on an idle machine, whose requests spread over
 * all the threads, the curve predicted 4.6 to 4.8% hits at 1% of the
 * footprint where an exact LRU hits 7.8% (test-tool-advise.sh failed
 * so, stop 58); with 8, 7.3%.  A lock per 8 sampled accesses rather
 * than 32 costs nothing a profile shows.  A thread's last accesses
 * wait for its batch to fill (or fsc_mrc_flush).  A batch names its curve by
 * ID, not by pointer: a thread that turns to another curve drops what
 * it held for the last (which may have been freed since), at most
 * MRC_BATCH - 1 accesses.
 */
#define MRC_BATCH 8

struct batch {
  uint64_t id;
  unsigned n;
  uint64_t block[MRC_BATCH], hash[MRC_BATCH];
};
static __thread struct batch batch;

static void
batch_apply (struct fsc_mrc *m)
{
  pthread_mutex_lock (&m->lock);
  for (unsigned i = 0; i < batch.n; ++i)
    access_locked (m, batch.block[i], batch.hash[i]);
  pthread_mutex_unlock (&m->lock);
  batch.n = 0;
}

void
fsc_mrc_access (struct fsc_mrc *m, uint64_t block)
{
  uint64_t h = mix (block);
  if (!__atomic_load_n (&m->all, __ATOMIC_RELAXED) &&
      h >= __atomic_load_n (&m->threshold, __ATOMIC_RELAXED))
    return;                             /* most blocks: no lock */
  if (batch.id != m->id) {
    batch.id = m->id;
    batch.n = 0;
  }
  batch.block[batch.n] = block;
  batch.hash[batch.n] = h;
  if (++batch.n == MRC_BATCH)
    batch_apply (m);
}

void
fsc_mrc_flush (struct fsc_mrc *m)
{
  if (batch.id == m->id && batch.n > 0)
    batch_apply (m);
}

double
fsc_mrc_rate (struct fsc_mrc *m)
{
  fsc_mrc_flush (m);
  pthread_mutex_lock (&m->lock);
  double r = m->all ? 1.0 : ldexp ((double) m->threshold, -64);
  pthread_mutex_unlock (&m->lock);
  return r;
}

double
fsc_mrc_hit_ratio (struct fsc_mrc *m, uint64_t size, uint64_t *refs)
{
  fsc_mrc_flush (m);
  pthread_mutex_lock (&m->lock);
  double hits = 0, total = m->total;
  if (size > 0) {
    double b = log2 ((double) size) * MRC_SUB;
    for (unsigned i = 0; i < MRC_BUCKETS - 1; ++i) {
      /* Bucket i holds distances in [2^(i/SUB), 2^((i+1)/SUB)): whole
       * below SIZE, a share of the one SIZE falls in.
       */
      if (i + 1 <= b)
        hits += m->hist[i];
      else {
        if (b > i)
          hits += m->hist[i] * (b - i);
        break;
      }
    }
  }
  pthread_mutex_unlock (&m->lock);
  if (refs)
    *refs = (uint64_t) total;
  return total > 0 ? hits / total : 0;
}
