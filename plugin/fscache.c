/* nbdkit-fscache-filter: a persistent, coherent, checksummed local
 * cache of a slow upstream's blocks.
 *
 * This file is the thin nbdkit side: it parses the fscache-*
 * parameters, derives each export's object key, computes the
 * coherency data (upstream size, generation, sampled fingerprint) and
 * turns NBD requests into calls of libfscache (core/fscache.h), which
 * does the caching.  Every call to the upstream, from a client request
 * or from a readahead thread, goes through upstream.c, which keeps the
 * upstream's thread model: misses of many requests and connections
 * proceed in parallel where the upstream allows it, one at a time per
 * connection or per server where it does not, and hits never wait for
 * the upstream at all.
 *
 * Identity of an object: the fscache-key parameter, or by default the
 * plugin parameters this filter sees, plus the client's export name.
 * See nbdkit-fscache-filter(1) for the user's view.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "xxh.h"

#include "fscache.h"
#include "keyenc.h"
#include "readahead.h"
#include "trace.h"
#include "upstream.h"
#include "utils.h"

enum mode { MODE_WRITETHROUGH, MODE_WRITEAROUND };

/* Parameters, set in .config and read-only afterwards. */
static char *dir;
static char *key;               /* fscache-key, or NULL */
static char *derived_key;       /* from the plugin parameters */
static size_t derived_len;
static uint32_t block_size = 64 * 1024;
static enum mode mode = MODE_WRITETHROUGH;
static char *generation;
static int validate = FSC_VALIDATE_SAMPLE;
static bool verify = true;
static char *stats_file;
static uint64_t readahead = 4 * 1024 * 1024;
static bool offline = false;    /* fscache-offline */
static uint64_t max_size;       /* fscache-max-size, 0: none */
static unsigned min_free = 1;   /* fscache-min-free, % of blocks */
static unsigned min_free_inodes = 1; /* fscache-min-free-inodes */
static char *trace_file;        /* fscache-trace */
static uint64_t trace_max = UINT64_C (1) << 30; /* fscache-trace-max */
static struct fsc_trace *trace; /* open while the filter is loaded */

static struct fsc_cache *cache;

#define SAMPLE_SIZE 4096
#define SAMPLE_COUNT 8          /* first, last and 6 fixed per object */
/* A read starting within this of where the last one ended is near
 * it.  Two near reads in a row (a stream whose requests overtake each
 * other, a reader skipping a little), or an exactly sequential one,
 * get whole blocks (FSC_READ_NEAR); any other read only the pieces it
 * covers.  Random reads land near twice in a row with a chance of
 * about (2 * NEAR_BYTES / export size)^2: 0.1% over 16 MiB.
 */
#define NEAR_BYTES (256 * 1024)

struct handle {
  struct fsc_object *obj;
  uint64_t size;                /* the export's size, fixed at .prepare */
  time_t err_said;              /* last upstream failure logged (atomic) */
  uint64_t last_end;            /* end of the last read (atomic) */
  bool last_near;               /* the last read was near the one
                                 * before (atomic) */
  unsigned err_unsaid;          /* failures since, not logged (atomic) */
  struct fsc_readahead *ra;     /* NULL if fscache-readahead=0 */
  struct upstream upstream;     /* this connection's upstream, gated */
  struct fsc_upstream up;       /* the same, for core/ */
  char *exportname;
  bool traced;                  /* its reads go into the trace */
};

static void
fscache_unload (void)
{
  free (dir);
  free (key);
  free (derived_key);
  free (generation);
  free (stats_file);
  free (trace_file);
}

/* Add KEY=VALUE to the derived key.  Values that name existing files
 * are made absolute, so the same image named from two directories is
 * one object.
 */
static int
derive_key (const char *k, const char *value)
{
  char *real = NULL;
  if (strchr (value, '/') || access (value, F_OK) == 0)
    real = realpath (value, NULL);
  const char *v = real ? real : value;
  size_t add = strlen (k) + strlen (v) + 2;
  char *p = realloc (derived_key, derived_len + add + 1);
  if (p == NULL) {
    nbdkit_error ("realloc: %m");
    free (real);
    return -1;
  }
  derived_key = p;
  derived_len += sprintf (p + derived_len, "%s=%s\n", k, v);
  free (real);
  return 0;
}

