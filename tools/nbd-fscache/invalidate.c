/* nbd-fscache invalidate: discard objects, safely, as the daemon culls
 * them (tools/common/cull.c): NAME.idx locked without waiting (an
 * object a proxy holds is refused, not waited for), the files moved
 * into DIR/graveyard with the index last, unlinked there, and only
 * then the lock released.  A proxy opening the object afterwards
 * creates it cold; one opening it meanwhile finds it locked and serves
 * that connection uncached.  Never a half-deleted object.
 *
 * An object whose write log (NAME.wlog, fscache-mode=writeback) holds
 * data not yet written back is refused: that log is the only copy of
 * what its clients wrote.  --force discards it with the object
 * (nbd-fscache writeback writes it back instead).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nbd-fscache.h"

#define INVALIDATE_USAGE "invalidate [--dir DIR] [--force] OBJECT... | --all"
#define RETRIES 5               /* a proxy may touch the index between
                                 * our look and our lock */

struct inv_opts {
  bool all, force;
};

static int
inv_opt (int c, const char *arg, void *opaque)
{
  struct inv_opts *io = opaque;
  (void) arg;
  switch (c) {
  case 'a': io->all = true; return 0;
  case 'f': io->force = true; return 0;
  default: return -1;
  }
}

/* Say why O (its log dirty) was not invalidated. */
static void
say_dirty (struct tool_cache *c, struct tool_object *o)
{
  uint64_t bytes = 0;
  int fanfd = tool_open_fan (c, o);
  struct fsc_wlog_info info;
  int r = fanfd >= 0 ? fsc_wlog_inspect (fanfd, o->f.name, &info) : -1;
  if (r == 0)
    bytes = info.dirty_bytes;
  else if (errno == EUCLEAN)
    tool_error ("invalidate: %s: its write log is DAMAGED (record %" PRIu64
                " at byte %" PRIu64 ") and holds flushed writes not written "
                "back, the only copy: %" PRIu64 " bytes intact before the "
                "damage; 'nbd-fscache writeback --salvage %s URI' writes "
                "them back; use --force to discard it all", o->f.name,
                info.damage_seq, info.damage_pos, info.dirty_bytes,
                o->f.name);
  else if (errno != ENOENT)
    tool_error ("invalidate: %s: its write log cannot be read (%m) and may "
                "hold data not written back (the only copy); use --force "
                "to discard it", o->f.name);
  if (fanfd >= 0)
    close (fanfd);
  if (r == 0 || errno == ENOENT)
    tool_error ("invalidate: %s: %" PRIu64 " bytes of dirty data not "
                "written back (the only copy); use --force to discard them",
                o->f.name, bytes);
}

