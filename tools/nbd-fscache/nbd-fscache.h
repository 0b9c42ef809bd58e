/* nbd-fscache: the operator's tool for a cache directory.  Shared
 * declarations of its modules:
 *
 *   main.c        the dispatcher: global options, --help, --version,
 *                 the subcommands' table; common option handling
 *   objects.c     opening a cache directory and listing its objects
 *                 (tools/common/scan.c), reading each one's index
 *                 (core/inspect/inspect.h), naming and finding them
 *   live.c        the counters of an object: NAME.stats (live, while a
 *                 proxy uses it) or the superblock's
 *   output.c      human sizes and times, JSON strings, messages
 *   ls.c, stat.c, prom.c, check.c, invalidate.c, warm.c, writeback.c
 *                 the subcommands (prom.c: stat --prometheus)
 *
 * Messages are "nbd-fscache: what: why" on stderr.  Exit codes (the
 * man page, nbd-fscache(1)): 0 success, 1 a finding (check found
 * problems, invalidate refused an object in use, no such object), 2
 * a usage error or an error that stopped the command.
 */
#ifndef NBD_FSCACHE_TOOL_H
#define NBD_FSCACHE_TOOL_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "index.h"
#include "inspect.h"
#include "keyenc.h"
#include "ostats.h"
#include "objects.h"
#include "utils.h"
#include "wlog.h"

#define PROG "nbd-fscache"

#define EXIT_FINDING 1
#define EXIT_USAGE 2            /* also: an error that stopped us */

/* ---- main.c ------------------------------------------------------ */

/* The options every subcommand takes (--dir, --help).  Parses ARGC,
 * ARGV of subcommand CMD with LONGOPTS/SHORTOPTS (which must include
 * "dir" as 'd' and "help" as 'h'); calls OPT for any other option
 * (returning -1 for a bad one).  Prints USAGE for --help and exits 0;
 * exits 2 on a usage error.  Returns optind.
 */
struct option;
extern int tool_getopt (const char *cmd, const char *usage, int argc,
                        char **argv, const char *shortopts,
                        const struct option *longopts,
                        int (*opt) (int c, const char *arg, void *opaque),
                        void *opaque);

/* The cache directory: --dir, or the filter's default (as
 * nbdkit-fscache-filter(1) documents fscache-dir).  Exits 2 if it
 * cannot be found.
 */
extern const char *tool_dir (void);
extern void tool_set_dir (const char *dir);

/* ---- objects.c --------------------------------------------------- */

/* Where an object's counters come from (live.c). */
enum counters_source {
  SRC_NONE = 0,                 /* no readable superblock or stats file */
  SRC_SUPERBLOCK,               /* NAME.idx's superblock */
  SRC_STATS,                    /* NAME.stats, newer than the superblock */
  SRC_LIVE,                     /* NAME.stats of the process using it */
};

struct tool_object {
  struct fscd_object f;         /* from the scan: files, size, lock */
  int err;                      /* errno opening its index, or 0 */
  struct fsc_inspect_info info; /* if err is 0 */
  char key[288];                /* the key for humans (key_show) */
  char *identity;               /* the key's identity (before the NUL),
                                 * escaped; NULL if unknown */
  char *export;                 /* its export name, escaped, or NULL */
  struct fsc_ostats ctr;        /* its counters */
  enum counters_source src;
  double ctr_time;              /* when they were written (unix s) */
  /* The miss-ratio curve from NAME.stats (any age): MRC_N points. */
  unsigned mrc_n;
  uint64_t mrc_since, mrc_refs;
  uint64_t cap;                 /* the size cap NAME.stats gives, 0:
                                 * none */
  uint64_t mrc_bytes[FSC_LIVE_MRC_MAX];
  double mrc_hit[FSC_LIVE_MRC_MAX];
  int wlog_err;                 /* errno reading NAME.wlog (ENOENT:
                                 * none), or 0 */
  struct fsc_wlog_info wlog;    /* if wlog_err is 0 */
};

struct tool_cache {
  const char *dir;
  int dirfd, objdirfd;
  struct tool_object *v;        /* sorted by name */
  size_t n;
  uint64_t total_bytes;         /* every file under objects/ */
  bool locks_known;
};

/* Open the cache directory DIR (exiting 2 with a message for CMD if it
 * is not a cache) and list its objects, reading each index and its
 * counters.  Returns 0, or -1 with errno.
 */
extern int tool_cache_open (const char *cmd, const char *dir,
                            struct tool_cache *c);

/* The same, but a damaged fscache.hdr (with objects/ there) is no
 * reason to exit: *BAD_HEADER says so (check reports and repairs it).
 */
extern int tool_cache_open_checking (const char *cmd, const char *dir,
                                     struct tool_cache *c, bool *bad_header);
extern void tool_cache_close (struct tool_cache *c);

