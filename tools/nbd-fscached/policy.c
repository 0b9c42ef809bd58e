/* nbd-fscached: the policy, one tick at a time.
 *
 * Every tick samples the file system (fstatvfs of DIR: available
 * blocks f_bavail of f_blocks, available files f_favail of f_files)
 * and scans objects/ (scan.c: allocated bytes, last use, in-use
 * hints), then acts in three steps.
 *
 * 1. The stop mark.  Below bstop free blocks or fstop free files,
 *    DIR/fscache.stop is created: filters cache no new blocks.  It is
 *    removed when free blocks and files are back at or above bcull
 *    and fcull.
 *
 * 2. Culling, with cachefilesd's hysteresis, three independent
 *    triggers:
 *       blocks   starts below bcull, stops at or above brun;
 *       files    starts below fcull, stops at or above frun;
 *       size     starts above max-size, stops at or below max-size
 *                minus the margin (max-size / 20).
 *    While one is on, idle objects are culled (cull.c) in scan order,
 *    unusable ones first then least recently used first, re-sampling
 *    after each, until every trigger is off.  An object whose index
 *    changed in the last GRACE seconds is not culled: it is being
 *    opened (a proxy creates NAME.idx before it locks it) or was just
 *    used.  A tick culls for at most TICK_BUDGET seconds, then yields
 *    to the event loop and comes back at once.  An object whose write
 *    log (fscache-mode=writeback) holds data not yet written back is
 *    never culled, however little space is left: it is the only copy
 *    of what its clients wrote.  The scan keeps such objects out of
 *    the candidates, cull.c checks again under the lock, and the
 *    counters say how many there are (objects_dirty, dirty_bytes).
 *
 * 3. Quotas.  When the idle objects are all gone (the scan saw every
 *    one) and a blocks or size trigger is still on, the objects in
 *    use get quota records (quota.c).  The rule:
 *
 *       B = min (max-size - 3/2 margin - OTHER,       (size)
 *                U + available - brun - (brun - bcull) / 2)  (blocks)
 *
 *    where U is what the objects in use allocate now and OTHER the
 *    rest of objects/: half a margin beyond where culling stops, so
 *    that objects filling up to their budgets turn the trigger off.  "In use" is locked (by /proc/locks or our own
 *    try) or used in the last ACTIVE seconds: clients that reconnect
 *    leave their object unlocked between connections, and one just
 *    opened may not be locked yet.  B is shared by max-min fairness:
 *    every object in use gets the same budget L, the largest such that the
 *    demands, each capped at L, sum to B.  An object's demand is what
 *    it allocates if it is clearly below its current budget (by an
 *    eighth, at least 256 KiB), else unbounded: it would take more.
 *    So small objects keep what they use and the large ones share the
 *    rest equally.  Budgets go down at once (and first records are
 *    written at once), but up only RAISE_DELAY after the last
 *    lowering, by more than 1/16, and only as far as the objects'
 *    current sizes leave room under B (see apply_quotas): a filter
 *    takes a record up only within its commit interval.  While
 *    quotas are in force and an object in use presses against its
 *    budget, one idle object per tick is culled, least recently used
 *    first (what would have happened had it been allowed to grow),
 *    among those not used in the last ACTIVE seconds.
 *
 *    Quotas are lifted (every NAME.quota removed) once no object is
 *    in use, or no trigger is on and the objects in use could grow by
 *    a margin (the larger of the max-size margin and brun - bcull)
 *    within B.
 *
 * Ticks come every second, every 0.25 s while culling or with quotas
 * in force, and at once when a tick ran out of time or the scan kept
 * only part of the candidates.  A change under objects/ (watch.c)
 * brings the next tick forward, to no less than min_gap (0.25 s)
 * after the last one.  A scan longer than 1/20 of the period
 * stretches both, so a huge cache costs at most 5% of a CPU.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "fscached.h"
#include "utils.h"

#define STOP_MARK "fscache.stop"
#define GRACE 2                 /* seconds */
#define ACTIVE 10               /* seconds */
#define TICK_BUDGET 0.2         /* seconds of culling per tick */
#define PERIOD_IDLE 1.0
#define PERIOD_BUSY 0.25
#define PERIOD_AGAIN 0.01
#define STATS_PERIOD 2.0
#define MIN_SLACK (256 * 1024)
#define RAISE_DELAY 5.0         /* seconds: > the filter's commit interval */

