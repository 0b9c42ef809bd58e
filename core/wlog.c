/* libfscache: the write log of writeback mode (wlog.h says what it is
 * for; docs/format.md, "Write log", has the bytes; docs/design.md,
 * "Writeback", the reasons).
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
 * tests/test-wb-damage.sh, tests/unit-wlog.c (8b), tests/fuzz-wlog.c
 * (its oracle).
 *
 * Rule 8 (durable before acknowledged or sent): nothing the log holds
 * is acknowledged as flushed, or sent to the upstream, before a sync
 * of the log covers it.  Recovery syncs what it adopts before the open
 * returns (kill -9 leaves the log in the page cache, which a power cut
 * then loses; durable_seq starts at next_seq only because of that
 * sync), and the writer takes only records below durable_seq (it
 * starts the sync itself, shared with flushers through sync_upto).
 * Broken by: tests/unit-powerloss.c run_restart (a flush after kill -9
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
 * applies.  Broken by: tests/unit-wlog.c sections 10 (a flush loop
 * during an outage), 11 (zero records at the bound), 13 (a failed
 * record write, then the log goes on); tests/test-wb-diskfull.sh (the
 * cache disk full, reserved and not).
 *
 * Rule 10 (overlapping writes): client writes, zeroes and trims that
 * touch the same unit are serialized, whatever their alignment: an
 * unaligned write's read-modify-write never logs an old unit over an
 * overlapping write (range_lock).  Broken by tests/test-wb-overlap.sh.
 *
 * Rule 11 (no lock across upstream I/O): neither wl->lock nor
 * wl->punch is held while a read waits for the object or the
 * upstream, so reads of dirty or cached data never wait for a miss
 * (fsc_wlog_read).  Broken by tests/test-wb-hang.sh.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include "xxh.h"

#include "wlog-int.h"
#include "safeopen.h"

static uint64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *
fsc_wlog_mismatch_name (int m)
{
  switch (m) {
  case FSC_WLOG_FITS: return "fits";
  case FSC_WLOG_SIZE_CHANGED: return "upstream-size-changed";
  case FSC_WLOG_GENERATION_CHANGED: return "generation-changed";
  case FSC_WLOG_SAMPLE_CHANGED: return "upstream-changed";
  default: return "unknown";
  }
}

/*----------------------------------------------------------------------
 * The extent map: a treap of disjoint extents ordered by start.
 */

