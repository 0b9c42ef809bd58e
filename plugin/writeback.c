/* nbdkit-fscache-filter: fscache-mode=writeback, the filter's side.
 * writeback.h says what this file is for; core/wlog/wlog.h what the log
 * promises; docs/design.md, "Writeback", why.
 *
 * State: one struct wb per export in writeback mode, on a list of the
 * process's (the writers outlive connections, so nothing per
 * connection can hold them), from the first connection's .prepare to
 * .cleanup.  The list's lock covers only the list; a wb being set up
 * is on it marked not ready, and others wait for it (like the objects
 * in core/object/object.c), so nothing is held across the log's opening or
 * the upstream's.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "keyenc.h"
#include "utils.h"

#include "blocksize.h"
#include "label.h"
#include "params.h"
#include "writeback.h"
#include "say.h"

struct wb {
  struct wb *next;
  char *key;
  size_t klen;
  char *exportname;
  struct fsc_wlog *wl;
  struct fsc_object *obj;       /* a reference of ours (the writer
                                 * holds another) */
  struct upstream up;           /* the writer's own, shared context */
  uint64_t size;
  /* What the writer was told the upstream can do (fsc_wb_upstream),
   * from the first context; every reopened one must still can.
   */
  bool caps_known;
  bool can_flush, can_trim, can_zero;
  /* Messages (under list_lock). */
  bool outage;                  /* said that the upstream is away */
  time_t stall_said;            /* last backpressure message */
};

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct wb *list;
static nbdkit_backend *backend;

void
wb_set_backend (nbdkit_backend *b)
{
  backend = b;
}

struct wb *
wb_find (const void *k, size_t klen)
{
  SCOPED_LOCK (&list_lock);
  for (struct wb *w = list; w; w = w->next)
    if (w->klen == klen && memcmp (w->key, k, klen) == 0)
      return w;
  return NULL;
}

struct fsc_wlog *
wb_log (struct wb *wb)
{
  return wb->wl;
}

/*----------------------------------------------------------------------
 * The writer's upstream (struct fsc_wb_upstream over upstream.c).
 */

static int
set_errno (int err)
{
  errno = err ? err : EIO;
  return -1;
}

static int
w_pwrite (void *opaque, const void *buf, uint32_t count, uint64_t offset)
{
  struct wb *wb = opaque;
  int err = 0;
  if (bs_pwrite (&wb->up, buf, count, offset, 0, &err) == -1)
    return set_errno (err);
  return 0;
}

static int
w_zero (void *opaque, uint32_t count, uint64_t offset)
{
  struct wb *wb = opaque;
  int err = 0;
  if (bs_zero (&wb->up, count, offset, NBDKIT_FLAG_MAY_TRIM, &err) == -1)
    return set_errno (err);
  return 0;
}

/* A zero the client sent with NO_HOLE: without may_trim, so that the
 * upstream keeps the range allocated (issue 29, item 3).
 */
static int
w_zero_keep (void *opaque, uint32_t count, uint64_t offset)
{
  struct wb *wb = opaque;
  int err = 0;
  if (bs_zero (&wb->up, count, offset, 0, &err) == -1)
    return set_errno (err);
  return 0;
}

static int
w_trim (void *opaque, uint32_t count, uint64_t offset)
{
  struct wb *wb = opaque;
  int err = 0;
  if (bs_trim (&wb->up, count, offset, 0, &err) == -1)
    return set_errno (err);
  return 0;
}

static int
w_flush (void *opaque)
{
  struct wb *wb = opaque;
  int err = 0;
  int r = upstream_flush (&wb->up, 0, &err);
  wb_log_notices (wb);
  return r == -1 ? set_errno (err) : 0;
}

static int
w_pread (void *opaque, void *buf, uint32_t count, uint64_t offset)
{
  struct wb *wb = opaque;
  int err = 0;
  if (bs_pread (&wb->up, buf, count, offset, 0, &err) == -1)
    return set_errno (err);
  return 0;
}

/* Open (or reopen) the writer's context: the nbd plugin, for one,
 * connects again on open, so this is how the writer comes back after
 * its upstream went away.
 */
