/* libfscache: the write log of writeback mode (wlog.h says what it is
 * for; docs/format.md, "Write log", has the bytes; docs/design.md,
 * "Writeback", the reasons).
 *
 * The log is five files.  This one: records and their ring, append,
 * apply, sync and flush, epochs, retiring, the header's writes, and
 * the rules below.  wlog-map.c: the extent map of dirty ranges (what a
 * read or the writer looks up).  wlog-client.c: the client's reads,
 * writes, zeroes and trims on top of the log and the map (rules 10 and
 * 11 are kept there).  wlog-recover.c: the log read back, recovery at
 * open (rule 7 is kept there), close, the counters and notices the
 * caller reads, and the tools' inspection.  wlog-format.c: the bytes
 * of the header and the records, encoded and decoded.  wlog-int.h says
 * which file owns each helper they share.
 *
 * The life of a record:
 *
 *   1. reserved: under wl->lock it gets the next sequence number, the
 *      current epoch and the next bytes of the file (the head), and
 *      joins the ring of records; a write past the dirty bound waits
 *      here for the writer to retire records (backpressure).
 *   2. written: its bytes go to the file without the lock.
 *   3. applied: records are put into the extent map strictly in
 *      sequence order (a record written early waits for those reserved
 *      before it), so the map always shows the order recovery would
 *      find, and a flush knows that everything below applied_seq is
 *      in the file.  The client's write is acknowledged here (with
 *      FUA after a sync).
 *   4. durable: a flush or FUA syncs the file once for every record
 *      applied so far (concurrent flushers share syncs), then appends
 *      a marker record naming what that sync covered.
 *   5. retired by the writer (writeback.c) once the upstream has it
 *      and has flushed: the header's tail moves past it (synced), it
 *      leaves the map, and its space is punched.
 *
 * Recovery reads records from the tail, each checked (header checksum
 * seeded with the log's incarnation, every data unit's hash).  Since a
 * flush waits for every record below it to be written before it syncs,
 * no record a flush covered lies after a torn one.
 *
 * Writeback rules (rules 1-5 are atop commit.c, store.c and evict.c;
 * rule 6, flush and FUA order, atop writeback.c):
 *
 * Rule 7 (what recovery may drop): only a torn tail, which nothing
 * promised.  Where the records stop decoding (record SEQ at byte POS),
 * the rest of the file is searched, 8-byte step by step, for records
 * of this incarnation (their checksum is seeded with it) with a larger
 * sequence number.  If a marker among them covers SEQ (its bound is
 * above SEQ), SEQ was synced before that marker was written: the log
 * is damaged, not torn, and is never cut or shortened: the open fails
 * with EUCLEAN, saying where, and only a salvage (FSC_WLOG_SALVAGE,
 * nbd-fscache writeback --salvage) or a forced discard goes past it.
 * Otherwise the tail from POS is cut, so no record of an earlier run
 * can ever follow a later one.  Records at or below the header's tail
 * were written back and are never read.  A record whose header decodes
 * but whose data fails is damage too if a marker covers it (kept, its
 * units fail with EIO), else torn (cut with what follows).  Broken by:
 * tests/writeback/test-wb-damage.sh, tests/unit/unit-wlog.c (8b), tests/fuzz-wlog.c
 * (its oracle).
 *
 * Rule 8 (durable before acknowledged or sent): nothing the log holds
 * is acknowledged as flushed, or sent to the upstream, before a sync
 * of the log covers it.  Recovery syncs what it adopts before the open
 * returns (kill -9 leaves the log in the page cache, which a power cut
 * then loses; durable_seq starts at next_seq only because of that
 * sync), and the writer takes only records below durable_seq (it
 * starts the sync itself, shared with flushers through sync_upto).
 * Broken by: tests/unit/unit-powerloss.c run_restart (a flush after kill -9
 * and a restart, then power loss) and sent_not_durable (every unit
 * sent upstream was durable in the log).
 *
 * Rule 9 (bounded log): the bytes between tail and head never exceed
 * dirty-max plus one marker, and the records in memory never exceed
 * dirty-max / 4096 plus one; that space is the log's (reserved), and
 * a failed record write costs its request, not the log.  A flush with
 * nothing new since the last marker writes no marker and syncs
 * nothing; every other append is charged its bytes, at least one
 * unit, and one marker's worth (so a marker, which never waits, always
 * fits in what its records reserved).  wl_reserve keeps dirty-max
 * past the tail allocated (fallocate, KEEP_SIZE).  A record whose
 * write fails becomes a void record (WL_VOID) before anything after it
 * applies.  Broken by: tests/unit/unit-wlog.c sections 10 (a flush loop
 * during an outage), 11 (zero records at the bound), 13 (a failed
 * record write, then the log goes on); tests/writeback/test-wb-diskfull.sh (the
 * cache disk full, reserved and not).
 *
 * Rule 10 (overlapping writes): client writes, zeroes and trims that
 * touch the same unit are serialized, whatever their alignment: an
 * unaligned write's read-modify-write never logs an old unit over an
 * overlapping write (range_lock).  Broken by tests/writeback/test-wb-overlap.sh.
 *
 * Rule 11 (no lock across upstream I/O): neither wl->lock nor
 * wl->punch is held while a read waits for the object or the
 * upstream, so reads of dirty or cached data never wait for a miss
 * (fsc_wlog_read).  Broken by tests/writeback/test-wb-hang.sh.
 */