static int
fscache_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *k, const char *value)
{
  if (strcmp (k, "fscache-dir") == 0) {
    free (dir);
    if (*value == '\0') {
      nbdkit_error ("fscache-dir: must not be empty");
      return -1;
    }
    dir = nbdkit_absolute_path (value);
    return dir ? 0 : -1;
  }
  if (strcmp (k, "fscache-key") == 0) {
    if (*value == '\0') {
      nbdkit_error ("fscache-key: must not be empty");
      return -1;
    }
    free (key);
    key = strdup (value);
    return key ? 0 : -1;
  }
  if (strcmp (k, "fscache-block-size") == 0) {
    int64_t r = nbdkit_parse_size (value);
    if (r == -1) {
      nbdkit_error ("fscache-block-size=%s: not a size", value);
      return -1;
    }
    if (r < 4096 || r > 4 * 1024 * 1024 || !is_power_of_2 (r)) {
      nbdkit_error ("fscache-block-size=%s: must be a power of 2 "
                    "from 4K to 4M", value);
      return -1;
    }
    block_size = r;
    return 0;
  }
  if (strcmp (k, "fscache-mode") == 0) {
    if (strcmp (value, "writethrough") == 0)
      mode = MODE_WRITETHROUGH;
    else if (strcmp (value, "writearound") == 0)
      mode = MODE_WRITEAROUND;
    else {
      nbdkit_error ("fscache-mode=%s: must be writethrough or writearound",
                    value);
      return -1;
    }
    return 0;
  }
  if (strcmp (k, "fscache-generation") == 0) {
    if (strlen (value) > FSC_GEN_MAX) {
      nbdkit_error ("fscache-generation: longer than %d bytes", FSC_GEN_MAX);
      return -1;
    }
    free (generation);
    generation = strdup (value);
    return generation ? 0 : -1;
  }
  if (strcmp (k, "fscache-validate") == 0) {
    if (strcmp (value, "sample") == 0)
      validate = FSC_VALIDATE_SAMPLE;
    else if (strcmp (value, "size") == 0)
      validate = FSC_VALIDATE_SIZE;
    else if (strcmp (value, "none") == 0)
      validate = FSC_VALIDATE_NONE;
    else {
      nbdkit_error ("fscache-validate=%s: must be sample, size or none",
                    value);
      return -1;
    }
    return 0;
  }
  if (strcmp (k, "fscache-verify") == 0) {
    int r = nbdkit_parse_bool (value);
    if (r == -1) {
      nbdkit_error ("fscache-verify=%s: not a boolean", value);
      return -1;
    }
    verify = r;
    return 0;
  }
  if (strcmp (k, "fscache-readahead") == 0) {
    int64_t r = nbdkit_parse_size (value);
    if (r == -1) {
      nbdkit_error ("fscache-readahead=%s: not a size", value);
      return -1;
    }
    if (r > 1024 * 1024 * 1024) {
      nbdkit_error ("fscache-readahead=%s: at most 1G", value);
      return -1;
    }
    readahead = r;
    return 0;
  }
  if (strcmp (k, "fscache-max-size") == 0) {
    int64_t r = nbdkit_parse_size (value);
    if (r == -1) {
      nbdkit_error ("fscache-max-size=%s: not a size", value);
      return -1;
    }
    if (r != 0 && r < 1024 * 1024) {
      nbdkit_error ("fscache-max-size=%s: at least 1M (or 0 for no cap)",
                    value);
      return -1;
    }
    max_size = r;
    return 0;
  }
  if (strcmp (k, "fscache-min-free") == 0 ||
      strcmp (k, "fscache-min-free-inodes") == 0) {
    char *end;
    errno = 0;
    unsigned long pct = strtoul (value, &end, 10);
    if (*end == '%')
      end++;
    if (errno || end == value || *end || !(*value >= '0' && *value <= '9') ||
        pct >= 100) {
      nbdkit_error ("%s=%s: must be a percentage from 0%% to 99%%, "
                    "like 1%%", k, value);
      return -1;
    }
    if (strcmp (k, "fscache-min-free") == 0)
      min_free = pct;
    else
      min_free_inodes = pct;
    return 0;
  }
  if (strcmp (k, "fscache-offline") == 0) {
    int r = nbdkit_parse_bool (value);
    if (r == -1) {
      nbdkit_error ("fscache-offline=%s: not a boolean", value);
      return -1;
    }
    offline = r;
    return 0;
  }
  if (strcmp (k, "fscache-stats") == 0) {
    free (stats_file);
    stats_file = nbdkit_absolute_path (value);
    return stats_file ? 0 : -1;
  }
  if (strcmp (k, "fscache-trace") == 0) {
    free (trace_file);
    trace_file = nbdkit_absolute_path (value);
    return trace_file ? 0 : -1;
  }
  if (strcmp (k, "fscache-trace-max") == 0) {
    int64_t r = nbdkit_parse_size (value);
    if (r == -1) {
      nbdkit_error ("fscache-trace-max=%s: not a size", value);
      return -1;
    }
    if (r < 4096) {
      nbdkit_error ("fscache-trace-max=%s: at least 4K", value);
      return -1;
    }
    trace_max = r;
    return 0;
  }
  if (strncmp (k, "fscache-", 8) == 0) {
    nbdkit_error ("unknown parameter %s (see nbdkit-fscache-filter(1))", k);
    return -1;
  }
  if (derive_key (k, value) == -1)
    return -1;
  return next (nxdata, k, value);
}

