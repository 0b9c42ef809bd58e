/* Shared by the programs under tools/ (nbd-fscached, nbd-fscache):
 * what they do to the objects of a cache directory from outside the
 * filter, without the filter's library opening them.
 *
 *   scan.c      one pass over DIR/objects: every object's files, sizes,
 *               last use, and whether it is in use (/proc/locks, read
 *               without taking any lock)
 *   cull.c      removing one idle object safely: its index locked, its
 *               files moved into DIR/graveyard (index last), unlinked
 *   cachedir.c  checking that a directory is a cache, with a message
 *
 * The contract with the filter is docs/format.md, "Culling: last use,
 * the graveyard, quotas and the stop mark".  These files print
 * nothing themselves: they report through fscd_log and fscd_debug,
 * which each program defines (to syslog or stderr for the daemon,
 * "nbd-fscache: ..." on stderr for the tool).
 */
#ifndef FSC_TOOLS_OBJECTS_H
#define FSC_TOOLS_OBJECTS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <sys/types.h>
#include <syslog.h>

/* ---- defined by each program ------------------------------------- */

/* Log at PRIO (LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO). */
extern void fscd_log (int prio, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* Log at LOG_DEBUG if the debug level is at least LEVEL (1..3). */
extern void fscd_debug (unsigned level, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* ---- scan.c ------------------------------------------------------ */

/* Which of an object's files exist (struct fscd_object.files). */
#define FSCD_F_IDX    1u
#define FSCD_F_DATA   2u
#define FSCD_F_SUMS   4u
#define FSCD_F_STALE  8u
#define FSCD_F_QUOTA 16u
#define FSCD_F_OTHER 32u        /* anything else named NAME.* */
#define FSCD_F_STATS 64u        /* NAME.stats: live counters, or the
                                 * history of a discarded object */
#define FSCD_F_WLOG 128u        /* NAME.wlog: the write log of
                                 * fscache-mode=writeback */

/* One object found by a scan: the files NAME.* of one fan-out dir. */
struct fscd_object {
  unsigned fan;                 /* its fan-out directory, @00 .. @ff */
  char *name;                   /* NAME, without suffix */
  unsigned files;               /* FSCD_F_* */
  uint64_t bytes;               /* allocated bytes of all its files */
  struct timespec mtime;        /* of NAME.idx (else its newest file) */
  dev_t dev;                    /* NAME.idx's device and inode */
  ino_t ino;
  bool locked;                  /* NAME.idx or NAME.wlog is in
                                 * /proc/locks: in use */
  bool dirty;                   /* NAME.wlog holds records not yet
                                 * written back, or cannot be read
                                 * (it may hold the only copy): never
                                 * culled (fscd_wlog_dirty) */
  uint64_t dirty_bytes;         /* of which bytes of the export */
  bool busy;                    /* found locked when we tried: in use */
  bool gone;                    /* culled by this tick */
};

/* A scan's result.  Objects in use (by /proc/locks) are all kept in
 * PINNED; idle objects whose write log holds dirty data in DIRTY
 * (they are never culled); of the others, only the 2^culltable least
 * recently used are kept, in CAND, oldest first.
 */
struct fscd_scan {
  struct fscd_object *cand;
  size_t ncand, candcap;
  bool truncated;               /* more idle objects than CAND holds */
  struct fscd_object *pinned;
  size_t npinned, pinnedcap;
  struct fscd_object *dirty;    /* idle, with dirty data */
  size_t ndirty, dirtycap;
  uint64_t dirty_objects;       /* objects with dirty data, in use too */
  uint64_t dirty_bytes;         /* the dirty bytes of all of them */
  uint64_t damaged_objects;     /* of which with a damaged write log
                                 * (Rule 7 of core/wlog/wlog.c) */
  uint64_t total_bytes;         /* every file under objects/ */
  uint64_t nobjects;
  uint64_t nfiles;
  bool locks_known;             /* /proc/locks could be read */
  double seconds;               /* how long the scan took */
};

/* Open fan-out directory FAN (0..255) of OBJDIRFD, never following a
 * symlink; its name "@xx" goes to NAME.  The descriptor, or -1 with
 * errno.
 */
extern int fscd_open_fan (int objdirfd, unsigned fan, char name[4]);

/* Scan OBJDIRFD (DIR/objects) into *S, keeping at most CANDMAX
 * candidates.  Returns 0, or -1 with errno if objects/ itself cannot
 * be read (an unreadable fan-out directory is logged and skipped).
 */
extern int fscd_scan (int objdirfd, size_t candmax, struct fscd_scan *s);
extern void fscd_scan_free (struct fscd_scan *s);

/* Does the write log NAME.wlog in fan-out directory FANFD hold data
 * not yet written back?  Read with fsc_wlog_inspect, without its lock
 * (a proxy may be appending).  True if it holds records, or if it is
 * there but cannot be read (damaged: it may hold the only copy, and
 * the filter refuses it too); false if there is none or it is empty.
 * *BYTES gets the dirty bytes (0 if unknown); *DAMAGED (if not NULL)
 * whether it is damaged (EUCLEAN, EBADMSG: the filter refuses it).
 */
extern bool fscd_wlog_dirty (int fanfd, const char *name, uint64_t *bytes,
                             bool *damaged);

/* ---- cull.c ------------------------------------------------------ */

struct fscd_grave {
  int fd;                       /* DIR/graveyard */
  uint64_t seq;                 /* for unique names */
  unsigned pause_ms;            /* NBD_FSCACHED_TEST_PAUSE_MS */
};

/* Open (creating it mode 0700 if needed) DIR/graveyard and remove
 * everything in it.  Returns 0 or -1 with errno.
 */
extern int fscd_grave_open (int dirfd, struct fscd_grave *g);
extern void fscd_grave_close (struct fscd_grave *g);

/* Outcomes of fscd_cull. */
enum fscd_cull_result {
  FSCD_CULLED = 0,              /* its files are gone */
  FSCD_CULL_BUSY = 1,           /* locked: in use */
  FSCD_CULL_CHANGED = 2,        /* used or replaced since the scan */
  FSCD_CULL_ERROR = 3,          /* an error, logged */
  FSCD_CULL_DIRTY = 4,          /* its write log holds dirty data: kept */
};

/* Flags of fscd_cull. */
#define FSCD_CULL_FORCE 1u      /* discard a dirty write log too
                                 * (nbd-fscache invalidate --force) */
#define FSCD_CULL_KEEP_WLOG 2u  /* leave NAME.wlog alone: the caller
                                 * holds its lock (nbd-fscache writeback) */

/* Cull the idle object O (see the design comment of cull.c): with its
 * index locked (and its write log, if any), rename its files into the
 * graveyard, index last, then unlink them.  A write log with dirty data
 * keeps the whole object (FSCD_CULL_DIRTY) unless FLAGS has
 * FSCD_CULL_FORCE.  *FREED gets the allocated bytes removed.
 */
extern enum fscd_cull_result fscd_cull (int objdirfd, struct fscd_grave *g,
                                        const struct fscd_object *o,
                                        unsigned flags, uint64_t *freed,
                                        unsigned *nfiles);

/* ---- cachedir.c -------------------------------------------------- */

/* Check that DIR is an existing cache directory (a valid fscache.hdr
 * and objects/, ours and not writable by others), opening it as the
 * filter would but changing nothing.  Returns 0, or -1 with a message
 * "DIR: why" in WHY and errno set (EBADMSG: the header is damaged).
 */
extern int fscd_check_dir (const char *dir, char *why, size_t whylen);

#endif /* FSC_TOOLS_OBJECTS_H */
