/* libfscache: the writer of writeback mode, which sends the write log
 * (wlog.c) to the upstream in order.
 *
 * Rule 6 (flush and FUA order): a write that arrived after a flush or
 * a FUA write was acknowledged reaches the upstream only after that
 * flush's writes, or that FUA write, are on the upstream and flushed
 * there.  An epoch ends at a flush and at a completed FUA write
 * (wlog.c, fsc_wlog_flush and wl_append); the writer sends one epoch at a
 * time and flushes the upstream before it touches the next.  Broken by
 * tests/writeback/test-wb-fua.sh (FUA: the knob NBD_FSCACHE_WB_FUA_UNORDERED=1
 * leaves a FUA write's epoch open) and tests/writeback/test-wb-cacheloss.sh
 * (flush: NBD_FSCACHE_WB_UNORDERED=1), both judged by tests/wb-oracle
 * after a cache loss.  A FUA write is not sent upstream with FUA and
 * waited for, which would cost the client an upstream round trip per
 * FUA write: its epoch's upstream flush, before anything later is
 * sent, gives the same order; the writer pays one upstream round trip
 * per epoch instead (docs/benchmarks.md, "FUA as an ordering point").
 *
 * One round:
 *
 *   1. Take a batch: the oldest records durable in the log (the
 *      writer syncs the log first if need be), all of one epoch
 *      (the epoch may still be open: its later records come in a later
 *      round, which is still "part of the next epoch"), at most
 *      BATCH_BYTES of them.
 *   2. Collapse it: within an epoch the order of writes to different
 *      bytes does not matter, and of writes to the same bytes only the
 *      last counts, so the batch becomes the newest version of each
 *      byte, and neighbours of one kind merge into requests of up to
 *      MAX_REQ bytes.
 *   3. Send the requests, NPARALLEL at a time (1 for a serial upstream:
 *      the filter's gate keeps the thread model, we only avoid queueing
 *      on it), each as a writethrough write would go: the object drops
 *      the blocks first (rule 2 of design.md), and stores the new bytes
 *      after.  Then an upstream flush.
 *   4. Only now is the batch safe upstream: re-read the coherency sample
 *      regions the batch touched, move the header's tail past the batch
 *      (synced), and retire its records (wl_retire frees them and
 *      punches their space once no reader holds them).
 *
 * Any upstream failure (an outage, an error) makes the round start
 * over after a pause that doubles up to MAX_BACKOFF_MS, with a reopen
 * of the upstream connection; the requests are idempotent, and the
 * next epoch is never touched before this one is flushed, so a failure
 * anywhere leaves the upstream at a flushed state plus part of the
 * epoch being written.
 *
 * When the log is empty the writer rewinds it to its start (the header
 * first, then the file is cut), so the file does not grow forever.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xxh.h"

#include "wlog-int.h"

#define BATCH_BYTES (UINT64_C (256) << 20)
#define MAX_REQ (UINT64_C (4) << 20)    /* bytes per upstream request */
#define MIN_BACKOFF_MS 100
#define MAX_BACKOFF_MS 5000
#define IDLE_MS 1000                    /* look again at least this often */

/* One upstream request of a batch. */
struct req {
  uint64_t off, len;
  int type;                             /* enum wl_type */
  /* Pieces of records whose bytes make it up (data only). */
  size_t first, n;                      /* into the batch's piece list */
};

struct batch {
  struct fsc_wlog *wl;
  struct wl_segs pc;                    /* the batch's newest versions */
  struct req *rq;
  size_t nrq, rqcap;
  /* Dispatch. */
  pthread_mutex_t lock;
  pthread_mutex_t update_lock;          /* update_obj, one at a time */
  size_t next;                          /* next request to send */
  int err;                              /* first failure */
  bool bad_log;                         /* a record failed its check */
  uint64_t bad_off;
};