/* The default cache directory (fsc_default_dir), or NULL (said). */
static char *
default_dir (void)
{
  char *r = fsc_default_dir ();
  if (r == NULL && errno == ENOENT)
    nbdkit_error ("fscache-dir: not set, and no NBD_FSCACHE_DIR, "
                  "XDG_CACHE_HOME or HOME to default from");
  else if (r == NULL)
    nbdkit_error ("fscache-dir: %m");
  return r;
}

static int
fscache_config_complete (nbdkit_next_config_complete *next,
                         nbdkit_backend *nxdata)
{
  if (dir == NULL && (dir = default_dir ()) == NULL)
    return -1;
  if (key == NULL && derived_key == NULL) {
    nbdkit_error ("fscache-key: not set and no plugin parameters to "
                  "derive it from; set fscache-key=STRING");
    return -1;
  }
  if (key == NULL) {
    /* The parameters may hold passwords: keep only their hash, which
     * is all the identity needs, out of file names and indexes.
     */
    uint64_t lo, hi;
    char *hashed;
    fsc_key_hash (derived_key, derived_len, &lo, &hi);
    int n = asprintf (&hashed, "params-%016" PRIx64 "%016" PRIx64, hi, lo);
    if (n == -1) {
      nbdkit_error ("asprintf: %m");
      return -1;
    }
    free (derived_key);
    derived_key = hashed;
    derived_len = n;
  }

  /* Created now (before the cache, so that a refused start creates no
   * cache directory), so that a trace that cannot be written is an
   * error at start-up rather than a silent loss.
   */
  if (trace_file && fsc_trace_open (trace_file, trace_max, &trace) == -1) {
    nbdkit_error ("fscache-trace=%s: %m", trace_file);
    return -1;
  }

  struct fsc_cache_config cfg = {
    .dir = dir,
    .create = true,
    .min_free_pct = min_free,
    .min_free_files_pct = min_free_inodes,
    .faults = getenv ("NBD_FSCACHE_FAULTS"),
  };
  if (fsc_cache_open (&cfg, &cache) == -1) {
    switch (errno) {
    case EPERM:
      nbdkit_error ("fscache-dir=%s: refusing to use a cache directory "
                    "owned by another user or writable by others "
                    "(it should be mode 0700 and owned by uid %d)",
                    dir, (int) geteuid ());
      break;
    case EPROTONOSUPPORT:
      nbdkit_error ("fscache-dir=%s: written by a newer nbd-fscache; "
                    "refusing to touch it", dir);
      break;
    case EINVAL:
      nbdkit_error ("NBD_FSCACHE_FAULTS: malformed fault spec");
      break;
    default:
      nbdkit_error ("fscache-dir=%s: cannot create or open the cache "
                    "directory: %m", dir);
    }
    return -1;
  }
  return next (nxdata);
}

/* The server's final thread model: how upstream calls must be gated. */
static int
fscache_get_ready (int thread_model)
{
  upstream_set_thread_model (thread_model);
  nbdkit_debug ("fscache: upstream calls follow thread model %s",
                upstream_thread_model_name ());
  return 0;
}

static int
fscache_after_fork (nbdkit_backend *nxdata)
{
  if (fsc_cache_start (cache) == -1) {
    nbdkit_error ("fscache: starting the committer thread: %m");
    return -1;
  }
  return 0;
}

