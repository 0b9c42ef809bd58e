/* libfscache: recording an access trace (fscache-trace=FILE).
 *
 * What a workload touches first, in order, is what a warm-up should
 * fetch first: overlaybd warms containers this way.  A trace records
 * the parts of client reads (4 KiB units) that no earlier read touched,
 * with the milliseconds since the trace began; `nbd-fscache warm
 * --trace` replays them in that order through a proxy.  The format is
 * docs/format.md, "Access traces".
 *
 * The set of units already touched is an open-addressing hash set of
 * unit numbers, grown by doubling, bounded by the byte limit (at most
 * 2 * limit / 4 KiB slots: 4 MiB for the default 1 GiB), so memory
 * follows what was read, not the export's size.  Entries collect in a
 * chunk of up to TRACE_CHUNK_MAX; a full chunk, one older than a
 * second, and the last one at close are written with one write(2)
 * each, checksummed, so a crash loses at most the chunk in memory.
 *
 * t->lock guards the set and the chunk being filled (memory only) and
 * is never held across a write.  A chunk leaves with a ticket taken
 * under it; writers then take their turn by ticket (t->wlock and
 * t->turn), so that chunks reach the file in the order they were
 * filled whichever thread gets to write first.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trace.h"
#include "utils.h"
#include "xxh.h"

#define UNIT_SHIFT FSC_TRACE_UNIT_SHIFT
#define TRACE_CHUNK_MAX FSC_TRACE_CHUNK_MAX
#define ENTRY_SIZE FSC_TRACE_ENTRY
#define HEAD FSC_TRACE_CHUNK_HEAD
#define FLUSH_MS 1000


struct fsc_trace {
  pthread_mutex_t lock, wlock;
  pthread_cond_t turn;          /* now_serving moved (under wlock) */
  uint64_t next_ticket;         /* under lock */
  uint64_t now_serving;         /* under wlock */
  int fd;
  bool bound;                   /* header written for one object */
  bool full;                    /* the limit was reached */
  uint64_t key_lo, key_hi;
  uint64_t size;                /* export size */
  uint64_t limit, recorded;     /* bytes */
  uint64_t start_ms, last_flush_ms;
  uint64_t *set;                /* unit + 1; 0 is empty */
  size_t set_cap, set_len;      /* capacity: a power of 2 */
  size_t set_max;               /* capacity never grows past this */
  unsigned char *chunk;         /* HEAD + ENTRY_SIZE * MAX + 8 bytes */
  unsigned nentries;
  int err;                      /* first write error, 0 if none */
};

int
fsc_trace_open (const char *path, uint64_t limit, struct fsc_trace **tp)
{
  struct fsc_trace *t = calloc (1, sizeof *t);
  if (t == NULL)
    return -1;
  t->chunk = malloc (HEAD + ENTRY_SIZE * TRACE_CHUNK_MAX + 8);
  /* Never through a symlink planted at PATH (ELOOP), never waiting on
   * a FIFO (refused below, as anything but a regular file).
   */
  t->fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW |
                O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  struct stat st;
  if (t->fd >= 0 && (fstat (t->fd, &st) == -1 || !S_ISREG (st.st_mode))) {
    close (t->fd);
    t->fd = -1;
    errno = EPERM;
  }
  if (t->fd >= 0)
    (void) fcntl (t->fd, F_SETFL, fcntl (t->fd, F_GETFL) & ~O_NONBLOCK);
  if (t->chunk == NULL || t->fd == -1) {
    int e = errno;
    if (t->fd >= 0)
      close (t->fd);
    free (t->chunk);
    free (t);
    errno = e;
    return -1;
  }
  t->limit = limit;
  /* Twice the units of LIMIT, as a power of 2, at least 1024. */
  uint64_t units = MAX (limit >> UNIT_SHIFT, UINT64_C (512));
  size_t cap = 1024;
  while (cap / 2 < units && cap < (SIZE_MAX >> 4))
    cap *= 2;
  t->set_max = cap;
  pthread_mutex_init (&t->lock, NULL);
  pthread_mutex_init (&t->wlock, NULL);
  pthread_cond_init (&t->turn, NULL);
  *tp = t;
  return 0;
}