struct sample {
  uint64_t frsize;
  uint64_t blocks, bavail, brun, bcull, bstop;
  uint64_t files, favail, frun, fcull, fstop;
  bool files_known;
};

/* PCT % of TOTAL without overflow. */
static uint64_t
pct_of (uint64_t total, unsigned pct)
{
  return total / 100 * pct + total % 100 * pct / 100;
}

static uint64_t
sat_mul (uint64_t a, uint64_t b)
{
  uint64_t r;
  return MUL_OVERFLOW (a, b, &r) ? UINT64_MAX : r;
}

static uint64_t
sat_add (uint64_t a, uint64_t b)
{
  uint64_t r;
  return ADD_OVERFLOW (a, b, &r) ? UINT64_MAX : r;
}

static uint64_t
sat_sub (uint64_t a, uint64_t b)
{
  return a > b ? a - b : 0;
}

static double
mono_now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
take_sample (const struct fscd_state *st, struct sample *s)
{
  struct statvfs v;
  const unsigned *p = st->cfg->pct;

  if (fstatvfs (st->dirfd, &v) == -1)
    return -1;
  s->frsize = v.f_frsize ? v.f_frsize : v.f_bsize;
  s->blocks = v.f_blocks;
  s->bavail = v.f_bavail;
  s->brun = pct_of (s->blocks, p[FSCD_BRUN]);
  s->bcull = pct_of (s->blocks, p[FSCD_BCULL]);
  s->bstop = pct_of (s->blocks, p[FSCD_BSTOP]);
  s->files = v.f_files;
  s->favail = v.f_favail;
  s->files_known = v.f_files > 0;
  s->frun = pct_of (s->files, p[FSCD_FRUN]);
  s->fcull = pct_of (s->files, p[FSCD_FCULL]);
  s->fstop = pct_of (s->files, p[FSCD_FSTOP]);
  return 0;
}

static uint64_t
margin_of (const struct fscd_config *cfg)
{
  return cfg->max_size / 20;
}

/* ---- the stop mark ----------------------------------------------- */