static void
write_stats (void)
{
  if (!stats_file || !cache)
    return;
  struct fsc_stats st;
  char buf[4096];
  CLEANUP_FREE char *tmp = NULL;

  fsc_cache_stats (cache, &st);
  size_t len = fsc_stats_format (&st, buf, sizeof buf);
  if (len >= sizeof buf || asprintf (&tmp, "%s.%d.tmp", stats_file,
                                     (int) getpid ()) == -1)
    return;
  FILE *fp = fopen (tmp, "w");
  if (fp == NULL) {
    nbdkit_debug ("fscache-stats=%s: %m", stats_file);
    return;
  }
  fwrite (buf, 1, len, fp);
  if (fclose (fp) == 0)
    rename (tmp, stats_file);
  else
    unlink (tmp);
}

static void
fscache_cleanup (nbdkit_backend *nxdata)
{
  if (cache) {
    fsc_cache_commit_all (cache);
    write_stats ();
    fsc_cache_close (cache);
    cache = NULL;
  }
  if (trace) {
    uint64_t rec = 0;
    if (fsc_trace_close (trace, &rec) == -1)
      nbdkit_error ("fscache-trace=%s: writing the trace: %m", trace_file);
    else
      nbdkit_debug ("fscache-trace=%s: %" PRIu64 " bytes recorded",
                    trace_file, rec);
    trace = NULL;
  }
}

#define fscache_config_help \
  "fscache-dir=DIR            Cache directory.\n" \
  "fscache-key=STRING         Identity of the upstream (default: derived).\n" \
  "fscache-block-size=SIZE    Cache block size (default 64K).\n" \
  "fscache-mode=writethrough|writearound   Write policy.\n" \
  "fscache-generation=STRING  Upstream version; a change discards the cache.\n" \
  "fscache-validate=sample|size|none       Coherency check at open.\n" \
  "fscache-verify=BOOL        Verify checksums of hits (default true).\n" \
  "fscache-readahead=SIZE     Sequential readahead window (default 4M, 0 off).\n" \
  "fscache-max-size=SIZE      Cap on each export's cached bytes (default none).\n" \
  "fscache-min-free=N%        Cache nothing below N% free space (default 1%).\n" \
  "fscache-min-free-inodes=N% The same for free inodes (default 1%).\n" \
  "fscache-offline=BOOL       Serve the cached copy read-only when the\n" \
  "                           upstream cannot be opened (default false).\n" \
  "fscache-stats=FILE         Write counters to FILE.\n" \
  "fscache-trace=FILE         Record the first touches of the export.\n" \
  "fscache-trace-max=SIZE     Stop the trace after SIZE bytes (default 1G)."

/*----------------------------------------------------------------------
 * Connections.
 */

/* The upstream context is ours, not nbdkit's (upstream.h says why):
 * opened here, prepared in .prepare, finalized in .finalize, closed in
 * .close, each through the connection's gate.  nbdkit therefore passes
 * NEXT == NULL to every callback, which use h->upstream instead.
 */
static void *
fscache_open (nbdkit_next_open *next, nbdkit_context *nxdata,
              int readonly, const char *exportname, int is_tls)
{
  struct handle *h = calloc (1, sizeof *h);
  if (h == NULL || (h->exportname = strdup (exportname)) == NULL) {
    nbdkit_error ("calloc: %m");
    free (h);
    return NULL;
  }
  h->up.pread = upstream_fsc_pread;
  h->up.opaque = &h->upstream;
  if (upstream_open (&h->upstream, nxdata, readonly, exportname) == -1 &&
      !offline) {
    nbdkit_error ("fscache: export \"%s\": cannot open the upstream "
                  "(fscache-offline=true would serve what is cached)",
                  exportname);
    upstream_close (&h->upstream);
    free (h->exportname);
    free (h);
    return NULL;
  }
  return h;
}