enum fscd_cull_result
tool_discard (struct tool_cache *c, struct tool_object *o, struct fscd_grave *g,
              unsigned flags)
{
  enum fscd_cull_result r = FSCD_CULL_CHANGED;

  for (int i = 0; i < RETRIES && r == FSCD_CULL_CHANGED; ++i) {
    /* fscd_cull checks that the index is still the one looked at:
     * look again, as the scan would.
     */
    char idx[FSC_NAME_MAX + 8];
    struct stat st;
    int fanfd = tool_open_fan (c, o);
    if (fanfd == -1)
      return errno == ENOENT ? FSCD_CULLED : FSCD_CULL_ERROR;
    snprintf (idx, sizeof idx, "%s.idx", o->f.name);
    if (fstatat (fanfd, idx, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      o->f.files |= FSCD_F_IDX;
      o->f.dev = st.st_dev;
      o->f.ino = st.st_ino;
      o->f.mtime = st.st_mtim;
    }
    else
      o->f.files &= ~FSCD_F_IDX;
    close (fanfd);
    uint64_t freed;
    unsigned nfiles;
    r = fscd_cull (c->objdirfd, g, &o->f, flags, &freed, &nfiles);
  }
  return r;
}

/* Leave O's counters in NAME.stats, with this invalidation counted,
 * for the object's next incarnation to carry on (the filter reads them
 * when it creates an object without an index: core/disk/live.c).  Best
 * effort: without them the history starts again from zero.
 */
static void
keep_history (struct tool_cache *c, struct tool_object *o)
{
  if (o->err || o->info.reason != FSC_OK)
    return;
  struct fsc_ostats s = o->ctr;
  struct timespec now;
  clock_gettime (CLOCK_REALTIME, &now);
  s.v[FSC_OSTAT_invalidations]++;
  s.v[FSC_OSTAT_last_invalidation] = now.tv_sec;
  s.v[FSC_OSTAT_present_blocks] = s.v[FSC_OSTAT_cached_bytes] = 0;
  s.last_reason = FSC_REJ_INVALIDATED;
  struct fsc_live_head h = {
    .pid = (long) getpid (),
    .updated_ms = (uint64_t) now.tv_sec * 1000 + now.tv_nsec / 1000000,
    .open = false,
    .key_hash_hi = o->info.sb.key_hash_hi,
    .key_hash_lo = o->info.sb.key_hash_lo,
    .incarnation = o->info.sb.incarnation,
    .size = o->info.sb.size,
    .block_size = o->info.sb.block_size,
  };
  int fanfd = tool_open_fan (c, o);
  if (fanfd == -1 || fsc_live_write (fanfd, o->f.name, &h, &s) == -1)
    tool_error ("invalidate: %s: its counters are lost: %m", o->f.name);
  if (fanfd >= 0)
    close (fanfd);
}

int
tool_grave_open (struct tool_cache *c, struct fscd_grave *g, const char *cmd)
{
  if (fscd_grave_open (c->dirfd, g) == -1) {
    tool_error ("%s: %s/graveyard: %m", cmd, c->dir);
    return -1;
  }
  return 0;
}

int
fscache_cmd_invalidate (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { "all", no_argument, NULL, 'a' },
    { "force", no_argument, NULL, 'f' },
    { NULL, 0, NULL, 0 },
  };
  struct inv_opts io = { false, false };
  struct tool_cache c;
  struct fscd_grave g;
  int ret = EXIT_SUCCESS;

  int i = tool_getopt ("invalidate", INVALIDATE_USAGE, argc, argv, "d:haf",
                       longopts, inv_opt, &io);
  bool all = io.all;
  if (all == (i < argc)) {
    tool_error ("invalidate: %s", all ? "--all and OBJECT exclude each other"
                                      : "no OBJECT (or --all) given");
    fprintf (stderr, "usage: " PROG " " INVALIDATE_USAGE "\n");
    return EXIT_USAGE;
  }
  if (tool_cache_open ("invalidate", tool_dir (), &c) == -1) {
    tool_error ("invalidate: %s: %m", tool_dir ());
    return EXIT_USAGE;
  }
  size_t n = all ? c.n : (size_t) (argc - i);
  CLEANUP_FREE struct tool_object **v = calloc (n ? n : 1, sizeof *v);
  if (v == NULL) {
    tool_error ("invalidate: %m");
    tool_cache_close (&c);
    return EXIT_USAGE;
  }
  /* Find them all before discarding any. */
  for (size_t k = 0; k < n; ++k)
    if ((v[k] = all ? &c.v[k] : tool_find ("invalidate", &c, argv[i + k]))
        == NULL)
      ret = EXIT_FINDING;
  bool go = ret == EXIT_SUCCESS;
  if (go && tool_grave_open (&c, &g, "invalidate") == -1) {
    go = false;
    ret = EXIT_USAGE;
  }
  for (size_t k = 0; go && k < n; ++k) {
    bool dirty = tool_dirty (v[k]);
    switch (tool_discard (&c, v[k], &g, io.force ? FSCD_CULL_FORCE : 0)) {
    case FSCD_CULLED:
      keep_history (&c, v[k]);
      if (dirty && io.force && v[k]->wlog_err == 0)
        printf ("%s: invalidated (%s), %" PRIu64 " bytes of dirty data "
                "discarded\n", v[k]->key, v[k]->f.name,
                v[k]->wlog.dirty_bytes);
      else if (dirty && io.force)
        printf ("%s: invalidated (%s), its %s write log "
                "discarded\n", v[k]->key, v[k]->f.name,
                tool_wlog_damaged (v[k]) ? "damaged" : "unreadable");
      else
        printf ("%s: invalidated (%s)\n", v[k]->key, v[k]->f.name);
      break;
    case FSCD_CULL_DIRTY:
      say_dirty (&c, v[k]);
      ret = EXIT_FINDING;
      break;
    case FSCD_CULL_BUSY:
      tool_error ("invalidate: %s: in use by a running process: "
                  "not invalidated", v[k]->f.name);
      ret = EXIT_FINDING;
      break;
    case FSCD_CULL_CHANGED:
      tool_error ("invalidate: %s: kept changing while we tried: "
                  "not invalidated", v[k]->f.name);
      ret = EXIT_FINDING;
      break;
    default:
      ret = EXIT_USAGE;         /* fscd_cull said why */
      break;
    }
  }
  if (go)
    fscd_grave_close (&g);
  tool_cache_close (&c);
  return ret;
}
