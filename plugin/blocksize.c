/* nbdkit-fscache-filter: the upstream's block-size constraints, kept by
 * every request the filter makes on its own.
 *
 * A client's requests already obey the upstream's minimum and maximum:
 * the filter advertises the upstream's own (fscache_block_size).  But
 * the filter also makes requests of its own shapes: the 4 KiB
 * coherency sample, 4 KiB piece fills, whole-block fills, 1 MiB
 * readahead chunks, and the writeback writer's records.  Behind an
 * upstream that enforces its constraints (blocksize-policy with
 * blocksize-error-policy=error, a server that rejects them) those
 * failed, so that every connection was refused (an unaligned sample)
 * or legal client reads failed with EIO (a 64 KiB fill over a 32 KiB
 * maximum).  Issue 29, item 2; tests/filter/test-transparent.sh, part 2.
 *
 * So the data calls below take any range and turn it into requests
 * the upstream accepts:
 *  - reads are rounded out to the minimum (the extra bytes read into a
 *    bounce buffer and dropped) and split at the maximum;
 *  - writes and zeroes are split at the maximum; an unaligned head or
 *    tail is read, patched and written whole (read-modify-write);
 *  - trims are shrunk to the aligned part (a trim is advisory).
 * The export's end is always a legal end, aligned or not.
 *
 * The read-modify-write is a fallback: clients obey the minimum, and
 * the writer's records are made of their writes, so in practice it
 * never runs.  When it does, one lock per process orders the RMWs
 * (two of them on one aligned block would lose one's bytes); it is
 * held across their upstream calls, the one place the filter does
 * that, since nothing cheaper keeps two patches of one block apart.
 * Constraints come from the upstream's block_size, asked once per
 * upstream (nbdkit caches it per context too).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blocksize.h"
#include "upstream.h"
#include "say.h"

/* Where reads and writes are split when the upstream gives no
 * maximum: NBD's 32 MiB, well over anything the filter asks at once.
 * Zeroes and trims are then not split at all.
 */
#define NO_MAX (32u << 20)

static pthread_mutex_t rmw_lock = PTHREAD_MUTEX_INITIALIZER;

/* U's minimum (>= 1) and maximum (a multiple of the minimum, >= it;
 * 0 if the upstream gives none).
 */
static void
limits (struct upstream *u, uint32_t *minp, uint32_t *maxp)
{
  uint32_t mn = __atomic_load_n (&u->bs_min, __ATOMIC_ACQUIRE);
  if (mn == 0) {
    uint32_t a = 0, pref = 0, b = 0;
    if (upstream_block_size (u, &a, &pref, &b) == -1 || a == 0)
      a = 1;
    if (b == (uint32_t) -1 || b >= NO_MAX)
      b = 0;
    if (b) {
      b = b / a * a;
      if (b < a)
        b = a;
    }
    __atomic_store_n (&u->bs_max, b, __ATOMIC_RELAXED);
    __atomic_store_n (&u->bs_min, a, __ATOMIC_RELEASE);
    mn = a;
  }
  *minp = mn;
  *maxp = __atomic_load_n (&u->bs_max, __ATOMIC_RELAXED);
}

/* Where data requests are split. */
static uint32_t
data_max (uint32_t max, uint32_t min)
{
  return max ? max : NO_MAX / min * min;
}

/* The export's size, for the legal unaligned end; UINT64_MAX if not
 * known (then nothing is clipped).
 */
static uint64_t
export_size (struct upstream *u)
{
  int64_t s = upstream_get_size (u);
  return s < 0 ? UINT64_MAX : (uint64_t) s;
}

/* [*A, *B): [OFF, OFF + COUNT) rounded out to MIN, clipped at SIZE. */
static void
round_out (uint64_t off, uint64_t count, uint32_t min, uint64_t size,
           uint64_t *a, uint64_t *b)
{
  *a = off / min * min;
  uint64_t end = off + count;
  *b = end % min ? end - end % min + min : end;
  if (*b > size)
    *b = size > end ? size : end;
}

/* Aligned reads of [A, B) into BUF, split at MAX. */
static int
read_split (struct upstream *u, unsigned char *buf, uint64_t a, uint64_t b,
            uint32_t max, uint32_t flags, int *err)
{
  for (uint64_t p = a; p < b;) {
    uint32_t n = b - p > max ? max : (uint32_t) (b - p);
    if (upstream_pread (u, buf + (p - a), n, p, flags, err) == -1)
      return -1;
    p += n;
  }
  return 0;
}