static uint32_t
next_prio (uint32_t *s)
{
  /* xorshift32: priorities only need to look random. */
  uint32_t x = *s ? *s : 2463534242u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

/* Nodes starting before KEY into *L, the others into *R. */
static void
split (struct wl_ext *t, uint64_t key, struct wl_ext **l, struct wl_ext **r)
{
  if (t == NULL) {
    *l = *r = NULL;
    return;
  }
  if (t->start < key) {
    split (t->r, key, &t->r, r);
    *l = t;
  }
  else {
    split (t->l, key, l, &t->l);
    *r = t;
  }
}

static struct wl_ext *
merge (struct wl_ext *l, struct wl_ext *r)
{
  if (l == NULL)
    return r;
  if (r == NULL)
    return l;
  if (l->prio > r->prio) {
    l->r = merge (l->r, r);
    return l;
  }
  r->l = merge (l, r->l);
  return r;
}

void
wl_map_free (struct wl_ext *t)
{
  if (t == NULL)
    return;
  wl_map_free (t->l);
  wl_map_free (t->r);
  free (t);
}

/* Make [START, END) map to E in *ROOT, cutting what was there, with
 * the nodes X (the new extent) and REST (the tail of an extent the
 * range splits; freed if not needed), both allocated by the caller: it
 * cannot fail, so the map is never left half changed.  Caller holds
 * wl->lock if ROOT is the log's map.
 */
static void
map_insert_nodes (struct fsc_wlog *wl, struct wl_ext **root, uint64_t start,
                  uint64_t end, struct wl_entry *e, struct wl_ext *x,
                  struct wl_ext *rest)
{
  struct wl_ext *l, *m, *r;
  bool need_rest = false;
  split (*root, start, &l, &r);
  /* The last extent before START may reach into the range, or past it.
   * (Then nothing starts inside the range: one REST is enough.)
   */
  struct wl_ext *last = l;
  while (last && last->r)
    last = last->r;
  if (last && last->end > start) {
    if (last->end > end) {
      need_rest = true;
      *rest = (struct wl_ext) { .start = end, .end = last->end,
                                .e = last->e };
    }
    last->end = start;
  }
  split (r, end, &m, &r);
  /* Extents starting inside the range: all covered but maybe the last. */
  struct wl_ext *mlast = m;
  while (mlast && mlast->r)
    mlast = mlast->r;
  if (mlast && mlast->end > end) {
    need_rest = true;
    *rest = (struct wl_ext) { .start = end, .end = mlast->end,
                              .e = mlast->e };
  }
  wl_map_free (m);
  *x = (struct wl_ext) { .start = start, .end = end, .e = e };
  x->prio = next_prio (&wl->prng);
  if (need_rest)
    rest->prio = next_prio (&wl->prng);
  else {
    free (rest);
    rest = NULL;
  }
  *root = merge (merge (l, x), merge (rest, r));
}

/* Make [START, END) map to E in *ROOT.  Only allocation can fail: then
 * the map is left as it was, and wl_map_try_insert returns -1 (ENOMEM)
 * while wl_map_insert marks the log failed (its callers check
 * wl->failed).  Appends never get here: their nodes are
 * allocated with the record (wl_entry.spare), so a record that was
 * written always enters the map.
 */
int
wl_map_try_insert (struct fsc_wlog *wl, struct wl_ext **root,
                   uint64_t start, uint64_t end, struct wl_entry *e)
{
  struct wl_ext *x = malloc (sizeof *x);
  struct wl_ext *rest = malloc (sizeof *rest);
  if (x == NULL || rest == NULL) {
    free (x);
    free (rest);
    errno = ENOMEM;
    return -1;
  }
  map_insert_nodes (wl, root, start, end, e, x, rest);
  return 0;
}

void
wl_map_insert (struct fsc_wlog *wl, struct wl_ext **root, uint64_t start,
               uint64_t end, struct wl_entry *e)
{
  if (wl_map_try_insert (wl, root, start, end, e) == -1) {
    wl->failed = true;
    wl->err = ENOMEM;
  }
}

void
wl_map_visit (const struct wl_ext *t, uint64_t a, uint64_t b,
              wl_visit_fn *fn, void *opaque)
{
  if (t == NULL)
    return;
  if (a < t->start)
    wl_map_visit (t->l, a, b, fn, opaque);
  if (t->start < b && t->end > a)
    fn (opaque, t);
  if (b > t->end)
    wl_map_visit (t->r, a, b, fn, opaque);
}

/* T without its nodes that map to E (freed), as a treap: merging the
 * two subtrees of a removed node keeps the order and the heap.
 */
static struct wl_ext *
prune (struct wl_ext *t, const struct wl_entry *e)
{
  if (t == NULL)
    return NULL;
  t->l = prune (t->l, e);
  t->r = prune (t->r, e);
  if (t->e != e)
    return t;
  struct wl_ext *rest = merge (t->l, t->r);
  free (t);
  return rest;
}

/* Remove the extents in E's range that still map to E (the rest of
 * the range belongs to newer records).  It allocates nothing, so it
 * cannot fail: a retired record never stays in the map.
 */
static void
map_remove_entry (struct wl_ext **root, const struct wl_entry *e)
{
  struct wl_ext *l, *m, *r;
  split (*root, e->off, &l, &r);
  split (r, e->off + e->len, &m, &r);
  *root = merge (merge (l, prune (m, e)), r);
}

/*----------------------------------------------------------------------
 * Header.
 */

/* Encode WL's header (gen GEN) into the slot buffer P. */
static void
encode_header (const struct fsc_wlog *wl, uint64_t gen, unsigned char *p)
{
  memset (p, 0, WL_SLOT);
  memcpy (p, WL_MAGIC, 8);
  put_le32 (p + 8, WL_VERSION);
  put_le32 (p + 12, FSC_WLOG_UNIT);
  put_le64 (p + 16, gen);
  put_le64 (p + 24, wl->incarnation);
  put_le64 (p + 32, wl->key_lo);
  put_le64 (p + 40, wl->key_hi);
  put_le64 (p + 48, wl->key_len);
  put_le64 (p + 56, wl->size);
  put_le64 (p + 64, wl->tail_pos);
  put_le64 (p + 72, wl->tail_seq);
  put_le64 (p + 80, wl->epoch);
  put_le32 (p + 88, wl->sample.n);
  put_le32 (p + 92, wl->has_generation ? strlen (wl->generation)
            : UINT32_MAX);
  for (unsigned i = 0; i < FSC_WLOG_SAMPLES; ++i) {
    put_le64 (p + 96 + 8 * i, wl->sample.off[i]);
    put_le32 (p + 160 + 4 * i, wl->sample.len[i]);
    put_le64 (p + 192 + 8 * i, wl->sample.hash[i]);
  }
  if (wl->has_generation)
    memcpy (p + 256, wl->generation, strlen (wl->generation));
  put_le64 (p + WL_SLOT - 8, XXH3_64bits (p, WL_SLOT - 8));
}

/* Decode slot P into WL's fields; false if it is not a valid header. */
static bool
decode_header (struct fsc_wlog *wl, const unsigned char *p, uint64_t *gen)
{
  if (memcmp (p, WL_MAGIC, 8) != 0 ||
      get_le64 (p + WL_SLOT - 8) != XXH3_64bits (p, WL_SLOT - 8) ||
      get_le32 (p + 8) != WL_VERSION || get_le32 (p + 12) != FSC_WLOG_UNIT)
    return false;
  uint32_t n = get_le32 (p + 88), glen = get_le32 (p + 92);
  if (n > FSC_WLOG_SAMPLES || (glen != UINT32_MAX && glen > FSC_GEN_MAX))
    return false;
  *gen = get_le64 (p + 16);
  wl->incarnation = get_le64 (p + 24);
  wl->key_lo = get_le64 (p + 32);
  wl->key_hi = get_le64 (p + 40);
  wl->key_len = get_le64 (p + 48);
  wl->size = get_le64 (p + 56);
  wl->tail_pos = get_le64 (p + 64);
  wl->tail_seq = get_le64 (p + 72);
  wl->epoch = get_le64 (p + 80);
  wl->sample.n = n;
  for (unsigned i = 0; i < FSC_WLOG_SAMPLES; ++i) {
    wl->sample.off[i] = get_le64 (p + 96 + 8 * i);
    wl->sample.len[i] = get_le32 (p + 160 + 4 * i);
    wl->sample.hash[i] = get_le64 (p + 192 + 8 * i);
  }
  wl->has_generation = glen != UINT32_MAX;
  memset (wl->generation, 0, sizeof wl->generation);
  if (wl->has_generation)
    memcpy (wl->generation, p + 256, glen);
  return wl->tail_pos >= WL_START && wl->tail_seq >= 1;
}

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
  encode_header (wl, gen, p);
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

uint64_t
wl_hdr_bytes (const struct wl_entry *e)
{
  return WL_REC_HDR + 8 * (uint64_t) e->nunits;
}

static uint64_t
rec_size (uint32_t nunits, uint64_t datalen)
{
  return ROUND_UP (WL_REC_HDR + 8 * (uint64_t) nunits + datalen,
                   (uint64_t) 8);
}

/* Header bytes of E (with hashes already at P + WL_REC_HDR), and its
 * checksum.
 */
static void
encode_rec (const struct fsc_wlog *wl, const struct wl_entry *e,
            unsigned char *p)
{
  memset (p, 0, WL_REC_HDR);
  put_le32 (p, WL_REC_MAGIC);
  p[4] = e->type;
  put_le64 (p + 8, e->seq);
  put_le64 (p + 16, e->epoch);
  put_le64 (p + 24, e->off);
  put_le64 (p + 32, e->type == WL_VOID ? e->rsize : e->len);
  put_le32 (p + 40, e->nunits);
  put_le64 (p + 48, e->time_ms);
  for (uint32_t i = 0; i < e->nunits; ++i)
    put_le64 (p + WL_REC_HDR + 8 * i, e->hashes[i]);
  put_le64 (p + 56, XXH3_64bits_withSeed (p, 56, wl->incarnation) ^
            XXH3_64bits_withSeed (p + WL_REC_HDR, 8 * (size_t) e->nunits,
                                  wl->incarnation));
}

/* Decode a record header at P (WL_REC_HDR bytes) without the
 * checksum, which needs the hashes: false if malformed.
 */
static bool
decode_rec_head (const struct fsc_wlog *wl, const unsigned char *p,
                 struct wl_entry *e)
{
  if (get_le32 (p) != WL_REC_MAGIC)
    return false;
  e->type = p[4];
  e->seq = get_le64 (p + 8);
  e->epoch = get_le64 (p + 16);
  e->off = get_le64 (p + 24);
  e->len = get_le64 (p + 32);
  e->nunits = get_le32 (p + 40);
  e->time_ms = get_le64 (p + 48);
  /* A marker's offset is the sequence number up to which (exclusive)
   * the log was synced before it was written.
   */
  if (e->type == WL_FLUSH)
    return e->off <= e->seq && e->len == 0 && e->nunits == 0;
  /* A void record's length is its slot's: a header at least, whole
   * 8-byte words, at most the largest record.
   */
  if (e->type == WL_VOID)
    return e->off == 0 && e->nunits == 0 && e->len >= WL_REC_HDR &&
      e->len % 8 == 0 &&
      e->len <= rec_size (WL_REC_UNITS, (uint64_t) WL_REC_UNITS *
                          FSC_WLOG_UNIT);
  /* Whole units, but for a range that ends at the export's end. */
  if (e->len == 0 || e->off % FSC_WLOG_UNIT || e->off >= wl->size ||
      e->len > wl->size - e->off ||
      (e->len % FSC_WLOG_UNIT && e->off + e->len != wl->size))
    return false;
  /* The length first: near 2^64 its unit count would wrap. */
  if (e->type == WL_DATA)
    return e->len <= (uint64_t) WL_REC_UNITS * FSC_WLOG_UNIT &&
      e->nunits == DIV_ROUND_UP (e->len, FSC_WLOG_UNIT);
  return (WL_IS_ZERO (e->type) || e->type == WL_TRIM) && e->nunits == 0;
}

static bool
rec_csum_ok (const struct fsc_wlog *wl, const unsigned char *p,
             uint32_t nunits)
{
  return get_le64 (p + 56) ==
    (XXH3_64bits_withSeed (p, 56, wl->incarnation) ^
     XXH3_64bits_withSeed (p + WL_REC_HDR, 8 * (size_t) nunits,
                           wl->incarnation));
}

static void
free_entry (struct wl_entry *e)
{
  if (e) {
    free (e->hashes);
    free (e->spare[0]);
    free (e->spare[1]);
    free (e);
  }
}

static int
ring_push (struct fsc_wlog *wl, struct wl_entry *e)
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
      map_insert_nodes (wl, &wl->root, e->off, e->off + e->len, e,
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
    encode_rec (wl, e, h);
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

/* Append one client operation: TYPE over [OFF, OFF+LEN) (unit-aligned
 * but for the export's end), DATA for WL_DATA.  Split into records of
 * at most WL_REC_UNITS units, written with one pwrite.
 */
static int mark_synced (struct fsc_wlog *wl, uint64_t upto);

static int
append (struct fsc_wlog *wl, int type, uint64_t off, uint64_t len,
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
  for (uint64_t i = 0; i < nrec; ++i) {
    struct wl_entry *e = calloc (1, sizeof *e);
    if (e == NULL)
      goto nomem;
    es[i] = e;
    e->type = type;
    /* Its map nodes now, so that applying it cannot fail. */
    if (type != WL_FLUSH &&
        ((e->spare[0] = malloc (sizeof (struct wl_ext))) == NULL ||
         (e->spare[1] = malloc (sizeof (struct wl_ext))) == NULL))
      goto nomem;
    if (type == WL_DATA) {
      uint64_t ro = i * WL_REC_UNITS * FSC_WLOG_UNIT;
      e->off = off + ro;
      e->len = MIN (len - ro, (uint64_t) WL_REC_UNITS * FSC_WLOG_UNIT);
      e->nunits = DIV_ROUND_UP (e->len, FSC_WLOG_UNIT);
      e->hashes = malloc (8 * (size_t) e->nunits);
      if (e->hashes == NULL)
        goto nomem;
      for (uint32_t u = 0; u < e->nunits; ++u) {
        uint64_t uo = ro + (uint64_t) u * FSC_WLOG_UNIT;
        e->hashes[u] = XXH3_64bits (data + uo,
                                    MIN ((uint64_t) FSC_WLOG_UNIT, len - uo));
      }
      e->rsize = rec_size (e->nunits, e->len);
    }
    else {
      e->off = off;
      e->len = len;
      e->rsize = rec_size (0, 0);
    }
    total += e->rsize;
  }
  buf = malloc (total);
  if (buf == NULL)
    goto nomem;

  /* Rule 9: a data, zero or trim record is charged one marker besides
   * its bytes (and at least one unit of records in memory), so that
   * the marker of a flush or FUA after it fits in what it reserved.
   */
  uint64_t charge = total + nrec * rec_size (0, 0);
  uint64_t max_recs = wl->dirty_max / FSC_WLOG_UNIT;

  /* A failed record's slot first (rule 9): nothing past it applies. */
  pthread_mutex_lock (&wl->lock);
  bool holes = wl->holes != 0;
  pthread_mutex_unlock (&wl->lock);
  if (holes && fill_holes (wl) == -1) {
    for (uint64_t i = 0; i < nrec; ++i)
      free_entry (es[i]);
    goto out;
  }

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
    goto out;
  }
  uint64_t pos = wl->head_pos, seq0 = wl->next_seq, t = now_ms ();
  uint64_t my_epoch = wl->epoch;
  for (uint64_t i = 0; i < nrec; ++i) {
    if (ring_push (wl, es[i]) == -1) {
      /* Nothing reserved yet for the rest: undo ours. */
      for (uint64_t j = 0; j < i; ++j)
        wl->rlen--;
      pthread_mutex_unlock (&wl->lock);
      goto nomem;
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

  /* The records' bytes, then one write. */
  uint64_t p = 0;
  for (uint64_t i = 0; i < nrec; ++i) {
    struct wl_entry *e = es[i];
    memset (buf + p, 0, e->rsize);
    encode_rec (wl, e, buf + p);
    if (type == WL_DATA)
      memcpy (buf + p + wl_hdr_bytes (e), data + (e->off - off), e->len);
    p += e->rsize;
  }
  int r = fsc_io_pwrite (&wl->cache->io, FSC_FILE_WLOG, wl->fd, buf, total,
                         pos);
  int err = errno;

  pthread_mutex_lock (&wl->lock);
  if (r == -1) {
    /* Not fatal (rule 9): the slots become void records, this request
     * fails, and the log goes on once a void header can be written
     * (now, or at a later append).
     */
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
    pthread_mutex_unlock (&wl->lock);
    (void) fill_holes (wl);
    free (buf);
    free (es);
    errno = EIO;
    return -1;
  }
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
  r = wl->failed || (type != WL_FLUSH && wl->applied_seq < seq0 + nrec)
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
    free_entry (es[i]);
  errno = ENOMEM;
 out:
  free (buf);
  free (es);
  return -1;
}

/*----------------------------------------------------------------------
 * Reads.
 */

/* Read [OFF, OFF+LEN) of record E's data into DST, verifying every
 * unit it touches.  OFF is unit-aligned relative to E; LEN may end at
 * E's end.  Returns 0, or -1 with errno EIO (bad or unreadable).
 */
int
wl_read_units (struct fsc_wlog *wl, const struct wl_entry *e, uint64_t off,
               uint64_t len, unsigned char *dst)
{
  uint64_t rel = off - e->off;
  ssize_t n = fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd, dst, len,
                            e->pos + wl_hdr_bytes (e) + rel);
  if (n != (ssize_t) len) {
    errno = EIO;
    return -1;
  }
  for (uint64_t u = 0; u < len; u += FSC_WLOG_UNIT) {
    uint64_t ul = MIN ((uint64_t) FSC_WLOG_UNIT, len - u);
    if (XXH3_64bits (dst + u, ul) != e->hashes[(rel + u) / FSC_WLOG_UNIT]) {
      errno = EIO;
      return -1;
    }
  }
  return 0;
}

void
wl_collect (void *opaque, const struct wl_ext *x)
{
  struct wl_segs *s = opaque;
  if (s->n == s->cap) {
    size_t ncap = s->cap ? 2 * s->cap : 16;
    struct wl_seg *v = realloc (s->v, ncap * sizeof *v);
    if (v == NULL) {
      s->nomem = true;
      return;
    }
    s->v = v;
    s->cap = ncap;
  }
  s->v[s->n++] = (struct wl_seg) { x->start, x->end, x->e };
}

/* Serve [S, T) of logged record E into DST. */
static int
read_logged (struct fsc_wlog *wl, const struct wl_entry *e, uint64_t s,
             uint64_t t, unsigned char *dst)
{
  if (e->type != WL_DATA) {
    memset (dst, 0, t - s);
    return 0;
  }
  uint64_t ua = e->off + ROUND_DOWN (s - e->off, (uint64_t) FSC_WLOG_UNIT);
  uint64_t ub = MIN (e->off + ROUND_UP (t - e->off, (uint64_t) FSC_WLOG_UNIT),
                     e->off + e->len);
  if (ua == s && ub == t)
    return wl_read_units (wl, e, s, t - s, dst);
  unsigned char *b = malloc (ub - ua);
  if (b == NULL)
    return -1;
  int r = wl_read_units (wl, e, ua, ub - ua, b);
  if (r == 0)
    memcpy (dst, b + (s - ua), t - s);
  free (b);
  return r;
}

/* Rule 11 (no lock across upstream I/O): a read holds wl->punch (and
 * wl->lock) only while it reads the log, never across the misses it
 * sends to the object (the cache or the upstream).  wl->punch prefers
 * writers: a reader holding it across a slow miss would stall the
 * writer's retire behind it, and every later read, of dirty and cached
 * data too, behind the writer.  So a read works in two phases: the
 * logged pieces from a snapshot of the map, under the lock; then the
 * gaps between them, without it.  A gap was not dirty at the snapshot;
 * what is written there later is a later write, which a read that
 * overlaps it may or may not see, as on a disk.
 * Broken by tests/test-wb-hang.sh.
 */
int
fsc_wlog_read (struct fsc_wlog *wl, struct fsc_object *obj, void *buf,
               uint32_t count, uint64_t offset,
               const struct fsc_upstream *up, unsigned flags)
{
  unsigned char *out = buf;
  struct wl_segs s = { 0 };
  int r = 0, err = 0;
  uint64_t end = offset + count;

  /* Phase 1: the logged pieces. */
  pthread_rwlock_rdlock (&wl->punch);
  pthread_mutex_lock (&wl->lock);
  wl_map_visit (wl->root, offset, end, wl_collect, &s);
  pthread_mutex_unlock (&wl->lock);
  if (s.nomem) {
    /* A partial list would serve stale upstream bytes for the rest. */
    pthread_rwlock_unlock (&wl->punch);
    free (s.v);
    errno = ENOMEM;
    return -1;
  }
  for (size_t i = 0; i < s.n && r == 0; ++i) {
    uint64_t a = MAX (s.v[i].start, offset), b = MIN (s.v[i].end, end);
    if (read_logged (wl, s.v[i].e, a, b, out + (a - offset)) == -1) {
      err = errno;
      if (err != ENOMEM) {
        pthread_mutex_lock (&wl->lock);
        wl_notice (wl, FSC_WLOG_NOTICE_BADREAD, err, a);
        pthread_mutex_unlock (&wl->lock);
        err = EBADMSG;          /* ours, not the upstream's */
      }
      r = -1;
    }
  }
  pthread_rwlock_unlock (&wl->punch);
  if (r == -1) {
    free (s.v);
    errno = err;
    return -1;
  }

  /* Phase 2: the gaps, from the object, without a lock. */
  uint64_t cur = offset;
  for (size_t i = 0; i <= s.n && r == 0; ++i) {
    uint64_t a = i < s.n ? MAX (s.v[i].start, offset) : end;
    if (cur < a)
      r = fsc_object_read (obj, out + (cur - offset), a - cur, cur, up,
                           flags);
    if (i < s.n)
      cur = MIN (s.v[i].end, end);
  }
  free (s.v);
  return r;
}

/*----------------------------------------------------------------------
 * The client's operations.
 */

/* Rule 10 (overlapping writes): writes whose units overlap are
 * serialized, whatever their alignment.  Every client write, zero and
 * trim owns the units it touches (a range lock, wl->rmw) from before
 * it reads anything until its records are applied, so an unaligned
 * write's read-modify-write cannot read a unit, let an overlapping
 * aligned write land, and then log the old unit over it.  Range locks
 * rather than sub-unit records: the format, recovery and the writer's
 * batches stay as they are, and the list holds at most one entry per
 * request in flight (16 at iodepth 16), scanned under wl->lock.
 * Broken by tests/test-wb-overlap.sh.
 */

/* Wait until no write owns a unit of [A, B), then own it. */
static void
range_lock (struct fsc_wlog *wl, uint64_t a, uint64_t b, struct wl_rmw *me)
{
  pthread_mutex_lock (&wl->lock);
  for (;;) {
    bool busy = false;
    for (struct wl_rmw *m = wl->rmw; m && !busy; m = m->next)
      if (m->start < b && m->end > a)
        busy = true;
    if (!busy)
      break;
    pthread_cond_wait (&wl->cond, &wl->lock);
  }
  me->start = a;
  me->end = b;
  me->next = wl->rmw;
  wl->rmw = me;
  pthread_mutex_unlock (&wl->lock);
}

static void
range_unlock (struct fsc_wlog *wl, struct wl_rmw *me)
{
  pthread_mutex_lock (&wl->lock);
  for (struct wl_rmw **p = &wl->rmw; *p; p = &(*p)->next)
    if (*p == me) {
      *p = me->next;
      break;
    }
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
}

/* The export's end, for units: the last unit may be short. */
static uint64_t
unit_end (const struct fsc_wlog *wl, uint64_t x)
{
  return MIN (ROUND_UP (x, (uint64_t) FSC_WLOG_UNIT), wl->size);
}

/* Write BUF (NULL: zeroes) over [OFFSET, OFFSET+COUNT) as data,
 * reading the rest of partly covered units first.  The caller owns
 * the units (range_lock).
 */
static int
write_data (struct fsc_wlog *wl, struct fsc_object *obj,
            const struct fsc_upstream *up, const void *buf, uint64_t count,
            uint64_t offset, bool fua)
{
  uint64_t a = ROUND_DOWN (offset, (uint64_t) FSC_WLOG_UNIT);
  uint64_t b = unit_end (wl, offset + count);
  if (a == offset && b == offset + count && buf)
    return append (wl, WL_DATA, offset, count, buf, fua);

  unsigned char *tmp = malloc (b - a);
  if (tmp == NULL)
    return -1;
  int r = 0;
  /* The rest of the first and the last unit, each read once. */
  uint64_t tu = ROUND_DOWN (offset + count, (uint64_t) FSC_WLOG_UNIT);
  if (a < offset)
    r = fsc_wlog_read (wl, obj, tmp, MIN (a + FSC_WLOG_UNIT, b) - a, a, up,
                       0);
  if (r == 0 && offset + count < b && !(tu == a && a < offset))
    r = fsc_wlog_read (wl, obj, tmp + (tu - a), b - tu, tu, up, 0);
  if (r == 0) {
    if (buf)
      memcpy (tmp + (offset - a), buf, count);
    else
      memset (tmp + (offset - a), 0, count);
    r = append (wl, WL_DATA, a, b - a, tmp, fua);
  }
  int e = errno;
  free (tmp);
  errno = e;
  return r;
}

/* Own the units of [OFFSET, OFFSET+COUNT) around a client operation. */
#define UNITS_OF(wl, offset, count)                             \
  ROUND_DOWN ((offset), (uint64_t) FSC_WLOG_UNIT),              \
  unit_end ((wl), (offset) + (count))

int
fsc_wlog_pwrite (struct fsc_wlog *wl, struct fsc_object *obj,
                 const struct fsc_upstream *up, const void *buf,
                 uint32_t count, uint64_t offset, bool fua)
{
  if (count == 0)
    return fua ? fsc_wlog_flush (wl) : 0;
  struct wl_rmw me;
  range_lock (wl, UNITS_OF (wl, offset, count), &me);
  int r = write_data (wl, obj, up, buf, count, offset, fua);
  int e = errno;
  range_unlock (wl, &me);
  errno = e;
  return r;
}

int
fsc_wlog_zero (struct fsc_wlog *wl, struct fsc_object *obj,
               const struct fsc_upstream *up, uint32_t count,
               uint64_t offset, unsigned flags)
{
  const bool fua = flags & FSC_WLOG_FUA;
  /* The ragged ends are written as data, which keeps them allocated
   * either way.
   */
  const enum wl_type type = flags & FSC_WLOG_NO_HOLE ? WL_ZERO_ALLOC
    : WL_ZERO;
  if (count == 0)
    return fua ? fsc_wlog_flush (wl) : 0;
  uint64_t end = offset + count;
  uint64_t a = ROUND_UP (offset, (uint64_t) FSC_WLOG_UNIT);
  uint64_t b = end == wl->size ? end
    : ROUND_DOWN (end, (uint64_t) FSC_WLOG_UNIT);
  struct wl_rmw me;
  int r = 0;
  range_lock (wl, UNITS_OF (wl, offset, count), &me);
  if (a >= b)                   /* within one unit */
    r = write_data (wl, obj, up, NULL, count, offset, fua);
  else {
    if (offset < a)
      r = write_data (wl, obj, up, NULL, a - offset, offset, false);
    if (r == 0 && b < end)
      r = write_data (wl, obj, up, NULL, end - b, b, false);
    if (r == 0)
      r = append (wl, type, a, b - a, NULL, fua);
  }
  int e = errno;
  range_unlock (wl, &me);
  errno = e;
  return r;
}

int
fsc_wlog_trim (struct fsc_wlog *wl, uint32_t count, uint64_t offset,
               bool fua)
{
  /* Only whole units: a trim is advisory, its ragged ends may stay. */
  uint64_t end = offset + count;
  uint64_t a = ROUND_UP (offset, (uint64_t) FSC_WLOG_UNIT);
  uint64_t b = end == wl->size ? end
    : ROUND_DOWN (end, (uint64_t) FSC_WLOG_UNIT);
  if (a >= b)
    return fua ? fsc_wlog_flush (wl) : 0;
  struct wl_rmw me;
  range_lock (wl, a, b, &me);
  int r = append (wl, WL_TRIM, a, b - a, NULL, fua);
  int e = errno;
  range_unlock (wl, &me);
  errno = e;
  return r;
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
  return mark ? append (wl, WL_FLUSH, upto, 0, NULL, false) : 0;
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
    map_remove_entry (&wl->root, e);
    wl->rhead = (wl->rhead + 1) % wl->rcap;
    wl->rlen--;
    wl->ring_seq++;
    wl->dirty_bytes -= e->len;
    if (gone)
      gone[i] = e;
    else
      free_entry (e);           /* we hold wl->punch for writing */
  }
  if (wl->rlen)
    wl->first_epoch = wl_entry_at (wl, 0)->epoch;
  pthread_cond_broadcast (&wl->cond);
  pthread_mutex_unlock (&wl->lock);
  if (gone) {
    pthread_rwlock_wrlock (&wl->punch);
    for (size_t i = 0; i < n; ++i)
      free_entry (gone[i]);
  }
  pthread_rwlock_unlock (&wl->punch);
  free (gone);
}

/*----------------------------------------------------------------------
 * Open, recovery, close.
 */

static int
open_log_file (struct fsc_cache *c, const void *key, size_t key_len,
               bool create)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  char file[FSC_NAME_MAX + 8];
  fsc_key_encode (key, key_len, name, fan);
  /* Only an @xx nobody else may write (safeopen.c rule 1). */
  int dfd = fsc_own_subdir (c->objdirfd, fan, create, fan, NULL, 0);
  if (dfd == -1)
    return -1;
  snprintf (file, sizeof file, "%s.wlog", name);
  int fd = fsc_openat_own (dfd, file, O_RDWR | (create ? O_CREAT : 0));
  int e = errno;
  close (dfd);
  errno = e;
  return fd;
}