static void
fscache_close (void *handle)
{
  struct handle *h = handle;
  /* Only if .finalize did not run (a failed .prepare). */
  fsc_readahead_free (h->ra);
  if (h->obj)
    fsc_object_close (h->obj);
  upstream_close (&h->upstream);
  free (h->exportname);
  free (h);
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

/* The fingerprint for fscache-validate=sample: XXH3 of SAMPLE_COUNT
 * small reads at the start, the end and positions fixed by the key.
 * At most SAMPLE_COUNT * SAMPLE_SIZE = 32 KiB read upstream.  On an
 * upstream taking parallel requests the reads overlap, so that opening
 * an export costs one round trip to it rather than SAMPLE_COUNT (80 ms
 * on a 10 ms link); the fingerprint is the same either way.
 */
static int
fingerprint (struct upstream *up, const void *k, size_t klen, uint64_t size,
             uint64_t *fp)
{
  struct sample *sm = calloc (SAMPLE_COUNT, sizeof *sm);
  XXH3_state_t *s = XXH3_createState ();
  uint64_t seed = XXH3_64bits (k, klen);
  int r = -1, n = 0;

  if (sm == NULL || s == NULL || XXH3_64bits_reset (s) == XXH_ERROR) {
    errno = ENOMEM;
    goto out;
  }
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
    sm[n].up = up;
    sm[n].off = off;
    sm[n].n = MIN ((uint64_t) SAMPLE_SIZE, size - off);
  }
  /* Each read but the first in a thread (if it cannot start, here). */
  for (int i = 1; i < n; ++i)
    sm[i].started = upstream_parallel (up) &&
      pthread_create (&sm[i].thread, NULL, read_sample, &sm[i]) == 0;
  for (int i = 0; i < n; ++i) {
    if (sm[i].started)
      pthread_join (sm[i].thread, NULL);
    else
      read_sample (&sm[i]);
  }

  XXH3_64bits_update (s, &size, sizeof size);
  for (int i = 0; i < n; ++i) {
    if (sm[i].err) {
      errno = sm[i].err;
      goto out;
    }
    XXH3_64bits_update (s, &sm[i].off, sizeof sm[i].off);
    XXH3_64bits_update (s, sm[i].buf, sm[i].n);
  }
  *fp = XXH3_64bits_digest (s);
  r = 0;
 out:
  XXH3_freeState (s);
  free (sm);
  return r;
}