int
fsc_trace_bind (struct fsc_trace *t, uint64_t key_lo, uint64_t key_hi,
                uint64_t size, uint32_t block_size)
{
  unsigned char h[FSC_TRACE_HEADER_SIZE];

  pthread_mutex_lock (&t->lock);
  if (t->bound) {
    bool same = t->key_lo == key_lo && t->key_hi == key_hi;
    pthread_mutex_unlock (&t->lock);
    return same ? 1 : 0;
  }
  t->bound = true;
  t->key_lo = key_lo;
  t->key_hi = key_hi;
  t->size = size;
  t->start_ms = t->last_flush_ms = fsc_wall_ms ();
  memset (h, 0, sizeof h);
  memcpy (h + FSC_TH_MAGIC, FSC_TRACE_MAGIC, 8);
  put_le32 (h + FSC_TH_VERSION, FSC_TRACE_VERSION);
  put_le32 (h + FSC_TH_HEADER_SIZE, FSC_TRACE_HEADER_SIZE);
  put_le64 (h + FSC_TH_SIZE, size);
  put_le32 (h + FSC_TH_BLOCK_SIZE, block_size);
  put_le32 (h + FSC_TH_UNIT, FSC_TRACE_UNIT);
  put_le64 (h + FSC_TH_STARTED, t->start_ms);
  put_le64 (h + FSC_TH_KEY_LO, key_lo);
  put_le64 (h + FSC_TH_KEY_HI, key_hi);
  put_le64 (h + FSC_TH_CHECKSUM, XXH3_64bits (h, FSC_TH_CHECKSUM));
  /* Under t->lock: nothing can be recorded before the header is out,
   * and this is the only write done holding it (once per process).
   */
  int r = write (t->fd, h, sizeof h) == (ssize_t) sizeof h ? 1 : -1;
  if (r == -1) {
    t->err = errno ? errno : EIO;
    t->full = true;
  }
  pthread_mutex_unlock (&t->lock);
  return r;
}

/* Insert UNIT; true if it was not there.  Holds t->lock.  When the set
 * cannot grow (no memory, or the cap), the trace stops: full.
 */
static bool
set_add (struct fsc_trace *t, uint64_t unit)
{
  if ((t->set_len + 1) * 2 > t->set_cap) {
    size_t ncap = t->set_cap ? t->set_cap * 2 : 1024;
    uint64_t *ns = ncap <= t->set_max ? calloc (ncap, sizeof *ns) : NULL;
    if (ns == NULL) {
      t->full = true;
      return false;
    }
    for (size_t i = 0; i < t->set_cap; ++i) {
      uint64_t v = t->set[i];
      if (v == 0)
        continue;
      size_t j = (size_t) (v * UINT64_C (0x9E3779B97F4A7C15) >> 20) &
        (ncap - 1);
      while (ns[j])
        j = (j + 1) & (ncap - 1);
      ns[j] = v;
    }
    free (t->set);
    t->set = ns;
    t->set_cap = ncap;
  }
  uint64_t v = unit + 1;
  size_t j = (size_t) (v * UINT64_C (0x9E3779B97F4A7C15) >> 20) &
    (t->set_cap - 1);
  while (t->set[j]) {
    if (t->set[j] == v)
      return false;
    j = (j + 1) & (t->set_cap - 1);
  }
  t->set[j] = v;
  t->set_len++;
  return true;
}

/* Write the chunk being filled, if any.  Called holding t->lock; drops
 * it while waiting for its turn and writing, and returns with it held.
 */