static void
wlog_free (struct fsc_wlog *wl)
{
  if (wl == NULL)
    return;
  for (size_t i = 0; i < wl->rlen; ++i)
    free_entry (wl_entry_at (wl, i));
  free (wl->ring);
  wl_map_free (wl->root);
  if (wl->fd >= 0)
    close (wl->fd);             /* drops the flock */
  pthread_mutex_destroy (&wl->lock);
  pthread_cond_destroy (&wl->cond);
  pthread_cond_destroy (&wl->apply_cond);
  pthread_cond_destroy (&wl->sync_cond);
  pthread_rwlock_destroy (&wl->punch);
  free (wl);
}

/* Rule 7: the records of this incarnation from byte POS on (the log
 * stopped decoding there, expecting SEQ) with a sequence number above
 * SEQ, into DMG's damage_cover (the highest marker bound) and lost_*.
 * Read in large chunks: the magic is looked for in memory, and only a
 * match is decoded.  A valid record is stepped over whole (its data
 * may hold anything).
 */
static int
scan_beyond (struct fsc_wlog *wl, uint64_t pos, uint64_t file_size,
             uint64_t seq, struct fsc_wlog_info *dmg)
{
  const size_t chunk = 1u << 20;
  unsigned char *buf = malloc (chunk);
  unsigned char *hb = malloc (WL_REC_HDR + 8 * WL_REC_UNITS);
  uint64_t bstart = 0, blen = 0;
  int r = 0;
  if (buf == NULL || hb == NULL) {
    r = -1;
    goto out;
  }
  uint64_t p = ROUND_UP (pos, (uint64_t) 8);
  while (p + WL_REC_HDR <= file_size && p >= pos) {
    if (p < bstart || p + 4 > bstart + blen) {
      /* Holes (punched, or space reserved ahead) hold no record. */
      off_t d = lseek (wl->fd, (off_t) p, SEEK_DATA);
      if (d == -1 && errno == ENXIO)
        break;
      if (d > (off_t) p) {
        p = ROUND_UP ((uint64_t) d, (uint64_t) 8);
        continue;
      }
      uint64_t want = MIN ((uint64_t) chunk, file_size - p);
      ssize_t n = fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd, buf,
                                want, p);
      if (n < 0) {
        r = -1;
        goto out;
      }
      if (n < 4)
        break;
      bstart = p;
      blen = (uint64_t) n;
    }
    struct wl_entry h;
    memset (&h, 0, sizeof h);
    uint64_t hl;
    if (get_le32 (buf + (p - bstart)) == WL_REC_MAGIC &&
        fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd, hb, WL_REC_HDR,
                      p) == WL_REC_HDR &&
        decode_rec_head (wl, hb, &h) && h.seq > seq &&
        h.nunits <= WL_REC_UNITS &&
        ((hl = 8 * (uint64_t) h.nunits) == 0 ||
         fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd,
                       hb + WL_REC_HDR, hl, p + WL_REC_HDR) == (ssize_t) hl) &&
        rec_csum_ok (wl, hb, h.nunits)) {
      if (h.type == WL_FLUSH) {
        if (h.off > dmg->damage_cover)
          dmg->damage_cover = h.off;
      }
      else {
        dmg->lost_records++;
        dmg->lost_bytes += h.len;
        if (dmg->lost_end == 0 || h.off < dmg->lost_start)
          dmg->lost_start = h.off;
        if (h.off + h.len > dmg->lost_end)
          dmg->lost_end = h.off + h.len;
      }
      if (h.seq > dmg->lost_last_seq)
        dmg->lost_last_seq = h.seq;
      p += rec_size (h.nunits, h.type == WL_DATA ? h.len : 0);
    }
    else
      p += 8;
  }
 out:
  free (buf);
  free (hb);
  return r;
}

