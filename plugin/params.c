/* nbdkit-fscache-filter: parsing and checking the fscache-*
 * parameters (params.h has the struct and the life of its values).
 *
 * Each parameter is checked where it is parsed, so that a bad one is
 * an error naming it at start-up, never a surprise later.  What needs
 * every parameter at once (the default directory, the key) waits for
 * params_config_complete.  Opening the cache and the trace does not
 * happen here: that is the filter's state (fscache.c), not a
 * parameter.
 *
 * The derived key: every plugin parameter this filter sees, as
 * "KEY=VALUE\n" in the order given, values naming existing files made
 * absolute.  It is the upstream's identity when fscache-key is not
 * set.  Once complete it is replaced by its 128-bit hash, because the
 * parameters may hold passwords and the identity ends up in file
 * names and indexes.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "keyenc.h"
#include "manifest.h"
#include "wlog.h"
#include "utils.h"

#include "identity.h"
#include "params.h"
#include "say.h"

struct fscache_params params = {
  .block_size = 64 * 1024,
  .mode = MODE_WRITETHROUGH,
  .validate = FSC_VALIDATE_SAMPLE,
  .verify = true,
  .readahead = 4 * 1024 * 1024,
  .offline = false,
  .min_free = 1,
  .min_free_inodes = 1,
  .trace_max = UINT64_C (1) << 30,
  /* 1 GiB of dirty data: a VM's burst of writes (an install, a build)
   * stays local, it drains in about 90 s over 100 Mbit/s, and its
   * bookkeeping costs at most about 20 MiB of memory (4 KiB writes).
   */
  .dirty_max = FSC_WLOG_DEFAULT_DIRTY_MAX,
  /* 30 s: well inside systemd's default stop timeout of 90 s; what is
   * left stays on disk for the next proxy.
   */
  .writeback_drain = 30,
  /* See the man page, fscache-upstream-connections: measured in
   * docs/benchmarks.md.
   */
  .upstream_connections = 8,
  .peer_fanout = 8,
  /* core/base/peertree.c, T3: a node's parents per object at most 16,
   * whatever the fleet's size (docs/benchmarks.md, "Stripes").
   */
  .peer_stripes = 16,
  .peer_max_inbound = 256,
  .catchup = true,
  .latency_guard = true,
  .worker_yield = 25,
  .fill_probe = true,
  .mrc = true,
};

const char params_help[] =
  "fscache-dir=DIR            Cache directory.\n"
  "fscache-key=STRING         Identity of the upstream (default: derived).\n"
  "fscache-block-size=SIZE    Cache block size (default 64K).\n"
  "fscache-mode=writethrough|writearound|writeback   Write policy.\n"
  "fscache-generation=STRING  Upstream version; a change discards the cache.\n"
  "fscache-validate=sample|size|none       Coherency check at open.\n"
  "fscache-verify=BOOL        Verify checksums of hits (default true).\n"
  "fscache-readahead=SIZE     Sequential readahead window (default 4M, 0 off).\n"
  "fscache-upstream-connections=N  Contexts for a serial upstream (default 8, 16 over curl;\n"
  "                           given, over a parallel plugin too).\n"
  "fscache-catchup=BOOL       Fill skipped reads later, when idle (default true).\n"
  "fscache-mrc=BOOL           Keep each export's miss-ratio curve, for\n"
  "                           nbd-fscache advise (default true).\n"
  "fscache-worker-yield=US    A worker that served reads back to back for\n"
  "                           US microseconds without sleeping offers its\n"
  "                           CPU (default 25, 0 never).\n"
  "fscache-latency-guard=BOOL  Read hits upstream while the cache disk is\n"
  "                           slower than the upstream (default true; not\n"
  "                           in writeback mode).\n"
  "fscache-fill-probe=BOOL    Skip fills while they slow the clients, as\n"
  "                           measured on the stream (default true).\n"
  "fscache-max-size=SIZE      Cap on each export's cached bytes (default none).\n"
  "fscache-min-free=N%        Cache nothing below N% free space (default 1%).\n"
  "fscache-min-free-inodes=N% The same for free inodes (default 1%).\n"
  "fscache-offline=BOOL       Serve the cached copy read-only when the\n"
  "                           upstream cannot be opened (default false).\n"
  "fscache-stats=FILE         Write counters to FILE.\n"
  "fscache-trace=FILE         Record the first touches of the export.\n"
  "fscache-trace-max=SIZE     Stop the trace after SIZE bytes (default 1G).\n"
  "fscache-dirty-max=SIZE     Writeback: dirty data before writes wait\n"
  "                           (default 1G).\n"
  "fscache-writeback-drain=SECONDS  Writeback: at exit, write back for up\n"
  "                           to this long (default 30).\n"
  "fscache-peers=FILE         The fleet: one NBD URI per line, each a proxy\n"
  "                           of this filter; misses go to a range's owner.\n"
  "fscache-peers=dns:NAME[:PORT] The fleet: NAME's addresses, or SRV records.\n"
  "fscache-peer-self=URI      This node's line in fscache-peers.\n"
  "fscache-peer-max-inbound=N  Peers' connections served at once (default\n"
  "                           256); more are answered busy.\n"
  "fscache-peer-fanout=K      Each node serves a range to at most K others\n"
  "                           (a tree per range; default 8, 0: flat).\n"
  "fscache-peer-stripes=S     The ranges share S trees, so a node asks\n"
  "                           at most S peers (default 16, 0: a tree per\n"
  "                           range).\n"
  "fscache-peer-tls-psk=FILE  Peers speak TLS with this pre-shared key.\n"
  "fscache-peer-tls-certificates=DIR  Peers speak TLS, each with its own\n"
  "                           certificate from the fleet's CA.\n"
  "fscache-peer-only=BOOL     Serve fleet peers' connections alone.\n"
  "fscache-manifest=FILE      The image's manifest (nbd-fscache manifest):\n"
  "                           every block from a peer is checked.";

