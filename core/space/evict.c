/* libfscache: bounded space, inside one object (the seed's culling,
 * at block granularity), and the cache's free space floor.
 *
 * Budget.  An object may hold at most budget = min (fscache-max-size,
 * its quota) allocated bytes in its three files, as du counts them
 * (st_blocks, so holes, the index and the sums count as they really
 * are).  The quota is NAME.quota, written by nbd-fscached to shrink
 * objects in use (docs/format.md); the committer takes it up every
 * commit interval (fsc_object_check_budget) and shrinks the object.
 * Every write of new blocks first reserves its bytes (fsc_make_room):
 * if they do not fit, blocks are evicted until the object is a little
 * under budget (slack_of: a sixteenth of it, at least four blocks), so
 * evictions come in batches of one commit each.  Fills in flight are
 * counted (pending_alloc), so that concurrent fills cannot all pass
 * the check at once.
 *
 * Policy: S3-FIFO (SOSP '23) on bitmaps.  Each block has a reference
 * bit (group.referenced), set by hits under the lock the hit path
 * takes anyway (retrieve.c): no extra lock, no disk write.  Hits of
 * reads that continue a sequential stream (FSC_READ_SEQUENTIAL, the
 * caller's hint) set no bit, and neither does the first hit of a block
 * a prefetch brought (group.unread: that is its first use, not a
 * reuse).  A block filled goes on probation, a FIFO of block numbers
 * (obj->evict.pq).  Victims come from probation first, oldest first: blocks
 * hit since they arrived are promoted to the main set, the others
 * evicted and, if they were ever read, remembered as ghosts (obj->evict.gq,
 * a budget's worth); a ghost filled again skips probation, since it
 * was reused, only later than probation lasted.  So a scan, whose
 * blocks nobody hits again, only churns probation, and the hot set in
 * the main set is left alone.  Only when probation has no victims left
 * do they come from the main set, by CLOCK: a referenced block loses
 * its bit and stays (a second chance), and only as much as the write
 * needs, without the batch's slack.  The fills of a prefetch or a
 * sequential stream ("scan" fills) may only take unreferenced main
 * blocks' places and clear no bits; if that is not enough they are
 * not stored.  (S3-FIFO keeps probation at 10% of the cache; here
 * evictions come in batches as large as a fill, up to 4 MiB, which
 * would often exceed that share of a small cap, so probation has no
 * fixed share: ghosts give a block evicted too soon its way into the
 * main set.)  The main hand moves group by group, with bit operations
 * on 64 blocks at a time, visiting only the groups that exist.
 * Recency lives only in memory, as dm-cache's hints: a restart
 * forgets it (every block loaded is main and unreferenced), which may
 * cost hits, never data.
 *
 * Rule 4 of crash safety (rules 1-3 are in commit.c and store.c): an
 * eviction is durable before its space is reused.
 *  a. Under the lock, victims lose their present bit (no hit can start
 *     on them any more) and gain the evicted bit; their group is
 *     queued for the commit.
 *  b. A commit (commit.c) makes that durable: no record names them.
 *  c. Their space is punched (FALLOC_FL_PUNCH_HOLE, data and sums):
 *     each evicted block that is not present or claimed again, in a
 *     group with no hit in flight (group.readers), is claimed for the
 *     punch and released after it.
 *  d. The pages of hashes and index records left holding nothing are
 *     punched too (trim.c): the file system frees whole pages only.
 *  Only then does fsc_make_room return and the new data get written.
 *  Blocks dropped by writes (store.c) are punched the same way.
 *
 * Zero blocks (store.c) hold no space: they count 0 bytes, are never
 * put on probation nor taken as victims (evicting one would free
 * nothing and cost a hit), and their space is punched when they are
 * stored.
 *
 * Space nobody names (after a crash) is reclaim.c's.
 *
 * The floor.  Below fscache-min-free (blocks) or its inode twin, or
 * while DIR/fscache.stop exists, no new blocks are stored: misses are
 * served from upstream and hits keep working.  fstatvfs runs at most
 * every SPACE_CHECK_MS per cache, not once per request.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "safeopen.h"
#include "quota.h"
#include "utils.h"

#define SPACE_CHECK_MS 500

/* The probation and ghost FIFOs hold at most this many block numbers
 * each (8 MiB): memory must not grow with the budget.  A block that
 * falls off probation early becomes a main block; a ghost forgotten
 * early only costs its next fill a trip through probation.
 */
#define QUEUE_MAX ((size_t) 1 << 20)

