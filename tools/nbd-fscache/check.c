/* nbd-fscache check: verify objects, after dm-cache's cache_check.
 *
 * For each object: its files (an index, data segments and a sums file
 * of the lengths the export needs), the index (both superblock slots,
 * the winner's version and geometry, group records: damaged ones,
 * pieces a block cannot have), then every present block, read and
 * hashed exactly as a hit would (core/inspect/inspect.h: its data against the
 * index checksum, and its sub-block hashes in the sums file).  The
 * cache header is checked when the directory is opened.
 *
 * A problem is something that costs cached data or would make the
 * filter discard the object; notes (an unclean close, an old index
 * version, a stale mark) are things the filter handles by itself.
 *
 * --repair takes the object's lock as the filter does (refusing an
 * object a running process holds) and keeps it throughout: bad blocks
 * are dropped (a new group record without them, then their space
 * punched: core/inspect/inspect.c follows the commit rules), an object whose
 * index or files are beyond that is discarded through the graveyard
 * like invalidate.  A check without --repair of an object in use is
 * allowed, but what it finds may be a race with the proxy.
 *
 * Exit: 0 no problem (or, with --repair, every problem repaired), 1
 * problems remain, 2 a usage or I/O error.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fscache.h"
#include "nbd-fscache.h"

#define CHECK_USAGE "check [--dir DIR] [--repair] [OBJECT...]"

struct check {
  bool repair;
  bool progress;                /* stderr is a terminal */
  uint64_t total, done;         /* blocks, for the progress bar */
  int shown;                    /* percent last shown */
  uint64_t problems, repaired, blocks;
  bool io_error;
  /* The object being checked. */
  struct tool_object *o;
  struct fsc_inspect *ins;
};

static int
check_opt (int c, const char *arg, void *opaque)
{
  struct check *ck = opaque;
  (void) arg;
  if (c != 'r')
    return -1;
  ck->repair = true;
  return 0;
}

static void
progress (struct check *ck, bool end)
{
  if (!ck->progress)
    return;
  int pct = ck->total ? (int) (100 * ck->done / ck->total) : 100;
  if (end) {
    fprintf (stderr, "\r%-70s\r", "");
    return;
  }
  if (pct == ck->shown)
    return;
  ck->shown = pct;
  int bar = pct * 40 / 100;
  fprintf (stderr, "\r" PROG ": check: [%.*s%*s] %3d%%",
           bar, "########################################", 40 - bar, "",
           pct);
}