/* Scan records from the tail into the ring (recovery).  Stops at the
 * first record that is not the next one, whole and intact; sets
 * head_pos there.  VERIFY_DATA: also check every data unit (the
 * filter's open; tools only count).  If the stop is damage (Rule 7),
 * DMG->damaged is set with where, and the ring keeps what precedes it.
 */
static int
scan_records (struct fsc_wlog *wl, uint64_t file_size, bool verify_data,
              uint64_t *dropped, struct fsc_wlog_info *dmg)
{
  uint64_t pos = wl->tail_pos, seq = wl->tail_seq, epoch = 0;
  unsigned char *hb = malloc (WL_REC_HDR + 8 * WL_REC_UNITS);
  unsigned char *db = verify_data
    ? malloc ((size_t) WL_REC_UNITS * FSC_WLOG_UNIT) : NULL;
  if (hb == NULL || (verify_data && db == NULL)) {
    free (hb);
    free (db);
    return -1;
  }
  *dropped = 0;
  while (pos + WL_REC_HDR <= file_size) {
    struct wl_entry h;
    memset (&h, 0, sizeof h);
    if (fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd, hb, WL_REC_HDR,
                      pos) != WL_REC_HDR ||
        !decode_rec_head (wl, hb, &h) || h.seq != seq || h.epoch < epoch)
      break;
    uint64_t hl = 8 * (uint64_t) h.nunits;
    if (hl && fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd,
                            hb + WL_REC_HDR, hl, pos + WL_REC_HDR)
        != (ssize_t) hl)
      break;
    if (!rec_csum_ok (wl, hb, h.nunits))
      break;
    h.rsize = h.type == WL_VOID ? h.len
      : rec_size (h.nunits, h.type == WL_DATA ? h.len : 0);
    if (h.type == WL_VOID)
      h.len = 0;
    if (pos + h.rsize > file_size)
      break;
    struct wl_entry *e = malloc (sizeof *e);
    if (e == NULL)
      goto nomem;
    *e = h;
    e->pos = pos;
    e->done = true;
    e->hashes = NULL;
    if (h.nunits) {
      e->hashes = malloc (hl);
      if (e->hashes == NULL) {
        free (e);
        goto nomem;
      }
      for (uint32_t u = 0; u < h.nunits; ++u)
        e->hashes[u] = get_le64 (hb + WL_REC_HDR + 8 * u);
    }
    if (verify_data && h.type == WL_DATA &&
        wl_read_units (wl, e, e->off, e->len, db) == -1)
      e->bad = true;            /* torn or damaged: decided below */
    if (ring_push (wl, e) == -1) {
      free_entry (e);
      goto nomem;
    }
    wl->dirty_bytes += e->len;
    epoch = h.epoch;
    pos += h.rsize;
    seq++;
  }
  if (pos < file_size)
    *dropped = 1;
  wl->head_pos = pos;
  wl->next_seq = seq;
  /* Rule 7: is what follows the stop a torn tail or damage? */
  dmg->damaged = false;
  dmg->damage_cover = dmg->lost_records = dmg->lost_bytes = 0;
  dmg->lost_start = dmg->lost_end = dmg->lost_last_seq = 0;
  if (pos < file_size) {
    if (scan_beyond (wl, pos, file_size, seq, dmg) == -1) {
      free (hb);
      free (db);
      return -1;
    }
    if (dmg->damage_cover > seq) {
      dmg->damaged = true;
      dmg->damage_seq = seq;
      dmg->damage_pos = pos;
    }
  }
  /* A record whose data is bad and that no marker covers was never
   * promised: a torn write, cut off with everything after it.  One a
   * marker covers was synced before the marker was written: damage,
   * kept so that its units fail rather than read as the upstream's
   * older bytes.
   */
  uint64_t cover = dmg->damaged ? dmg->damage_cover : 0;
  size_t first_bad = SIZE_MAX;
  for (size_t i = 0; i < wl->rlen; ++i) {
    const struct wl_entry *e = wl_entry_at (wl, i);
    if (e->type == WL_FLUSH && e->off > cover)
      cover = e->off;
  }
  wl->marked_seq = cover;
  for (size_t i = 0; i < wl->rlen && first_bad == SIZE_MAX; ++i)
    if (wl_entry_at (wl, i)->bad && wl_entry_at (wl, i)->seq >= cover)
      first_bad = i;
  if (first_bad != SIZE_MAX) {
    struct wl_entry *fb = wl_entry_at (wl, first_bad);
    wl->head_pos = fb->pos;
    wl->next_seq = fb->seq;
    while (wl->rlen > first_bad) {
      struct wl_entry *e = wl_entry_at (wl, wl->rlen - 1);
      wl->dirty_bytes -= e->len;
      free_entry (e);
      wl->rlen--;
    }
    *dropped = 1;
  }
  free (hb);
  free (db);
  return 0;
 nomem:
  free (hb);
  free (db);
  errno = ENOMEM;
  return -1;
}