static int
add_req (struct batch *b, const struct wl_seg *p, size_t i)
{
  struct req *last = b->nrq ? &b->rq[b->nrq - 1] : NULL;
  if (last && last->type == p->e->type && last->off + last->len == p->start &&
      (p->e->type != WL_DATA || last->len + (p->end - p->start) <= MAX_REQ) &&
      last->len + (p->end - p->start) <= UINT32_MAX / 2) {
    last->len += p->end - p->start;
    last->n++;
    return 0;
  }
  if (b->nrq == b->rqcap) {
    size_t ncap = b->rqcap ? 2 * b->rqcap : 64;
    struct req *v = realloc (b->rq, ncap * sizeof *v);
    if (v == NULL)
      return -1;
    b->rq = v;
    b->rqcap = ncap;
  }
  b->rq[b->nrq++] = (struct req) {
    .off = p->start, .len = p->end - p->start, .type = p->e->type,
    .first = i, .n = 1,
  };
  return 0;
}

/* The bytes of data request R, from the log (verified). */
static int
load_req (struct batch *b, const struct req *r, unsigned char *data)
{
  for (size_t i = r->first; i < r->first + r->n; ++i) {
    const struct wl_seg *p = &b->pc.v[i];
    /* Extents are unit-aligned, so each piece is whole units of its
     * record (the last one may end at the export's end).
     */
    if (wl_read_units (b->wl, p->e, p->start, p->end - p->start,
                       data + (p->start - r->off)) == -1) {
      pthread_mutex_lock (&b->lock);
      b->bad_log = true;
      b->bad_off = p->start;
      pthread_mutex_unlock (&b->lock);
      errno = EIO;
      return -1;
    }
  }
  return 0;
}

/* After request R reached the upstream: make the object a copy of what
 * the upstream now holds, as a writethrough write would (rules 2 and 3
 * of design.md: blocks dropped, fetches in flight discarded, whole
 * blocks stored, partly covered ones merged if held whole), but
 * locally only, so no block is absent for longer than a local write,
 * and overlapping the batch's other requests.  Until the batch is
 * flushed upstream and the tail moves, the log still holds R's bytes
 * and serves every read of them, so neither the object's older copy
 * nor this newer one is seen early.  The drops need not be durable one
 * by one: the round commits once before the log lets go of the bytes.
 * DATA: R's bytes (data requests).
 */
static void
update_obj (struct batch *b, const struct req *r, const unsigned char *data)
{
  struct fsc_object *o = b->wl->obj;
  struct fsc_write w;
  if (o == NULL)
    return;
  if (r->type != WL_DATA) {
    /* Zeroes are stored as zero blocks, trimmed blocks just dropped. */
    for (uint64_t done = 0; done < r->len;) {
      uint32_t n = MIN (r->len - done, (uint64_t) 1 << 30);
      unsigned f = FSC_WRITE_NOSYNC |
        (WL_IS_ZERO (r->type) ? FSC_WRITE_KEEP : 0);
      if (fsc_object_write_begin_flags (o, r->off + done, n, f, &w) == 0)
        fsc_object_write_end (o, &w, NULL, true);
      done += n;
    }
    return;
  }
  /* One sender at a time: the update is local work, which several
   * senders at once would only add to the client's load on a small
   * machine; one overlaps the others' upstream waits well enough.
   */
  pthread_mutex_lock (&b->update_lock);
  if (fsc_object_write_begin_flags (o, r->off, r->len,
                                    FSC_WRITE_NOSYNC | FSC_WRITE_KEEP,
                                    &w) == 0)
    fsc_object_write_end (o, &w, data, true);
  pthread_mutex_unlock (&b->update_lock);
}

/* A data request's buffer, LEN bytes: the cache's big buffers
 * (bufs.c), mapped, so 4 KiB aligned, and pooled.  Aligned, the
 * object's copy of the bytes (update_obj) is a direct write (data.c:
 * O_DIRECT from FSC_DIRECT_MIN); from malloc it was not, and each 4 MiB
 * request was copied into the page cache a second time after the
 * upstream's write: a 5.5 to 7 ms stretch in the kernel per request
 * (perf trace), which no thread on that CPU could preempt (this
 * kernel preempts none), and the hits of another proxy on the same
 * machine woken there waited for it (perf sched timehist: 5.5 ms
 * scheduling delays behind the writeback proxy's thread; the drain's
 * hit p99.9, issue 44, stop 57).  Pooled, a steady drain maps and
 * faults in no new pages for each request.  Without an object (the
 * nbd-fscache writeback tool), aligned from the heap.
 */