#include <config.h>
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xxh.h"

#include "wlog-int.h"

/*----------------------------------------------------------------------
 * Header.
 */

/* Write the header (the other slot) and sync.  Only one caller at a
 * time: open, the writer, close (the writer stopped).
 */
int
wl_write_header (struct fsc_wlog *wl)
{
  unsigned char *p = malloc (WL_SLOT);
  if (p == NULL)
    return -1;
  pthread_mutex_lock (&wl->lock);
  uint64_t gen = wl->hdr_gen + 1;
  int slot = 1 - wl->hdr_slot;
  wl_encode_header (wl, gen, p);
  pthread_mutex_unlock (&wl->lock);
  int r = fsc_io_pwrite (&wl->cache->io, FSC_FILE_WLOG, wl->fd, p, WL_SLOT,
                         (uint64_t) slot * WL_SLOT);
  if (r == 0)
    r = fsc_io_sync (&wl->cache->io, FSC_FILE_WLOG, wl->fd);
  free (p);
  if (r == 0) {
    pthread_mutex_lock (&wl->lock);
    wl->hdr_gen = gen;
    wl->hdr_slot = slot;
    pthread_mutex_unlock (&wl->lock);
  }
  return r;
}

/*----------------------------------------------------------------------
 * Records.
 */

void
wl_free_entry (struct wl_entry *e)
{
  if (e) {
    free (e->hashes);
    free (e->spare[0]);
    free (e->spare[1]);
    free (e);
  }
}

int
wl_ring_push (struct fsc_wlog *wl, struct wl_entry *e)
{
  if (wl->rlen == wl->rcap) {
    size_t ncap = wl->rcap ? wl->rcap * 2 : 64;
    struct wl_entry **n = malloc (ncap * sizeof *n);
    if (n == NULL)
      return -1;
    for (size_t i = 0; i < wl->rlen; ++i)
      n[i] = wl_entry_at (wl, i);
    free (wl->ring);
    wl->ring = n;
    wl->rhead = 0;
    wl->rcap = ncap;
  }
  wl->ring[(wl->rhead + wl->rlen) % wl->rcap] = e;
  wl->rlen++;
  return 0;
}

void
wl_notice (struct fsc_wlog *wl, unsigned what, int err, uint64_t off)
{
  wl->notices |= what;
  if (err)
    wl->notice_err = err;
  if (what & FSC_WLOG_NOTICE_BADREAD)
    wl->notice_off = off;
}

/* The log cannot take more: a record may be lost or the map is wrong.
 * Caller holds wl->lock.
 */
static void
fail (struct fsc_wlog *wl, int err)
{
  if (!wl->failed) {
    wl->failed = true;
    wl->err = err;
  }
  wl_notice (wl, FSC_WLOG_NOTICE_FAILED, err, 0);
  pthread_cond_broadcast (&wl->cond);
  pthread_cond_broadcast (&wl->apply_cond);
  pthread_cond_broadcast (&wl->sync_cond);
}

