/* libfscache: the cache directory and its background committer.
 *
 * Layout of a cache directory (docs/format.md):
 *
 *   DIR/                 mode 0700, owned by the user running nbdkit
 *   DIR/fscache.hdr      512-byte header: magic, format version, the
 *                        cache's UUID, creation time, XXH3 checksum
 *   DIR/objects/@xx/     fan-out directories (keyenc.h)
 *   DIR/objects/@xx/NAME.idx, NAME.data   one object (index.h)
 *
 * The header is written to a temporary name, synced and renamed, so it
 * is either absent or whole.  A header that fails its checksum is
 * replaced (objects validate themselves); one from a newer version is
 * refused so that we never scribble over a cache we do not understand.
 *
 * One committer thread per cache makes fills durable in batches: it
 * wakes every commit_interval_ms, or sooner when an object has many
 * dirty groups, and commits each object with pending changes.  Reads
 * therefore never wait for an fsync.
 *
 * The fill threads (fill.c) start and stop with it.  Both run only
 * between fsc_cache_start and fsc_cache_close (unit tests run without
 * them: fills are then synchronous).
 *
 * The committer reaches objects through five calls only
 * (fsc_object_check_stale, fsc_object_has_dirty, fsc_object_commit,
 * fsc_object_check_budget, fsc_object_close); objects reach it through
 * the committer's kick (commit.c) and the fill queue.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uuid/uuid.h>
#include "xxh.h"

#include "internal.h"
#include "share-hooks.h"
#include "safeopen.h"
#include "utils.h"

#define HDR_NAME "fscache.hdr"
#define HDR_SIZE 512
#define HDR_VERSION 1           /* saved on disk */

/* How long a clean stop lets walks after a crash run on (stop_walks). */
#define STOP_WALK_MS 1000
static const unsigned char hdr_magic[8] = "NBDFSCHD";

/* Header field offsets, saved on disk. */
enum { H_MAGIC = 0, H_VERSION = 8, H_SIZE = 12, H_UUID = 16,
       H_CREATED = 32, H_CHECKSUM = HDR_SIZE - 8 };

/* Write a new header.  With REPLACE false, a header another process
 * created meanwhile wins (EEXIST): two nbdkit processes may create the
 * same cache directory at once.
 */
static int
write_header (struct fsc_cache *c, bool replace)
{
  unsigned char buf[HDR_SIZE] = { 0 };
  char tmp[64];

  snprintf (tmp, sizeof tmp, "%s.tmp.%ld", HDR_NAME, (long) getpid ());
  uuid_generate (c->uuid);
  memcpy (buf + H_MAGIC, hdr_magic, 8);
  put_le32 (buf + H_VERSION, HDR_VERSION);
  put_le32 (buf + H_SIZE, HDR_SIZE);
  memcpy (buf + H_UUID, c->uuid, 16);
  put_le64 (buf + H_CREATED, (uint64_t) time (NULL));
  put_le64 (buf + H_CHECKSUM, XXH3_64bits (buf, H_CHECKSUM));

  unlinkat (c->dirfd, tmp, 0);
  int fd = openat (c->dirfd, tmp,
                   O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd == -1)
    return -1;
  if (fsc_io_pwrite (&c->io, FSC_FILE_INDEX, fd, buf, HDR_SIZE, 0) == -1 ||
      fsync (fd) == -1) {
    int e = errno;
    close (fd);
    unlinkat (c->dirfd, tmp, 0);
    errno = e;
    return -1;
  }
  close (fd);
  int r = replace
    ? renameat (c->dirfd, tmp, c->dirfd, HDR_NAME)
    : renameat2 (c->dirfd, tmp, c->dirfd, HDR_NAME, RENAME_NOREPLACE);
  if (r == -1) {
    int e = errno;
    unlinkat (c->dirfd, tmp, 0);
    errno = e;
    return -1;
  }
  return fsync (c->dirfd);
}

/* Read the header.  Returns 0, or -1 with errno: ENOENT (absent),
 * EBADMSG (damaged), EPROTONOSUPPORT (newer version), or an I/O error.
 */