static int
open_upstream (struct wb *wb)
{
  if (upstream_open_shared (&wb->up, backend, 0, wb->exportname) == -1 ||
      upstream_prepare (&wb->up) == -1)
    return -1;
  int64_t size = upstream_get_size (&wb->up);
  if (size != (int64_t) wb->size) {
    /* Not the disk we write back to any more: never write to it. */
    nbdkit_error ("fscache: export \"%s\": writeback: the upstream's size "
                  "is now %" PRId64 ", not %" PRIu64 "; not writing back",
                  wb->exportname, size, wb->size);
    upstream_close (&wb->up);
    errno = ESTALE;
    return -1;
  }
  /* Ask the new context what it can do: nbdkit answers a data call on
   * a context only after the matching can_* was asked on that context
   * (it asserts so), and a reopened context is a new one.
   */
  bool can_write = upstream_can_write (&wb->up) == 1;
  bool can_flush = upstream_can_flush (&wb->up) == 1;
  bool can_trim = upstream_can_trim (&wb->up) == 1;
  bool can_zero = upstream_can_zero (&wb->up) > NBDKIT_ZERO_NONE;
  if (!wb->caps_known) {
    wb->caps_known = true;
    wb->can_flush = can_flush;
    wb->can_trim = can_trim;
    wb->can_zero = can_zero;
  }
  if (!can_write || (wb->can_flush && !can_flush) ||
      (wb->can_trim && !can_trim) || (wb->can_zero && !can_zero)) {
    nbdkit_error ("fscache: export \"%s\": writeback: the upstream no "
                  "longer accepts %s; not writing back", wb->exportname,
                  !can_write ? "writes" : !can_flush ? "flushes" :
                  !can_trim ? "trims" : "zeroes");
    upstream_close (&wb->up);
    errno = EROFS;
    return -1;
  }
  return 0;
}

static int
w_reopen (void *opaque)
{
  struct wb *wb = opaque;
  wb_log_notices (wb);
  upstream_close (&wb->up);
  return open_upstream (wb);
}

/*----------------------------------------------------------------------
 * Messages.
 */

void
wb_log_notices (struct wb *wb)
{
  int err;
  uint64_t off;
  unsigned n = fsc_wlog_take_notices (wb->wl, &err, &off);
  if (n == 0)
    return;
  if (n & FSC_WLOG_NOTICE_BADREAD)
    nbdkit_error ("fscache: ERROR: export \"%s\": dirty data at offset "
                  "%" PRIu64 " failed its checksum or could not be read "
                  "from the cache; it is the only copy: reads of it fail "
                  "with EIO, and it is not written back", wb->exportname,
                  off);
  if (n & FSC_WLOG_NOTICE_FAILED)
    nbdkit_error ("fscache: ERROR: export \"%s\": the write log failed "
                  "(%s): writes and flushes now fail with EIO; what was "
                  "flushed before stays in the cache to be written back",
                  wb->exportname, strerror (err));
  if (n & FSC_WLOG_NOTICE_NORESERVE)
    say_warning ("export \"%s\": could not reserve "
                 "fscache-dirty-max of space for the write log (%s): "
                 "writes may fail with EIO when the cache disk is full "
                 "(they go on once it has space again); free space or "
                 "lower fscache-dirty-max", wb->exportname, strerror (err));
  if (n & FSC_WLOG_NOTICE_WRITEFAIL)
    nbdkit_error ("fscache: ERROR: export \"%s\": a write to the write "
                  "log failed (%s): that request failed with EIO; later "
                  "writes go on once the cache disk takes writes again",
                  wb->exportname, strerror (err));
  pthread_mutex_lock (&list_lock);
  bool say_out = (n & FSC_WLOG_NOTICE_UPSTREAM) && !wb->outage;
  bool say_back = (n & FSC_WLOG_NOTICE_BACK) && wb->outage;
  if (say_out)
    wb->outage = true;
  if (say_back)
    wb->outage = false;
  time_t now = time (NULL);
  bool say_stall = (n & FSC_WLOG_NOTICE_STALLED) && now - wb->stall_said >= 60;
  if (say_stall)
    wb->stall_said = now;
  pthread_mutex_unlock (&list_lock);
  if (say_out)
    say_warning ("export \"%s\": writeback cannot reach "
                 "the upstream (%s); dirty data stays in the cache, "
                 "retrying", wb->exportname, strerror (err));
  if (say_back)
    say_note ("export \"%s\": writeback reached the upstream "
              "again", wb->exportname);
  if (say_stall)
    say_warning ("export \"%s\": fscache-dirty-max "
                 "reached; writes wait for writeback", wb->exportname);
}

