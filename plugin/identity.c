/* nbdkit-fscache-filter: the object key and the coherency fingerprint
 * of an export (identity.h says what they are and why they must never
 * change).
 *
 * The sample reads: on an upstream taking parallel requests each read
 * but the first runs in a thread of its own, so that opening an export
 * costs one round trip to the upstream rather than SAMPLE_COUNT (80 ms
 * on a 10 ms link).  The fingerprint is the same either way: it is
 * computed after every read has returned, in region order.  The
 * threads live only for the call; nothing here outlives it.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

#include "utils.h"

#include "identity.h"
#include "params.h"

char *
object_key (const char *exportname, size_t *len)
{
  const char *base = params.key ? params.key : params.derived_key;
  size_t blen = params.key ? strlen (params.key) : params.derived_len;
  size_t elen = strlen (exportname);
  char *k = malloc (blen + elen + 8);
  if (k == NULL)
    return NULL;
  memcpy (k, base, blen);
  memcpy (k + blen, "\0export=", 8);
  memcpy (k + blen + 8, exportname, elen);
  *len = blen + 8 + elen;
  return k;
}

void
sample_regions (const void *k, size_t klen, uint64_t size,
                struct fscache_sample_set *set)
{
  uint64_t seed = XXH3_64bits (k, klen);
  unsigned n = 0;

  memset (set, 0, sizeof *set);
  for (; n < SAMPLE_COUNT && size > 0; ++n) {
    uint64_t off;
    if (n == 0)
      off = 0;
    else if (n == 1)
      off = size > SAMPLE_SIZE ? size - SAMPLE_SIZE : 0;
    else {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      off = ROUND_DOWN ((seed >> 11) % size, (uint64_t) SAMPLE_SIZE);
    }
    set->off[n] = off;
    set->len[n] = MIN ((uint64_t) SAMPLE_SIZE, size - off);
  }
  set->n = n;
}

/* One sample read, in a thread of its own when the upstream allows
 * overlapping calls.
 */
struct sample {
  struct upstream *up;
  uint64_t off;
  uint32_t n;
  int err;                      /* 0, or the read's errno */
  pthread_t thread;
  bool started;
  unsigned char buf[SAMPLE_SIZE];
};

static void *
read_sample (void *arg)
{
  struct sample *sm = arg;
  int err = 0;
  if (upstream_pread (sm->up, sm->buf, sm->n, sm->off, 0, &err) == -1)
    sm->err = err ? err : EIO;
  return NULL;
}

int
fingerprint_regions (struct upstream *up, const void *k, size_t klen,
                     uint64_t size, struct fscache_sample_set *set,
                     uint64_t *fp)
{
  struct sample *sm = calloc (SAMPLE_COUNT, sizeof *sm);
  XXH3_state_t *s = XXH3_createState ();
  int r = -1;

  sample_regions (k, klen, size, set);
  if (sm == NULL || s == NULL || XXH3_64bits_reset (s) == XXH_ERROR) {
    errno = ENOMEM;
    goto out;
  }
  unsigned n = set->n;
  for (unsigned i = 0; i < n; ++i) {
    sm[i].up = up;
    sm[i].off = set->off[i];
    sm[i].n = set->len[i];
  }
  /* Each read but the first in a thread (if it cannot start, here). */
  for (unsigned i = 1; i < n; ++i)
    sm[i].started = upstream_parallel (up) &&
      pthread_create (&sm[i].thread, NULL, read_sample, &sm[i]) == 0;
  for (unsigned i = 0; i < n; ++i) {
    if (sm[i].started)
      pthread_join (sm[i].thread, NULL);
    else
      read_sample (&sm[i]);
  }

  /* What the fingerprint hashes, in this order (its value is in every
   * index, so this must not change): the size, then each region's
   * offset and bytes.
   */
  XXH3_64bits_update (s, &size, sizeof size);
  for (unsigned i = 0; i < n; ++i) {
    if (sm[i].err) {
      errno = sm[i].err;
      goto out;
    }
    XXH3_64bits_update (s, &sm[i].off, sizeof sm[i].off);
    XXH3_64bits_update (s, sm[i].buf, sm[i].n);
  }
  for (unsigned i = 0; i < n; ++i)
    set->hash[i] = XXH3_64bits (sm[i].buf, sm[i].n);
  *fp = XXH3_64bits_digest (s);
  r = 0;
 out:
  XXH3_freeState (s);
  free (sm);
  return r;
}

int
fingerprint (struct upstream *up, const void *k, size_t klen, uint64_t size,
             uint64_t *fp)
{
  struct fscache_sample_set set;
  return fingerprint_regions (up, k, klen, size, &set, fp);
}