static bool
stop_mark_exists (const struct fscd_state *st)
{
  return faccessat (st->dirfd, STOP_MARK, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

static void
stop_mark (struct fscd_state *st, const struct sample *s)
{
  bool below = s->bavail < s->bstop ||
    (s->files_known && s->favail < s->fstop);
  bool clear = s->bavail >= s->bcull &&
    (!s->files_known || s->favail >= s->fcull);

  if ((below || st->stopped) && !clear) {
    if (!stop_mark_exists (st)) {
      int fd = openat (st->dirfd, STOP_MARK,
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       0600);
      if (fd == -1 && errno != EEXIST) {
        fscd_log (LOG_ERR, "%s/%s: %s", st->cfg->dir, STOP_MARK,
                  strerror (errno));
        return;
      }
      if (fd >= 0)
        close (fd);
      st->ctr.stop_marks++;
      fscd_log (LOG_WARNING, "free space below bstop/fstop "
                "(%" PRIu64 " of %" PRIu64 " blocks, %" PRIu64 " of %"
                PRIu64 " files): caching stopped (%s)",
                s->bavail, s->blocks, s->favail, s->files, STOP_MARK);
    }
    st->stopped = true;
  }
  else if (st->stopped && clear) {
    if (unlinkat (st->dirfd, STOP_MARK, 0) == -1 && errno != ENOENT) {
      fscd_log (LOG_ERR, "%s/%s: %s", st->cfg->dir, STOP_MARK,
                strerror (errno));
      return;
    }
    st->stopped = false;
    fscd_log (LOG_NOTICE, "free space back above bcull/fcull: "
              "caching resumed");
  }
}

/* ---- quotas ------------------------------------------------------ */

/* Remove every NAME.quota (and our temporary files) under objects/. */
static void
remove_all_quotas (struct fscd_state *st)
{
  for (unsigned fan = 0; fan < 256; ++fan) {
    char fanname[4];
    int fd = fscd_open_fan (st->objdirfd, fan, fanname);
    if (fd == -1)
      continue;
    DIR *dir = fdopendir (fd);
    if (dir == NULL) {
      close (fd);
      continue;
    }
    struct dirent *d;
    while ((d = readdir (dir)) != NULL) {
      const char *dot = strchr (d->d_name, '.');
      if (dot == NULL ||
          (strcmp (dot, ".quota") != 0 && strncmp (dot, ".quota.tmp.", 11)))
        continue;
      if (unlinkat (fd, d->d_name, 0) == 0) {
        if (strcmp (dot, ".quota") == 0)
          st->ctr.quota_removals++;
        fscd_debug (1, "%s/%s: removed", fanname, d->d_name);
      }
      else if (errno != ENOENT)
        fscd_log (LOG_WARNING, "%s/%s: %s", fanname, d->d_name,
                  strerror (errno));
    }
    closedir (dir);
  }
}

struct inuse {
  struct fscd_object *o;
  bool has_budget;
  uint64_t budget;
  bool hungry;                  /* at (or near) its budget, or none yet */
};

static uint64_t
slack_of (uint64_t budget)
{
  return MAX (budget / 8, (uint64_t) MIN_SLACK);
}

static void
read_budgets (struct fscd_state *st, struct inuse *u, size_t n)
{
  for (size_t i = 0; i < n; ++i) {
    u[i].has_budget = (u[i].o->files & FSCD_F_QUOTA) &&
      fscd_quota_read (st->objdirfd, u[i].o, &u[i].budget) == 0;
    u[i].hungry = !u[i].has_budget ||
      sat_add (u[i].o->bytes, slack_of (u[i].budget)) >= u[i].budget;
  }
}

/* The objects that share the quotas, into U (with their budgets):
 * those in use (locked, by /proc/locks or by our own try), and those
 * used in the last ACTIVE seconds: a client that reconnects leaves its
 * object unlocked for a moment between connections, and one that has
 * just opened it may not hold it yet.  Counted as idle, such an object
 * would make the share of the others shrink by its whole size.
 */
static size_t
collect (struct fscd_state *st, struct fscd_scan *sc, struct inuse *u,
         time_t now)
{
  size_t n = 0;

  for (size_t i = 0; i < sc->npinned; ++i)
    u[n++] = (struct inuse) { .o = &sc->pinned[i] };
  for (size_t i = 0; i < sc->ncand; ++i) {
    struct fscd_object *o = &sc->cand[i];
    if (o->gone)
      continue;
    if (o->busy || o->mtime.tv_sec + ACTIVE > now)
      u[n++] = (struct inuse) { .o = o };
  }
  read_budgets (st, u, n);
  return n;
}

/* What the objects may allocate at most once budgets below X are
 * raised to X: each at its current size or its budget, whichever is
 * larger.
 */
static uint64_t
raise_cost (const struct inuse *u, size_t n, uint64_t x)
{
  uint64_t cost = 0;
  for (size_t i = 0; i < n; ++i)
    cost = sat_add (cost, MAX (u[i].o->bytes, MAX (u[i].budget, x)));
  return cost;
}

static void
write_quota (struct fscd_state *st, struct inuse *u, uint64_t budget,
             uint64_t B, size_t n)
{
  const struct fscd_object *o = u->o;
  if (fscd_quota_write (st->objdirfd, o, budget) == -1) {
    fscd_log (LOG_ERR, "objects/@%02x/%s.quota: %s", o->fan, o->name,
              strerror (errno));
    return;
  }
  st->ctr.quota_writes++;
  fscd_debug (1, "objects/@%02x/%s: quota %" PRIu64 " bytes "
              "(allocates %" PRIu64 ", budget %" PRIu64 " for %zu in use)",
              o->fan, o->name, budget, o->bytes, B, n);
  u->has_budget = true;
  u->budget = budget;
}

/* Step 3 (see the top of the file), at time NOW (monotonic seconds). */
static void
apply_quotas (struct fscd_state *st, const struct sample *s,
              uint64_t total, struct inuse *u, size_t n, double now)
{
  const struct fscd_config *cfg = st->cfg;
  uint64_t used = 0, B = UINT64_MAX, room;
  uint64_t avail = sat_mul (s->bavail, s->frsize);
  uint64_t brun = sat_mul (s->brun, s->frsize);
  uint64_t margin = margin_of (cfg);

  for (size_t i = 0; i < n; ++i)
    used = sat_add (used, u[i].o->bytes);
  uint64_t other = sat_sub (total, used);
  /* Half a margin under where culling stops: objects fill up to their
   * budgets, and the quota records and indexes grow a little, so a
   * target right at the stop line would keep the trigger on for good
   * (and cull whatever goes idle).
   */
  if (cfg->max_size)
    B = sat_sub (sat_sub (cfg->max_size, margin + margin / 2), other);
  if (s->blocks > 0) {
    uint64_t half = sat_mul (sat_sub (s->brun, s->bcull), s->frsize) / 2;
    B = MIN (B, sat_sub (sat_add (used, avail), sat_add (brun, half)));
  }

  room = MAX (cfg->max_size ? margin : 0,
              sat_mul (sat_sub (s->brun, s->bcull), s->frsize));
  if (n == 0 ||
      (!st->cull_blocks && !st->cull_size && sat_add (used, room) <= B)) {
    remove_all_quotas (st);
    st->quota_mode = false;
    st->quota_stuck_said = false;
    st->ctr.quota_level = 0;
    fscd_log (LOG_NOTICE, "quotas lifted: objects in use allocate %"
              PRIu64 " bytes of a budget of %" PRIu64, used, B);
    return;
  }
  uint64_t *d = malloc (n * sizeof *d);
  if (d == NULL) {
    fscd_log (LOG_ERR, "quotas: %s", strerror (errno));
    return;
  }
  uint64_t sumd = 0, maxd = 0;
  for (size_t i = 0; i < n; ++i) {
    d[i] = u[i].hungry ? UINT64_MAX : u[i].o->bytes;
    sumd = sat_add (sumd, d[i]);
    maxd = MAX (maxd, d[i]);
  }
  uint64_t L = fscd_fair_level (d, n, B);
  free (d);
  if (L == UINT64_MAX)          /* all fit: share what is left too */
    L = sat_add (maxd, sat_sub (B, sumd) / n);
  st->ctr.quota_level = L;

  /* Lower at once, raise later.  A filter takes a new record up only
   * within its commit interval, and until then it may grow to its old
   * budget: were one object's budget raised in the same breath as
   * another's was lowered, both could be at their larger figure for a
   * moment, over the limit.  So a tick that lowers (or gives a first
   * record) writes only that; raises wait until RAISE_DELAY after the
   * last lowering, when every filter has its lower budget, and then go
   * only as far as the objects' current sizes leave room: with
   * COST(X) = sum of max (allocated, budget raised to X), the largest
   * X <= L with COST(X) <= B.  Objects over their budget only shrink,
   * the others grow at most to their budget, so the total stays
   * within COST.
   */
  bool lowering = false;
  for (size_t i = 0; i < n; ++i)
    lowering = lowering || !u[i].has_budget || L < u[i].budget;
  if (lowering) {
    for (size_t i = 0; i < n; ++i)
      if (!u[i].has_budget || L < u[i].budget)
        write_quota (st, &u[i], L, B, n);
    st->last_lowering = now;
    return;
  }
  if (now - st->last_lowering < RAISE_DELAY)
    return;
  uint64_t lo = L, hi = L;
  for (size_t i = 0; i < n; ++i)
    lo = MIN (lo, u[i].budget);
  if (raise_cost (u, n, hi) > B) {
    /* The largest X in [lo, L] with raise_cost (X) <= B. */
    while (lo < hi) {
      uint64_t mid = lo + (hi - lo + 1) / 2;
      if (raise_cost (u, n, mid) <= B)
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (lo > u[i].budget && lo - u[i].budget > u[i].budget / 16)
      write_quota (st, &u[i], lo, B, n);
}

/* ---- state ------------------------------------------------------- */

int
fscd_state_open (struct fscd_state *st, const struct fscd_config *cfg,
                 char *err, size_t errlen)
{
  memset (st, 0, sizeof *st);
  st->min_gap = PERIOD_BUSY;
  st->cfg = cfg;
  st->objdirfd = -1;
  st->grave.fd = -1;
  st->dirfd = open (cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (st->dirfd == -1) {
    snprintf (err, errlen, "%s: %s", cfg->dir, strerror (errno));
    return -1;
  }
  if (flock (st->dirfd, LOCK_EX | LOCK_NB) == -1) {
    if (errno == EWOULDBLOCK)
      snprintf (err, errlen, "%s: another nbd-fscached manages this cache",
                cfg->dir);
    else
      snprintf (err, errlen, "%s: flock: %s", cfg->dir, strerror (errno));
    goto fail;
  }
  st->objdirfd = openat (st->dirfd, "objects",
                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (st->objdirfd == -1) {
    snprintf (err, errlen, "%s/objects: %s", cfg->dir, strerror (errno));
    goto fail;
  }
  if (fscd_grave_open (st->dirfd, &st->grave) == -1) {
    snprintf (err, errlen, "%s/graveyard: %s", cfg->dir, strerror (errno));
    goto fail;
  }
  /* A stop mark found here is a previous instance's: ours now. */
  st->stopped = stop_mark_exists (st);
  st->ctr.stopped = st->stopped;
  return 0;

 fail:
  if (st->objdirfd >= 0)
    close (st->objdirfd);
  close (st->dirfd);
  st->dirfd = st->objdirfd = -1;
  return -1;
}

void
fscd_state_close (struct fscd_state *st)
{
  if (st->dirfd < 0)
    return;
  /* The filter's own limits (fscache-max-size, fscache-min-free) apply
   * again once we are gone: leave no cap or stop that nobody lifts.
   */
  remove_all_quotas (st);
  if (st->stopped && unlinkat (st->dirfd, STOP_MARK, 0) == -1 &&
      errno != ENOENT)
    fscd_log (LOG_WARNING, "%s/%s: %s", st->cfg->dir, STOP_MARK,
              strerror (errno));
  st->stopped = st->quota_mode = false;
  st->ctr.stopped = st->ctr.quota_mode = st->ctr.culling = 0;
  st->ctr.quota_level = 0;
  if (fscd_counters_write (st->dirfd, &st->ctr) == -1)
    fscd_log (LOG_WARNING, "%s/nbd-fscached.stats: %s", st->cfg->dir,
              strerror (errno));
  fscd_grave_close (&st->grave);
  close (st->objdirfd);
  close (st->dirfd);            /* drops the directory's lock */
  st->dirfd = st->objdirfd = -1;
}

/* ---- the tick ---------------------------------------------------- */

static void
count_time (struct fscd_state *st, const struct sample *s, uint64_t total,
            double now)
{
  const struct fscd_config *cfg = st->cfg;

  if (st->have_sample && now > st->sample_time) {
    uint64_t ms = (uint64_t) ((now - st->sample_time) * 1000.0 + 0.5);
    if (st->below_bcull) st->ctr.below_bcull_ms += ms;
    if (st->below_bstop) st->ctr.below_bstop_ms += ms;
    if (st->below_fcull) st->ctr.below_fcull_ms += ms;
    if (st->below_fstop) st->ctr.below_fstop_ms += ms;
    if (st->over_max) st->ctr.over_max_size_ms += ms;
  }
  st->have_sample = true;
  st->sample_time = now;
  st->below_bcull = s->bavail < s->bcull;
  st->below_bstop = s->bavail < s->bstop;
  st->below_fcull = s->files_known && s->favail < s->fcull;
  st->below_fstop = s->files_known && s->favail < s->fstop;
  st->over_max = cfg->max_size && total > cfg->max_size;
}

static void
update_triggers (struct fscd_state *st, const struct sample *s,
                 uint64_t total)
{
  const struct fscd_config *cfg = st->cfg;

  if (s->bavail < s->bcull)
    st->cull_blocks = true;
  else if (s->bavail >= s->brun)
    st->cull_blocks = false;
  if (s->files_known && s->favail < s->fcull)
    st->cull_files = true;
  else if (!s->files_known || s->favail >= s->frun)
    st->cull_files = false;
  if (cfg->max_size && total > cfg->max_size)
    st->cull_size = true;
  else if (!cfg->max_size || total <= cfg->max_size - margin_of (cfg))
    st->cull_size = false;
}

static void
set_gauges (struct fscd_state *st, const struct sample *s,
            const struct fscd_scan *sc, uint64_t total, size_t ninuse)
{
  st->ctr.total_bytes = total;
  st->ctr.objects = sc->nobjects;
  st->ctr.objects_in_use = ninuse;
  st->ctr.objects_dirty = sc->dirty_objects;
  st->ctr.dirty_bytes = sc->dirty_bytes;
  st->ctr.blocks = s->blocks;
  st->ctr.free_blocks = s->bavail;
  st->ctr.files = s->files;
  st->ctr.free_files = s->favail;
  st->ctr.culling = st->cull_blocks || st->cull_files || st->cull_size;
  st->ctr.quota_mode = st->quota_mode;
  st->ctr.stopped = st->stopped;
}

double
fscd_tick (struct fscd_state *st, double now)
{
  const struct fscd_config *cfg = st->cfg;
  struct sample s;
  struct fscd_scan sc;
  double period = PERIOD_IDLE;
  double t0 = mono_now ();
  struct timespec wall;
  bool again = false;

  clock_gettime (CLOCK_REALTIME, &wall);
  if (take_sample (st, &s) == -1) {
    fscd_log (LOG_ERR, "%s: statvfs: %s", cfg->dir, strerror (errno));
    return PERIOD_IDLE;
  }
  if (fscd_scan (st->objdirfd, (size_t) 1 << cfg->culltable, &sc) == -1) {
    fscd_log (LOG_ERR, "%s/objects: %s", cfg->dir, strerror (errno));
    stop_mark (st, &s);
    return PERIOD_IDLE;
  }
  st->ctr.scans++;
  /* A damaged write log holds flushed writes the filter refuses to
   * serve: say so loudly whenever their number changes (never culled,
   * like every dirty one).
   */
  if (sc.damaged_objects != st->damaged_said && sc.damaged_objects > 0)
    fscd_log (LOG_ERR, "%" PRIu64 " objects have a damaged write log "
              "holding flushed writes not written back: never culled; "
              "their exports are refused (nbd-fscache ls shows them "
              "'damaged'; 'nbd-fscache writeback --salvage' or "
              "'invalidate --force' is the way out)", sc.damaged_objects);
  st->damaged_said = sc.damaged_objects;
  uint64_t total = sc.total_bytes;
  count_time (st, &s, total, now);
  stop_mark (st, &s);

  if (cfg->nocull) {
    set_gauges (st, &s, &sc, total, sc.npinned);
    fscd_scan_free (&sc);
    goto out;
  }

  /* Quota records found at the first tick are a previous instance's. */
  if (st->ctr.scans == 1) {
    for (size_t i = 0; i < sc.npinned && !st->quota_mode; ++i)
      st->quota_mode = (sc.pinned[i].files & FSCD_F_QUOTA) != 0;
    for (size_t i = 0; i < sc.ncand && !st->quota_mode; ++i)
      st->quota_mode = (sc.cand[i].files & FSCD_F_QUOTA) != 0;
  }

  update_triggers (st, &s, total);

  /* The objects sharing the quotas (see collect). */
  struct inuse *u = calloc (sc.npinned + sc.ncand + 1, sizeof *u);
  size_t nu;
  if (u == NULL) {
    fscd_log (LOG_ERR, "%s", strerror (errno));
    fscd_scan_free (&sc);
    goto out;
  }
  bool any_hungry = false;
  if (st->quota_mode) {
    nu = collect (st, &sc, u, wall.tv_sec);
    for (size_t k = 0; k < nu; ++k)
      any_hungry = any_hungry || u[k].hungry;
  }

  /* Step 2: cull. */
  uint64_t culled = 0, culled_bytes = 0;
  size_t i;
  for (i = 0; i < sc.ncand; ++i) {
    struct fscd_object *o = &sc.cand[i];
    uint64_t margin = margin_of (cfg);
    bool need_b = st->cull_blocks && s.bavail < s.brun;
    bool need_f = st->cull_files && s.favail < s.frun;
    bool need_m = st->cull_size && total > cfg->max_size - margin;
    bool need_h = st->quota_mode && any_hungry && culled == 0;
    if (!need_b && !need_f && !need_m && !need_h)
      break;
    if (mono_now () - t0 > TICK_BUDGET) {
      again = true;
      break;
    }
    if (o->mtime.tv_sec + GRACE > wall.tv_sec)
      continue;
    /* Culls for a hungry object take only objects that share no quota. */
    if (!need_b && !need_f && !need_m && o->mtime.tv_sec + ACTIVE > wall.tv_sec)
      continue;

    uint64_t freed;
    unsigned nfiles;
    switch (fscd_cull (st->objdirfd, &st->grave, o, 0, &freed, &nfiles)) {
    case FSCD_CULLED:
      culled++;
      culled_bytes = sat_add (culled_bytes, freed);
      st->ctr.culled_objects++;
      st->ctr.culled_bytes = sat_add (st->ctr.culled_bytes, freed);
      st->ctr.culled_files += nfiles;
      total = sat_sub (total, freed);
      o->gone = true;
      if (fscd_log_level () >= 1) {
        char when[32];
        struct tm tm;
        strftime (when, sizeof when, "%Y-%m-%d %H:%M:%S",
                  localtime_r (&o->mtime.tv_sec, &tm));
        fscd_debug (1, "culled objects/@%02x/%s: %" PRIu64 " bytes, "
                    "last used %s", o->fan, o->name, freed, when);
      }
      if (take_sample (st, &s) == -1)
        fscd_log (LOG_ERR, "%s: statvfs: %s", cfg->dir, strerror (errno));
      break;
    case FSCD_CULL_BUSY:
      o->busy = true;
      st->ctr.cull_busy++;
      break;
    case FSCD_CULL_CHANGED:
      st->ctr.cull_changed++;
      break;
    case FSCD_CULL_DIRTY:
      /* Dirty since the scan (it only counts those it sees). */
      st->ctr.cull_dirty++;
      break;
    case FSCD_CULL_ERROR:
      st->ctr.cull_errors++;
      break;
    }
  }
  bool exhausted = i == sc.ncand && !sc.truncated;
  if (i == sc.ncand && sc.truncated && culled > 0)
    again = true;               /* more idle objects than the table */
  if (culled > 0)
    fscd_log (LOG_INFO, "culled %" PRIu64 " objects, %" PRIu64 " bytes; "
              "free %" PRIu64 " of %" PRIu64 " blocks, %" PRIu64 " of %"
              PRIu64 " files, objects/ %" PRIu64 " bytes; dirty %" PRIu64
              " objects (%" PRIu64 " bytes, never culled)",
              culled, culled_bytes, s.bavail, s.blocks, s.favail, s.files,
              total, sc.dirty_objects, sc.dirty_bytes);
  bool need_more = (st->cull_blocks && s.bavail < s.brun) ||
    (st->cull_files && s.favail < s.frun) ||
    (st->cull_size && total > cfg->max_size - margin_of (cfg));
  if (exhausted && need_more && sc.dirty_objects > 0) {
    if (!st->dirty_said)
      fscd_log (LOG_WARNING, "dirty %" PRIu64 " objects hold %" PRIu64
                " bytes written in writeback mode and not yet written "
                "back: never culled (nbd-fscache ls shows them)",
                sc.dirty_objects, sc.dirty_bytes);
    st->dirty_said = true;
  }
  else if (!need_more)
    st->dirty_said = false;

  /* Step 3: quotas. */
  update_triggers (st, &s, total);
  nu = collect (st, &sc, u, wall.tv_sec);
  bool still_b = st->cull_blocks && s.bavail < s.brun;
  bool still_m = st->cull_size && total > cfg->max_size - margin_of (cfg);
  if (!st->quota_mode && exhausted && (still_b || still_m) && nu > 0) {
    st->quota_mode = true;
    fscd_log (LOG_NOTICE, "no idle object left to cull: setting quotas "
              "on the %zu objects in use", nu);
  }
  if (st->quota_mode)
    apply_quotas (st, &s, total, u, nu, now);
  if (exhausted && st->cull_files && s.favail < s.frun &&
      !st->quota_stuck_said) {
    fscd_log (LOG_WARNING, "free files below frun and no idle object "
              "left to cull");
    st->quota_stuck_said = true;
  }

  set_gauges (st, &s, &sc, total, nu);
  free (u);
  if (st->ctr.culling || st->quota_mode)
    period = PERIOD_BUSY;
  if (sc.seconds * 20 > period)
    period = sc.seconds * 20;
  st->min_gap = MAX (PERIOD_BUSY, sc.seconds * 20);
  if (again)
    period = PERIOD_AGAIN;
  fscd_scan_free (&sc);

 out:
  if (now - st->stats_time >= STATS_PERIOD || st->stats_time == 0) {
    st->stats_time = now;
    if (fscd_counters_write (st->dirfd, &st->ctr) == -1)
      fscd_log (LOG_WARNING, "%s/nbd-fscached.stats: %s", cfg->dir,
                strerror (errno));
    fscd_counters_log (LOG_DEBUG, &st->ctr);
  }
  return period;
}