static unsigned char *
req_buf_get (struct batch *b, uint64_t len, size_t *cap)
{
  struct fsc_object *o = b->wl->obj;
  if (o)
    return fsc_buf_get (o->cache, len, cap);
  void *p = NULL;
  *cap = 0;
  errno = posix_memalign (&p, 4096, len);
  return errno ? NULL : p;
}

static void
req_buf_put (struct batch *b, unsigned char *p, size_t cap)
{
  struct fsc_object *o = b->wl->obj;
  if (o)
    fsc_buf_put (o->cache, p, cap);
  else
    free (p);
}

/* Send request R upstream, then bring the object up to date. */
static int
send_req (struct batch *b, const struct req *r)
{
  struct fsc_wlog *wl = b->wl;
  const struct fsc_wb_upstream *up = &wl->up;
  int ret = 0;

  /* An upstream request is at most 32 bits of bytes: a huge zero or
   * trim goes in slices.
   */
  if (r->type != WL_DATA) {
    for (uint64_t done = 0; done < r->len && ret == 0;) {
      uint32_t n = MIN (r->len - done, (uint64_t) 1 << 30);
      uint64_t off = r->off + done;
      if (r->type == WL_ZERO && up->can_zero)
        ret = up->zero (up->opaque, n, off);
      else if (r->type == WL_ZERO_ALLOC && up->can_zero && up->zero_keep)
        ret = up->zero_keep (up->opaque, n, off);
      else if (WL_IS_ZERO (r->type)) {
        /* No zero upstream (or none that keeps the range allocated):
         * write zeroes, a slice at a time.
         */
        unsigned char *z = calloc (1, MIN ((uint64_t) n, MAX_REQ));
        if (z == NULL)
          ret = -1;
        for (uint64_t k = 0; k < n && ret == 0; k += MAX_REQ)
          ret = up->pwrite (up->opaque, z, MIN ((uint64_t) n - k, MAX_REQ),
                            off + k);
        free (z);
      }
      else if (up->can_trim)
        ret = up->trim (up->opaque, n, off);
      done += n;
    }
    if (ret == 0)
      update_obj (b, r, NULL);
    return ret;
  }

  size_t cap;
  unsigned char *data = req_buf_get (b, r->len, &cap);
  if (data == NULL)
    return -1;
  ret = load_req (b, r, data);
  if (ret == 0)
    ret = up->pwrite (up->opaque, data, r->len, r->off);
  if (ret == 0)
    update_obj (b, r, data);
  req_buf_put (b, data, cap);
  return ret;
}

static void *
sender (void *arg)
{
  struct batch *b = arg;
  for (;;) {
    pthread_mutex_lock (&b->lock);
    if (b->err || b->next >= b->nrq) {
      pthread_mutex_unlock (&b->lock);
      return NULL;
    }
    size_t i = b->next++;
    pthread_mutex_unlock (&b->lock);
    if (send_req (b, &b->rq[i]) == -1) {
      int e = errno ? errno : EIO;
      pthread_mutex_lock (&b->lock);
      if (!b->err)
        b->err = e;
      pthread_mutex_unlock (&b->lock);
    }
  }
}

/* A sender thread of its own (the writer sends too, under its name). */
static void *
sender_thread (void *arg)
{
  fsc_thread_name ("fsc-wb-send");
  return sender (arg);
}

/* Send every request of B, up to NPARALLEL at once.  0 or -1. */
static int
send_all (struct fsc_wlog *wl, struct batch *b)
{
  unsigned n = MAX (1u, MIN (wl->up.nparallel, 16u));
  pthread_t th[16];
  unsigned started = 0;
  if (n > b->nrq)
    n = b->nrq;
  for (unsigned i = 1; i < n; ++i)
    if (pthread_create (&th[started], NULL, sender_thread, b) == 0)
      started++;
  sender (b);
  for (unsigned i = 0; i < started; ++i)
    pthread_join (th[i], NULL);
  if (b->err) {
    errno = b->err;
    return -1;
  }
  return 0;
}

