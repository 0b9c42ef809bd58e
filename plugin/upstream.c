/* nbdkit-fscache-filter: gated calls to the upstream.  See upstream.h
 * for the design: which gate each thread model needs, why a gate is
 * held across one upstream call and nothing else, and what a
 * connection without an upstream answers.
 */
#include <config.h>

#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "blocksize.h"
#include "ownctx.h"
#include "quiet.h"
#include "readahead.h"
#include "upstream.h"
#include "yield.h"

/* Set once in .get_ready, before any connection; read-only after.
 * Until then, the most careful model.
 */
static int thread_model = NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS;

/* The gate of serialize_all_requests and serialize_connections. */
static pthread_mutex_t server_gate = PTHREAD_MUTEX_INITIALIZER;

/* Invariant U1: the filter's calls into the stack that may intern a
 * string with no connection to hold it (.open of a context of our own,
 * .export_description) run one at a time.  nbdkit 1.32 keeps those
 * strings (nbdkit_strdup_intern: the log and exportname filters' .open,
 * the nbd and sh plugins' export descriptions) in one global vector
 * that it appends to without a lock, since only .config was meant to
 * run there; contexts of our own (pool workers, catch-up, the view,
 * the writeback writer, a peer's host context) have no connection, so
 * two opened at once raced on its realloc: a double free, and nbdkit
 * died (the log filter over curl with a pool: 4 runs of 12 of
 * test-fscache-pool.sh under ASan; CI saw the crash).  Opens are
 * serialized only when a filter that interns in .open is loaded (the
 * three of nbdkit 1.32: log, exportname, ext2; a language plugin's
 * contexts are never opened by the filter, ownctx.c), since an open
 * may take a round trip (curl's HEAD) and a pool of 16 would open one
 * after another.  Broken by tests/filter/test-fscache-pool.sh, part 6.
 */
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t intern_once = PTHREAD_ONCE_INIT;
static bool intern_in_open;     /* such a filter is loaded */

static int
find_interning (struct dl_phdr_info *info, size_t size, void *data)
{
  static const char *const names[] = {
    "nbdkit-log-filter.so", "nbdkit-exportname-filter.so",
    "nbdkit-ext2-filter.so",
  };
  const char *base = info->dlpi_name ? strrchr (info->dlpi_name, '/') : NULL;
  base = base ? base + 1 : info->dlpi_name ? info->dlpi_name : "";
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
    if (strcmp (base, names[i]) == 0)
      return *(bool *) data = true;
  return 0;
}

static void
intern_check (void)
{
  dl_iterate_phdr (find_interning, &intern_in_open);
}

/* The intern lock for opening a context of our own (SHARED), or NULL. */
static pthread_mutex_t *
open_lock (bool shared)
{
  if (!shared)
    return NULL;
  pthread_once (&intern_once, intern_check);
  return intern_in_open ? &intern_lock : NULL;
}

void
upstream_set_thread_model (int model)
{
  thread_model = model;
}

const char *
upstream_thread_model_name (void)
{
  switch (thread_model) {
  case NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS:
    return "serialize_connections";
  case NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS:
    return "serialize_all_requests";
  case NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS:
    return "serialize_requests";
  default:
    return "parallel";
  }
}

unsigned
upstream_max_background (void)
{
  return thread_model >= NBDKIT_THREAD_MODEL_PARALLEL ? FSC_RA_THREADS : 1;
}

static inline void
gate_release (pthread_mutex_t **gate)
{
  if (*gate)
    pthread_mutex_unlock (*gate);
}

/* Hold GATE (if not NULL) to the end of the enclosing scope (HOLD_ as
 * HOLD, its variable named by the line, so that a scope holds two).
 */
#define HOLD_CAT_(a, b) a##b
#define HOLD_(gate, var)                                                \
  pthread_mutex_t *var __attribute__ ((cleanup (gate_release))) = (gate); \
  if (var)                                                              \
    pthread_mutex_lock (var)
#define HOLD_AT_(gate, line) HOLD_ (gate, HOLD_CAT_ (gate_held_, line))
#define HOLD(gate) HOLD_AT_ (gate, __LINE__)