/*----------------------------------------------------------------------
 * Who may open an object with a log.
 */

static void
say_stale (const char *exportname, const struct fsc_wlog_info *info,
           const char *dir)
{
  nbdkit_error ("fscache: export \"%s\": the cache holds %" PRIu64 " bytes "
                "of data written in writeback mode and not yet written "
                "back, but the upstream changed meanwhile (%s); refusing "
                "to serve it or to write it back.  Either write it back "
                "anyway with 'nbd-fscache --dir %s writeback OBJECT URI', "
                "or discard it with 'nbd-fscache --dir %s invalidate "
                "--force OBJECT' (see nbd-fscache ls for OBJECT)",
                exportname, info->dirty_bytes,
                fsc_wlog_mismatch_name (info->mismatch), dir, dir);
}

/* Rule 7 (core/wlog/wlog.c): a damaged log is refused, never shortened.
 * Say where, what survives and the ways out.
 */
static void
say_damaged (const char *exportname, const void *k, size_t klen,
             const struct fsc_wlog_info *info, const char *dir)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  fsc_key_encode (k, klen, name, fan);
  CLEANUP_FREE char *label = label_of (exportname);
  nbdkit_error ("fscache: export \"%s\" (%s): its write log "
                "%s/objects/%s/%s.wlog "
                "is DAMAGED: record %" PRIu64 " (at byte %" PRIu64 " of the "
                "file) cannot be read, although a later flush marker shows "
                "it was synced (records below %" PRIu64 " were); %" PRIu64
                " records (%" PRIu64 " bytes) before it are intact, %" PRIu64
                " intact writes (%" PRIu64 " bytes) after it cannot be "
                "written back in order.  Refusing the export, since the log "
                "holds the only copy of flushed writes.  Either write back "
                "what is intact with 'nbd-fscache --dir %s writeback "
                "--salvage %s URI' (it says what is lost), or discard it all "
                "with 'nbd-fscache --dir %s invalidate --force %s'",
                exportname, label ? label : "?", dir, fan, name,
                info->damage_seq,
                info->damage_pos, info->damage_cover, info->records,
                info->dirty_bytes, info->lost_records, info->lost_bytes,
                dir, name, dir, name);
}