/* VALUE as a decimal number from 0 to MAX, digits only, into *N.
 * Returns 0, or -1 if it is not one.
 */
static int
parse_count (const char *value, unsigned long max, unsigned long *n)
{
  char *end;
  errno = 0;
  *n = strtoul (value, &end, 10);
  if (errno || end == value || *end || !(*value >= '0' && *value <= '9') ||
      *n > max)
    return -1;
  return 0;
}

void
params_free (void)
{
  free (params.dir);
  free (params.key);
  free (params.derived_key);
  free (params.generation);
  free (params.stats_file);
  free (params.trace_file);
  free (params.peers_file);
  free (params.peer_self);
  free (params.peer_psk);
  free (params.peer_certs);
  free (params.manifest_file);
  fsc_manifest_close (params.manifest);
}

/* Read fscache-manifest=FILE (core/base/manifest.c) and square it with
 * fscache-generation: the manifest's generation is taken as the
 * image's if none is set, and a different one is another image.
 */
static int
load_manifest (void)
{
  if (fsc_manifest_open (params.manifest_file, &params.manifest) == -1) {
    nbdkit_error ("fscache-manifest=%s: %s", params.manifest_file,
                  errno == EBADMSG ? "its root does not match its contents "
                  "(damaged, or edited): write it again with nbd-fscache "
                  "manifest"
                  : errno == EINVAL ? "not a manifest of this version "
                  "(nbd-fscache manifest writes one)" : strerror (errno));
    return -1;
  }
  const char *g = fsc_manifest_generation (params.manifest);
  if (*g && params.generation && strcmp (g, params.generation) != 0) {
    nbdkit_error ("fscache-manifest=%s is of generation \"%s\", and "
                  "fscache-generation=%s: they are of two versions of the "
                  "image", params.manifest_file, g, params.generation);
    return -1;
  }
  if (*g && params.generation == NULL &&
      (params.generation = strdup (g)) == NULL) {
    nbdkit_error ("strdup: %m");
    return -1;
  }
  char root[65];
  fsc_manifest_root_hex (params.manifest, root);
  nbdkit_debug ("fscache-manifest=%s: %" PRIu64 " bytes in blocks of %"
                PRIu32 ", generation \"%s\", root %s", params.manifest_file,
                fsc_manifest_size (params.manifest),
                fsc_manifest_block_size (params.manifest), g, root);
  return 0;
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
  char *p = realloc (params.derived_key, params.derived_len + add + 1);
  if (p == NULL) {
    nbdkit_error ("realloc: %m");
    free (real);
    return -1;
  }
  params.derived_key = p;
  params.derived_len += sprintf (p + params.derived_len, "%s=%s\n", k, v);
  free (real);
  return 0;
}