/* U's gate, for calls on its context. */
#define GATED(u) HOLD ((u)->gate)

/* The server's gate, for server-wide calls under the models that
 * need it.
 */
#define SERVER_GATED()                                                  \
  HOLD (thread_model <= NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS ?    \
        &server_gate : NULL)

/* Open U's context on BACKEND, gated by the gate the thread model
 * gives a connection: none, its own, or the server's.  SHARED: outside
 * any client connection (the writeback writer's), one more
 * "connection" under serialize_requests.
 */
static int
open_gated (struct upstream *u, nbdkit_backend *backend, int readonly,
            const char *exportname, bool shared)
{
  u->next = NULL;
  u->prepared = false;
  u->offline_said = false;
  u->bs_min = u->bs_max = 0;
  pthread_mutex_init (&u->own, NULL);
  if (thread_model >= NBDKIT_THREAD_MODEL_PARALLEL)
    u->gate = NULL;
  else if (thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS)
    u->gate = &u->own;
  else
    u->gate = &server_gate;

  GATED (u);
  HOLD (open_lock (shared));
  u->next = nbdkit_next_context_open (backend, readonly, exportname, shared);
  return u->next ? 0 : -1;
}

int
upstream_open (struct upstream *u, nbdkit_context *context, int readonly,
               const char *exportname)
{
  return open_gated (u, nbdkit_context_get_backend (context), readonly,
                     exportname, false);
}

int
upstream_open_shared (struct upstream *u, nbdkit_backend *backend,
                      int readonly, const char *exportname)
{
  bool quiet = ownctx_opening ();
  int r = open_gated (u, backend, readonly, exportname, true);
  if (quiet)
    quiet_end ();
  return r;
}

int
upstream_open_own (struct upstream *u, nbdkit_backend *backend, int readonly,
                   const char *exportname, uint64_t size, int64_t *found)
{
  int64_t s = -1;
  *found = -1;
  if (upstream_open_shared (u, backend, readonly, exportname) == -1 ||
      upstream_prepare (u) == -1 || (s = upstream_get_size (u)) == -1) {
    upstream_close (u);
    return -1;
  }
  if ((uint64_t) s != size) {
    upstream_close (u);
    *found = s;
    return -1;
  }
  return 0;
}

bool
upstream_serial_requests (void)
{
  return thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS;
}

bool
upstream_model_allows_shared (void)
{
  return thread_model != NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS;
}

int
upstream_prepare (struct upstream *u)
{
  if (u->next == NULL)
    return 0;
  GATED (u);
  if (u->next->prepare (u->next) == -1)
    return -1;
  u->prepared = true;
  return 0;
}

int
upstream_finalize (struct upstream *u)
{
  if (u->next == NULL || !u->prepared)
    return 0;
  GATED (u);
  u->prepared = false;
  return u->next->finalize (u->next);
}

void
upstream_close (struct upstream *u)
{
  upstream_finalize (u);
  if (u->next) {
    GATED (u);
    nbdkit_next_context_close (u->next);
    u->next = NULL;
  }
  pthread_mutex_destroy (&u->own);
}

/* What the client hears of a failed upstream data call.  The request
 * was valid (nbdkit checked it), so only errors that mean something
 * about the data itself pass: no space, read-only, not permitted, not
 * supported, no memory, shutting down.  Everything else, above all the
 * EINVAL, ENOTCONN or EPIPE of a dead connection (which nbdkit would
 * send as EINVAL, "your request was invalid"), is an I/O error.
 */
static int
data_error (int *err)
{
  switch (*err) {
  case EPERM: case EROFS: case ENOSPC: case EDQUOT: case EFBIG:
  case ENOMEM: case ENOTSUP: case EOVERFLOW: case ESHUTDOWN:
    break;
  default:
    *err = EIO;
  }
  return -1;
}