/* The object key: the upstream's identity, NUL, the export name. */
static char *
object_key (const char *exportname, size_t *len)
{
  const char *base = key ? key : derived_key;
  size_t blen = key ? strlen (key) : derived_len;
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

/* The trace follows the first export opened; the others' reads are
 * not recorded (one trace, one object: its replay warms that object).
 */
static void
bind_trace (struct handle *h, const char *k, size_t klen, uint64_t size)
{
  if (trace == NULL)
    return;
  uint64_t lo, hi;
  fsc_key_hash (k, klen, &lo, &hi);
  int r = fsc_trace_bind (trace, lo, hi, size, block_size);
  if (r == -1)
    nbdkit_error ("fscache-trace=%s: writing the header: %m", trace_file);
  else if (r == 0)
    nbdkit_debug ("fscache-trace: export \"%s\" is not traced (the trace "
                  "follows the first export opened)", h->exportname);
  h->traced = r == 1;
}

static void log_notices (struct handle *h);

static int
start_readahead (struct handle *h)
{
  if (readahead == 0 || fsc_object_state (h->obj) != FSC_OBJ_AVAILABLE ||
      !upstream_available (&h->upstream))
    return 0;
  h->ra = fsc_readahead_new (h->obj, readahead, upstream_max_background (),
                            &h->up);
  if (h->ra == NULL) {
    nbdkit_error ("fscache: readahead: %m");
    return -1;
  }
  return 0;
}

/* The upstream could not be opened and fscache-offline is set: serve
 * the recorded copy read-only, as it was last validated, if there is
 * one that passes every check but the fingerprint.
 */
static int
prepare_offline (struct handle *h, struct fsc_object_params *p)
{
  uint64_t size;
  if (fsc_object_peek_size (cache, p->key, p->key_len, block_size,
                            &size) == -1) {
    nbdkit_error ("fscache: export \"%s\": upstream unavailable, and no "
                  "cached copy to serve (%m)", h->exportname);
    return -1;
  }
  p->size = size;
  p->offline = true;
  struct fsc_open_info info = { .shared = true };
  h->obj = fsc_object_get (cache, p);
  if (h->obj == NULL &&
      fsc_object_open (cache, p, &h->obj, &info) == -1) {
    nbdkit_error ("fscache: opening the cache object: %m");
    return -1;
  }
  if (fsc_object_state (h->obj) != FSC_OBJ_AVAILABLE) {
    nbdkit_error ("fscache: export \"%s\": upstream unavailable, and the "
                  "cached copy cannot be served (%s)", h->exportname,
                  info.busy ? "another process holds it" :
                  info.reason != FSC_OK ? fsc_reason_name (info.reason) :
                  "withdrawn");
    fsc_object_close (h->obj);
    h->obj = NULL;
    return -1;
  }
  h->size = size;
  nbdkit_error ("fscache: warning: export \"%s\": upstream unavailable; "
                "serving the cached copy read-only, as last validated "
                "(%" PRIu64 " blocks cached; reads of the rest fail with "
                "EIO)", h->exportname, fsc_object_present_blocks (h->obj));
  return 0;
}

static int
fscache_prepare (nbdkit_next *next, void *handle, int readonly)
{
  struct handle *h = handle;
  size_t klen;
  CLEANUP_FREE char *k = object_key (h->exportname, &klen);
  if (k == NULL) {
    nbdkit_error ("malloc: %m");
    return -1;
  }
  if (upstream_prepare (&h->upstream) == -1)
    return -1;

  struct fsc_object_params p = {
    .key = k, .key_len = klen, .block_size = block_size,
    .verify = verify, .validate = validate, .generation = generation,
    .max_size = max_size,
  };
  if (!upstream_available (&h->upstream))
    return prepare_offline (h, &p);

  int64_t size = upstream_get_size (&h->upstream);
  if (size == -1)
    return -1;
  h->size = p.size = size;

  /* Another connection has the object open: it was validated then. */
  h->obj = fsc_object_get (cache, &p);
  if (h->obj) {
    bind_trace (h, k, klen, size);
    return start_readahead (h);
  }

  if (validate == FSC_VALIDATE_SAMPLE &&
      fingerprint (&h->upstream, k, klen, size, &p.fingerprint) == -1) {
    nbdkit_error ("fscache: reading the coherency sample upstream: %m");
    return -1;
  }

  struct fsc_open_info info;
  if (fsc_object_open (cache, &p, &h->obj, &info) == -1) {
    nbdkit_error ("fscache: opening the cache object: %m");
    return -1;
  }
  if (info.busy)
    nbdkit_error ("fscache: warning: export \"%s\" is cached by another "
                  "process using %s; serving it uncached",
                  h->exportname, dir);
  else if (info.err)
    nbdkit_error ("fscache: warning: export \"%s\": cache unusable (%s); "
                  "serving it uncached", h->exportname,
                  strerror (info.err));
  else if (!info.shared) {
    if (info.reason != FSC_OK && info.reason != FSC_REJ_NEW)
      nbdkit_error ("fscache: warning: export \"%s\": discarding cached "
                    "data (%s), starting cold", h->exportname,
                    fsc_reason_name (info.reason));
    if (info.old_version)
      nbdkit_error ("fscache: export \"%s\": cache index of format "
                    "version %u read and upgraded to version %u",
                    h->exportname, info.old_version, FSC_INDEX_VERSION);
    if (info.unclean)
      nbdkit_error ("fscache: warning: export \"%s\": previous user did "
                    "not shut down cleanly; the cache was checked and "
                    "kept", h->exportname);
    nbdkit_debug ("fscache: export \"%s\": %s, %" PRIu64 " blocks cached",
                  h->exportname, fsc_reason_name (info.reason),
                  info.present_blocks);
  }
  bind_trace (h, k, klen, size);
  return start_readahead (h);
}

static int
fscache_finalize (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  if (h->obj == NULL)
    return upstream_finalize (&h->upstream);
  /* Readahead threads use this connection's upstream: stop them first. */
  fsc_readahead_free (h->ra);
  h->ra = NULL;
  if (fsc_object_needs_fingerprint (h->obj)) {
    size_t klen;
    uint64_t fp;
    CLEANUP_FREE char *k = object_key (h->exportname, &klen);
    int64_t size = upstream_get_size (&h->upstream);
    /* If we cannot fingerprint, the index stays marked stale and the
     * next open starts cold: safe.
     */
    if (k && size >= 0 &&
        fingerprint (&h->upstream, k, klen, size, &fp) == 0)
      fsc_object_set_fingerprint (h->obj, fp);
  }
  log_notices (h);
  fsc_object_close (h->obj);
  h->obj = NULL;
  write_stats ();
  return upstream_finalize (&h->upstream);
}

/*----------------------------------------------------------------------
 * Data.
 */

/* Log what the cache object wants said once: withdrawal, full disk. */
static void
log_notices (struct handle *h)
{
  int err;
  unsigned n = fsc_object_take_notices (h->obj, &err);
  if (n & FSC_NOTICE_WITHDRAWN)
    nbdkit_error ("fscache: warning: export \"%s\": cache I/O error (%s); "
                  "cache withdrawn, serving from upstream", h->exportname,
                  strerror (err));
  if (n & FSC_NOTICE_BADQUOTA)
    nbdkit_error ("fscache: warning: export \"%s\": its quota record "
                  "(.quota) is malformed; ignored", h->exportname);
  if (n & FSC_NOTICE_NOFILL)
    nbdkit_error ("fscache: warning: export \"%s\": cache directory full; "
                  "not caching new blocks for a while", h->exportname);
}

/* Say that an upstream call failed: at most one line a second per
 * connection, counting the rest (an outage would flood the log).
 */
static void
log_upstream_error (struct handle *h, const char *what, uint64_t offset,
                    uint32_t count, int err)
{
  time_t now = time (NULL);
  time_t last = __atomic_load_n (&h->err_said, __ATOMIC_RELAXED);
  if (now == last ||
      !__atomic_compare_exchange_n (&h->err_said, &last, now, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    __atomic_add_fetch (&h->err_unsaid, 1, __ATOMIC_RELAXED);
    return;
  }
  unsigned unsaid = __atomic_exchange_n (&h->err_unsaid, 0, __ATOMIC_RELAXED);
  char more[64] = "";
  if (unsaid)
    snprintf (more, sizeof more, " (and %u more since the last message)",
              unsaid);
  nbdkit_error ("fscache: export \"%s\": upstream %s at %" PRIu64 "+%" PRIu32
                " failed: %s%s", h->exportname, what, offset, count,
                strerror (err), more);
}

static int
fscache_can_cache (nbdkit_next *next, void *handle)
{
  /* We implement NBD_CMD_CACHE ourselves: it fills our cache. */
  return NBDKIT_CACHE_NATIVE;
}

static int
fscache_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  /* A read that starts where this connection's last one ended is part
   * of a stream: its hits do not protect blocks from eviction.
   */
  uint64_t prev = __atomic_exchange_n (&h->last_end, offset + count,
                                       __ATOMIC_RELAXED);
  unsigned rflags = prev == offset && offset != 0 ? FSC_READ_SEQUENTIAL : 0;
  bool near = prev != 0 && offset <= prev + NEAR_BYTES &&
    offset + count + NEAR_BYTES >= prev;
  bool was_near = __atomic_exchange_n (&h->last_near, near, __ATOMIC_RELAXED);
  if (rflags || (near && was_near))
    rflags |= FSC_READ_NEAR;
  int r = fsc_object_read (h->obj, buf, count, offset, &h->up, rflags);
  *err = errno;
  log_notices (h);
  if (r == -1) {
    log_upstream_error (h, "read", offset, count, *err);
    return -1;
  }
  fsc_readahead_observe (h->ra, offset, count);
  if (h->traced)
    fsc_trace_note (trace, offset, count);
  return 0;
}

static int
fscache_cache (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  /* Exactly what is asked, in pieces at the ends: a client that
   * names the ranges it will read (nbd-fscache warm --trace) should
   * not pay for whole blocks around them.  Aligned ranges are whole
   * blocks anyway.
   */
  int r = fsc_object_prefetch (h->obj, offset, count, &h->up,
                               FSC_PREFETCH_EXACT);
  *err = errno;
  log_notices (h);
  if (r == -1)
    log_upstream_error (h, "read (cache)", offset, count, *err);
  return r;
}

static int
fscache_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  struct handle *h = handle;
  struct fsc_write w;
  if (fsc_object_write_begin (h->obj, offset, count,
                              mode == MODE_WRITETHROUGH, &w) == -1) {
    *err = errno;
    nbdkit_error ("fscache: write: %m");
    return -1;
  }
  int r = upstream_pwrite (&h->upstream, buf, count, offset, flags, err);
  fsc_object_write_end (h->obj, &w, buf, r == 0);
  log_notices (h);
  if (r == -1)
    log_upstream_error (h, "write", offset, count, *err);
  return r;
}

