/* libfscache, host sharing: a joiner's object (share-int.h has the
 * overview).
 *
 * A process that opens an object another holds joins it: its object is
 * a shell, whose reads, prefetches, writes and commits go to the owner
 * over the link (share-link.c), its hits excepted (share-direct.c).
 * With no owner to talk to, a request is served uncached from the
 * upstream, or by the object this process took over.  A write whose
 * link breaks before the owner dropped its blocks marks the copy stale
 * (NAME.stale), as a process that cannot join does: whoever holds the
 * object next discards it.
 */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "share-int.h"
#include "utils.h"

static void
free_join (struct fsc_join *j)
{
  for (size_t i = 0; i < j->nidle; ++i)
    close (j->idle[i]);
  if (j->watch >= 0)
    close (j->watch);
  free (j->idle);
  free (j->maps);
  free (j->seen);
  if (j->ep)
    munmap ((void *) j->ep, EPOCH_SLOTS * sizeof (uint32_t));
  free ((void *) j->p.key);
  free ((void *) j->p.generation);
  pthread_mutex_destroy (&j->lock);
  pthread_cond_destroy (&j->freed);
  free (j);
}

int
fsc_share_join (struct fsc_object *o, const struct fsc_object_params *p,
                struct fsc_open_info *info)
{
  struct fsc_join *j = calloc (1, sizeof *j);
  if (j == NULL)
    return -1;
  pthread_mutex_init (&j->lock, NULL);
  pthread_cond_init (&j->freed, NULL);
  j->watch = -1;
  j->p = *p;
  j->p.key = malloc (p->key_len);
  j->p.generation = p->generation ? strdup (p->generation) : NULL;
  if (j->p.key == NULL || (p->generation && j->p.generation == NULL)) {
    free_join (j);
    errno = ENOMEM;
    return -1;
  }
  memcpy ((void *) j->p.key, p->key, p->key_len);

  struct welcome wel;
  int reason;
  /* The holder may still be opening the object (its socket comes right
   * after): wait for it a little.  A holder that never listens (a
   * writeback proxy, nbd-fscached culling, a tool) leaves us uncached,
   * as before sharing.
   */
  uint64_t deadline = fsc_mono_ms () + TAKEOVER_MS;
  int fd;
  while ((fd = sh_join_connect (o, p, &reason, &wel)) == -1 &&
         (errno == ENOENT || errno == ECONNREFUSED)
             && fsc_mono_ms () < deadline)
    poll (NULL, 0, RETRY_MS);
  if (fd == -1 && errno == EPERM) {
    info->reason = reason;
    info->owner_pid = wel.pid;
    info->owner_block_size = wel.block_size;
    info->owner_validate = wel.validate;
    free_join (j);
    FSC_STAT_ADD (&o->cache->stats, share_refused, 1);
    /* Settings that would make a lone opener discard the copy are
     * refused; a different upstream is only served uncached.
     */
    errno = reason == FSC_REJ_BLOCK_SIZE || reason == FSC_REJ_VALIDATE
      ? EPERM : EBUSY;
    return -1;
  }
  if (fd == -1) {
    free_join (j);
    errno = EBUSY;
    return -1;
  }
  else {
    j->idle = malloc (4 * sizeof *j->idle);
    if (j->idle == NULL) {
      close (fd);
      free_join (j);
      return -1;
    }
    j->cap = 4;
    j->watch = fd;              /* requests open sockets of their own */
    sh_setup_direct (o, j);
    info->owner_pid = wel.pid;
    info->present_blocks = wel.present_blocks;
  }
  o->join = j;
  o->ops = &fsc_join_ops;
  info->joined = true;
  FSC_STAT_ADD (&o->cache->stats, share_joins, 1);
  return 0;
}

void
fsc_share_leave (struct fsc_object *o)
{
  struct fsc_join *j = o->join;
  if (j == NULL)
    return;
  sh_report_hits (o, true);
  struct fsc_object *l = j->local;
  o->join = NULL;
  o->ops = &fsc_local_ops;
  free_join (j);
  if (l)
    fsc_object_close (l);
}

struct fsc_object *
fsc_share_detach_local (struct fsc_object *o)
{
  if (o->join == NULL)
    return NULL;
  SCOPED_LOCK (&o->join->lock);
  struct fsc_object *l = o->join->local;
  o->join->local = NULL;
  return l;
}