/* The object ARG names: its NAME, a unique prefix of names, or its key
 * as ls shows it (or its fscache-key, for the export "").  Prints
 * "nbd-fscache: CMD: ARG: ..." and returns NULL if none or several.
 */
extern struct tool_object *tool_find (const char *cmd, struct tool_cache *c,
                                      const char *arg);

/* Its fan-out directory, opened; -1 with errno. */
extern int tool_open_fan (const struct tool_cache *c,
                          const struct tool_object *o);

/* "in use", "dirty", "needs check" or "idle" (see ls in the man
 * page).
 */
extern const char *tool_state (const struct tool_object *o);

/* Does O's write log hold data not yet written back (or is it
 * unreadable, and so may)?  The age in seconds of its oldest dirty
 * write, 0 if none.
 */
extern bool tool_dirty (const struct tool_object *o);
extern bool tool_wlog_damaged (const struct tool_object *o);
extern const char *tool_wlog_state (const struct tool_object *o);
extern double tool_dirty_age (const struct tool_object *o);

/* Read the object's index again (after a change). */
extern void tool_reload (struct tool_cache *c, struct tool_object *o);

/* ---- invalidate.c ------------------------------------------------ */

/* Open DIR/graveyard for CMD (emptying it, as the daemon does at
 * start); 0, or -1 after a message.
 */
extern int tool_grave_open (struct tool_cache *c, struct fscd_grave *g,
                            const char *cmd);
/* Discard O as the daemon culls (tools/common/cull.c, with FLAGS),
 * looking at its index afresh first.  FSCD_CULL_BUSY: a running
 * process holds it; FSCD_CULL_DIRTY: its write log holds dirty data.
 */
extern enum fscd_cull_result tool_discard (struct tool_cache *c,
                                           struct tool_object *o,
                                           struct fscd_grave *g,
                                           unsigned flags);

/* ---- live.c ------------------------------------------------------ */

/* Fill O's counters from NAME.stats or the superblock (FANFD: its
 * fan-out directory).
 */
extern void tool_load_counters (int fanfd, struct tool_object *o);
extern const char *tool_source_name (enum counters_source s);

/* The kind of counter I: 'c' counter, 't' time, 'g' gauge. */
extern char tool_ostat_kind (unsigned i);
/* A sentence about counter I, for --prometheus's HELP. */
extern const char *tool_ostat_help (unsigned i);

/* ---- output.c ---------------------------------------------------- */

/* BYTES as "16.0M" etc. (powers of 1024). */
extern const char *fmt_size (uint64_t bytes, char buf[16]);
/* T (unix seconds) as "2026-12-04 01:02:03" local time, "-" if 0. */
extern const char *fmt_time (uint64_t t, char buf[32]);
/* S as a JSON string, quotes included. */
extern void json_str (FILE *fp, const char *s);
/* O's write log as JSON members (",\n" INDENT "\"write_log\": ..."):
 * write_log ("none", "ok", "unreadable"), dirty, dirty_bytes,
 * dirty_epochs, dirty_oldest_age_seconds.
 */
extern void tool_json_dirty (FILE *fp, const struct tool_object *o,
                             const char *indent);
/* Print "nbd-fscache: FMT" on stderr. */
extern void tool_error (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* The predicted hit ratio (0 to 1) of O's cache at BYTES, from its
 * miss-ratio curve (interpolated), or -1 if it has none.  (live.c)
 */
extern double tool_mrc_at (const struct tool_object *o, uint64_t bytes);
/* The multiples of the cached size stat and its Prometheus output give
 * the predicted hit ratio at.  (live.c)
 */
#define TOOL_MRC_SCALES 6
extern const double tool_mrc_scales[TOOL_MRC_SCALES];

/* A size: digits and an optional suffix (k, M, G, T or KiB... powers
 * of 1024; kB, MB... of 1000).  -1 on anything else, an overflow
 * included.  (warm.c)
 */
extern int tool_parse_size (const char *s, uint64_t *out);

/* ---- the subcommands --------------------------------------------- */

extern int fscache_cmd_ls (int argc, char **argv);
extern int fscache_cmd_stat (int argc, char **argv);
extern int fscache_cmd_check (int argc, char **argv);
extern int fscache_cmd_invalidate (int argc, char **argv);
extern int fscache_cmd_warm (int argc, char **argv);
extern int fscache_cmd_writeback (int argc, char **argv);
extern int fscache_cmd_manifest (int argc, char **argv);
extern int fscache_cmd_replay (int argc, char **argv);
extern int fscache_cmd_advise (int argc, char **argv);

/* prom.c: the Prometheus text format of objects V[0..N) and C's facts. */
extern void tool_prometheus (FILE *fp, const struct tool_cache *c,
                             struct tool_object *const *v, size_t n,
                             uint64_t fs_free, uint64_t fs_size);

#endif /* NBD_FSCACHE_TOOL_H */