/* Rehash the sample regions the batch touched, from the upstream. */
static int
resample (struct fsc_wlog *wl, const struct batch *b,
          struct fsc_wlog_sample *s)
{
  pthread_mutex_lock (&wl->lock);
  *s = wl->sample;
  pthread_mutex_unlock (&wl->lock);
  unsigned char *buf = NULL;
  for (unsigned i = 0; i < s->n; ++i) {
    uint64_t a = s->off[i], z = a + s->len[i];
    bool touched = false;
    for (size_t k = 0; k < b->nrq && !touched; ++k)
      touched = b->rq[k].off < z && b->rq[k].off + b->rq[k].len > a;
    if (!touched || s->len[i] == 0)
      continue;
    if (buf == NULL && (buf = malloc (4096 > s->len[i] ? 4096 : s->len[i]))
        == NULL)
      return -1;
    if (s->len[i] > 4096 ||
        wl->up.pread (wl->up.opaque, buf, s->len[i], a) == -1) {
      free (buf);
      return -1;
    }
    s->hash[i] = XXH3_64bits (buf, s->len[i]);
  }
  free (buf);
  return 0;
}

/* The log cannot go on: a header write failed, or a logged unit is
 * bad (BAD_OFF, or UINT64_MAX).  Said loudly; the writer then stops
 * sending (never what it cannot vouch for) and new writes get EIO.
 */
static void
writer_fail (struct fsc_wlog *wl, int err, uint64_t bad_off)
{
  pthread_mutex_lock (&wl->lock);
  if (bad_off != UINT64_MAX)
    wl_notice (wl, FSC_WLOG_NOTICE_BADREAD, err, bad_off);
  wl->failed = true;
  wl->halted = true;
  wl->err = err;
  wl_notice (wl, FSC_WLOG_NOTICE_FAILED, err, 0);
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
}

static void
sleep_ms (struct fsc_wlog *wl, unsigned ms)
{
  struct timespec ts;
  deadline_ms (&ts, ms);
  pthread_mutex_lock (&wl->lock);
  if (!wl->stopping)
    pthread_cond_timedwait (&wl->cond, &wl->lock, &ts);
  pthread_mutex_unlock (&wl->lock);
}

/* The log is empty and nothing is being appended: start it over at
 * WL_START, header first so that a crash in between finds an empty
 * log (the old records' sequence numbers are below the new tail's).
 */
static void
rewind_log (struct fsc_wlog *wl)
{
  pthread_mutex_lock (&wl->lock);
  if (wl->rlen || wl->head_pos == WL_START || wl->failed || wl->salvage ||
      wl->next_seq != wl->applied_seq) {
    pthread_mutex_unlock (&wl->lock);
    return;
  }
  wl->resetting = true;
  uint64_t old_tail = wl->tail_pos;
  wl->tail_pos = wl->head_pos = WL_START;
  pthread_mutex_unlock (&wl->lock);
  int r = wl_write_header (wl);
  pthread_rwlock_wrlock (&wl->punch);
  if (r == 0)
    r = ftruncate (wl->fd, WL_START);
  pthread_rwlock_unlock (&wl->punch);
  pthread_mutex_lock (&wl->lock);
  if (r == -1) {
    /* The old header still names OLD_TAIL; keep appending there. */
    wl->tail_pos = wl->head_pos = old_tail;
  }
  wl->resetting = false;
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
  /* The cut freed the reservation too (rule 9 of wlog.c). */
  if (r == 0)
    wl_reserve (wl);
}

/* A batch written back and flushed upstream (its N records, up to
 * END_POS and END_SEQ): move the log's tail past it and free its
 * space.  1 done; 0 not done (retried later, or the writer failed,
 * said); -1 a failure for round_once's failed path.
 */