static int
fsc_share_read (struct fsc_object *o, void *buf, uint32_t count,
                uint64_t offset, const struct fsc_upstream *up,
                unsigned flags)
{
  enum direct d = sh_direct_read (o, buf, count, offset, flags);
  if (d == DIRECT_SERVED)
    return 0;

  /* A link that breaks is tried once more: the next owner (or our
   * takeover) serves it from the cache, the upstream only if nobody
   * comes.
   */
  for (int attempt = 0; attempt < 2; ++attempt) {
    struct fsc_object *l;
    int fd = sh_get_conn (o, &l);
    if (l)
      return fsc_object_read (l, buf, count, offset, up, flags);
    if (fd < 0)
      break;
    int err;
    unsigned dflags = 0;
    if (sh_run (o, fd, MSG_READ, flags, offset, count, NULL, 0, buf, up,
                &err, &dflags) == 0) {
      sh_put_conn (o, fd, true);
      if (err == 0 && d == DIRECT_ABSENT && (dflags & DONE_HIT))
        sh_forget_maps (o, offset, count);
      if (err == 0)
        return 0;
      errno = err;
      return -1;
    }
    sh_put_conn (o, fd, false);
  }
  /* No owner: the upstream, uncached. */
  FSC_STAT_ADD (&o->cache->stats, share_fallbacks, 1);
  FSC_STAT_ADD (&o->cache->stats, miss_bytes, count);
  return up->pread (up->opaque, buf, count, offset);
}

static int
fsc_share_prefetch (struct fsc_object *o, uint64_t offset, uint64_t count,
                    const struct fsc_upstream *up, unsigned flags)
{
  struct fsc_object *l;
  int fd = sh_get_conn (o, &l);
  if (l)
    return fsc_object_prefetch (l, offset, count, up, flags);
  if (fd < 0)
    return 0;                   /* a prefetch may do nothing */
  int err;
  while (count > 0) {
    uint32_t n = MIN (count, (uint64_t) SHARE_MAX_COUNT);
    if (sh_run (o, fd, MSG_PREFETCH, flags, offset, n, NULL, 0, NULL, up,
                &err, NULL) == -1) {
      sh_put_conn (o, fd, false);
      return 0;
    }
    if (err) {
      sh_put_conn (o, fd, true);
      errno = err;
      return -1;
    }
    offset += n;
    count -= n;
  }
  sh_put_conn (o, fd, true);
  return 0;
}

static int
fsc_share_write_begin (struct fsc_object *o, uint64_t offset, uint64_t count,
                       unsigned flags, struct fsc_write *w)
{
  struct fsc_object *l;
  int fd = sh_get_conn (o, &l);
  if (l) {
    int r = fsc_object_write_begin_flags (l, offset, count, flags, w);
    w->local = l;
    return r;
  }
  memset (w, 0, sizeof *w);
  w->offset = offset;
  w->count = count;
  w->keep = flags & FSC_WRITE_KEEP;
  w->join_fd = -1;
  if (fd >= 0) {
    int err;
    if (sh_run (o, fd, MSG_WBEGIN, flags, offset, (uint32_t) count, NULL, 0,
                NULL, NULL, &err, NULL) == 0 && err == 0) {
      w->join_fd = fd;          /* held until the end */
      return 0;
    }
    sh_put_conn (o, fd, false);
  }
  /* Nobody could drop the blocks before the upstream changes: whoever
   * holds the object next discards its copy.
   */
  fsc_mark_stale (&o->files);
  return 0;
}

static void
fsc_share_write_end (struct fsc_object *o, struct fsc_write *w,
                     const void *buf, bool upstream_ok)
{
  if (w->local) {
    struct fsc_object *l = w->local;
    w->local = NULL;
    fsc_object_write_end (l, w, buf, upstream_ok);
    return;
  }
  int fd = w->join_fd;
  w->join_fd = -1;
  if (fd < 0)
    return;
  unsigned flags = (upstream_ok ? WEND_OK : 0) |
    (buf && w->keep && upstream_ok ? WEND_DATA : 0);
  uint32_t plen = (flags & WEND_DATA) ? (uint32_t) w->count : 0;
  int err;
  sh_put_conn (o, fd, sh_run (o, fd, MSG_WEND, flags, w->offset,
                              (uint32_t) w->count, buf, plen, NULL, NULL,
                              &err, NULL) == 0);
}

static int
fsc_share_commit (struct fsc_object *o)
{
  struct fsc_object *l;
  int fd = sh_get_conn (o, &l);
  if (l)
    return fsc_object_commit (l);
  if (fd < 0)
    return 0;                   /* nothing of ours to make durable */
  int err;
  if (sh_run (o, fd, MSG_COMMIT, 0, 0, 0, NULL, 0, NULL, NULL, &err,
              NULL) == -1) {
    sh_put_conn (o, fd, false);
    return 0;
  }
  sh_put_conn (o, fd, true);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* A joined object's operations (objops.h): set with o->join in
 * fsc_share_join, back to fsc_local_ops in fsc_share_leave.
 */
const struct fsc_object_ops fsc_join_ops = {
  .read = fsc_share_read,
  .prefetch = fsc_share_prefetch,
  .write_begin = fsc_share_write_begin,
  .write_end = fsc_share_write_end,
  .commit = fsc_share_commit,
  .close = fsc_share_leave,
};
