/* libfscache: the write log read back (wlog.c has the overview):
 * opening a log, with recovery, closing it, the counters and notices
 * its caller reads, and the tools' read-only inspection.
 *
 * Recovery reads records from the tail, each checked (header checksum
 * seeded with the log's incarnation, every data unit's hash).  Since a
 * flush waits for every record below it to be written before it syncs,
 * no record a flush covered lies after a torn one.  Where the records
 * stop decoding, what follows is a torn tail, cut, or damage, never cut
 * (rule 7, atop wlog.c, says which, and is kept here by scan_beyond,
 * scan_records and fsc_wlog_open).  What recovery adopts is synced
 * before the open returns (rule 8).  The bytes of the header and the
 * records are decoded by wlog-format.c; wlog.c writes the header.
 *
 * A file of its own because it runs before the log takes requests and
 * the writer starts (and close after the writer stopped): it shares
 * the formats and the ring with the log but none of its concurrency.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include "xxh.h"

#include "wlog-int.h"
#include "safeopen.h"

/*----------------------------------------------------------------------
 * Header.
 */

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
        wl_decode_header (&tmp, p + s * WL_SLOT, &gen) &&
        (best == -1 || gen > best_gen)) {
      best = s;
      best_gen = gen;
    }
  }
  if (best >= 0) {
    wl_decode_header (wl, p + best * WL_SLOT, &best_gen);
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
    wl_free_entry (wl_entry_at (wl, i));
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
        wl_decode_rec_head (wl, hb, &h) && h.seq > seq &&
        h.nunits <= WL_REC_UNITS &&
        ((hl = 8 * (uint64_t) h.nunits) == 0 ||
         fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd,
                       hb + WL_REC_HDR, hl, p + WL_REC_HDR) == (ssize_t) hl) &&
        wl_rec_csum_ok (wl, hb, h.nunits)) {
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
      p += wl_rec_size (h.nunits, h.type == WL_DATA ? h.len : 0);
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
        !wl_decode_rec_head (wl, hb, &h) || h.seq != seq || h.epoch < epoch)
      break;
    uint64_t hl = 8 * (uint64_t) h.nunits;
    if (hl && fsc_io_pread (&wl->cache->io, FSC_FILE_WLOG, wl->fd,
                            hb + WL_REC_HDR, hl, pos + WL_REC_HDR)
        != (ssize_t) hl)
      break;
    if (!wl_rec_csum_ok (wl, hb, h.nunits))
      break;
    h.rsize = h.type == WL_VOID ? h.len
      : wl_rec_size (h.nunits, h.type == WL_DATA ? h.len : 0);
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
    if (wl_ring_push (wl, e) == -1) {
      wl_free_entry (e);
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
      wl_free_entry (e);
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

/* A log not yet opened: its locks, and what does not depend on the
 * file.  NULL out of memory.
 */
static struct fsc_wlog *
wlog_new (struct fsc_cache *cache, const struct fsc_wlog_params *p)
{
  struct fsc_wlog *wl = calloc (1, sizeof *wl);
  if (wl == NULL)
    return NULL;
  wl->cache = cache;
  wl->fd = -1;
  wl->hdr_slot = 1;
  wl->dirty_max = p->dirty_max ? p->dirty_max : FSC_WLOG_DEFAULT_DIRTY_MAX;
  wl->prng = (uint32_t) (uintptr_t) wl ^ (uint32_t) fsc_wall_ms ();
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
  return wl;
}

/* An empty file: a new log, with P's coherency data.  0, or -1. */
static int
create_log (struct fsc_wlog *wl, const struct fsc_wlog_params *p,
            struct fsc_wlog_info *info)
{
  /* New: a header of our own, both slots (the first write). */
  uuid_t u;
  uuid_generate_random (u);
  memcpy (&wl->incarnation, u, sizeof wl->incarnation);
  wl->tail_pos = wl->head_pos = WL_START;
  wl->tail_seq = wl->next_seq = 1;
  adopt (wl, p);
  info->created = true;
  if (wl_write_header (wl) == -1 || wl_write_header (wl) == -1)
    return -1;
  return 0;
}

/* A file of SIZE bytes with a log in it: its header and records
 * (rule 7), cut and synced (rule 8), checked against the upstream P
 * describes.  0, or -1 with errno (EUCLEAN: damaged; ESTALE: the
 * upstream does not fit, INFO->mismatch says how).
 */
static int
recover_log (struct fsc_wlog *wl, const struct fsc_wlog_params *p,
             unsigned flags, off_t size, struct fsc_wlog_info *info)
{
  uint64_t lo = wl->key_lo, hi = wl->key_hi, kl = wl->key_len;
  if (load_header (wl) == -1)
    return -1;
  if (wl->key_lo != lo || wl->key_hi != hi || wl->key_len != kl) {
    errno = EBADMSG;
    return -1;
  }
  uint64_t dropped;
  if (scan_records (wl, size, true, &dropped, info) == -1)
    return -1;
  if (info->damaged) {
    /* Rule 7: never cut a damaged log.  A salvage takes the records
     * before the damage and leaves the file as it is.
     */
    fsc_wlog_counters (wl, info);
    if (!(flags & FSC_WLOG_SALVAGE)) {
      errno = EUCLEAN;
      return -1;
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
  if ((!wl->salvage && (uint64_t) size > wl->head_pos &&
       ftruncate (wl->fd, wl->head_pos) == -1) ||
      fsc_io_sync (&wl->cache->io, FSC_FILE_WLOG, wl->fd) == -1)
    return -1;
  if (wl->rlen) {
    info->mismatch = check_fit (wl, p);
    if (info->mismatch != FSC_WLOG_FITS) {
      fsc_wlog_counters (wl, info);
      info->mismatch = check_fit (wl, p);
      errno = ESTALE;
      return -1;
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
      return -1;
  }
  return 0;
}

/* The records recovered into the map, all applied and durable.  0, or
 * -1 ENOMEM.
 */
static int
map_recovered (struct fsc_wlog *wl, struct fsc_wlog_info *info)
{
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
    return -1;
  }
  return 0;
}

int
fsc_wlog_open (struct fsc_cache *cache, const struct fsc_wlog_params *p,
               unsigned flags, struct fsc_wlog **wlp,
               struct fsc_wlog_info *info)
{
  memset (info, 0, sizeof *info);
  struct fsc_wlog *wl = wlog_new (cache, p);
  if (wl == NULL)
    return -1;

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
    if (create_log (wl, p, info) == -1)
      goto err;
  }
  else if (recover_log (wl, p, flags, st.st_size, info) == -1)
    goto err;
  if (map_recovered (wl, info) == -1)
    goto err;
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

/*----------------------------------------------------------------------
 * The caller's view: counters and notices.
 */

bool
fsc_wlog_dirty (struct fsc_wlog *wl)
{
  SCOPED_LOCK (&wl->lock);
  return wl->rlen > 0;
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

/*----------------------------------------------------------------------
 * Inspection, read-only (the tools').
 */

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
    wl_free_entry (wl_entry_at (wl, i));
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