/* Put applied records into the map, in order.  Caller holds lock. */
static void
apply_done (struct fsc_wlog *wl)
{
  bool any = false;
  while (wl->applied_seq < wl->next_seq && !wl->failed) {
    struct wl_entry *e = wl_entry_at (wl, wl->applied_seq - wl->ring_seq);
    if (!e->done)
      break;
    /* Void records (a failed write's slot, rule 9) map nothing. */
    bool maps = e->type != WL_FLUSH && e->type != WL_VOID;
    if (maps && e->spare[0]) {
      wl_map_insert_nodes (wl, &wl->root, e->off, e->off + e->len, e,
                           e->spare[0], e->spare[1]);
      e->spare[0] = e->spare[1] = NULL;
    }
    else if (maps)
      wl_map_insert (wl, &wl->root, e->off, e->off + e->len, e);
    if (wl->failed)
      break;
    wl->applied_seq++;
    any = true;
  }
  /* Only who waits for what is now applied: appenders behind a slower
   * one, flushers, and the writer when idle.  Waking every waiter on
   * every record (a thundering herd at iodepth 16: a flush waiting for
   * a sync woke with each write) showed in profiles as most of the
   * front end's CPU.
   */
  if (any && wl->applied_seq >= wl->apply_want) {
    wl->apply_want = UINT64_MAX;
    pthread_cond_broadcast (&wl->apply_cond);
  }
  if (any && wl->writer_idle)
    pthread_cond_broadcast (&wl->cond);
}

/* Wait until every record before TARGET is applied (or the log
 * failed).  Caller holds wl->lock.  A waiter woken for a lower target
 * than its own registers again.
 */
static void
apply_wait_upto (struct fsc_wlog *wl, uint64_t target)
{
  while (!wl->failed && !wl->holes && wl->applied_seq < target) {
    if (target < wl->apply_want)
      wl->apply_want = target;
    pthread_cond_wait (&wl->apply_cond, &wl->lock);
  }
}

/* Make every applied record durable, at least up to TARGET.  Caller
 * holds wl->lock; it is dropped around the sync.
 */
int
wl_sync_upto (struct fsc_wlog *wl, uint64_t target)
{
  while (wl->durable_seq < target && !wl->failed) {
    if (wl->syncing) {
      pthread_cond_wait (&wl->sync_cond, &wl->lock);
      continue;
    }
    wl->syncing = true;
    uint64_t s = wl->applied_seq;
    pthread_mutex_unlock (&wl->lock);
    int r = fsc_io_sync (&wl->cache->io, FSC_FILE_WLOG, wl->fd);
    int e = errno;
    pthread_mutex_lock (&wl->lock);
    wl->syncing = false;
    if (r == -1)
      fail (wl, e);
    else if (s > wl->durable_seq)
      wl->durable_seq = s;
    pthread_cond_broadcast (&wl->sync_cond);
  }
  if (wl->failed) {
    errno = EIO;
    return -1;
  }
  return 0;
}

void
wl_reserve (struct fsc_wlog *wl)
{
  pthread_mutex_lock (&wl->lock);
  uint64_t from = wl->head_pos;
  uint64_t to = ROUND_UP (wl->tail_pos + wl->dirty_max + WL_REC_HDR,
                          (uint64_t) 4096);
  bool salvage = wl->salvage;
  pthread_mutex_unlock (&wl->lock);
  /* A salvage leaves a damaged log's file as it is (rule 7). */
  if (to <= from || salvage)
    return;
  /* Beyond the size (KEEP_SIZE): recovery reads no further than the
   * file's size, and allocated space reads as zeroes anyway.
   */
  int r = fallocate (wl->fd, FALLOC_FL_KEEP_SIZE, (off_t) from,
                     (off_t) (to - from));
  int e = errno;
  pthread_mutex_lock (&wl->lock);
  if (r == -1 && !wl->unreserved)
    wl_notice (wl, FSC_WLOG_NOTICE_NORESERVE, e, 0);
  wl->unreserved = r == -1;
  pthread_mutex_unlock (&wl->lock);
}