static int
read_header (struct fsc_cache *c)
{
  unsigned char buf[HDR_SIZE];
  int fd = openat (c->dirfd, HDR_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1)
    return -1;
  ssize_t n = fsc_io_pread (&c->io, FSC_FILE_INDEX, fd, buf, HDR_SIZE, 0);
  int e = errno;
  close (fd);
  if (n == -1) {
    errno = e;
    return -1;
  }
  if (n != HDR_SIZE || memcmp (buf + H_MAGIC, hdr_magic, 8) != 0) {
    errno = EBADMSG;
    return -1;
  }
  if (get_le32 (buf + H_VERSION) != HDR_VERSION) {
    errno = EPROTONOSUPPORT;
    return -1;
  }
  if (get_le32 (buf + H_SIZE) != HDR_SIZE ||
      get_le64 (buf + H_CHECKSUM) != XXH3_64bits (buf, H_CHECKSUM)) {
    errno = EBADMSG;
    return -1;
  }
  memcpy (c->uuid, buf + H_UUID, 16);
  return 0;
}

static void
free_scratch (void *p)
{
  free (p);
}

char *
fsc_default_dir (void)
{
  const char *env = getenv ("NBD_FSCACHE_DIR");
  char *r = NULL;

  if (env && *env) {
    if (*env == '/')
      return strdup (env);
    char *cwd = getcwd (NULL, 0);
    if (cwd == NULL)
      return NULL;
    if (asprintf (&r, "%s/%s", cwd, env) == -1)
      r = NULL;
    free (cwd);
    return r;
  }
  if (geteuid () == 0)
    return strdup ("/var/cache/nbd-fscache");
  env = getenv ("XDG_CACHE_HOME");
  if (env && *env == '/') {     /* relative values are invalid: ignored */
    if (asprintf (&r, "%s/nbd-fscache", env) == -1)
      return NULL;
    return r;
  }
  env = getenv ("HOME");
  if (env && *env) {
    if (asprintf (&r, "%s/.cache/nbd-fscache", env) == -1)
      return NULL;
    return r;
  }
  errno = ENOENT;
  return NULL;
}

int
fsc_cache_open (const struct fsc_cache_config *config,
                struct fsc_cache **cachep)
{
  struct fsc_cache *c = calloc (1, sizeof *c);
  char objname[4096];
  int e;

  if (c == NULL)
    return -1;
  c->dirfd = c->objdirfd = -1;
  c->commit_interval_ms = config->commit_interval_ms ?: 2000;
  c->min_free_pct = config->min_free_pct;
  c->min_free_files_pct = config->min_free_files_pct;
  if (fsc_io_init (&c->io, config->faults) == -1)
    goto err_free;

  /* Rules 1 and 2 of safeopen.c: nobody else may redirect the path or
   * write the directory.
   */
  if (config->why && config->why_len)
    config->why[0] = '\0';
  c->dirfd = fsc_safe_open_dir (config->dir, config->create,
                                config->why, config->why_len);
  if (c->dirfd == -1)
    goto err_close;

  if (read_header (c) == -1) {
    bool damaged = errno == EBADMSG;
    if ((errno != ENOENT && !damaged) || config->existing)
      goto err_close;
    if (write_header (c, damaged) == -1) {
      /* Another process created it first: use theirs. */
      if (errno != EEXIST || read_header (c) == -1)
        goto err_close;
    }
  }

  snprintf (objname, sizeof objname, "%s/objects", config->dir);
  c->objdirfd = fsc_own_subdir (c->dirfd, "objects", !config->existing,
                                objname, config->why, config->why_len);
  if (c->objdirfd == -1)
    goto err_close;