static int
set_dir (const char *k, const char *value)
{
  free (params.dir);
  if (*value == '\0') {
    nbdkit_error ("fscache-dir: must not be empty");
    return -1;
  }
  params.dir = nbdkit_absolute_path (value);
  return params.dir ? 0 : -1;
}

static int
set_key (const char *k, const char *value)
{
  if (*value == '\0') {
    nbdkit_error ("fscache-key: must not be empty");
    return -1;
  }
  free (params.key);
  params.key = strdup (value);
  return params.key ? 0 : -1;
}

static int
set_block_size (const char *k, const char *value)
{
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
  params.block_size = r;
  return 0;
}

static int
set_mode (const char *k, const char *value)
{
  if (strcmp (value, "writethrough") == 0)
    params.mode = MODE_WRITETHROUGH;
  else if (strcmp (value, "writearound") == 0)
    params.mode = MODE_WRITEAROUND;
  else if (strcmp (value, "writeback") == 0)
    params.mode = MODE_WRITEBACK;
  else {
    nbdkit_error ("fscache-mode=%s: must be writethrough, writearound "
                  "or writeback", value);
    return -1;
  }
  return 0;
}

static int
set_generation (const char *k, const char *value)
{
  if (strlen (value) > FSC_GEN_MAX) {
    nbdkit_error ("fscache-generation: longer than %d bytes", FSC_GEN_MAX);
    return -1;
  }
  free (params.generation);
  params.generation = strdup (value);
  return params.generation ? 0 : -1;
}

static int
set_validate (const char *k, const char *value)
{
  if (strcmp (value, "sample") == 0)
    params.validate = FSC_VALIDATE_SAMPLE;
  else if (strcmp (value, "size") == 0)
    params.validate = FSC_VALIDATE_SIZE;
  else if (strcmp (value, "none") == 0)
    params.validate = FSC_VALIDATE_NONE;
  else {
    nbdkit_error ("fscache-validate=%s: must be sample, size or none",
                  value);
    return -1;
  }
  return 0;
}

/* KEY=VALUE, a boolean, into *OUT. */
static int
set_bool (const char *k, const char *value, bool *out)
{
  int r = nbdkit_parse_bool (value);
  if (r == -1) {
    nbdkit_error ("%s=%s: not a boolean", k, value);
    return -1;
  }
  *out = r;
  return 0;
}

/* The setters of the boolean parameters: set_bool into params.FIELD. */
#define BOOL_SETTER(field)                                      \
  static int                                                    \
  set_##field (const char *k, const char *value)                \
  {                                                             \
    return set_bool (k, value, &params.field);                  \
  }
BOOL_SETTER (verify)
BOOL_SETTER (catchup)
BOOL_SETTER (mrc)
BOOL_SETTER (latency_guard)
BOOL_SETTER (fill_probe)
BOOL_SETTER (peer_only)
BOOL_SETTER (offline)

static int
set_readahead (const char *k, const char *value)
{
  int64_t r = nbdkit_parse_size (value);
  if (r == -1) {
    nbdkit_error ("fscache-readahead=%s: not a size", value);
    return -1;
  }
  if (r > 1024 * 1024 * 1024) {
    nbdkit_error ("fscache-readahead=%s: at most 1G", value);
    return -1;
  }
  params.readahead = r;
  return 0;
}

/* K=VALUE, a number of UNIT from 0 to MAX, into *N; said if not. */
static int
set_count (const char *k, const char *value, unsigned long max,
           const char *unit, unsigned long *n)
{
  if (parse_count (value, max, n) == -1) {
    nbdkit_error ("%s=%s: must be a number of %s from 0 to %lu",
                  k, value, unit, max);
    return -1;
  }
  return 0;
}

/* The setters of the plain count parameters: set_count into
 * params.FIELD.
 */
#define COUNT_SETTER(field, max, unit)                          \
  static int                                                    \
  set_##field (const char *k, const char *value)                \
  {                                                             \
    unsigned long n;                                            \
    if (set_count (k, value, (max), (unit), &n) == -1)          \
      return -1;                                                \
    params.field = n;                                           \
    return 0;                                                   \
  }