static int
retire_batch (struct fsc_wlog *wl, struct batch *b, size_t n,
              uint64_t end_pos, uint64_t end_seq)
{
  struct fsc_wlog_sample s;
  if (resample (wl, b, &s) == -1)
    return -1;
  pthread_mutex_lock (&wl->lock);
  struct fsc_wlog_sample old_sample = wl->sample;
  uint64_t old_pos = wl->tail_pos, old_seq = wl->tail_seq;
  wl->sample = s;
  wl->tail_pos = end_pos;
  wl->tail_seq = end_seq;
  pthread_mutex_unlock (&wl->lock);
  if (wl_write_header (wl) == -1) {
    if (errno == ENOMEM) {
      /* Nothing written: the tail stays, and the round is retried
       * later (its requests are idempotent).
       */
      pthread_mutex_lock (&wl->lock);
      wl->sample = old_sample;
      wl->tail_pos = old_pos;
      wl->tail_seq = old_seq;
      pthread_mutex_unlock (&wl->lock);
      return 0;
    }
    writer_fail (wl, errno, UINT64_MAX);
    return 0;
  }
  /* The retired records' space: punched from the old tail's page on
   * (whatever precedes the old tail in that page was retired before;
   * rounding up would leave one page of every batch allocated until
   * the log empties), up to the new tail's page, which stays.
   */
  pthread_mutex_lock (&wl->lock);
  uint64_t punch_from = wl_entry_at (wl, 0)->pos;
  pthread_mutex_unlock (&wl->lock);
  wl_retire (wl, n);
  pthread_rwlock_wrlock (&wl->punch);
  uint64_t a = ROUND_DOWN (punch_from, (uint64_t) 4096);
  uint64_t z = ROUND_DOWN (end_pos, (uint64_t) 4096);
  if (a >= WL_START && z > a)
    (void) punch_hole (wl->fd, a, z - a);
  pthread_rwlock_unlock (&wl->punch);
  /* What was punched behind the tail is reserved again ahead of it
   * (rule 9 of wlog.c): dirty-max of space stays the log's.
   */
  wl_reserve (wl);
  return 1;
}

/* One round; returns 1 if it wrote something back, 0 if there was
 * nothing to do, -1 on an upstream or cache failure.
 */