  if ((e = pthread_key_create (&c->scratch_key, free_scratch)) != 0) {
    errno = e;
    goto err_close;
  }
  /* The host's sharing, above the object core (share-hooks.h). */
  c->share = &fsc_share_hooks;
  pthread_mutex_init (&c->lock, NULL);
  pthread_cond_init (&c->cond, NULL);
  pthread_cond_init (&c->ready_cond, NULL);
  pthread_mutex_init (&c->fill_lock, NULL);
  pthread_cond_init (&c->fill_cond, NULL);
  pthread_cond_init (&c->fill_idle_cond, NULL);
  pthread_mutex_init (&c->budget_lock, NULL);
  {
    const char *tb = getenv ("NBD_FSCACHE_TEST_BUDGET");
    c->test_budget = tb == NULL ? -1 : strcmp (tb, "0") != 0;
    /* With it, a test reads a few MiB past the burst rather than
     * 64 MiB (tests/filter/test-fscache-any-plugin.sh: the catch-up in front
     * of every plugin).
     */
    const char *tburst = getenv ("NBD_FSCACHE_TEST_BURST");
    c->budget_burst = tburst ? strtoull (tburst, NULL, 10) : 0;
    /* Tests write every aligned block directly (0), or none (a size
     * no write reaches), data.c.
     */
    const char *tdm = getenv ("NBD_FSCACHE_TEST_DIRECT_MIN");
    c->direct_min = tdm ? strtoull (tdm, NULL, 10) : FSC_DIRECT_MIN;
  }
  /* The fills' cost is measured unless a test fixed the budget
   * (NBD_FSCACHE_TEST_BUDGET) or the filter turns it off
   * (fsc_cache_set_fill_probe).
   */
  fsc_cost_init (&c->cost, c->test_budget < 0);
  fsc_meter_init (&c->up_meter, &c->stats.upstream_busy_us);
  fsc_meter_init (&c->fill_meter, &c->stats.fill_busy_us);
  c->fill_tail = &c->fill_head;
  *cachep = c;
  return 0;

 err_close:
  e = errno;
  if (c->objdirfd >= 0)
    close (c->objdirfd);
  if (c->dirfd >= 0)
    close (c->dirfd);
  errno = e;
 err_free:
  e = errno;
  free (c);
  errno = e;
  return -1;
}

void
fsc_cache_uuid (const struct fsc_cache *cache, char out[37])
{
  uuid_unparse_lower (cache->uuid, out);
}

void
fsc_cache_stats (struct fsc_cache *cache, struct fsc_stats *st)
{
  fsc_stats_snapshot (&cache->stats, st);
}

void
fsc_cache_set_peers_known (struct fsc_cache *cache, uint64_t n)
{
  __atomic_store_n (&cache->stats.peers_known, n, __ATOMIC_RELAXED);
}

void
fsc_cache_set_peers_aside (struct fsc_cache *cache, uint64_t n)
{
  __atomic_store_n (&cache->stats.peers_aside, n, __ATOMIC_RELAXED);
}

void
fsc_cache_set_peer_tree_depth (struct fsc_cache *cache, uint64_t depth)
{
  __atomic_store_n (&cache->stats.peer_tree_depth, depth, __ATOMIC_RELAXED);
}

uint64_t
fsc_cache_io_calls (struct fsc_cache *cache, int op, int kind)
{
  return __atomic_load_n (&cache->io.calls[op][kind], __ATOMIC_RELAXED);
}

void
fsc_cache_set_guard (struct fsc_cache *cache, bool on)
{
  cache->guard.enabled = on;
}

void
fsc_cache_set_fill_probe (struct fsc_cache *cache, bool on)
{
  cache->cost.enabled = on && cache->test_budget < 0;
}

void
fsc_cache_set_trace (struct fsc_cache *cache, fsc_io_trace_fn *fn,
                     void *opaque)
{
  cache->io.trace_opaque = opaque;
  cache->io.trace = fn;
}

/* The committer's round over the open objects: commit each with
 * changes and, with BUDGETS, let each take up its quota and shrink to
 * its budget (evict.c).  References are taken under cache->lock, the
 * work is done without it.
 */