static void
problem (struct check *ck, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

static void
problem (struct check *ck, const char *fmt, ...)
{
  va_list ap;
  progress (ck, true);
  printf ("%s: ", ck->o->f.name);
  va_start (ap, fmt);
  vprintf (fmt, ap);
  va_end (ap);
  putchar ('\n');
  ck->problems++;
}

static void
note (struct check *ck, const char *what)
{
  progress (ck, true);
  printf ("%s: note: %s\n", ck->o->f.name, what);
}

static int
check_group (void *opaque, const struct fsc_grec *rec, int slot)
{
  struct check *ck = opaque;
  uint64_t drop = 0;

  for (unsigned i = 0; i < FSC_GROUP_BLOCKS; ++i) {
    uint64_t b = rec->group * FSC_GROUP_BLOCKS + i, off, len, bytes;
    unsigned pieces;
    bool zero;
    if (!(rec->present & (UINT64_C (1) << i)))
      continue;
    fsc_inspect_block_range (ck->ins, b, &off, &len);
    if (!fsc_inspect_block (ck->ins, rec, i, &pieces, &zero, &bytes)) {
      if (rec->zero & (UINT64_C (1) << i))
        problem (ck, "block %" PRIu64 " (offset %" PRIu64 "): marked zero "
                 "with pieces 0x%04x or a checksum not that of zeroes "
                 "(never served)", b, off, rec->pieces[i]);
      else
        problem (ck, "block %" PRIu64 " (offset %" PRIu64 "): pieces 0x%04x "
                 "it cannot have (never served)", b, off, rec->pieces[i]);
      drop |= UINT64_C (1) << i;
      continue;
    }
    /* A zero block reads nothing: its checksum is checked alone. */
    int r = fsc_inspect_verify (ck->ins, b, rec->csum[i], pieces, zero);
    ck->blocks++;
    ck->done++;
    progress (ck, false);
    if (r == -1) {
      progress (ck, true);
      tool_error ("check: %s: block %" PRIu64 ": %m", ck->o->f.name, b);
      ck->io_error = true;
      return -1;
    }
    if (r) {
      problem (ck, "block %" PRIu64 " (offset %" PRIu64 ", %" PRIu64
               " bytes): %s%s%s", b, off, len,
               r & FSC_INSPECT_BAD_DATA ? "data does not match its checksum"
               : "", r == (FSC_INSPECT_BAD_DATA | FSC_INSPECT_BAD_SUMS)
               ? "; " : "",
               r & FSC_INSPECT_BAD_SUMS
               ? "sub-block hashes do not match its checksum" : "");
      drop |= UINT64_C (1) << i;
    }
  }
  if (drop && ck->repair) {
    if (fsc_inspect_drop (ck->ins, rec, slot, rec->group, drop) == -1) {
      tool_error ("check: %s: group %" PRIu64 ": cannot drop blocks: %m",
                  ck->o->f.name, rec->group);
      ck->io_error = true;
      return -1;
    }
    ck->repaired += __builtin_popcountll (drop);
  }
  return 0;
}

/* Problems only a discard repairs; returns how many. */
static unsigned
check_files (struct check *ck, const struct fsc_inspect_info *in)
{
  unsigned n = 0;
  if (in->reason != FSC_OK) {
    problem (ck, "index not valid: %s (superblock slot 0: %s, slot 1: %s);"
             " the next open starts the object cold",
             fsc_reason_name (in->reason), fsc_reason_name (in->slot_reason[0]),
             fsc_reason_name (in->slot_reason[1]));
    return 1;
  }
  if (in->bad_segments) {
    problem (ck, "%" PRIu64 " of %" PRIu64 " data files missing, not ours or "
             "of the wrong length (data-file-size)", in->bad_segments,
             in->nseg);
    n++;
  }
  if (!in->sums_ok) {
    problem (ck, "sums file missing, not ours or of the wrong length "
             "(data-file-size)");
    n++;
  }
  return n;
}

static void
check_one (struct check *ck, struct tool_cache *c, struct tool_object *o,
           struct fscd_grave *g)
{
  struct fsc_inspect_info in;
  uint64_t before = ck->problems;
  bool discard = false;

  ck->o = o;
  ck->ins = NULL;
  memset (&in, 0, sizeof in);
  if (tool_dirty (o)) {
    if (o->wlog_err == EUCLEAN)
      problem (ck, "write log DAMAGED: record %" PRIu64 " at byte %" PRIu64
               " cannot be read although a later marker shows it was "
               "flushed; %" PRIu64 " records before it intact, %" PRIu64
               " after it lost; kept (nbd-fscache writeback --salvage "
               "OBJECT URI writes back the intact ones, invalidate --force "
               "discards it all)", o->wlog.damage_seq, o->wlog.damage_pos,
               o->wlog.records, o->wlog.lost_records);
    else if (o->wlog_err)
      problem (ck, "write log unreadable (%s): it may hold written data "
               "not yet written back, the only copy; kept (nbd-fscache "
               "invalidate --force discards it)", strerror (o->wlog_err));
    else {
      char what[160];
      snprintf (what, sizeof what, "holds %" PRIu64 " bytes of dirty data "
                "in %" PRIu64 " epochs (writeback mode), not yet written "
                "back", o->wlog.dirty_bytes, o->wlog.epochs);
      note (ck, what);
    }
    if (!(o->f.files & FSCD_F_IDX)) {
      /* A writeback proxy may drop the object and keep its log. */
      if (o->wlog_err == 0)
        printf ("%s: ok (%s, write log only)\n", o->f.name, o->key);
      return;
    }
  }
  if (!(o->f.files & FSCD_F_IDX)) {
    problem (ck, "files without an index (what a crash while removing "
             "leaves)");
    discard = true;
    goto out;
  }
  int fanfd = tool_open_fan (c, o);
  if (fanfd == -1 ||
      fsc_inspect_open (fanfd, o->f.name, ck->repair, &ck->ins, &in) == -1) {
    int e = errno;
    if (fanfd >= 0)
      close (fanfd);
    if (e == EPERM) {
      problem (ck, "index is not a regular file of ours with one link "
               "(the filter serves it uncached)");
      return;
    }
    errno = e;
    tool_error ("check: %s: %m", o->f.name);
    ck->io_error = true;
    return;
  }
  close (fanfd);
  if (ck->repair && fsc_inspect_lock (ck->ins) == -1) {
    if (errno == EWOULDBLOCK)
      tool_error ("check: %s: in use by a running process: refusing to "
                  "repair it (stop the proxy first)", o->f.name);
    else
      tool_error ("check: %s: flock: %m", o->f.name);
    ck->io_error = true;
    goto out;
  }
  if (!ck->repair && o->f.locked)
    note (ck, "in use by a running process: what this check finds may be "
          "a race with it");

  if (check_files (ck, &in) > 0) {
    discard = true;
    goto out;
  }
  if (in.sb.version < FSC_INDEX_VERSION)
    note (ck, "index of an older format version, upgraded at the next open");
  if (!(in.sb.flags & FSC_SB_CLEAN) && !o->f.locked)
    note (ck, "not closed cleanly: the next open reclaims the space no "
          "block names");
  if (in.stale)
    note (ck, "marked stale (another process wrote upstream): the next "
          "open starts it cold");
  if (in.damaged_groups) {
    CLEANUP_FREE uint64_t *gs = calloc (in.damaged_groups, sizeof *gs);
    uint64_t k = gs ? fsc_inspect_damaged (ck->ins, gs, in.damaged_groups) : 0;
    problem (ck, "%" PRIu64 " group records damaged (both slots): their "
             "blocks are lost", in.damaged_groups);
    for (uint64_t j = 0; ck->repair && j < k; ++j) {
      if (fsc_inspect_drop (ck->ins, NULL, -1, gs[j], 0) == -1) {
        tool_error ("check: %s: group %" PRIu64 ": %m", o->f.name, gs[j]);
        ck->io_error = true;
        goto out;
      }
    }
    if (ck->repair && k == in.damaged_groups)
      ck->repaired++;
  }
  if (fsc_inspect_groups (ck->ins, check_group, ck) == -1 && !ck->io_error) {
    tool_error ("check: %s: %m", o->f.name);
    ck->io_error = true;
  }

 out:
  /* The lock goes with the inspection: discarding takes it again. */
  fsc_inspect_close (ck->ins);
  ck->ins = NULL;
  if (discard && ck->repair && !ck->io_error) {
    switch (tool_discard (c, o, g, 0)) {
    case FSCD_CULLED:
      printf ("%s: discarded\n", o->f.name);
      ck->repaired += ck->problems - before;
      break;
    case FSCD_CULL_BUSY:
      tool_error ("check: %s: in use by a running process: not discarded",
                  o->f.name);
      break;
    case FSCD_CULL_DIRTY:
      tool_error ("check: %s: its write log holds dirty data: not "
                  "discarded (a writeback proxy writes it back and starts "
                  "the object again; or nbd-fscache writeback, or "
                  "invalidate --force)", o->f.name);
      break;
    default:
      tool_error ("check: %s: could not be discarded", o->f.name);
      ck->io_error = true;
      break;
    }
  }
  progress (ck, true);
  if (ck->problems == before && !ck->io_error)
    printf ("%s: ok (%s, %" PRIu64 " blocks verified)\n", o->f.name, o->key,
            in.present_blocks);
}

int
fscache_cmd_check (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { "repair", no_argument, NULL, 'r' },
    { NULL, 0, NULL, 0 },
  };
  struct check ck = { .shown = -1 };
  struct tool_cache c;
  struct fscd_grave g = { .fd = -1 };

  int i = tool_getopt ("check", CHECK_USAGE, argc, argv, "d:hr", longopts,
                       check_opt, &ck);
  ck.progress = isatty (STDERR_FILENO);
  bool bad_header;
  if (tool_cache_open_checking ("check", tool_dir (), &c, &bad_header) == -1) {
    tool_error ("check: %s: %m", tool_dir ());
    return EXIT_USAGE;
  }
  if (bad_header) {
    /* The filter writes a new header over a damaged one (a new cache
     * UUID; nothing else depends on it), and so does a repair.
     */
    ck.problems++;
    printf ("fscache.hdr: damaged or not a cache header%s\n",
            ck.repair ? "" : " (the filter, or check --repair, writes a "
            "new one)");
    if (ck.repair) {
      struct fsc_cache *fc;
      struct fsc_cache_config cc = { .dir = tool_dir () };
      if (fsc_cache_open (&cc, &fc) == -1) {
        tool_error ("check: %s: writing a new fscache.hdr: %m", tool_dir ());
        tool_cache_close (&c);
        return EXIT_USAGE;
      }
      fsc_cache_close (fc);
      ck.repaired++;
      printf ("fscache.hdr: repaired (a new header)\n");
    }
  }
  size_t n = i < argc ? (size_t) (argc - i) : c.n;
  CLEANUP_FREE struct tool_object **v = calloc (n ? n : 1, sizeof *v);
  if (v == NULL) {
    tool_error ("check: %m");
    tool_cache_close (&c);
    return EXIT_USAGE;
  }
  for (size_t k = 0; k < n; ++k) {
    v[k] = i < argc ? tool_find ("check", &c, argv[i + k]) : &c.v[k];
    if (v[k] == NULL) {
      tool_cache_close (&c);
      return EXIT_USAGE;
    }
    ck.total += v[k]->info.present_blocks;
  }
  if (ck.repair && tool_grave_open (&c, &g, "check") == -1) {
    tool_cache_close (&c);
    return EXIT_USAGE;
  }
  for (size_t k = 0; k < n && !ck.io_error; ++k)
    check_one (&ck, &c, v[k], &g);
  progress (&ck, true);
  printf ("%zu objects, %" PRIu64 " blocks verified: %" PRIu64 " problems",
          n, ck.blocks, ck.problems);
  if (ck.repair)
    printf (", %" PRIu64 " repaired", ck.repaired);
  printf ("\n");
  if (g.fd >= 0)
    fscd_grave_close (&g);
  tool_cache_close (&c);
  if (ck.io_error)
    return EXIT_USAGE;
  if (ck.problems == 0)
    return EXIT_SUCCESS;
  return ck.repair && ck.repaired >= ck.problems ? EXIT_SUCCESS : EXIT_FINDING;
}