int
wb_check_log (struct fsc_cache *cache, const char *exportname,
              const void *k, size_t klen, uint64_t size,
              const struct fscache_sample_set *set, bool wbmode,
              struct fsc_wlog **wlp)
{
  struct fsc_wlog_params p = {
    .key = k, .key_len = klen, .size = size,
    .generation = params.generation, .dirty_max = params.dirty_max,
  };
  if (set) {
    _Static_assert (SAMPLE_COUNT == FSC_WLOG_SAMPLES, "one sample");
    p.sample.n = set->n;
    memcpy (p.sample.off, set->off, sizeof p.sample.off);
    memcpy (p.sample.len, set->len, sizeof p.sample.len);
    memcpy (p.sample.hash, set->hash, sizeof p.sample.hash);
  }
  struct fsc_wlog_info info;
  struct fsc_wlog *wl = NULL;
  *wlp = NULL;
  if (fsc_wlog_open (cache, &p, wbmode ? FSC_WLOG_CREATE : 0, &wl,
                     &info) == -1) {
    switch (errno) {
    case ENOENT:
      return 0;                 /* no log: nothing to say */
    case EBUSY:
      nbdkit_error ("fscache: export \"%s\": another process uses its "
                    "cache in writeback mode (%s); refusing, since the "
                    "upstream may not hold what that process's clients "
                    "wrote", exportname, params.dir);
      return -1;
    case ESTALE:
      say_stale (exportname, &info, params.dir);
      return -1;
    case EUCLEAN:
      say_damaged (exportname, k, klen, &info, params.dir);
      return -1;
    case EBADMSG:
      nbdkit_error ("fscache: export \"%s\": its write log (.wlog in %s) "
                    "is damaged or not its own; refusing, since it may "
                    "hold the only copy of written data (nbd-fscache "
                    "invalidate --force discards it)", exportname,
                    params.dir);
      return -1;
    default:
      if (!wbmode) {
        /* No log of ours can be behind a path we cannot open (a
         * planted link, a foreign file): the object's own checks
         * decide about the rest.
         */
        nbdkit_debug ("fscache: export \"%s\": no usable write log: %m",
                      exportname);
        return 0;
      }
      nbdkit_error ("fscache: export \"%s\": opening its write log: %m",
                    exportname);
      return -1;
    }
  }
  if (info.dropped_records)
    nbdkit_debug ("fscache: export \"%s\": write log cut after its last "
                  "intact record (writes never flushed)", exportname);
  if (!wbmode) {
    bool dirty = fsc_wlog_dirty (wl);
    fsc_wlog_close (wl);
    if (dirty) {
      nbdkit_error ("fscache: export \"%s\": the cache holds %" PRIu64
                    " bytes written in writeback mode and not yet written "
                    "back; serving it in another mode would be stale.  "
                    "Use fscache-mode=writeback (which writes it back), "
                    "or 'nbd-fscache --dir %s writeback OBJECT URI', or "
                    "discard it with 'nbd-fscache --dir %s invalidate "
                    "--force OBJECT'", exportname, info.dirty_bytes,
                    params.dir, params.dir);
      return -1;
    }
    return 0;
  }
  if (info.records)
    say_note ("export \"%s\": %" PRIu64 " bytes of dirty data "
              "in %" PRIu64 " epochs found in the cache; writing them "
              "back", exportname, info.dirty_bytes, info.epochs);
  *wlp = wl;
  return 0;
}

struct wb *
wb_start (struct fsc_cache *cache, const char *exportname, const void *k,
          size_t klen, struct fsc_wlog *wl, struct fsc_object *obj,
          const struct fsc_open_info *info)
{
  if (info->busy) {
    nbdkit_error ("fscache: export \"%s\": another process caches it (%s); "
                  "writeback needs the object to itself", exportname,
                  params.dir);
    fsc_wlog_close (wl);
    return NULL;
  }
  struct wb *wb = calloc (1, sizeof *wb);
  if (wb == NULL || (wb->key = malloc (klen)) == NULL ||
      (wb->exportname = strdup (exportname)) == NULL) {
    nbdkit_error ("calloc: %m");
    goto err;
  }
  memcpy (wb->key, k, klen);
  wb->klen = klen;
  wb->wl = wl;
  wb->obj = fsc_object_ref (obj);
  struct fsc_wlog_info li;
  fsc_wlog_counters (wl, &li);
  wb->size = li.size;
  if (open_upstream (wb) == -1) {
    nbdkit_error ("fscache: export \"%s\": writeback: opening the writer's "
                  "connection to the upstream: %m", exportname);
    goto err_up;
  }
  struct fsc_wb_upstream wup = {
    .pwrite = w_pwrite, .zero = w_zero, .zero_keep = w_zero_keep,
    .trim = w_trim, .flush = w_flush,
    .pread = w_pread, .reopen = w_reopen, .opaque = wb,
    .nparallel = upstream_parallel (&wb->up) ? 8 : 1,
    .can_trim = wb->can_trim,
    .can_zero = wb->can_zero,
    .can_flush = wb->can_flush,
  };
  if (fsc_wlog_start_writer (wl, obj, &wup) == -1) {
    nbdkit_error ("fscache: export \"%s\": starting the writer: %m",
                  exportname);
    goto err_up;
  }
  pthread_mutex_lock (&list_lock);
  wb->next = list;
  list = wb;
  pthread_mutex_unlock (&list_lock);
  (void) cache;
  return wb;

 err_up:
  upstream_close (&wb->up);
  fsc_object_close (wb->obj);
 err:
  fsc_wlog_close (wl);
  if (wb) {
    free (wb->key);
    free (wb->exportname);
    free (wb);
  }
  return NULL;
}