/* Write the header of every void record not yet written (rule 9: a
 * failed record's slot must become something recovery accepts before
 * anything after it is applied), after trying the reservation again.
 * Returns 0 once none is left, or -1 EIO.  Called without wl->lock.
 */
static int
fill_holes (struct fsc_wlog *wl)
{
  unsigned char h[WL_REC_HDR];
  int r = 0, err = 0;
  wl_reserve (wl);
  pthread_mutex_lock (&wl->lock);
  for (uint64_t s = wl->applied_seq; wl->holes && !wl->failed &&
         s < wl->next_seq && r == 0; ++s) {
    /* By sequence number: the ring's index moves when the writer
     * retires records while the lock is dropped.
     */
    struct wl_entry *e = wl_entry_at (wl, s - wl->ring_seq);
    if (e->type != WL_VOID || e->done)
      continue;
    wl_encode_rec (wl, e, h);
    uint64_t pos = e->pos;
    pthread_mutex_unlock (&wl->lock);
    r = fsc_io_pwrite (&wl->cache->io, FSC_FILE_WLOG, wl->fd, h, sizeof h,
                       pos);
    err = errno;
    pthread_mutex_lock (&wl->lock);
    if (r == 0 && !e->done) {
      e->done = true;
      wl->holes--;
    }
  }
  if (r == -1)
    wl_notice (wl, FSC_WLOG_NOTICE_WRITEFAIL, err, 0);
  apply_done (wl);
  r = wl->holes || wl->failed ? -1 : 0;
  pthread_mutex_unlock (&wl->lock);
  if (r == -1)
    errno = EIO;
  return r;
}

static int mark_synced (struct fsc_wlog *wl, uint64_t upto);

/* The NREC records of an append of TYPE over [OFF, OFF+LEN) into ES
 * (zeroed): their ranges, unit hashes, sizes and map nodes; their
 * total size added to *TOTAL.  -1 out of memory (ES holds what was
 * allocated, for the caller to free).
 */
static int
make_records (int type, uint64_t off, uint64_t len,
              const unsigned char *data, struct wl_entry **es,
              uint64_t nrec, uint64_t *total)
{
  for (uint64_t i = 0; i < nrec; ++i) {
    struct wl_entry *e = calloc (1, sizeof *e);
    if (e == NULL)
      return -1;
    es[i] = e;
    e->type = type;
    /* Its map nodes now, so that applying it cannot fail. */
    if (type != WL_FLUSH &&
        ((e->spare[0] = malloc (sizeof (struct wl_ext))) == NULL ||
         (e->spare[1] = malloc (sizeof (struct wl_ext))) == NULL))
      return -1;
    if (type == WL_DATA) {
      uint64_t ro = i * WL_REC_UNITS * FSC_WLOG_UNIT;
      e->off = off + ro;
      e->len = MIN (len - ro, (uint64_t) WL_REC_UNITS * FSC_WLOG_UNIT);
      e->nunits = DIV_ROUND_UP (e->len, FSC_WLOG_UNIT);
      e->hashes = malloc (8 * (size_t) e->nunits);
      if (e->hashes == NULL)
        return -1;
      for (uint32_t u = 0; u < e->nunits; ++u) {
        uint64_t uo = ro + (uint64_t) u * FSC_WLOG_UNIT;
        e->hashes[u] = XXH3_64bits (data + uo,
                                    MIN ((uint64_t) FSC_WLOG_UNIT, len - uo));
      }
      e->rsize = wl_rec_size (e->nunits, e->len);
    }
    else {
      e->off = off;
      e->len = len;
      e->rsize = wl_rec_size (0, 0);
    }
    *total += e->rsize;
  }
  return 0;
}

/* Reserve the NREC records ES (step 1 of a record's life): wait while
 * the writer rewinds, or while CHARGE more bytes or the records would
 * pass the dirty bound (backpressure; a marker never waits), then give
 * them their sequence numbers, epoch and bytes of the file, in the
 * ring.  *POS is where they go, *SEQ0 the first's sequence number,
 * *EPOCH the epoch they joined.  0, or -1 with errno EIO (the log
 * failed: nothing reserved, ES left to the caller) or ENOMEM (the ring
 * could not grow: nothing reserved).
 */