/* A data call on U's context, gated, with its error mapped. */
#define DATA_CALL(u, err, call)                                         \
  do {                                                                  \
    if ((u)->next == NULL)                                              \
      return no_upstream ((u), (err));                                  \
    GATED (u);                                                          \
    if ((call) == -1)                                                   \
      return data_error (err);                                          \
    return 0;                                                           \
  } while (0)

/* Without an upstream a data call fails with EIO, said once per
 * connection (a client retrying would flood the log otherwise).
 */
static int
no_upstream (struct upstream *u, int *err)
{
  if (!u->offline_said) {
    u->offline_said = true;
    nbdkit_error ("fscache: upstream unavailable: data that is not cached "
                  "cannot be read, and nothing can be written (EIO)");
  }
  *err = EIO;
  return -1;
}

int
upstream_pread (struct upstream *u, void *buf, uint32_t count,
                uint64_t offset, uint32_t flags, int *err)
{
  yield_note_upstream ();
  DATA_CALL (u, err, u->next->pread (u->next, buf, count, offset, flags, err));
}

int
upstream_pwrite (struct upstream *u, const void *buf, uint32_t count,
                 uint64_t offset, uint32_t flags, int *err)
{
  DATA_CALL (u, err, u->next->pwrite (u->next, buf, count, offset, flags, err));
}

int
upstream_zero (struct upstream *u, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  DATA_CALL (u, err, u->next->zero (u->next, count, offset, flags, err));
}

int
upstream_trim (struct upstream *u, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  DATA_CALL (u, err, u->next->trim (u->next, count, offset, flags, err));
}

int
upstream_flush (struct upstream *u, uint32_t flags, int *err)
{
  DATA_CALL (u, err, u->next->flush (u->next, flags, err));
}

int
upstream_extents (struct upstream *u, uint32_t count, uint64_t offset,
                  uint32_t flags, struct nbdkit_extents *extents, int *err)
{
  DATA_CALL (u, err, u->next->extents (u->next, count, offset, flags, extents, err));
}

int64_t
upstream_get_size (struct upstream *u)
{
  if (u->next == NULL) {
    errno = ENOTCONN;
    return -1;
  }
  GATED (u);
  return u->next->get_size (u->next);
}

const char *
upstream_export_description (struct upstream *u)
{
  if (u->next == NULL)
    return NULL;
  GATED (u);
  HOLD (&intern_lock);
  return u->next->export_description (u->next);
}

int
upstream_block_size (struct upstream *u, uint32_t *minimum,
                     uint32_t *preferred, uint32_t *maximum)
{
  if (u->next == NULL) {
    *minimum = *preferred = *maximum = 0;
    return 0;
  }
  GATED (u);
  return u->next->block_size (u->next, minimum, preferred, maximum);
}

/* The can_* queries: passed on gated, or the answer without upstream. */
#define QUERY(name, offline)                                            \
  int                                                                   \
  upstream_##name (struct upstream *u)                                  \
  {                                                                     \
    if (u->next == NULL)                                                \
      return (offline);                                                 \
    GATED (u);                                                          \
    return u->next->name (u->next);                                     \
  }
QUERY (can_write, 0)
QUERY (can_flush, 0)
QUERY (is_rotational, 0)
QUERY (can_trim, 0)
QUERY (can_zero, NBDKIT_ZERO_NONE)
QUERY (can_fast_zero, 0)
QUERY (can_extents, 0)
QUERY (can_fua, NBDKIT_FUA_NONE)
QUERY (can_multi_conn, 1)       /* read-only from one cache: consistent */

int
upstream_preconnect (nbdkit_next_preconnect *next, nbdkit_backend *nxdata,
                     int readonly)
{
  SERVER_GATED ();
  return next (nxdata, readonly);
}

int
upstream_list_exports (nbdkit_next_list_exports *next, nbdkit_backend *nxdata,
                       int readonly, struct nbdkit_exports *exports)
{
  SERVER_GATED ();
  return next (nxdata, readonly, exports);
}

const char *
upstream_default_export (nbdkit_next_default_export *next,
                         nbdkit_backend *nxdata, int readonly)
{
  SERVER_GATED ();
  return next (nxdata, readonly);
}