int
bs_pread (struct upstream *u, void *buf, uint32_t count, uint64_t offset,
          uint32_t flags, int *err)
{
  uint32_t min, max;
  limits (u, &min, &max);
  max = data_max (max, min);
  if (min == 1 && count <= max)
    return upstream_pread (u, buf, count, offset, flags, err);
  uint64_t a, b;
  round_out (offset, count, min, min == 1 ? UINT64_MAX : export_size (u),
             &a, &b);
  if (a == offset && b == offset + count)
    return read_split (u, buf, a, b, max, flags, err);
  unsigned char *bounce = malloc (b - a);
  if (bounce == NULL) {
    *err = ENOMEM;
    return -1;
  }
  int r = read_split (u, bounce, a, b, max, flags, err);
  if (r == 0)
    memcpy (buf, bounce + (offset - a), count);
  free (bounce);
  return r;
}

/* Write BUF (NULL: zeroes, by the upstream's zero with FLAGS) over the
 * aligned [A, B), split at MAX (0: zeroes unsplit, but within what a
 * request can say).
 */
static int
write_split (struct upstream *u, const unsigned char *buf, uint64_t a,
             uint64_t b, uint32_t max, uint32_t flags, int *err)
{
  if (max == 0)
    max = UINT32_MAX;
  for (uint64_t p = a; p < b;) {
    uint32_t n = b - p > max ? max : (uint32_t) (b - p);
    int r = buf ? upstream_pwrite (u, buf + (p - a), n, p, flags, err)
      : upstream_zero (u, n, p, flags, err);
    if (r == -1)
      return -1;
    p += n;
  }
  return 0;
}

/* BUF or zeroes over [OFFSET, OFFSET + COUNT), any alignment: the
 * unaligned ends by read-modify-write of the blocks around them.
 */
static int
write_any (struct upstream *u, const unsigned char *buf, uint32_t count,
           uint64_t offset, uint32_t flags, int *err)
{
  uint32_t min, max;
  limits (u, &min, &max);
  uint64_t a, b;
  round_out (offset, count, min, min == 1 ? UINT64_MAX : export_size (u),
             &a, &b);
  if (a == offset && b == offset + count)
    return write_split (u, buf, a, b, buf ? data_max (max, min) : max,
                        flags, err);

  /* The fallback: the whole rounded range, read, patched, written. */
  max = data_max (max, min);
  unsigned char *bounce = malloc (b - a);
  if (bounce == NULL) {
    *err = ENOMEM;
    return -1;
  }
  pthread_mutex_lock (&rmw_lock);
  int r = read_split (u, bounce, a, b, max, 0, err);
  if (r == 0) {
    if (buf)
      memcpy (bounce + (offset - a), buf, count);
    else
      memset (bounce + (offset - a), 0, count);
    r = write_split (u, bounce, a, b, max, flags & NBDKIT_FLAG_FUA, err);
  }
  pthread_mutex_unlock (&rmw_lock);
  free (bounce);
  return r;
}

int
bs_pwrite (struct upstream *u, const void *buf, uint32_t count,
           uint64_t offset, uint32_t flags, int *err)
{
  return write_any (u, buf, count, offset, flags, err);
}

int
bs_zero (struct upstream *u, uint32_t count, uint64_t offset,
         uint32_t flags, int *err)
{
  return write_any (u, NULL, count, offset, flags, err);
}

int
bs_trim (struct upstream *u, uint32_t count, uint64_t offset,
         uint32_t flags, int *err)
{
  uint32_t min, max;
  limits (u, &min, &max);
  uint64_t end = offset + count;
  uint64_t a = offset % min ? offset - offset % min + min : offset;
  uint64_t b = min == 1 || end == export_size (u) ? end : end / min * min;
  if (max == 0)
    max = UINT32_MAX;
  for (uint64_t p = a; p < b;) {
    uint32_t n = b - p > max ? max : (uint32_t) (b - p);
    if (upstream_trim (u, n, p, flags, err) == -1)
      return -1;
    p += n;
  }
  return 0;
}

void
bs_check_block_size (struct upstream *u, uint32_t block_size)
{
  static bool said;
  uint32_t min, max;
  limits (u, &min, &max);
  if ((block_size % min == 0 && (max == 0 || block_size <= max)) ||
      __atomic_test_and_set (&said, __ATOMIC_RELAXED))
    return;
  say_warning ("fscache-block-size=%" PRIu32 " does not "
               "fit the upstream's block sizes (minimum %" PRIu32
               ", maximum %" PRIu32 "): each fill is %s; a block size "
               "that is a multiple of the minimum and at most the "
               "maximum avoids that", block_size, min, max,
               block_size % min ? "rounded out to the minimum, reading "
               "bytes it then drops" : "split into several requests");
}