static void
flush_locked (struct fsc_trace *t)
{
  if (t->nentries == 0)
    return;
  const size_t body = HEAD + (size_t) ENTRY_SIZE * t->nentries;
  unsigned char *c = t->chunk;
  memcpy (c, FSC_TRACE_CHUNK_MAGIC, 4);
  put_le32 (c + 4, t->nentries);
  put_le64 (c + body, XXH3_64bits (c, body));
  unsigned char *out = malloc (body + 8);
  if (out == NULL) {
    t->err = ENOMEM;
    t->full = true;
    t->nentries = 0;
    return;
  }
  memcpy (out, c, body + 8);
  t->nentries = 0;
  t->last_flush_ms = fsc_wall_ms ();
  const uint64_t ticket = t->next_ticket++;
  pthread_mutex_unlock (&t->lock);
  pthread_mutex_lock (&t->wlock);
  while (t->now_serving != ticket)
    pthread_cond_wait (&t->turn, &t->wlock);
  ssize_t w = write (t->fd, out, body + 8);
  int e = errno;
  t->now_serving++;
  pthread_cond_broadcast (&t->turn);
  pthread_mutex_unlock (&t->wlock);
  free (out);
  pthread_mutex_lock (&t->lock);
  if (w != (ssize_t) (body + 8) && t->err == 0) {
    t->err = w == -1 ? e : EIO;
    t->full = true;
  }
}

/* Append an entry of units [U0, U1).  Holds t->lock. */
static void
add_entry (struct fsc_trace *t, uint64_t u0, uint64_t u1, uint32_t ms)
{
  while (u0 < u1 && !t->full) {
    /* An entry's length is a u32 of bytes. */
    uint64_t n = MIN (u1 - u0, (uint64_t) (UINT32_MAX >> UNIT_SHIFT));
    unsigned char *e = t->chunk + HEAD + (size_t) ENTRY_SIZE * t->nentries;
    put_le64 (e, u0 << UNIT_SHIFT);
    put_le32 (e + 8, (uint32_t) (n << UNIT_SHIFT));
    put_le32 (e + 12, ms);
    t->recorded += n << UNIT_SHIFT;
    u0 += n;
    if (++t->nentries == TRACE_CHUNK_MAX)
      flush_locked (t);
  }
}

void
fsc_trace_note (struct fsc_trace *t, uint64_t offset, uint64_t count)
{
  if (count == 0)
    return;
  pthread_mutex_lock (&t->lock);
  if (!t->bound || t->full || offset >= t->size) {
    pthread_mutex_unlock (&t->lock);
    return;
  }
  count = MIN (count, t->size - offset);
  const uint64_t now = fsc_wall_ms ();
  const uint32_t ms =
    (uint32_t) MIN (now - t->start_ms, (uint64_t) UINT32_MAX);
  uint64_t u = offset >> UNIT_SHIFT;
  const uint64_t uend =
    (offset + count + (1u << UNIT_SHIFT) - 1) >> UNIT_SHIFT;
  uint64_t run = UINT64_MAX;            /* start of a run of new units */
  bool limit = false;
  for (; u < uend && !t->full; ++u) {
    if (t->recorded + ((u - (run == UINT64_MAX ? u : run) + 1) << UNIT_SHIFT)
        > t->limit) {
      limit = true;
      break;
    }
    bool fresh = set_add (t, u);
    if (fresh && run == UINT64_MAX)
      run = u;
    else if (!fresh && run != UINT64_MAX) {
      add_entry (t, run, u, ms);
      run = UINT64_MAX;
    }
  }
  if (run != UINT64_MAX)
    add_entry (t, run, u, ms);
  if (limit)
    t->full = true;             /* the rest is not recorded */
  if (now >= t->last_flush_ms + FLUSH_MS || t->full)
    flush_locked (t);
  pthread_mutex_unlock (&t->lock);
}

int
fsc_trace_close (struct fsc_trace *t, uint64_t *recorded)
{
  if (t == NULL)
    return 0;
  pthread_mutex_lock (&t->lock);
  flush_locked (t);
  int err = t->err;
  if (recorded)
    *recorded = t->recorded;
  pthread_mutex_unlock (&t->lock);
  if (close (t->fd) == -1 && err == 0)
    err = errno;
  pthread_mutex_destroy (&t->lock);
  pthread_mutex_destroy (&t->wlock);
  pthread_cond_destroy (&t->turn);
  free (t->set);
  free (t->chunk);
  free (t);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}
