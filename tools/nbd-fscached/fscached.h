/* nbd-fscached: the culling daemon of an nbd-fscache cache directory,
 * after cachefilesd.  Shared declarations of its modules:
 *
 *   config.c    the configuration file: parsing, ranges, the cache check
 *   log.c       messages to syslog or stderr, by debug level
 *   ../common/  shared with nbd-fscache(1) (objects.h): scan.c, one pass
 *               over DIR/objects; cull.c, culling one object into
 *               DIR/graveyard; cachedir.c, checking a cache directory
 *   quota.c     NAME.quota records and the fair-share rule
 *   policy.c    one tick: thresholds, culling, quotas, the stop mark
 *   counters.c  the counters and DIR/nbd-fscached.stats
 *   watch.c     inotify on objects/: a change brings the next tick forward
 *   atomic.c    writing a small file atomically (temp file, rename)
 *   main.c      options, daemonising, the libev loop, signals, reload
 *
 * The contract with the filter is docs/format.md, "Culling: last use,
 * the graveyard, quotas and the stop mark".  Everything here runs in
 * one thread, the event loop's.
 */
#ifndef FSCACHED_H
#define FSCACHED_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <sys/types.h>
#include <syslog.h>

#include "objects.h"

#define PROG "nbd-fscached"

/* Exit codes (documented in nbd-fscached(8)). */
#define EXIT_CONFIG 1           /* bad configuration, or a runtime error */
#define EXIT_USAGE 2            /* bad command line */

/* ---- config.c ---------------------------------------------------- */

/* Indexes of the six thresholds in struct fscd_config.pct[]. */
enum { FSCD_BRUN, FSCD_BCULL, FSCD_BSTOP, FSCD_FRUN, FSCD_FCULL, FSCD_FSTOP,
       FSCD_NPCT };

#define FSCD_CULLTABLE_MIN 12
#define FSCD_CULLTABLE_MAX 20
#define FSCD_CULLTABLE_DEFAULT 12

struct fscd_config {
  char *file;                   /* the file it was read from */
  char *dir;                    /* "dir": the cache directory */
  unsigned dir_line;            /* line of "dir", for messages */
  unsigned pct[FSCD_NPCT];      /* brun .. fstop, percent */
  unsigned pct_line[FSCD_NPCT]; /* the line that set each one; 0: default */
  uint64_t max_size;            /* "max-size" in bytes; 0: no cap */
  unsigned culltable;           /* log2 of the cull table's entries */
  bool nocull;                  /* "nocull": only the stop mark */
  char *tag;                    /* "tag", or NULL */
  unsigned debug;               /* "debug N" */
};

/* Read FILE into *CFG (defaults for what it does not set) and check
 * it, including that the directory is a cache (fscd_config_check_dir).
 * Returns 0, or -1 with the message "FILE:LINE: message" (or
 * "FILE: message") in ERR; *CFG is then left empty.  Never prints.
 */
extern int fscd_config_read (const char *file, struct fscd_config *cfg,
                             char *err, size_t errlen);

/* Free what *CFG holds and empty it. */
extern void fscd_config_free (struct fscd_config *cfg);

/* Parse a size: digits, optionally followed by K, M, G or T (powers
 * of 1024, either case).  Returns 0, or -1 if malformed or overflowing.
 */
extern int fscd_parse_size (const char *s, uint64_t *out);

/* ---- log.c ------------------------------------------------------- */

/* Where messages go: syslog (default) or stderr, which messages
 * (LOG_DEBUG ones only up to LEVEL) and the tag they carry.  The one
 * piece of process-wide state: messages come from every module.
 */
extern void fscd_log_setup (bool to_stderr, unsigned level, const char *tag);
extern unsigned fscd_log_level (void);

/* fscd_log and fscd_debug: in objects.h (shared with nbd-fscache). */

/* ---- quota.c ----------------------------------------------------- */

/* Read O's NAME.quota: 0 and *BUDGET, or -1 (absent or invalid). */
extern int fscd_quota_read (int objdirfd, const struct fscd_object *o,
                            uint64_t *budget);
/* Write NAME.quota atomically (temp file, fsync, rename).  0 or -1. */
extern int fscd_quota_write (int objdirfd, const struct fscd_object *o,
                             uint64_t budget);
/* The fair share: the level L such that the N demands D[], each
 * capped at L, sum to at most BUDGET (max-min fairness, "water
 * filling").  UINT64_MAX in D[] is an unbounded demand.  Returns
 * UINT64_MAX if every demand fits uncapped.  Sorts D.
 */
extern uint64_t fscd_fair_level (uint64_t *d, size_t n, uint64_t budget);

/* ---- counters.c -------------------------------------------------- */

/* Counters (cumulative) and gauges (the last tick's view), printed as
 * "name value" lines under these stable names.
 */