COUNT_SETTER (worker_yield, 1000000, "microseconds")
COUNT_SETTER (writeback_drain, 86400, "seconds")

static int
set_upstream_connections (const char *k, const char *value)
{
  unsigned long n;
  if (set_count (k, value, 64, "connections", &n) == -1)
    return -1;
  params.upstream_connections = n;
  params.upstream_connections_given = true;
  return 0;
}

static int
set_peer_fanout (const char *k, const char *value)
{
  unsigned long n;
  if (parse_count (value, 65536, &n) == -1) {
    nbdkit_error ("fscache-peer-fanout=%s: must be a number of askers from "
                  "1 to 65536, or 0 for a flat fleet", value);
    return -1;
  }
  params.peer_fanout = n;
  return 0;
}

static int
set_peer_stripes (const char *k, const char *value)
{
  unsigned long n;
  if (parse_count (value, 65536, &n) == -1) {
    nbdkit_error ("fscache-peer-stripes=%s: must be a number of trees from "
                  "1 to 65536, or 0 for a tree per range", value);
    return -1;
  }
  params.peer_stripes = n;
  return 0;
}

static int
set_peer_max_inbound (const char *k, const char *value)
{
  unsigned long n;
  if (parse_count (value, 1000000, &n) == -1 || n == 0) {
    nbdkit_error ("fscache-peer-max-inbound=%s: must be a number of "
                  "connections from 1 to 1000000", value);
    return -1;
  }
  params.peer_max_inbound = n;
  return 0;
}

static int
set_max_size (const char *k, const char *value)
{
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
  params.max_size = r;
  return 0;
}

static int
set_min_free (const char *k, const char *value)
{
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
    params.min_free = pct;
  else
    params.min_free_inodes = pct;
  return 0;
}

static int
set_stats (const char *k, const char *value)
{
  free (params.stats_file);
  params.stats_file = nbdkit_absolute_path (value);
  return params.stats_file ? 0 : -1;
}

static int
set_peer_certs (const char *k, const char *value)
{
  free (params.peer_certs);
  params.peer_certs = nbdkit_absolute_path (value);
  return params.peer_certs ? 0 : -1;
}

static int
set_manifest (const char *k, const char *value)
{
  free (params.manifest_file);
  params.manifest_file = nbdkit_absolute_path (value);
  return params.manifest_file ? 0 : -1;
}

static int
set_peers (const char *k, const char *value)
{
  char **p = strcmp (k, "fscache-peers") == 0 ? &params.peers_file
    : &params.peer_psk;
  free (*p);
  /* dns:NAME:PORT or dns:NAME (SRV) is a name to resolve, not a path
   * (memberdns.c).
   */
  if (p == &params.peers_file && strncmp (value, "dns:", 4) == 0) {
    const char *port = strrchr (value + 4, ':');
    if (value[4] == 0 || value[4] == ':' ||
        (port && (port[1] == 0 ||
                  strspn (port + 1, "0123456789") != strlen (port + 1)))) {
      nbdkit_error ("fscache-peers=%s: dns: takes NAME:PORT (the fleet's "
                    "name, whose addresses are its members, and the port "
                    "they serve on) or NAME (its SRV records)", value);
      *p = NULL;
      return -1;
    }
    *p = strdup (value);
  }
  else
    *p = nbdkit_absolute_path (value);
  return *p ? 0 : -1;
}

static int
set_peer_self (const char *k, const char *value)
{
  if (*value == 0) {
    nbdkit_error ("fscache-peer-self: empty; it must be this node's line "
                  "in fscache-peers");
    return -1;
  }
  free (params.peer_self);
  params.peer_self = strdup (value);
  if (params.peer_self == NULL) {
    nbdkit_error ("strdup: %m");
    return -1;
  }
  return 0;
}

static int
set_trace (const char *k, const char *value)
{
  free (params.trace_file);
  params.trace_file = nbdkit_absolute_path (value);
  return params.trace_file ? 0 : -1;
}