/* Groups read in at a time when the sweep found too few victims in
 * memory.
 */
#define PAGE_IN_GROUPS 256

/* Below the free space floor, or stopped by the daemon?  Looks at most
 * every SPACE_CHECK_MS; between looks, the last answer.
 */
bool
fsc_space_low (struct fsc_cache *c)
{
  uint64_t now = fsc_mono_ms ();
  uint64_t last = __atomic_load_n (&c->space_checked_ms, __ATOMIC_RELAXED);
  if (now - last < SPACE_CHECK_MS ||
      !__atomic_compare_exchange_n (&c->space_checked_ms, &last, now, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return __atomic_load_n (&c->space_low, __ATOMIC_RELAXED);

  bool low = faccessat (c->dirfd, "fscache.stop", F_OK,
                        AT_SYMLINK_NOFOLLOW) == 0;
  struct statvfs sv;
  if (!low && (c->min_free_pct || c->min_free_files_pct) &&
      fstatvfs (c->dirfd, &sv) == 0) {
    /* free * 100 < total * pct, without overflow for any real size. */
    if (c->min_free_pct && sv.f_blocks &&
        (unsigned __int128) sv.f_bavail * 100 <
        (unsigned __int128) sv.f_blocks * c->min_free_pct)
      low = true;
    if (c->min_free_files_pct && sv.f_files &&
        (unsigned __int128) sv.f_favail * 100 <
        (unsigned __int128) sv.f_files * c->min_free_files_pct)
      low = true;
  }
  bool was = __atomic_exchange_n (&c->space_low, low, __ATOMIC_RELAXED);
  if (low && was && last)
    FSC_STAT_ADD (&c->stats, lowspace_ms, now - last);
  return low;
}

uint64_t
fsc_object_allocated (struct fsc_object *o)
{
  return fsc_data_allocated (o) + fd_allocated (o->files.sfd) +
    fd_allocated (o->files.ifd);
}

/* How far under budget an eviction goes: a batch, so that evictions
 * (each a commit) are rare.
 */
static uint64_t
slack_of (const struct fsc_object *o, uint64_t budget)
{
  return MAX (budget / 16, 4 * (uint64_t) o->geom.block_size);
}

/* Queue group GI for punching.  Holds o->lock.  Returns 0 or -1. */
static int
queue_punch (struct fsc_object *o, uint64_t gi)
{
  struct group *g = grp (o, gi);
  if (g->on_punch)
    return 0;
  if (o->evict.npunch == o->evict.punch_cap) {
    size_t ncap = o->evict.punch_cap ? o->evict.punch_cap * 2 : 16;
    uint64_t *p = realloc (o->evict.punch, ncap * sizeof *p);
    if (p == NULL)
      return -1;
    o->evict.punch = p;
    o->evict.punch_cap = ncap;
  }
  o->evict.punch[o->evict.npunch++] = gi;
  g->on_punch = true;
  return 0;
}

/* Append B to the ring Q (head, length, capacity), growing it up to
 * MAX entries; when full at MAX, the oldest entry is dropped and
 * returned in *DROPPED (else UINT64_MAX).  Returns 0, or -1 (no
 * memory: not appended).
 */
static int
ring_push (uint64_t **q, size_t *head, size_t *len, size_t *cap,
           size_t max, uint64_t b, uint64_t *dropped)
{
  *dropped = UINT64_MAX;
  if (*len == *cap && *cap < max) {
    size_t ncap = MIN (MAX (*cap * 2, (size_t) 64), max);
    uint64_t *p = malloc (ncap * sizeof *p);
    if (p == NULL)
      return -1;
    for (size_t i = 0; i < *len; ++i)
      p[i] = (*q)[(*head + i) % *cap];
    free (*q);
    *q = p;
    *head = 0;
    *cap = ncap;
  }
  if (*len == *cap) {
    if (*cap == 0)
      return -1;
    *dropped = (*q)[*head];
    *head = (*head + 1) % *cap;
    (*len)--;
  }
  (*q)[(*head + (*len)++) % *cap] = b;
  return 0;
}

/* Blocks a budget holds, at least 1: the bound of both rings. */
static size_t
budget_blocks (const struct fsc_object *o, uint64_t budget)
{
  return MAX (budget / o->geom.block_size, (uint64_t) 1);
}

void
fsc_note_filled (struct fsc_object *o, uint64_t b, bool prefetched)
{
  struct group *g = grp (o, GROUP_OF (b));
  uint64_t bit = BIT_OF (b);
  uint64_t budget = fsc_budget_of (o), dropped;
  if (prefetched)
    g->unread |= bit;
  else
    g->unread &= ~bit;
  g->referenced &= ~bit;
  if (budget == UINT64_MAX || (g->probation & bit))
    return;
  if (g->ghost & bit) {
    /* Evicted from probation lately and wanted again: its reuse
     * distance is longer than probation, not a scan: main at once.
     */
    g->ghost &= ~bit;
    return;
  }
  /* Into the probation FIFO (without memory it stays a main block).
   * Stale entries make it longer than probation; 4 budgets bound it.
   */
  struct fsc_evict *ev = &o->evict;
  if (ring_push (&ev->pq, &ev->pq_head, &ev->pq_len, &ev->pq_cap,
                 MIN (4 * budget_blocks (o, budget), QUEUE_MAX), b,
                 &dropped) == -1)
    return;
  g->probation |= bit;
  o->evict.nprobation++;
  if (dropped != UINT64_MAX) {
    /* The oldest entry fell off: its block, if still on probation,
     * becomes a main block.
     */
    struct group *dg = grp (o, GROUP_OF (dropped));
    uint64_t dbit = BIT_OF (dropped);
    if (dropped != b && dg && (dg->probation & dbit)) {
      dg->probation &= ~dbit;           /* probation implies present */
      o->evict.nprobation--;
    }
  }
}

/* Remember B, just evicted from probation, as a ghost. */
static void
note_ghost (struct fsc_object *o, uint64_t b, uint64_t budget)
{
  uint64_t dropped;
  struct fsc_evict *ev = &o->evict;
  if (ring_push (&ev->gq, &ev->gq_head, &ev->gq_len, &ev->gq_cap,
                 MIN (budget_blocks (o, budget), QUEUE_MAX), b,
                 &dropped) == -1)
    return;
  grp (o, GROUP_OF (b))->ghost |= BIT_OF (b);
  if (dropped != UINT64_MAX && dropped != b && grp (o, GROUP_OF (dropped)))
    grp (o, GROUP_OF (dropped))->ghost &= ~BIT_OF (dropped);
}

void
fsc_note_dropped (struct fsc_object *o, uint64_t gi, uint64_t bits)
{
  if (fsc_budget_of (o) == UINT64_MAX || bits == 0)
    return;
  grp (o, gi)->evicted |= bits;
  queue_punch (o, gi);          /* no memory: the space stays, harmless */
}

/* Evict TAKEN (present, unclaimed) blocks of group GI.  Holds o->lock.
 * Returns their bytes, or 0 if there was no memory to record it.
 */
static uint64_t
evict_bits (struct fsc_object *o, uint64_t gi, uint64_t taken)
{
  struct group *g = grp (o, gi);
  uint64_t bytes = 0;
  for (uint64_t t = taken; t; t &= t - 1)
    bytes += block_held (o, g, gi * FSC_GROUP_BLOCKS + __builtin_ctzll (t));
  g->present &= ~taken;
  g->evicted |= taken;
  if (fsc_mark_dirty (o, gi, g) == -1 || queue_punch (o, gi) == -1) {
    g->present |= taken;        /* cannot record it: put them back */
    g->evicted &= ~taken;
    return 0;
  }
  g->zero &= ~taken;            /* none, as victims go: never named */
  fsc_note_gone (o, g, taken);
  FSC_STAT_ADD (&o->cache->stats, evicted_blocks, __builtin_popcountll (taken));
  FSC_STAT_ADD (&o->cache->stats, evicted_bytes, bytes);
  FSC_OSTAT_ADD (o, evicted_blocks, __builtin_popcountll (taken));
  FSC_OSTAT_ADD (o, evicted_bytes, bytes);
  return bytes;
}

/* The lowest bits of VICTIMS (blocks of group GI) worth at least WANT
 * bytes, or all of them.
 */
static uint64_t
take_upto (struct fsc_object *o, uint64_t gi, uint64_t victims,
           uint64_t want)
{
  uint64_t taken = 0, bytes = 0;
  while (victims && bytes < want) {
    uint64_t bit = victims & -victims;
    victims &= victims - 1;
    unsigned x = __builtin_ctzll (bit);
    taken |= bit;
    bytes += block_held (o, grp (o, gi), gi * FSC_GROUP_BLOCKS + x);
  }
  return taken;
}

/* Evict WANT bytes, S3-FIFO style (see the top of this file): from
 * probation first, then, up to NEED bytes (WANT without the batch's
 * slack), from the main blocks by CLOCK.  Holds o->lock.  Returns the
 * bytes evicted.
 */
static uint64_t
sweep (struct fsc_object *o, uint64_t want, uint64_t need, uint64_t budget,
       bool scan)
{
  uint64_t freed = 0;

  /* Probation first, oldest first. */
  {
    for (size_t n = o->evict.pq_len;
         freed < want && n > 0 && o->evict.pq_len > 0; --n) {
      uint64_t b = o->evict.pq[o->evict.pq_head];
      o->evict.pq_head = (o->evict.pq_head + 1) % o->evict.pq_cap;
      o->evict.pq_len--;
      uint64_t gi = GROUP_OF (b), bit = BIT_OF (b);
      struct group *g = grp (o, gi);
      if (g == NULL || !(g->present & g->probation & bit & ~g->zero))
        continue;                       /* stale: gone or promoted */
      if ((g->referenced & bit) || (g->fetching & bit)) {
        /* Hit again since it came (or busy): promoted to main. */
        g->probation &= ~bit;
        g->referenced &= ~bit;
        o->evict.nprobation--;
        FSC_STAT_ADD (&o->cache->stats, promoted_blocks, 1);
        continue;
      }
      /* A prefetched block nobody read was never used: no ghost, so
       * that its demand read later does not count as a reuse.
       */
      bool used = !(g->unread & bit);
      uint64_t got = evict_bits (o, gi, bit);
      if (got && used)
        note_ghost (o, b, budget);
      freed += got;
    }
  }

  /* Then the main blocks, by CLOCK (two revolutions clear every bit),
   * but only what the write needs, without the batch's slack: the hot
   * set pays as little as it can.
   */
  for (uint64_t visited = 0;
       freed < need && visited <= 2 * o->pager.ngalloc; ++visited) {
    /* The hand visits allocated groups only (groups.c). */
    uint64_t gi = fsc_grp_next (o, o->evict.hand < o->geom.ngroups
                                ? o->evict.hand : 0);
    if (gi >= o->geom.ngroups && (gi = fsc_grp_next (o, 0)) >= o->geom.ngroups)
      break;
    o->evict.hand = gi + 1;
    struct group *g = grp (o, gi);
    /* Zero blocks hold no space: evicting them would free nothing. */
    uint64_t cand = g->present & ~g->fetching & ~g->zero;
    uint64_t victims = cand & ~g->referenced;
    /* A scan's blocks take only unreferenced places: they do not use
     * up the second chance of the hot set's blocks.
     */
    if (!scan)
      g->referenced &= ~cand;
    if (victims) {
      uint64_t taken = take_upto (o, gi, victims, need - freed);
      uint64_t got = evict_bits (o, gi, taken);
      if (got)
        FSC_STAT_ADD (&o->cache->stats, evicted_main,
                      __builtin_popcountll (taken));
      freed += got;
    }
  }
  return freed;
}

/* Punch the space of the evicted blocks of the queued groups (step c).
 * Groups with a hit in flight stay queued for the next time.  Returns
 * 0, or -1 with errno if punching failed.
 */
static int
punch_queued (struct fsc_object *o)
{
  pthread_mutex_lock (&o->lock);
  size_t n = o->evict.npunch;
  uint64_t *gis = o->evict.punch;
  o->evict.punch = NULL;
  o->evict.npunch = o->evict.punch_cap = 0;
  pthread_mutex_unlock (&o->lock);

  int r = 0, e = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t gi = gis[i];
    pthread_mutex_lock (&o->lock);
    struct group *g = grp (o, gi);
    g->on_punch = false;
    g->evicted &= ~g->present;          /* refilled since: keep */
    uint64_t todo = g->evicted & ~g->fetching;
    if (r == -1 || __atomic_load_n (&g->readers, __ATOMIC_ACQUIRE) != 0) {
      if (g->evicted)
        queue_punch (o, gi);
      pthread_mutex_unlock (&o->lock);
      continue;
    }
    g->fetching |= todo;                /* claimed: no fill meanwhile */
    g->evicted &= ~todo;
    /* Evicted blocks a fetch claimed before us: a fill in pieces
     * punches its own (store.c); one that fails leaves the bytes to
     * a later pass.
     */
    if (g->evicted)
      queue_punch (o, gi);
    pthread_mutex_unlock (&o->lock);

    uint64_t punched = 0;
    while (todo && r == 0) {
      /* One run of consecutive blocks at a time. */
      unsigned i0 = __builtin_ctzll (todo);
      unsigned i1 = i0;
      while (i1 + 1 < FSC_GROUP_BLOCKS && (todo >> (i1 + 1)) & 1)
        i1++;
      uint64_t b0 = gi * FSC_GROUP_BLOCKS + i0;
      uint64_t b1 = gi * FSC_GROUP_BLOCKS + i1;
      uint64_t s = block_start (&o->geom, b0),
        len = block_end (&o->geom, b1) - s;
      uint64_t ss = sums_offset (&o->geom, b0);
      uint64_t slen = sums_offset (&o->geom, b1 + 1) - ss;
      if (fsc_data_punch (o, s, len) == -1 ||
          punch_hole (o->files.sfd, ss, slen) == -1) {
        r = -1;
        e = errno;
      }
      uint64_t run = group_span_bits (gi, b0, b1);
      todo &= ~run;
      if (r == 0)
        punched |= run;
      pthread_mutex_lock (&o->lock);
      g->fetching &= ~run;
      if (r == -1)
        g->evicted |= run & ~g->present;
      pthread_cond_broadcast (&o->cond);
      fsc_claim_wake (o, gi * FSC_GROUP_BLOCKS,
                      (gi + 1) * FSC_GROUP_BLOCKS - 1);
      pthread_mutex_unlock (&o->lock);
    }
    fsc_trim_meta (o, gi, punched);     /* step d (trim.c) */
    if (todo) {                         /* after a failure: release */
      pthread_mutex_lock (&o->lock);
      g->fetching &= ~todo;
      g->evicted |= todo & ~g->present;
      pthread_cond_broadcast (&o->cond);
      fsc_claim_wake (o, gi * FSC_GROUP_BLOCKS,
                      (gi + 1) * FSC_GROUP_BLOCKS - 1);
      pthread_mutex_unlock (&o->lock);
    }
  }
  free (gis);
  if (r == -1)
    errno = e;
  return r;
}

/* Make LEN more bytes fit in the budget, evicting (down to a slack
 * under it) if they do not, and reserve them (o->evict.pending_alloc) in the
 * same critical section as the check, so that two writers cannot both
 * pass it: one evictor or checker at a time (o->evict.evicting).  Returns 0
 * (reserved), or -1 with errno (EAGAIN: could not get under budget;
 * else the object was withdrawn or punching failed).
 */
static int
shrink (struct fsc_object *o, uint64_t len, bool scan)
{
  struct fsc_stats *st = &o->cache->stats;

  pthread_mutex_lock (&o->lock);
  for (int round = 0; ; ++round) {
    while (o->evict.evicting)
      pthread_cond_wait (&o->cond, &o->lock);
    uint64_t budget = fsc_budget_of (o);
    uint64_t pend = o->evict.pending_alloc;
    if (budget == UINT64_MAX || o->state != FSC_OBJ_AVAILABLE) {
      o->evict.pending_alloc += len;
      pthread_mutex_unlock (&o->lock);
      return 0;
    }
    o->evict.evicting = true;
    pthread_mutex_unlock (&o->lock);

    uint64_t used = fsc_object_allocated (o) + pend;
    int r = 0;
    bool fits = used + len <= budget;
    if (!fits && round < 3 && len <= budget) {
      uint64_t slack = slack_of (o, budget);
      uint64_t need = used + len - budget;
      uint64_t want = need + MIN (slack, budget - len);
      pthread_mutex_lock (&o->lock);
      bool paged_out = o->pager.nonres_blocks > 0 ||
        o->pager.census_next < o->geom.ngroups;
      /* With blocks in groups not in memory (groups.c), the main set
       * in memory is the part somebody used lately: those not in
       * memory are the colder victims.  So the first sweep takes only
       * probation, and the main set's victims come after some groups
       * are read in, from where the clock hand starts.  (Sweeping the
       * resident groups alone took the hot set, the only thing in
       * memory, while colder blocks sat unseen on disk:
       * test-fscache-max-size's scan resistance.)
       */
      uint64_t got = sweep (o, want, paged_out ? 0 : need, budget, scan);
      uint64_t target = o->change_seq;
      uint64_t from = o->evict.lhand;
      pthread_mutex_unlock (&o->lock);
      if (got < need && paged_out) {
        uint64_t start;
        bool read_in = fsc_groups_page_in (o, &start, &from,
                                           PAGE_IN_GROUPS) == 0;
        pthread_mutex_lock (&o->lock);
        if (read_in) {
          o->evict.lhand = from;
          o->evict.hand = start;
        }
        /* If reading failed, the resident main set it is. */
        got += sweep (o, want - MIN (got, want), need - got, budget, scan);
        target = o->change_seq;
        pthread_mutex_unlock (&o->lock);
      }
      if (got > 0) {
        FSC_STAT_ADD (st, eviction_rounds, 1);
        r = fsc_commit_upto (o, target);        /* step b */
      }
      if (r == 0)
        r = punch_queued (o);                   /* step c */
    }
    int e = errno;

    pthread_mutex_lock (&o->lock);
    o->evict.evicting = false;
    pthread_cond_broadcast (&o->cond);
    if (r == -1) {
      pthread_mutex_unlock (&o->lock);
      errno = e;
      return -1;
    }
    if (fits) {
      o->evict.pending_alloc += len;
      pthread_mutex_unlock (&o->lock);
      return 0;
    }
    if (round >= 3 || len > budget) {
      pthread_mutex_unlock (&o->lock);
      errno = EAGAIN;
      return -1;
    }
  }
}

int
fsc_make_room (struct fsc_object *o, uint64_t len, bool scan)
{
  struct fsc_cache *c = o->cache;
  if (fsc_space_low (c)) {
    FSC_STAT_ADD (&c->stats, lowspace_skips, 1);
    errno = EAGAIN;
    return -1;
  }
  if (shrink (o, len, scan) == -1) {
    if (errno == EAGAIN)
      FSC_STAT_ADD (&c->stats, cap_skips, 1);
    else if (errno == EOPNOTSUPP) {
      /* The filesystem cannot punch holes: a cap cannot be kept here,
       * so store nothing more (never grow past it).
       */
      FSC_STAT_ADD (&c->stats, cap_skips, 1);
      errno = EAGAIN;
    }
    return -1;
  }
  return 0;
}

void
fsc_room_done (struct fsc_object *o, uint64_t len)
{
  SCOPED_LOCK (&o->lock);
  o->evict.pending_alloc -= MIN (len, o->evict.pending_alloc);
}

/* Read NAME.quota if it changed since the last look; set o->evict.quota
 * (UINT64_MAX: none).  A malformed record counts as none.
 */
static void
read_quota (struct fsc_object *o)
{
  char name[FILE_NAME_MAX];
  struct stat st;
  uint64_t q = UINT64_MAX;

  fsc_file_name (&o->files, ".quota", name);
  if (fstatat (o->files.fandirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    pthread_mutex_lock (&o->lock);
    bool same = st.st_ino == o->evict.quota_ino &&
      st.st_mtim.tv_sec == o->evict.quota_mtime.tv_sec &&
      st.st_mtim.tv_nsec == o->evict.quota_mtime.tv_nsec;
    pthread_mutex_unlock (&o->lock);
    if (same)
      return;
    unsigned char buf[FSC_QUOTA_SIZE + 1];
    int fd = fsc_open_regular (o->files.fandirfd, name, O_RDONLY, 0);
    bool gone = fd == -1 && errno == ENOENT;    /* just lifted */
    ssize_t n = fd >= 0 ? pread (fd, buf, sizeof buf, 0) : -1;
    if (fd >= 0)
      close (fd);
    if (gone)
      memset (&st, 0, sizeof st);
    else if (n < 0 || fsc_quota_decode (buf, (size_t) n, &q) == -1) {
      q = UINT64_MAX;
      pthread_mutex_lock (&o->lock);
      if (!o->evict.quota_bad_said)
        FSC_NOTICE (o, FSC_NOTICE_BADQUOTA);
      o->evict.quota_bad_said = true;
      pthread_mutex_unlock (&o->lock);
    }
  }
  else
    memset (&st, 0, sizeof st);

  pthread_mutex_lock (&o->lock);
  o->evict.quota_ino = st.st_ino;
  o->evict.quota_mtime = st.st_mtim;
  if (o->evict.quota != q)
    FSC_STAT_ADD (&o->cache->stats, quota_changes, 1);
  o->evict.quota = q;
  pthread_mutex_unlock (&o->lock);
}

void
fsc_punch_pending (struct fsc_object *o)
{
  int e = errno;
  (void) punch_queued (o);
  errno = e;
}

void
fsc_object_check_budget (struct fsc_object *o)
{
  if (fsc_object_state (o) != FSC_OBJ_AVAILABLE || o->files.fandirfd < 0)
    return;
  read_quota (o);
  /* Shrinking to the budget also punches what writes dropped. */
  if (shrink (o, 0, false) == 0)
    punch_queued (o);
}