void
wb_shutdown_all (void)
{
  pthread_mutex_lock (&list_lock);
  struct wb *all = list;
  list = NULL;
  pthread_mutex_unlock (&list_lock);

  while (all) {
    struct wb *wb = all;
    all = wb->next;
    uint64_t left = fsc_wlog_drain (wb->wl,
                                    (uint64_t) params.writeback_drain * 1000);
    bool refused = left && errno == ESHUTDOWN;
    wb_log_notices (wb);
    struct fsc_wlog_info info;
    fsc_wlog_counters (wb->wl, &info);
    if (refused)
      nbdkit_error ("fscache: export \"%s\": %" PRIu64 " bytes of dirty "
                    "data in %" PRIu64 " epochs left in the cache: the "
                    "upstream refuses requests while nbdkit shuts down (a "
                    "filter below this one sleeps, such as delay or rate), "
                    "so the writeback stops now; the next proxy on it "
                    "writes them back", wb->exportname, left, info.epochs);
    else if (left)
      nbdkit_error ("fscache: export \"%s\": %" PRIu64 " bytes of dirty "
                    "data in %" PRIu64 " epochs left in the cache after "
                    "%u s of writeback (fscache-writeback-drain); the next "
                    "proxy on it writes them back", wb->exportname, left,
                    info.epochs, params.writeback_drain);
    else
      nbdkit_debug ("fscache: export \"%s\": everything written back",
                    wb->exportname);
    fsc_wlog_close (wb->wl);    /* stops the writer, drops its ref */
    /* Ours is the last reference now: the object's closing wants the
     * upstream's fingerprint as our writeback left it.
     */
    if (fsc_object_needs_fingerprint (wb->obj)) {
      uint64_t fp;
      if (fingerprint (&wb->up, wb->key, wb->klen, wb->size, &fp) == 0)
        fsc_object_set_fingerprint (wb->obj, fp);
    }
    fsc_object_close (wb->obj);
    upstream_close (&wb->up);
    free (wb->key);
    free (wb->exportname);
    free (wb);
  }
}

/*----------------------------------------------------------------------
 * The client's requests in writeback mode.  Errors: the log's (EIO
 * once it failed, said loudly by wb_log_notices), or the upstream's
 * when an unaligned write had to read the rest of a unit.
 */

static int
done (struct wb *wb, int r, int *err)
{
  if (r == -1)
    *err = errno == ENOMEM || errno == ENOSPC ? errno : EIO;
  wb_log_notices (wb);
  return r;
}

int
wb_pread (struct wb *wb, struct fsc_object *obj, const struct fsc_upstream *up,
          void *buf, uint32_t count, uint64_t offset, unsigned rflags,
          int *err)
{
  int r = fsc_wlog_read (wb->wl, obj, buf, count, offset, up, rflags);
  bool damaged = r == -1 && errno == EBADMSG;
  done (wb, r, err);
  return damaged ? WB_DAMAGED : r;
}

int
wb_pwrite (struct wb *wb, struct fsc_object *obj,
           const struct fsc_upstream *up, const void *buf, uint32_t count,
           uint64_t offset, uint32_t flags, int *err)
{
  return done (wb, fsc_wlog_pwrite (wb->wl, obj, up, buf, count, offset,
                                    flags & NBDKIT_FLAG_FUA), err);
}

int
wb_zero (struct wb *wb, struct fsc_object *obj, const struct fsc_upstream *up,
         uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  unsigned f = (flags & NBDKIT_FLAG_FUA ? FSC_WLOG_FUA : 0) |
    (flags & NBDKIT_FLAG_MAY_TRIM ? 0 : FSC_WLOG_NO_HOLE);
  return done (wb, fsc_wlog_zero (wb->wl, obj, up, count, offset, f), err);
}

int
wb_trim (struct wb *wb, uint32_t count, uint64_t offset, uint32_t flags,
         int *err)
{
  return done (wb, fsc_wlog_trim (wb->wl, count, offset,
                                  flags & NBDKIT_FLAG_FUA), err);
}

int
wb_flush (struct wb *wb, int *err)
{
  return done (wb, fsc_wlog_flush (wb->wl), err);
}