static void
each_object (struct fsc_cache *cache, bool budgets)
{
  struct fsc_object **objs = NULL;
  size_t n = 0, cap = 0;

  pthread_mutex_lock (&cache->lock);
  for (struct fsc_object *o = cache->objects; o; o = o->next) {
    /* A shell (share-joiner.c) has nothing to commit: its owner does that. */
    if (o->closing || !o->ready || o->join)
      continue;
    /* Another process wrote upstream past us: drop our copy. */
    if (fsc_object_check_stale (o) ||
        (!budgets && !fsc_object_has_dirty (o)))
      continue;
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 8;
      struct fsc_object **p = realloc (objs, ncap * sizeof *p);
      if (p == NULL)
        break;
      objs = p;
      cap = ncap;
    }
    o->refs++;
    objs[n++] = o;
  }
  pthread_mutex_unlock (&cache->lock);

  for (size_t i = 0; i < n; ++i) {
    if (budgets)
      fsc_object_check_budget (objs[i]);
    /* Page out what requests left behind past the resident bound
     * (groups.c); a request pages out only while it pins new groups.
     */
    pthread_mutex_lock (&objs[i]->lock);
    if (objs[i]->pager.ngalloc > objs[i]->pager.res_max)
      fsc_groups_trim (objs[i]);
    pthread_mutex_unlock (&objs[i]->lock);
    /* The counters ride on commits: an object only read from (hits)
     * gets no index writes of its own, and its index's mtime keeps
     * meaning its last change (nbd-fscached's age).  NAME.stats has
     * them every round.
     */
    if (fsc_object_has_dirty (objs[i]) && fsc_object_commit (objs[i]) == 0)
      fsc_object_save_counters (objs[i]);
    if (budgets)
      fsc_live_publish (objs[i], true, false);
    fsc_object_close (objs[i]);
  }
  free (objs);
}

void
fsc_cache_commit_all (struct fsc_cache *cache)
{
  each_object (cache, false);
}

static void *
committer (void *arg)
{
  struct fsc_cache *c = arg;
  fsc_thread_name ("fsc-commit");

  for (;;) {
    pthread_mutex_lock (&c->lock);
    if (!c->stopping && !c->commit_wanted) {
      struct timespec ts;
      deadline_ms (&ts, c->commit_interval_ms);
      pthread_cond_timedwait (&c->cond, &c->lock, &ts);
    }
    bool stop = c->stopping;
    c->commit_wanted = false;
    pthread_mutex_unlock (&c->lock);
    if (stop)
      return NULL;
    each_object (c, true);
  }
}





int
fsc_cache_start (struct fsc_cache *cache)
{
  SCOPED_LOCK (&cache->lock);
  if (cache->committer_running)
    return 0;
  int e = pthread_create (&cache->committer, NULL, committer, cache);
  if (e != 0) {
    errno = e;
    return -1;
  }
  cache->committer_running = true;
  fsc_fill_start (cache);
  return 0;
}

/* A clean stop soon after a crash finds the walk that reclaims
 * unnamed space (evict.c) still running: seconds per GiB of scattered
 * blocks, 13 s at 32 GiB cached, minutes at the hundreds of GiB a host
 * gives its cache, and a service manager kills what takes too long,
 * which leaves the index unclean all the same.  So the walks get
 * STOP_WALK_MS to end, and are then stopped: the index is committed
 * but not marked clean, and the next open walks again, in the
 * background, as after the crash.  Holds no lock.
 */
static void
stop_walks (struct fsc_cache *cache)
{
  struct timespec dl;
  deadline_ms (&dl, STOP_WALK_MS);
  SCOPED_LOCK (&cache->lock);
  for (;;) {
    bool walking = false;
    for (struct fsc_object *o = cache->objects; o && !walking; o = o->next)
      if (!o->join) {
        SCOPED_LOCK (&o->lock);
        walking = o->reclaim.running;
      }
    if (!walking ||
        pthread_cond_timedwait (&cache->ready_cond, &cache->lock,
                                &dl) == ETIMEDOUT)
      break;
  }
  for (struct fsc_object *o = cache->objects; o; o = o->next)
    if (!o->join)
      fsc_reclaim_stop (o);
}