static int
round_once (struct fsc_wlog *wl)
{
  struct batch b;
  memset (&b, 0, sizeof b);
  b.wl = wl;
  pthread_mutex_init (&b.lock, NULL);
  pthread_mutex_init (&b.update_lock, NULL);
  struct wl_ext *map = NULL;
  size_t n = 0;
  uint64_t end_pos = 0, end_seq = 0, bytes = 0;
  int ret = -1;

  /* 1. The batch: only records durable in the log (rule 8 of wlog.c:
   * a record sent before its sync could reach the upstream and be lost
   * from the log by a power cut).  The writer syncs what is applied
   * itself when nothing durable waits, so unflushed writes are written
   * back as promptly; a sync in progress (a flusher's) is shared, and
   * while flushes keep records durable the writer adds no sync.  A
   * failed log's records that a sync covered are still written back.
   */
  pthread_mutex_lock (&wl->lock);
  if (wl->durable_seq <= wl->ring_seq && wl->durable_seq < wl->applied_seq)
    (void) wl_sync_upto (wl, wl->applied_seq);
  size_t avail = wl->durable_seq > wl->ring_seq
    ? wl->durable_seq - wl->ring_seq : 0;
  if (avail == 0) {
    pthread_mutex_unlock (&wl->lock);
    pthread_mutex_destroy (&b.lock);
    pthread_mutex_destroy (&b.update_lock);
    return 0;
  }
  uint64_t epoch = wl_entry_at (wl, 0)->epoch;
  bool mapfail = false;
  for (; n < avail && bytes < BATCH_BYTES && !mapfail; ++n) {
    struct wl_entry *e = wl_entry_at (wl, n);
    if (e->epoch != epoch && !wl->unordered)
      break;
    /* 2. Newest version of each byte (records are in sequence order). */
    /* Out of memory the round is retried later (never the log failed
     * for a private map).
     */
    if (e->type != WL_FLUSH && e->type != WL_VOID &&
        wl_map_try_insert (wl, &map, e->off, e->off + e->len, e) == -1)
      mapfail = true;
    bytes += e->rsize;
    end_pos = e->pos + e->rsize;
    end_seq = e->seq + 1;
  }
  pthread_mutex_unlock (&wl->lock);
  if (mapfail)
    goto out;
  wl_map_visit (map, 0, UINT64_MAX, wl_collect, &b.pc);
  if (b.pc.nomem)
    goto out;
  if (wl->unordered) {
    /* Test knob (NBD_FSCACHE_WB_UNORDERED): what a writer that ignores
     * epochs would do, newest first and no flush between epochs.
     */
    for (size_t i = 0; i < b.pc.n / 2; ++i) {
      struct wl_seg t = b.pc.v[i];
      b.pc.v[i] = b.pc.v[b.pc.n - 1 - i];
      b.pc.v[b.pc.n - 1 - i] = t;
    }
  }
  for (size_t i = 0; i < b.pc.n; ++i)
    if (add_req (&b, &b.pc.v[i], i) == -1)
      goto out;

  /* 3. Send, then flush. */
  if (wl->unordered && wl->up.nparallel > 1) {
    /* In order of the reversed list, one at a time. */
    for (size_t i = 0; i < b.nrq; ++i)
      if (send_req (&b, &b.rq[i]) == -1)
        goto failed;
  }
  else if (send_all (wl, &b) == -1)
    goto failed;
  if (wl->up.can_flush && !wl->unordered &&
      wl->up.flush (wl->up.opaque) == -1)
    goto failed;
  if (wl->obj) {
    /* Durable before the log forgets the bytes: a crash after the
     * tail moves must not find the object naming older ones.  A
     * failure withdraws the object (its files go): safe too.
     */
    (void) fsc_object_commit (wl->obj);
  }

  /* 4. Durable upstream: move the tail. */
  int rb = retire_batch (wl, &b, n, end_pos, end_seq);
  if (rb == -1)
    goto failed;
  if (rb == 1)
    ret = 1;
  goto out;

 failed:
  if (b.bad_log) {
    /* A logged unit failed its check: the only copy is bad. */
    writer_fail (wl, EIO, b.bad_off);
    goto out;
  }
  ret = -1;
 out:
  wl_map_free (map);
  free (b.pc.v);
  free (b.rq);
  pthread_mutex_destroy (&b.lock);
  pthread_mutex_destroy (&b.update_lock);
  return ret;
}