/* Load the newer valid header slot of FD into WL; -1 EBADMSG if none. */
static int
load_header (struct fsc_wlog *wl)
{
  unsigned char *p = malloc (2 * WL_SLOT);
  if (p == NULL)
    return -1;
  ssize_t n = fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd, p,
                            2 * WL_SLOT, 0);
  if (n < 0) {
    free (p);
    return -1;
  }
  int best = -1;
  uint64_t best_gen = 0;
  for (int s = 0; s < 2; ++s) {
    struct fsc_wlog tmp;
    uint64_t gen;
    memset (&tmp, 0, sizeof tmp);
    if ((s + 1) * WL_SLOT <= (size_t) n &&
        decode_header (&tmp, p + s * WL_SLOT, &gen) &&
        (best == -1 || gen > best_gen)) {
      best = s;
      best_gen = gen;
    }
  }
  if (best >= 0) {
    decode_header (wl, p + best * WL_SLOT, &best_gen);
    wl->hdr_gen = best_gen;
    wl->hdr_slot = best;
  }
  free (p);
  if (best < 0) {
    errno = EBADMSG;
    return -1;
  }
  return 0;
}

/* Does the upstream P describes fit the log's records?  Regions that a
 * pending record touches may hold part of its epoch: not evidence.
 */
static int
check_fit (struct fsc_wlog *wl, const struct fsc_wlog_params *p)
{
  if (p->size != wl->size)
    return FSC_WLOG_SIZE_CHANGED;
  bool pg = p->generation != NULL;
  if (pg != wl->has_generation ||
      (pg && strcmp (p->generation, wl->generation) != 0))
    return FSC_WLOG_GENERATION_CHANGED;
  if (p->sample.n == 0 || wl->sample.n == 0)
    return FSC_WLOG_FITS;
  for (unsigned i = 0; i < wl->sample.n && i < p->sample.n; ++i) {
    if (p->sample.off[i] != wl->sample.off[i] ||
        p->sample.len[i] != wl->sample.len[i])
      return FSC_WLOG_SAMPLE_CHANGED;
    bool touched = false;
    uint64_t a = wl->sample.off[i], b = a + wl->sample.len[i];
    for (size_t k = 0; k < wl->rlen && !touched; ++k) {
      const struct wl_entry *e = wl_entry_at (wl, k);
      touched = e->off < b && e->off + e->len > a;
    }
    if (!touched && p->sample.hash[i] != wl->sample.hash[i])
      return FSC_WLOG_SAMPLE_CHANGED;
  }
  return FSC_WLOG_FITS;
}