/* Zero and trim: drop the blocks (durably), then the upstream op
 * (upstream_zero or upstream_trim, which share a signature).
 */
typedef int upstream_range_op (struct upstream *u, uint32_t count,
                               uint64_t offset, uint32_t flags, int *err);

static int
drop_then (struct handle *h, upstream_range_op *op,
           const char *what, uint32_t count, uint64_t offset,
           uint32_t flags, int *err)
{
  struct fsc_write w;
  if (fsc_object_write_begin (h->obj, offset, count, false, &w) == -1) {
    *err = errno;
    nbdkit_error ("fscache: %s: %m", what);
    return -1;
  }
  int r = op (&h->upstream, count, offset, flags, err);
  fsc_object_write_end (h->obj, &w, NULL, r == 0);
  log_notices (h);
  if (r == -1)
    log_upstream_error (h, what, offset, count, *err);
  return r;
}

static int
fscache_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return drop_then (handle, upstream_zero, "zero", count, offset, flags, err);
}

static int
fscache_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  return drop_then (handle, upstream_trim, "trim", count, offset, flags, err);
}

static int
fscache_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct handle *h = handle;
  if (upstream_flush (&h->upstream, flags, err) == -1)
    return -1;
  /* A cache failure only withdraws the object: not the client's error. */
  fsc_object_commit (h->obj);
  log_notices (h);
  return 0;
}