/* K=VALUE, a size of at least MIN (said as MINS), into *OUT. */
static int
set_size_min (const char *k, const char *value, int64_t min,
              const char *mins, uint64_t *out)
{
  int64_t r = nbdkit_parse_size (value);
  if (r == -1 || r < min) {
    nbdkit_error ("%s=%s: %s", k, value, r == -1 ? "not a size" : mins);
    return -1;
  }
  *out = r;
  return 0;
}

static int
set_trace_max (const char *k, const char *value)
{
  return set_size_min (k, value, 4096, "at least 4K", &params.trace_max);
}

static int
set_dirty_max (const char *k, const char *value)
{
  return set_size_min (k, value, 1024 * 1024, "at least 1M",
                       &params.dirty_max);
}

/* The fscache-* parameters and their setters: each checks VALUE,
 * says what is wrong with it, and stores it in PARAMS.
 */
static const struct {
  const char *name;
  int (*set) (const char *k, const char *value);
} setters[] = {
  { "fscache-dir", set_dir },
  { "fscache-key", set_key },
  { "fscache-block-size", set_block_size },
  { "fscache-mode", set_mode },
  { "fscache-generation", set_generation },
  { "fscache-validate", set_validate },
  { "fscache-verify", set_verify },
  { "fscache-readahead", set_readahead },
  { "fscache-catchup", set_catchup },
  { "fscache-latency-guard", set_latency_guard },
  { "fscache-worker-yield", set_worker_yield },
  { "fscache-fill-probe", set_fill_probe },
  { "fscache-mrc", set_mrc },
  { "fscache-upstream-connections", set_upstream_connections },
  { "fscache-max-size", set_max_size },
  { "fscache-min-free", set_min_free },
  { "fscache-min-free-inodes", set_min_free },
  { "fscache-offline", set_offline },
  { "fscache-stats", set_stats },
  { "fscache-peers", set_peers },
  { "fscache-peer-tls-psk", set_peers },
  { "fscache-peer-self", set_peer_self },
  { "fscache-peer-fanout", set_peer_fanout },
  { "fscache-peer-stripes", set_peer_stripes },
  { "fscache-peer-max-inbound", set_peer_max_inbound },
  { "fscache-manifest", set_manifest },
  { "fscache-peer-tls-certificates", set_peer_certs },
  { "fscache-peer-only", set_peer_only },
  { "fscache-trace", set_trace },
  { "fscache-trace-max", set_trace_max },
  { "fscache-dirty-max", set_dirty_max },
  { "fscache-writeback-drain", set_writeback_drain },
};

int
params_config (const char *k, const char *value)
{
  for (size_t i = 0; i < sizeof setters / sizeof setters[0]; ++i)
    if (strcmp (k, setters[i].name) == 0)
      return setters[i].set (k, value);
  if (strncmp (k, "fscache-", 8) == 0) {
    nbdkit_error ("unknown parameter %s (see nbdkit-fscache-filter(1))", k);
    return -1;
  }
  if (derive_key (k, value) == -1)
    return -1;
  return 1;
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

/* The fleet's parameters (peers.c): together as they must be, the
 * certificates readable, the manifest read.  0, or -1 having said why.
 */
static int
check_fleet (void)
{
  if ((params.peer_self || params.peer_psk || params.peer_certs) &&
      params.peers_file == NULL) {
    nbdkit_error ("fscache-peer-self, fscache-peer-tls-psk and "
                  "fscache-peer-tls-certificates need fscache-peers=FILE "
                  "(the fleet's list of proxies)");
    return -1;
  }
  if (params.peer_only && params.peers_file == NULL) {
    nbdkit_error ("fscache-peer-only needs fscache-peers=FILE: it serves "
                  "a fleet's peers and nothing else");
    return -1;
  }
  if (params.peer_psk && params.peer_certs) {
    nbdkit_error ("fscache-peer-tls-psk and fscache-peer-tls-certificates: "
                  "one or the other (a fleet's key, or a certificate per "
                  "node)");
    return -1;
  }
  if (params.peer_certs) {
    static const char *const need[] = { "ca-cert.pem", "client-cert.pem",
                                        "client-key.pem" };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; ++i) {
      CLEANUP_FREE char *f = NULL;
      if (asprintf (&f, "%s/%s", params.peer_certs, need[i]) == -1 ||
          access (f, R_OK) == -1) {
        nbdkit_error ("fscache-peer-tls-certificates=%s: cannot read %s "
                      "(the directory holds the fleet's ca-cert.pem, this "
                      "node's client-cert.pem and client-key.pem for "
                      "asking, server-cert.pem and server-key.pem for "
                      "nbdkit --tls-certificates, and ca-crl.pem)",
                      params.peer_certs, need[i]);
        return -1;
      }
    }
  }
  if (params.peers_file && params.peer_self == NULL) {
    nbdkit_error ("fscache-peers=%s: set fscache-peer-self=URI too, to say "
                  "which line of the file is this node", params.peers_file);
    return -1;
  }
  if (params.manifest_file && load_manifest () == -1)
    return -1;
  /* Peers' data is trusted without a manifest (issue 43): then at least
   * the image is versioned by hand, not told apart by 8 samples only.
   */
  if (params.peers_file && params.manifest == NULL &&
      params.generation == NULL) {
    nbdkit_error ("fscache-peers=%s: set fscache-manifest=FILE (nbd-fscache "
                  "manifest: every block from a peer is checked against "
                  "the image), or at least fscache-generation=STRING (the "
                  "image's version; then peers are trusted: any node can "
                  "put any data in this cache)", params.peers_file);
    return -1;
  }
  return 0;
}