/* Take P's coherency data (the log is empty). */
static void
adopt (struct fsc_wlog *wl, const struct fsc_wlog_params *p)
{
  wl->size = p->size;
  wl->has_generation = p->generation != NULL;
  memset (wl->generation, 0, sizeof wl->generation);
  if (p->generation)
    strncpy (wl->generation, p->generation, FSC_GEN_MAX);
  wl->sample = p->sample;
}

int
fsc_wlog_open (struct fsc_cache *cache, const struct fsc_wlog_params *p,
               unsigned flags, struct fsc_wlog **wlp,
               struct fsc_wlog_info *info)
{
  memset (info, 0, sizeof *info);
  struct fsc_wlog *wl = calloc (1, sizeof *wl);
  if (wl == NULL)
    return -1;
  wl->cache = cache;
  wl->fd = -1;
  wl->hdr_slot = 1;
  wl->dirty_max = p->dirty_max ? p->dirty_max : FSC_WLOG_DEFAULT_DIRTY_MAX;
  wl->prng = (uint32_t) (uintptr_t) wl ^ (uint32_t) now_ms ();
  pthread_mutex_init (&wl->lock, NULL);
  pthread_cond_init (&wl->cond, NULL);
  pthread_cond_init (&wl->apply_cond, NULL);
  pthread_cond_init (&wl->sync_cond, NULL);
  wl->apply_want = UINT64_MAX;
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init (&ra);
  pthread_rwlockattr_setkind_np (&ra,
                                 PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init (&wl->punch, &ra);
  pthread_rwlockattr_destroy (&ra);

  fsc_key_hash (p->key, p->key_len, &wl->key_lo, &wl->key_hi);
  wl->key_len = p->key_len;
  wl->fd = open_log_file (cache, p->key, p->key_len,
                          flags & FSC_WLOG_CREATE);
  if (wl->fd == -1)
    goto err;
  if (flock (wl->fd, LOCK_EX | LOCK_NB) == -1) {
    if (errno == EWOULDBLOCK)
      errno = EBUSY;
    goto err;
  }
  struct stat st;
  if (fstat (wl->fd, &st) == -1)
    goto err;

  if (st.st_size == 0) {
    /* New: a header of our own, both slots (the first write). */
    uuid_t u;
    uuid_generate_random (u);
    memcpy (&wl->incarnation, u, sizeof wl->incarnation);
    wl->tail_pos = wl->head_pos = WL_START;
    wl->tail_seq = wl->next_seq = 1;
    adopt (wl, p);
    info->created = true;
    if (wl_write_header (wl) == -1 || wl_write_header (wl) == -1)
      goto err;
  }
  else {
    uint64_t lo = wl->key_lo, hi = wl->key_hi, kl = wl->key_len;
    if (load_header (wl) == -1)
      goto err;
    if (wl->key_lo != lo || wl->key_hi != hi || wl->key_len != kl) {
      errno = EBADMSG;
      goto err;
    }
    uint64_t dropped;
    if (scan_records (wl, st.st_size, true, &dropped, info) == -1)
      goto err;
    if (info->damaged) {
      /* Rule 7: never cut a damaged log.  A salvage takes the records
       * before the damage and leaves the file as it is.
       */
      fsc_wlog_counters (wl, info);
      if (!(flags & FSC_WLOG_SALVAGE)) {
        errno = EUCLEAN;
        goto err;
      }
      wl->salvage = true;
      dropped = 0;
    }
    info->dropped_records = dropped;
    /* Cut what follows the last good record: nothing there was
     * promised, and a record of this run must never be followed by a
     * stale one of the last run.  Then sync, cut or not (rule 8): a
     * run killed before its flush left its records in the page cache
     * only, and from here on they count as durable.
     */
    if ((!wl->salvage && (uint64_t) st.st_size > wl->head_pos &&
         ftruncate (wl->fd, wl->head_pos) == -1) ||
        fsc_io_sync (&cache->io, FSC_FILE_WLOG, wl->fd) == -1)
      goto err;
    if (wl->rlen) {
      info->mismatch = check_fit (wl, p);
      if (info->mismatch != FSC_WLOG_FITS) {
        fsc_wlog_counters (wl, info);
        info->mismatch = check_fit (wl, p);
        errno = ESTALE;
        goto err;
      }
      /* New writes come after whatever survived of the last epoch. */
      wl->epoch = wl_entry_at (wl, wl->rlen - 1)->epoch + 1;
      wl->first_epoch = wl_entry_at (wl, 0)->epoch;
    }
    else if (!wl->salvage) {
      /* Empty: start over at the beginning, with today's upstream. */
      adopt (wl, p);
      wl->tail_pos = wl->head_pos = WL_START;
      wl->tail_seq = wl->next_seq;
      if (wl_write_header (wl) == -1 ||
          ftruncate (wl->fd, WL_START) == -1)
        goto err;
    }
  }
  wl->ring_seq = wl->tail_seq;
  for (size_t i = 0; i < wl->rlen; ++i) {
    struct wl_entry *e = wl_entry_at (wl, i);
    if (e->bad)
      info->damaged_records++;
    if (e->type != WL_FLUSH && e->type != WL_VOID) {
      wl_map_insert (wl, &wl->root, e->off, e->off + e->len, e);
      wl->last_data_seq = e->seq + 1;
    }
  }
  /* Durable: the open synced the file (rule 8). */
  wl->applied_seq = wl->durable_seq = wl->next_seq;
  if (wl->failed) {
    errno = ENOMEM;
    goto err;
  }
  wl->unordered = getenv ("NBD_FSCACHE_WB_UNORDERED") != NULL;
  wl->fua_unordered = getenv ("NBD_FSCACHE_WB_FUA_UNORDERED") != NULL;
  /* Rule 9: the space dirty-max may take, so that an accepted write
   * never fails for space (a failure is a notice).
   */
  wl_reserve (wl);
  fsc_wlog_counters (wl, info);
  *wlp = wl;
  return 0;

 err:;
  int e = errno;
  wlog_free (wl);
  errno = e;
  return -1;
}

bool
fsc_wlog_dirty (struct fsc_wlog *wl)
{
  SCOPED_LOCK (&wl->lock);
  return wl->rlen > 0;
}

void
fsc_wlog_close (struct fsc_wlog *wl)
{
  if (wl == NULL)
    return;
  wl_writer_stop (wl);
  /* The header as of the last retire is already durable; the records
   * after it were synced by flushes (or are lost as unflushed writes
   * may be): nothing to write but a final sync for the rest.
   */
  if (!wl->failed)
    (void) fsc_io_sync (&wl->cache->io, FSC_FILE_WLOG, wl->fd);
  wlog_free (wl);
}

void
fsc_wlog_counters (struct fsc_wlog *wl, struct fsc_wlog_info *info)
{
  SCOPED_LOCK (&wl->lock);
  info->dirty_bytes = wl->dirty_bytes;
  info->log_bytes = wl->head_pos - wl->tail_pos;
  info->records = wl->rlen;
  info->size = wl->size;
  info->has_generation = wl->has_generation;
  memcpy (info->generation, wl->generation, sizeof info->generation);
  /* Markers carry the epoch they were written in, which may be the
   * next one: count the epochs of records that hold writes.
   */
  size_t fi = 0, li = wl->rlen;
  while (fi < wl->rlen && wl_entry_at (wl, fi)->type == WL_FLUSH)
    fi++;
  while (li > fi && wl_entry_at (wl, li - 1)->type == WL_FLUSH)
    li--;
  if (fi < li) {
    const struct wl_entry *f = wl_entry_at (wl, fi);
    const struct wl_entry *l = wl_entry_at (wl, li - 1);
    info->epochs = l->epoch - f->epoch + 1;
    info->oldest_ms = f->time_ms;
  }
  else {
    info->epochs = 0;
    info->oldest_ms = 0;
  }
}

unsigned
fsc_wlog_take_notices (struct fsc_wlog *wl, int *err, uint64_t *offset)
{
  SCOPED_LOCK (&wl->lock);
  unsigned n = wl->notices;
  wl->notices = 0;
  if (err)
    *err = wl->notice_err;
  if (offset)
    *offset = wl->notice_off;
  return n;
}

int
fsc_wlog_inspect (int dirfd, const char *name, struct fsc_wlog_info *info)
{
  char file[FSC_NAME_MAX + 8];
  memset (info, 0, sizeof *info);
  if (snprintf (file, sizeof file, "%s.wlog", name) >= (int) sizeof file) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = fsc_open_regular (dirfd, file, O_RDONLY, 0);
  if (fd == -1)
    return -1;
  struct fsc_cache c;
  memset (&c, 0, sizeof c);
  struct fsc_wlog *wl = calloc (1, sizeof *wl);
  struct stat st;
  int r = -1;
  if (wl == NULL || fstat (fd, &st) == -1)
    goto out;
  wl->cache = &c;
  wl->fd = fd;
  pthread_mutex_init (&wl->lock, NULL);
  if (st.st_size == 0) {
    r = 0;
    goto out_free;
  }
  uint64_t dropped;
  if (load_header (wl) == -1 ||
      scan_records (wl, st.st_size, false, &dropped, info) == -1)
    goto out_free;
  fsc_wlog_counters (wl, info);
  if (info->damaged) {
    errno = EUCLEAN;
    goto out_free;
  }
  r = 0;
 out_free:
  for (size_t i = 0; i < wl->rlen; ++i)
    free_entry (wl_entry_at (wl, i));
  free (wl->ring);
  pthread_mutex_destroy (&wl->lock);
 out:;
  int e = errno;
  free (wl);
  close (fd);
  errno = e;
  return r;
}

int
fsc_wlog_peek (struct fsc_cache *cache, const void *key, size_t key_len,
               struct fsc_wlog_info *info)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  fsc_key_encode (key, key_len, name, fan);
  int dfd = fsc_own_subdir (cache->objdirfd, fan, false, fan, NULL, 0);
  if (dfd == -1)
    return -1;
  int r = fsc_wlog_inspect (dfd, name, info);
  int e = errno;
  close (dfd);
  errno = e;
  return r;
}