/* The queries: the upstream's answers (gated), or the read-only answers
 * of a connection without upstream (upstream.h).
 */
static int64_t
fscache_get_size (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return h->size;
}

static const char *
fscache_export_description (nbdkit_next *next, void *handle)
{
  struct handle *h = handle;
  return upstream_export_description (&h->upstream);
}

static int
fscache_block_size (nbdkit_next *next, void *handle, uint32_t *minimum,
                    uint32_t *preferred, uint32_t *maximum)
{
  struct handle *h = handle;
  return upstream_block_size (&h->upstream, minimum, preferred, maximum);
}

#define QUERY(name)                                                     \
  static int                                                            \
  fscache_##name (nbdkit_next *next, void *handle)                      \
  {                                                                     \
    struct handle *h = handle;                                          \
    return upstream_##name (&h->upstream);                              \
  }
QUERY (can_write)
QUERY (can_flush)
QUERY (is_rotational)
QUERY (can_trim)
QUERY (can_zero)
QUERY (can_fast_zero)
QUERY (can_extents)
QUERY (can_fua)
QUERY (can_multi_conn)

static int
fscache_preconnect (nbdkit_next_preconnect *next, nbdkit_backend *nxdata,
                    int readonly)
{
  return upstream_preconnect (next, nxdata, readonly);
}

static int
fscache_list_exports (nbdkit_next_list_exports *next, nbdkit_backend *nxdata,
                      int readonly, int is_tls,
                      struct nbdkit_exports *exports)
{
  return upstream_list_exports (next, nxdata, readonly, exports);
}

static const char *
fscache_default_export (nbdkit_next_default_export *next,
                        nbdkit_backend *nxdata, int readonly, int is_tls)
{
  return upstream_default_export (next, nxdata, readonly);
}

/* Extents pass through, but gated like every other upstream call. */
static int
fscache_extents (nbdkit_next *next, void *handle, uint32_t count,
                 uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  struct handle *h = handle;
  return upstream_extents (&h->upstream, count, offset, flags, extents, err);
}

static int
fscache_thread_model (void)
{
  return NBDKIT_THREAD_MODEL_PARALLEL;
}

static struct nbdkit_filter filter = {
  .name = "fscache",
  .longname = "nbdkit persistent local cache filter",
  .unload = fscache_unload,
  .config = fscache_config,
  .config_complete = fscache_config_complete,
  .config_help = fscache_config_help,
  .thread_model = fscache_thread_model,
  .get_ready = fscache_get_ready,
  .after_fork = fscache_after_fork,
  .cleanup = fscache_cleanup,
  .preconnect = fscache_preconnect,
  .list_exports = fscache_list_exports,
  .default_export = fscache_default_export,
  .open = fscache_open,
  .close = fscache_close,
  .prepare = fscache_prepare,
  .finalize = fscache_finalize,
  .get_size = fscache_get_size,
  .export_description = fscache_export_description,
  .block_size = fscache_block_size,
  .can_write = fscache_can_write,
  .can_flush = fscache_can_flush,
  .is_rotational = fscache_is_rotational,
  .can_trim = fscache_can_trim,
  .can_zero = fscache_can_zero,
  .can_fast_zero = fscache_can_fast_zero,
  .can_extents = fscache_can_extents,
  .can_fua = fscache_can_fua,
  .can_multi_conn = fscache_can_multi_conn,
  .can_cache = fscache_can_cache,
  .pread = fscache_pread,
  .pwrite = fscache_pwrite,
  .zero = fscache_zero,
  .trim = fscache_trim,
  .flush = fscache_flush,
  .cache = fscache_cache,
  .extents = fscache_extents,
};

NBDKIT_REGISTER_FILTER (filter)