static int
reserve_records (struct fsc_wlog *wl, int type, struct wl_entry **es,
                 uint64_t nrec, uint64_t charge, uint64_t *pos,
                 uint64_t *seq0, uint64_t *epoch)
{
  uint64_t max_recs = wl->dirty_max / FSC_WLOG_UNIT;
  pthread_mutex_lock (&wl->lock);
  bool said = false;
  while (!wl->failed &&
         (wl->resetting ||
          (type != WL_FLUSH && wl->rlen &&
           (wl->head_pos - wl->tail_pos + charge > wl->dirty_max ||
            wl->rlen + 2 * nrec > max_recs)))) {
    if (!said && !wl->resetting) {
      wl_notice (wl, FSC_WLOG_NOTICE_STALLED, 0, 0);
      said = true;
    }
    pthread_cond_wait (&wl->cond, &wl->lock);
  }
  if (wl->failed) {
    pthread_mutex_unlock (&wl->lock);
    errno = EIO;
    return -1;
  }
  *pos = wl->head_pos;
  *seq0 = wl->next_seq;
  uint64_t t = fsc_wall_ms ();
  *epoch = wl->epoch;
  for (uint64_t i = 0; i < nrec; ++i) {
    if (wl_ring_push (wl, es[i]) == -1) {
      /* Nothing reserved yet for the rest: undo ours. */
      for (uint64_t j = 0; j < i; ++j)
        wl->rlen--;
      pthread_mutex_unlock (&wl->lock);
      errno = ENOMEM;
      return -1;
    }
  }
  for (uint64_t i = 0; i < nrec; ++i) {
    struct wl_entry *e = es[i];
    e->seq = wl->next_seq++;
    e->epoch = wl->epoch;
    e->pos = wl->head_pos;
    e->time_ms = t;
    wl->head_pos += e->rsize;
    wl->dirty_bytes += e->len;
  }
  if (wl->rlen == nrec)
    wl->first_epoch = wl->epoch;
  if (type != WL_FLUSH) {
    wl->epoch_used = true;
    wl->last_data_seq = wl->next_seq;
  }
  pthread_mutex_unlock (&wl->lock);
  return 0;
}

/* The bytes of the NREC records ES into BUF, for one write: headers,
 * and for WL_DATA their part of DATA (the append's, from OFF).
 */
static void
encode_records (const struct fsc_wlog *wl, int type, struct wl_entry **es,
                uint64_t nrec, uint64_t off, const unsigned char *data,
                unsigned char *buf)
{
  uint64_t p = 0;
  for (uint64_t i = 0; i < nrec; ++i) {
    struct wl_entry *e = es[i];
    memset (buf + p, 0, e->rsize);
    wl_encode_rec (wl, e, buf + p);
    if (type == WL_DATA)
      memcpy (buf + p + wl_hdr_bytes (e), data + (e->off - off), e->len);
    p += e->rsize;
  }
}

/* The write of the NREC records ES failed with ERR: their slots become
 * void records, to be written by fill_holes (rule 9).  Caller holds
 * wl->lock.
 */
static void
void_records (struct fsc_wlog *wl, struct wl_entry **es, uint64_t nrec,
              int err)
{
  wl_notice (wl, FSC_WLOG_NOTICE_WRITEFAIL, err, 0);
  for (uint64_t i = 0; i < nrec; ++i) {
    struct wl_entry *e = es[i];
    wl->dirty_bytes -= e->len;
    e->type = WL_VOID;
    e->off = e->len = 0;
    e->nunits = 0;
    free (e->hashes);
    e->hashes = NULL;
  }
  wl->holes += nrec;
  pthread_cond_broadcast (&wl->apply_cond);
}

/* The NREC records ES, from SEQ0, are in the file: apply them (step
 * 3), wait until a write's are applied, and with FUA make them durable
 * (step 4) and close their epoch MY_EPOCH (rule 6).  Caller holds
 * wl->lock.  0, or -1.
 */
