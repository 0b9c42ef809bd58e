/* nbdkit-fscache-filter: gated calls to the upstream.  See upstream.h
 * for the design: which gate each thread model needs, and why a gate
 * is held across one upstream call and nothing else.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>

#include "readahead.h"
#include "upstream.h"

/* Set once in .get_ready, before any connection; read-only after. */
static int thread_model = NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS;

/* The gate of serialize_all_requests and serialize_connections. */
static pthread_mutex_t server_gate = PTHREAD_MUTEX_INITIALIZER;

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

void
upstream_init (struct upstream *u)
{
  u->next = NULL;
  pthread_mutex_init (&u->own, NULL);
  if (thread_model >= NBDKIT_THREAD_MODEL_PARALLEL)
    u->gate = NULL;
  else if (thread_model == NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS)
    u->gate = &u->own;
  else
    u->gate = &server_gate;
}

void
upstream_fini (struct upstream *u)
{
  pthread_mutex_destroy (&u->own);
  u->next = NULL;
}

void
upstream_bind (struct upstream *u, nbdkit_next *next)
{
  u->next = next;
}

static inline void
gate_release (pthread_mutex_t **gate)
{
  if (*gate)
    pthread_mutex_unlock (*gate);
}

/* Hold U's gate (if it has one) to the end of the enclosing scope. */
#define GATED(u)                                                        \
  pthread_mutex_t *gate_held_ __attribute__ ((cleanup (gate_release))) = \
    (u)->gate;                                                          \
  if (gate_held_)                                                       \
    pthread_mutex_lock (gate_held_)

int
upstream_pread (struct upstream *u, void *buf, uint32_t count,
                uint64_t offset, uint32_t flags, int *err)
{
  GATED (u);
  return u->next->pread (u->next, buf, count, offset, flags, err);
}

int
upstream_pwrite (struct upstream *u, const void *buf, uint32_t count,
                 uint64_t offset, uint32_t flags, int *err)
{
  GATED (u);
  return u->next->pwrite (u->next, buf, count, offset, flags, err);
}

int
upstream_zero (struct upstream *u, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  GATED (u);
  return u->next->zero (u->next, count, offset, flags, err);
}

int
upstream_trim (struct upstream *u, uint32_t count, uint64_t offset,
               uint32_t flags, int *err)
{
  GATED (u);
  return u->next->trim (u->next, count, offset, flags, err);
}

int
upstream_flush (struct upstream *u, uint32_t flags, int *err)
{
  GATED (u);
  return u->next->flush (u->next, flags, err);
}

int
upstream_extents (struct upstream *u, uint32_t count, uint64_t offset,
                  uint32_t flags, struct nbdkit_extents *extents, int *err)
{
  GATED (u);
  return u->next->extents (u->next, count, offset, flags, extents, err);
}

int64_t
upstream_get_size (struct upstream *u)
{
  GATED (u);
  return u->next->get_size (u->next);
}

int
upstream_fsc_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  int err = 0;
  if (upstream_pread (opaque, buf, count, offset, 0, &err) == -1) {
    errno = err ? err : EIO;
    return -1;
  }
  return 0;
}