#define FSCD_COUNTERS(X)                                                 \
  X (culled_objects)        /* objects culled */                         \
  X (culled_bytes)          /* their allocated bytes */                  \
  X (culled_files)          /* their files */                            \
  X (cull_busy)             /* found in use when we tried */             \
  X (cull_changed)          /* used since the scan: skipped */           \
  X (cull_dirty)            /* found holding dirty data: kept */         \
  X (cull_errors)           /* failed culls */                           \
  X (quota_writes)          /* quota records written */                  \
  X (quota_removals)        /* quota records removed */                  \
  X (stop_marks)            /* times fscache.stop was created */         \
  X (scans)                 /* scans of objects/ */                      \
  X (below_bcull_ms)        /* time with free blocks below bcull */      \
  X (below_bstop_ms)        /* ... below bstop */                        \
  X (below_fcull_ms)        /* time with free files below fcull */       \
  X (below_fstop_ms)        /* ... below fstop */                        \
  X (over_max_size_ms)      /* time with the directory over max-size */

#define FSCD_GAUGES(X)                                                   \
  X (total_bytes)           /* allocated bytes under objects/ */         \
  X (objects)               /* objects found by the last scan */         \
  X (objects_in_use)        /* of which in use */                        \
  X (objects_dirty)         /* of which with dirty data (never culled) */\
  X (dirty_bytes)           /* their data not yet written back */        \
  X (blocks)                /* the file system's blocks (f_blocks) */    \
  X (free_blocks)           /* available blocks (f_bavail) */            \
  X (files)                 /* its inodes (f_files) */                   \
  X (free_files)            /* available inodes (f_favail) */            \
  X (culling)               /* 1 while culling */                        \
  X (quota_mode)            /* 1 while quota records are in force */     \
  X (quota_level)           /* the fair share in bytes, 0: none */       \
  X (stopped)               /* 1 while fscache.stop exists */

struct fscd_counters {
#define FSCD_DECL(n) uint64_t n;
  FSCD_COUNTERS (FSCD_DECL)
  FSCD_GAUGES (FSCD_DECL)
#undef FSCD_DECL
};

/* Format *C as "name value\n" lines into BUF; the length needed. */
extern size_t fscd_counters_format (const struct fscd_counters *c,
                                    char *buf, size_t size);
/* Write them to DIRFD/nbd-fscached.stats atomically.  0 or -1. */
extern int fscd_counters_write (int dirfd, const struct fscd_counters *c);
/* Log them, one line, at PRIO (or at debug level 2 if PRIO is LOG_DEBUG). */
extern void fscd_counters_log (int prio, const struct fscd_counters *c);

/* ---- atomic.c ---------------------------------------------------- */

/* Write LEN bytes of BUF to DIRFD/NAME atomically (NAME.tmp.PID, then
 * rename), with fdatasync first if SYNC.  0, or -1 with errno.
 */
extern int fscd_write_atomic (int dirfd, const char *name, const void *buf,
                              size_t len, bool sync);

/* ---- watch.c ----------------------------------------------------- */

struct fscd_watch {
  int fd;                       /* the inotify instance, non-blocking */
  int objwd;                    /* its watch of DIR/objects */
  char *dir;
};

/* Watch DIR/objects and its fan-out directories.  0, or -1 with errno
 * (the daemon then runs on its timer alone).
 */
extern int fscd_watch_open (struct fscd_watch *w, const char *dir);
extern void fscd_watch_close (struct fscd_watch *w);
/* Read and discard the pending events, watching new fan-out
 * directories.  Returns the number of events read.
 */
extern unsigned fscd_watch_drain (struct fscd_watch *w);

/* ---- policy.c ---------------------------------------------------- */

/* The daemon's view of one cache directory. */
struct fscd_state {
  const struct fscd_config *cfg;
  int dirfd;                    /* DIR, flock'ed: one daemon per cache */
  int objdirfd;                 /* DIR/objects */
  struct fscd_grave grave;
  struct fscd_counters ctr;

  /* Hysteresis: set at the cull threshold, cleared at the run one. */
  bool cull_blocks, cull_files, cull_size;
  bool stopped;                 /* we keep fscache.stop */
  bool quota_mode;              /* quota records are in force */
  bool quota_stuck_said;        /* logged that quotas cannot help */
  bool dirty_said;              /* logged that dirty objects stay */
  uint64_t damaged_said;        /* damaged write logs last logged */
  double last_lowering;         /* when a budget was last lowered */

  /* The last sample, for the time counters. */
  bool have_sample;
  double sample_time;
  double stats_time;            /* when the stats file was last written */
  double min_gap;               /* seconds between ticks at the least */
  bool below_bcull, below_bstop, below_fcull, below_fstop, over_max;
};

/* Take DIR (already checked by fscd_config_read): lock it, open
 * objects/, empty the graveyard.  Returns 0, or -1 with a message in
 * ERR.
 */
extern int fscd_state_open (struct fscd_state *st,
                            const struct fscd_config *cfg,
                            char *err, size_t errlen);

/* Leave DIR: remove the quota records and the stop mark we keep (the
 * filter's own limits apply again), write the stats file, unlock.
 */
extern void fscd_state_close (struct fscd_state *st);

/* One tick at time NOW (seconds, any epoch).  Returns the delay in
 * seconds until the next one.
 */
extern double fscd_tick (struct fscd_state *st, double now);

#endif /* FSCACHED_H */