void
fsc_cache_close (struct fsc_cache *cache)
{
  if (cache == NULL)
    return;

  /* Finish the queued fills first: they hold object references. */
  fsc_fill_stop (cache);

  pthread_mutex_lock (&cache->lock);
  cache->stopping = true;
  pthread_cond_signal (&cache->cond);
  bool running = cache->committer_running;
  pthread_mutex_unlock (&cache->lock);
  if (running)
    pthread_join (cache->committer, NULL);

  /* Objects still open (a connection nbdkit did not close) are closed
   * here, which commits them and marks them clean.  First the other
   * processes' requests end (their references are the closer's then),
   * and shells let go of the objects they took over, which are listed
   * themselves (share-joiner.c).
   */
  pthread_mutex_lock (&cache->lock);
  size_t nobj = 0;
  for (struct fsc_object *o = cache->objects; o; o = o->next)
    nobj++;
  const size_t cap = nobj;
  struct fsc_object **objs = calloc (cap ? cap : 1, sizeof *objs);
  size_t nshell = 0;
  for (struct fsc_object *o = cache->objects; objs && o && nshell < cap;
       o = o->next)
    if (o->join)
      objs[nshell++] = o;
  pthread_mutex_unlock (&cache->lock);
  /* (No lock: no connection is left to close a shell meanwhile.) */
  for (size_t i = 0; i < nshell; ++i)
    (void) fsc_share_detach_local (objs[i]);
  pthread_mutex_lock (&cache->lock);
  nobj = 0;
  for (struct fsc_object *o = cache->objects; objs && o && nobj < cap;
       o = o->next)
    if (!o->join && o->share && !o->lingering && !o->closing &&
        o->refs > 0) {
      /* Held across the stop.  A joiner's connection may end on its
       * own just now: its thread then drops its reference (it has not
       * seen the stop), and were that the last one, it would close the
       * object and stop the server a second time, beside this stop:
       * a listener joined twice (a hang at exit), a server freed under
       * it (tests/unit/unit-object.c, test_share_partial's end, hung about
       * one run in three).  With this reference, the last close is
       * ours, after the stop.
       */
      o->refs++;
      objs[nobj++] = o;         /* (the others' reclaimer does it) */
    }
  pthread_mutex_unlock (&cache->lock);
  for (size_t i = 0; i < nobj; ++i) {
    fsc_share_stop (objs[i]);
    fsc_object_close (objs[i]);
  }
  free (objs);
  stop_walks (cache);
  for (;;) {
    pthread_mutex_lock (&cache->lock);
    /* Objects lingering for their walk after a crash, and those their
     * reclaimer is closing, close themselves once it ends (evict.c):
     * waited for (stop_walks has ended the walks by now, or soon).
     */
    struct fsc_object *o;
    for (;;) {
      for (o = cache->objects; o && (o->lingering || o->closing);
           o = o->next)
        ;
      if (o || cache->objects == NULL)
        break;
      pthread_cond_wait (&cache->ready_cond, &cache->lock);
    }
    if (o)
      o->refs = 1;
    pthread_mutex_unlock (&cache->lock);
    if (o == NULL)
      break;
    fsc_object_close (o);
  }
  /* The reclaimers that closed their objects themselves: gone from the
   * list above, and perhaps not yet out of close_object.
   */
  pthread_mutex_lock (&cache->lock);
  struct fsc_ended_thread *ended = cache->ended;
  cache->ended = NULL;
  pthread_mutex_unlock (&cache->lock);
  while (ended) {
    struct fsc_ended_thread *next = ended->next;
    pthread_join (ended->thread, NULL);
    free (ended);
    ended = next;
  }

  fsc_buf_pool_free (cache);
  void *p = pthread_getspecific (cache->scratch_key);
  free (p);
  pthread_setspecific (cache->scratch_key, NULL);
  pthread_key_delete (cache->scratch_key);
  close (cache->objdirfd);
  close (cache->dirfd);
  pthread_mutex_destroy (&cache->lock);
  pthread_cond_destroy (&cache->cond);
  pthread_cond_destroy (&cache->ready_cond);
  pthread_mutex_destroy (&cache->fill_lock);
  pthread_cond_destroy (&cache->fill_cond);
  pthread_cond_destroy (&cache->fill_idle_cond);
  pthread_mutex_destroy (&cache->budget_lock);
  fsc_meter_destroy (&cache->up_meter);
  fsc_meter_destroy (&cache->fill_meter);
  fsc_cost_destroy (&cache->cost);
  free (cache);
}