static int
settle_records (struct fsc_wlog *wl, int type, struct wl_entry **es,
                uint64_t nrec, uint64_t seq0, uint64_t my_epoch, bool fua)
{
  for (uint64_t i = 0; i < nrec; ++i)
    es[i]->done = true;
  apply_done (wl);
  /* A write is acknowledged once it (and so everything before it) is
   * in the map, so that reads see it.  A flush marker changes no
   * data: its flusher need not wait for the writes that came after
   * its flush.
   */
  if (type != WL_FLUSH)
    apply_wait_upto (wl, seq0 + nrec);
  /* Behind a failed record's slot not yet void on disk: EIO (the
   * record is in the log, and applies once the slot is filled, as a
   * failed write's bytes may).
   */
  int r = wl->failed || (type != WL_FLUSH && wl->applied_seq < seq0 + nrec)
    ? -1 : 0;
  if (r == 0 && fua) {
    r = wl_sync_upto (wl, seq0 + nrec);
    /* Rule 6: the FUA write is about to be acknowledged, so a write
     * that arrives from now on must reach the upstream after it: it
     * goes to the next epoch, which the writer sends only once this
     * one is written back and flushed upstream.  Writes concurrent
     * with this one may share its epoch (nothing orders them).  If a
     * flush or another FUA already closed our epoch, nothing to do: no
     * empty epochs.
     */
    if (r == 0 && wl->epoch == my_epoch && wl->epoch_used &&
        !wl->fua_unordered) {
      wl->epoch++;
      wl->epoch_used = false;
    }
  }
  return r;
}

/* Append one client operation: TYPE over [OFF, OFF+LEN) (unit-aligned
 * but for the export's end), DATA for WL_DATA.  Split into records of
 * at most WL_REC_UNITS units, written with one pwrite.
 */
int
wl_append (struct fsc_wlog *wl, int type, uint64_t off, uint64_t len,
           const unsigned char *data, bool fua)
{
  if (wl->salvage) {
    errno = EROFS;              /* Rule 7: past the damage is not ours */
    return -1;
  }
  uint64_t nrec = type == WL_DATA
    ? DIV_ROUND_UP (len, (uint64_t) WL_REC_UNITS * FSC_WLOG_UNIT) : 1;
  uint64_t total = 0;
  struct wl_entry **es = calloc (nrec, sizeof *es);
  unsigned char *buf = NULL;
  if (es == NULL)
    return -1;
  if (make_records (type, off, len, data, es, nrec, &total) == -1)
    goto nomem;
  buf = malloc (total);
  if (buf == NULL)
    goto nomem;

  /* Rule 9: a data, zero or trim record is charged one marker besides
   * its bytes (and at least one unit of records in memory), so that
   * the marker of a flush or FUA after it fits in what it reserved.
   */
  uint64_t charge = total + nrec * wl_rec_size (0, 0);

  /* A failed record's slot first (rule 9): nothing past it applies. */
  pthread_mutex_lock (&wl->lock);
  bool holes = wl->holes != 0;
  pthread_mutex_unlock (&wl->lock);
  if (holes && fill_holes (wl) == -1) {
    for (uint64_t i = 0; i < nrec; ++i)
      wl_free_entry (es[i]);
    goto out;
  }

  uint64_t pos, seq0, my_epoch;
  if (reserve_records (wl, type, es, nrec, charge, &pos, &seq0,
                       &my_epoch) == -1) {
    if (errno == ENOMEM)
      goto nomem;
    goto out;                   /* EIO: the log failed */
  }

  /* The records' bytes, then one write. */
  encode_records (wl, type, es, nrec, off, data, buf);
  int r = fsc_io_pwrite (&wl->cache->io, FSC_FILE_WLOG, wl->fd, buf, total,
                         pos);
  int err = errno;

  pthread_mutex_lock (&wl->lock);
  if (r == -1) {
    /* Not fatal (rule 9): the slots become void records, this request
     * fails, and the log goes on once a void header can be written
     * (now, or at a later append).
     */
    void_records (wl, es, nrec, err);
    pthread_mutex_unlock (&wl->lock);
    (void) fill_holes (wl);
    free (buf);
    free (es);
    errno = EIO;
    return -1;
  }
  r = settle_records (wl, type, es, nrec, seq0, my_epoch, fua);
  pthread_mutex_unlock (&wl->lock);
  free (buf);
  free (es);
  if (r == 0 && fua)
    r = mark_synced (wl, seq0 + nrec);
  if (r == -1)
    errno = EIO;
  return r;

 nomem:
  for (uint64_t i = 0; i < nrec; ++i)
    wl_free_entry (es[i]);
  errno = ENOMEM;
 out:
  free (buf);
  free (es);
  return -1;
}