int
params_config_complete (void)
{
  /* A test knob (tests/README.md): a small resident set makes a small
   * cache page its groups in and out as a big one does.
   */
  const char *rg = getenv ("NBD_FSCACHE_RESIDENT_GROUPS");
  if (rg && *rg) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull (rg, &end, 10);
    if (errno || *end || v == 0 || rg[0] == '-') {
      nbdkit_error ("NBD_FSCACHE_RESIDENT_GROUPS=%s: not a positive number",
                    rg);
      return -1;
    }
    params.resident_groups = v;
  }
  if (check_fleet () == -1)
    return -1;
  if (params.dir == NULL && (params.dir = default_dir ()) == NULL)
    return -1;
  if (params.key == NULL && params.derived_key == NULL) {
    nbdkit_error ("fscache-key: not set and no plugin parameters to "
                  "derive it from; set fscache-key=STRING");
    return -1;
  }
  /* A key given by hand is the identity the user says it is, whatever
   * serves it; only a sample of the data would tell two upstreams of one
   * size apart.  With fscache-generation too, the user versions the
   * upstream by hand, as the warning itself advises: nothing to say.
   */
  if (params.key && params.validate != FSC_VALIDATE_SAMPLE &&
      params.generation == NULL)
    say_warning ("fscache-key=%s with fscache-validate=%s: "
                 "any upstream of the same size served with this key "
                 "(another plugin, other filters, another image) shares "
                 "this cache object and is served its data; give each "
                 "upstream its own fscache-key, or change "
                 "fscache-generation when the upstream changes",
                 params.key,
                 params.validate == FSC_VALIDATE_SIZE ? "size" : "none");
  if (params.key == NULL) {
    /* Two plugins (or filter stacks) may take the same parameters: the
     * plugin's name and the filters below us are part of the identity
     * (identity.c).
     */
    CLEANUP_FREE char *stack = identity_stack ();
    if (stack == NULL) {
      nbdkit_error ("fscache: the plugin's name: %m");
      return -1;
    }
    nbdkit_debug ("fscache: derived key from: %s", stack);
    char *p = realloc (params.derived_key,
                       params.derived_len + strlen (stack) + 1);
    if (p == NULL) {
      nbdkit_error ("realloc: %m");
      return -1;
    }
    params.derived_key = p;
    memcpy (p + params.derived_len, stack, strlen (stack) + 1);
    params.derived_len += strlen (stack);
    /* The parameters may hold passwords: keep only their hash, which
     * is all the identity needs, out of file names and indexes.
     */
    uint64_t lo, hi;
    char *hashed;
    fsc_key_hash (params.derived_key, params.derived_len, &lo, &hi);
    int n = asprintf (&hashed, "params-%016" PRIx64 "%016" PRIx64, hi, lo);
    if (n == -1) {
      nbdkit_error ("asprintf: %m");
      return -1;
    }
    free (params.derived_key);
    params.derived_key = hashed;
    params.derived_len = n;
  }
  return 0;
}
