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

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xxh.h"

#include "utils.h"

#include "blocksize.h"
#include "identity.h"
#include "params.h"

/*----------------------------------------------------------------------
 * The stack below us, for the derived key.
 *
 * nbdkit's filter API names neither the plugin nor the other filters,
 * and two plugins may take the same parameters (pattern 16M and memory
 * 16M): their derived keys would be one.  So the names are found
 * outside the API: the plugin is the one nbdkit-NAME-plugin.so loaded
 * in this process (dl_iterate_phdr: nbdkit loads exactly one), the
 * filters below us are the --filter arguments after ours on nbdkit's
 * command line (/proc/self/cmdline), in order.  Both are reduced to
 * NAME, so that "memory" and ".../nbdkit-memory-plugin.so" are one.
 */

/* NAME from "nbdkit-NAME-KIND.so[.N]" or a path to it; else the base
 * name as it is.  Returns a malloc'd string or NULL.
 */
static char *
short_name (const char *path, const char *kind)
{
  const char *b = strrchr (path, '/');
  b = b ? b + 1 : path;
  char suffix[32];
  snprintf (suffix, sizeof suffix, "-%s.so", kind);
  const char *end = strstr (b, suffix);
  if (strncmp (b, "nbdkit-", 7) == 0 && end && end > b + 7)
    return strndup (b + 7, end - (b + 7));
  return strdup (b);
}

static int
find_plugin (struct dl_phdr_info *info, size_t size, void *opaque)
{
  char **name = opaque;
  const char *p = info->dlpi_name;
  const char *b = p ? strrchr (p, '/') : NULL;
  b = b ? b + 1 : p;
  (void) size;
  if (b && *name == NULL && strncmp (b, "nbdkit-", 7) == 0 &&
      strstr (b, "-plugin.so") != NULL)
    *name = short_name (b, "plugin");
  return *name != NULL;
}

/* Is the --filter argument ARG this filter (MYSELF: our .so's path)? */
static bool
is_us (const char *arg, const char *myself)
{
  if (strchr (arg, '/') == NULL && strchr (arg, '.') == NULL)
    return strcmp (arg, "fscache") == 0;
  char a[PATH_MAX], m[PATH_MAX];
  return realpath (arg, a) && realpath (myself, m) && strcmp (a, m) == 0;
}

char *
identity_stack (void)
{
  char *plugin = NULL, *out = NULL;
  char *cmd = NULL;
  size_t len = 0, cap = 0;
  Dl_info me;

  dl_iterate_phdr (find_plugin, &plugin);
  if (dladdr ((void *) identity_stack, &me) == 0 || me.dli_fname == NULL)
    me.dli_fname = "";

  /* The command line: NUL-separated arguments. */
  int fd = open ("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    for (;;) {
      if (len == cap) {
        char *p = realloc (cmd, cap ? cap * 2 : 4096);
        if (p == NULL)
          break;
        cmd = p;
        cap = cap ? cap * 2 : 4096;
      }
      ssize_t r = read (fd, cmd + len, cap - len);
      if (r <= 0)
        break;
      len += r;
    }
    close (fd);
  }

  size_t olen = 0;
  FILE *fp = open_memstream (&out, &olen);
  if (fp == NULL)
    goto done;
  fprintf (fp, "nbdkit-plugin=%s\n", plugin ? plugin : "?");
  fputs ("nbdkit-filters-below=", fp);
  bool below = false, first = true;
  for (size_t i = 0; cmd && i < len; ) {
    const char *a = cmd + i;
    size_t alen = strnlen (a, len - i);
    i += alen + 1;
    const char *f = NULL;
    if (strncmp (a, "--filter=", 9) == 0)
      f = a + 9;
    else if (strcmp (a, "--filter") == 0 && i < len) {
      f = cmd + i;
      i += strnlen (f, len - i) + 1;
    }
    if (f == NULL)
      continue;
    if (!below) {
      below = is_us (f, me.dli_fname);
      continue;
    }
    char *n = short_name (f, "filter");
    fprintf (fp, "%s%s", first ? "" : ",", n ? n : f);
    free (n);
    first = false;
  }
  fputc ('\n', fp);
  if (fclose (fp) != 0) {
    free (out);
    out = NULL;
  }
 done:
  free (cmd);
  free (plugin);
  return out;
}

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
  if (bs_pread (sm->up, sm->buf, sm->n, sm->off, 0, &err) == -1)
    sm->err = err ? err : EIO;
  return NULL;
}

/* A read of its own (the first is read on the caller's thread). */
static void *
sample_thread (void *arg)
{
  fsc_thread_name ("fsc-identity");
  return read_sample (arg);
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
      pthread_create (&sm[i].thread, NULL, sample_thread, &sm[i]) == 0;
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