static void *
writer (void *arg)
{
  struct fsc_wlog *wl = arg;
  fsc_thread_name ("fsc-wb-writer");
  unsigned backoff = MIN_BACKOFF_MS;
  for (;;) {
    pthread_mutex_lock (&wl->lock);
    bool stop = wl->stopping, halted = wl->halted;
    /* A failed log syncs no more: what it had synced is the work. */
    bool work = (wl->failed ? wl->durable_seq : wl->applied_seq) >
      wl->tail_seq;
    pthread_mutex_unlock (&wl->lock);
    if (stop)
      break;
    /* A failed append leaves the records before it good: they are
     * still written back.  A halt sends nothing more.
     */
    if (halted) {
      sleep_ms (wl, IDLE_MS);
      continue;
    }
    if (!work) {
      rewind_log (wl);
      pthread_mutex_lock (&wl->lock);
      if (!wl->stopping &&
          (wl->failed ? wl->durable_seq : wl->applied_seq) <=
          wl->tail_seq) {
        struct timespec ts;
        deadline_ms (&ts, IDLE_MS);
        wl->writer_idle = true;       /* apply_done wakes us */
        pthread_cond_timedwait (&wl->cond, &wl->lock, &ts);
        wl->writer_idle = false;
      }
      pthread_mutex_unlock (&wl->lock);
      continue;
    }
    int r = round_once (wl);
    if (r >= 0) {
      if (wl->outage) {
        pthread_mutex_lock (&wl->lock);
        wl_notice (wl, FSC_WLOG_NOTICE_BACK, 0, 0);
        pthread_mutex_unlock (&wl->lock);
      }
      wl->outage = 0;
      __atomic_store_n (&wl->last_err, 0, __ATOMIC_RELAXED);
      backoff = MIN_BACKOFF_MS;
      continue;
    }
    int e = errno;
    pthread_mutex_lock (&wl->lock);
    wl->last_err = e;
    pthread_cond_broadcast (&wl->cond);         /* a drain may end */
    /* A round that halted the writer (writer_fail: a bad logged unit,
     * a header write error) said why; it is no upstream failure, and
     * the next turn only idles.
     */
    halted = wl->halted;
    if (!halted && wl->outage++ == 0)
      wl_notice (wl, FSC_WLOG_NOTICE_UPSTREAM, e, 0);
    pthread_mutex_unlock (&wl->lock);
    if (halted)
      continue;
    sleep_ms (wl, backoff);
    backoff = MIN (backoff * 2, (unsigned) MAX_BACKOFF_MS);
    /* A stale write from the old context (issue 25): every sender of
     * the failed round has returned (send_all joins them), the reopen
     * closes the old context before it opens the new one, and the
     * next round sends the whole failed epoch again and flushes it on
     * the new context before any later epoch.  So a write of the old context that the server still
     * executes late carries bytes of this epoch or an earlier one, and
     * can only be overtaken by a later epoch if the server runs it
     * after the new context's flush: NBD has no fencing of a dead
     * connection's requests, so what the server keeps in its queue for
     * that long is beyond the client's reach.  design.md, "The writer".
     */
    if (wl->up.reopen)
      (void) wl->up.reopen (wl->up.opaque);
  }
  return NULL;
}

int
fsc_wlog_start_writer (struct fsc_wlog *wl, struct fsc_object *obj,
                       const struct fsc_wb_upstream *up)
{
  if (wl->writer_running) {
    errno = EBUSY;
    return -1;
  }
  wl->up = *up;
  if (wl->up.nparallel == 0)
    wl->up.nparallel = 1;
  wl->obj = obj;
  if (obj)
    fsc_object_ref (obj);
  wl->stopping = false;
  int e = pthread_create (&wl->writer, NULL, writer, wl);
  if (e) {
    if (obj)
      fsc_object_close (obj);
    wl->obj = NULL;
    errno = e;
    return -1;
  }
  wl->writer_running = true;
  return 0;
}

void
wl_writer_stop (struct fsc_wlog *wl)
{
  if (!wl->writer_running)
    return;
  pthread_mutex_lock (&wl->lock);
  wl->stopping = true;
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
  pthread_join (wl->writer, NULL);
  wl->writer_running = false;
  if (wl->obj)
    fsc_object_close (wl->obj);
  wl->obj = NULL;
}

/* ESHUTDOWN from the upstream: nbdkit_nanosleep's answer once the
 * server is shutting down, which the filters that sleep (delay, rate)
 * pass on.  Below them nothing more gets through in this process, so
 * waiting out the drain time would only hold up the exit, writing
 * nothing (issue 29, item 5): the drain ends at once and says why.
 * nbdkit 1.32 has no hook that runs before it starts refusing sleeps,
 * so the backlog stays for the next proxy (tests/filter/test-transparent.sh).
 */
uint64_t
fsc_wlog_drain (struct fsc_wlog *wl, uint64_t timeout_ms)
{
  struct timespec end;
  deadline_ms (&end, timeout_ms);
  SCOPED_LOCK (&wl->lock);
  while (wl->rlen && timeout_ms && wl->writer_running && !wl->stopping &&
         !wl->halted && wl->last_err != ESHUTDOWN &&
         !(wl->failed && wl->durable_seq <= wl->tail_seq)) {
    if (pthread_cond_timedwait (&wl->cond, &wl->lock, &end) == ETIMEDOUT)
      break;
  }
  errno = wl->rlen && wl->last_err == ESHUTDOWN ? ESHUTDOWN : 0;
  return wl->dirty_bytes;
}