/* After a sync that made every record below UPTO durable: say so in
 * the log with a marker (not synced itself: the next sync takes it),
 * so that recovery can tell a record that was promised and is damaged
 * (below a marker's bound: kept, its units fail) from one torn by a
 * crash before any sync covered it (cut off).  A marker written before
 * the sync could not tell them apart: the sync may write it and tear
 * an earlier record.
 */
static int
mark_synced (struct fsc_wlog *wl, uint64_t upto)
{
  pthread_mutex_lock (&wl->lock);
  bool mark = upto > wl->marked_seq;
  if (mark)
    wl->marked_seq = upto;
  pthread_mutex_unlock (&wl->lock);
  return mark ? wl_append (wl, WL_FLUSH, upto, 0, NULL, false) : 0;
}

int
fsc_wlog_flush (struct fsc_wlog *wl)
{
  pthread_mutex_lock (&wl->lock);
  bool holes = wl->holes != 0;
  pthread_mutex_unlock (&wl->lock);
  if (holes && fill_holes (wl) == -1)
    return -1;
  pthread_mutex_lock (&wl->lock);
  /* A new epoch only if the current one holds a record: the epochs
   * waiting then count real barriers.  (Even with nothing to sync: a
   * FUA write's marker may have made them durable, but only a flush
   * orders them before what comes next.)
   */
  if (wl->epoch_used) {
    wl->epoch++;
    wl->epoch_used = false;
  }
  /* Nothing new since a marker, which a sync preceded (rule 9): no
   * marker and no sync.  After a restart the records recovered are
   * durable (rule 8: the open synced them).
   */
  if (!wl->failed && wl->last_data_seq <= wl->marked_seq &&
      wl->last_data_seq <= wl->durable_seq) {
    pthread_mutex_unlock (&wl->lock);
    return 0;
  }
  uint64_t target = wl->next_seq;
  apply_wait_upto (wl, target);
  int r = wl->applied_seq < target && !wl->failed ? -1
    : wl_sync_upto (wl, target);
  if (r == -1)
    errno = EIO;
  pthread_mutex_unlock (&wl->lock);
  return r == 0 ? mark_synced (wl, target) : r;
}

/*----------------------------------------------------------------------
 * Retiring (the writer's, after the tail moved durably).
 */

/* Retire the N oldest records: out of the map and the ring, then
 * freed once no reader can hold them.  Readers copy nothing of a
 * record: they hold wl->punch while they use it, so records are freed
 * (and their space punched) only once every read that could have found
 * them is over.  Nothing here may fail: if the list of records to free
 * cannot be allocated, the punch lock is taken first and they are
 * freed as they leave (readers wait a little longer, that is all).
 */
void
wl_retire (struct fsc_wlog *wl, size_t n)
{
  struct wl_entry **gone = malloc (n * sizeof *gone);
  if (gone == NULL)
    pthread_rwlock_wrlock (&wl->punch);
  pthread_mutex_lock (&wl->lock);
  for (size_t i = 0; i < n; ++i) {
    struct wl_entry *e = wl_entry_at (wl, 0);
    wl_map_remove_entry (&wl->root, e);
    wl->rhead = (wl->rhead + 1) % wl->rcap;
    wl->rlen--;
    wl->ring_seq++;
    wl->dirty_bytes -= e->len;
    if (gone)
      gone[i] = e;
    else
      wl_free_entry (e);           /* we hold wl->punch for writing */
  }
  if (wl->rlen)
    wl->first_epoch = wl_entry_at (wl, 0)->epoch;
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
  if (gone) {
    pthread_rwlock_wrlock (&wl->punch);
    for (size_t i = 0; i < n; ++i)
      wl_free_entry (gone[i]);
  }
  pthread_rwlock_unlock (&wl->punch);
  free (gone);
}
