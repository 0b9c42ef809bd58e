/* nbd-fscache stat: every counter of one object, or summed over the
 * cache, with the cache's own facts (objects, allocated bytes, the
 * file system's free space).
 *
 * Summing: counters and gauges add up; times (last_use,
 * last_invalidation) take the latest.  The write log's figures
 * (dirty_bytes, dirty_epochs: add up; dirty_oldest_age_seconds: the
 * oldest) come from NAME.wlog, read without its lock.  Output as "name value" lines,
 * as JSON (--json) or in Prometheus' text format (--prometheus, in
 * prom.c), to stdout or, with --output FILE, to FILE.tmp.PID renamed
 * to FILE, so that a textfile collector never reads half a file.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "nbd-fscache.h"

#define STAT_USAGE \
  "stat [--dir DIR] [OBJECT] [--json | --prometheus [--output FILE]]"

struct stat_opts {
  bool json, prom;
  const char *output;
};

static int
stat_opt (int c, const char *arg, void *opaque)
{
  struct stat_opts *so = opaque;
  switch (c) {
  case 'j': so->json = true; return 0;
  case 'p': so->prom = true; return 0;
  case 'o': so->output = arg; return 0;
  default: return -1;
  }
}

static void
sum_counters (struct tool_object *const *v, size_t n, struct fsc_ostats *sum)
{
  memset (sum, 0, sizeof *sum);
  for (size_t k = 0; k < n; ++k)
    for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i) {
      uint64_t x = v[k]->ctr.v[i];
      if (tool_ostat_kind (i) == 't')
        sum->v[i] = MAX (sum->v[i], x);
      else if (ADD_OVERFLOW (sum->v[i], x, &sum->v[i]))
        sum->v[i] = UINT64_MAX;
    }
}

/* The write logs' figures, summed. */
struct dirty_sum {
  uint64_t objects, bytes, epochs;
  double age;
};

static void
sum_dirty (struct tool_object *const *v, size_t n, struct dirty_sum *d)
{
  memset (d, 0, sizeof *d);
  for (size_t k = 0; k < n; ++k) {
    const struct tool_object *o = v[k];
    if (tool_dirty (o))
      d->objects++;
    if (o->wlog_err)
      continue;
    if (ADD_OVERFLOW (d->bytes, o->wlog.dirty_bytes, &d->bytes))
      d->bytes = UINT64_MAX;
    if (ADD_OVERFLOW (d->epochs, o->wlog.epochs, &d->epochs))
      d->epochs = UINT64_MAX;
    d->age = MAX (d->age, tool_dirty_age (o));
  }
}

static void
json_counters (FILE *fp, const struct fsc_ostats *ctr, const char *indent)
{
  fprintf (fp, "{");
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    fprintf (fp, "%s\n%s  \"%s\": %" PRIu64, i ? "," : "", indent,
             fsc_ostat_name (i), ctr->v[i]);
  fprintf (fp, "\n%s}", indent);
}

static void
print_json (FILE *fp, const struct tool_cache *c, struct tool_object *const *v,
            size_t n, uint64_t fs_free, uint64_t fs_size)
{
  struct fsc_ostats sum;
  sum_counters (v, n, &sum);
  fprintf (fp, "{\n  \"cache\": {\n    \"dir\": ");
  json_str (fp, c->dir);
  fprintf (fp, ",\n    \"objects\": %zu,\n    \"allocated_bytes\": %" PRIu64
           ",\n    \"filesystem_free_bytes\": %" PRIu64
           ",\n    \"filesystem_size_bytes\": %" PRIu64 "\n  },\n",
           c->n, c->total_bytes, fs_free, fs_size);
  fprintf (fp, "  \"objects\": [");
  for (size_t k = 0; k < n; ++k) {
    const struct tool_object *o = v[k];
    fprintf (fp, "%s\n    {\n      \"name\": ", k ? "," : "");
    json_str (fp, o->f.name);
    fprintf (fp, ",\n      \"key\": ");
    json_str (fp, o->key);
    if (o->info.sb.label[0]) {
      fprintf (fp, ",\n      \"label\": ");
      json_str (fp, o->info.sb.label);
    }
    fprintf (fp, ",\n      \"state\": ");
    json_str (fp, tool_state (o));
    fprintf (fp, ",\n      \"source\": ");
    json_str (fp, tool_source_name (o->src));
    fprintf (fp, ",\n      \"counters_time\": %.3f", o->ctr_time);
    if (o->err == 0 && o->info.reason == FSC_OK)
      fprintf (fp, ",\n      \"size\": %" PRIu64 ",\n      \"block_size\": %"
               PRIu32, o->info.sb.size, o->info.sb.block_size);
    fprintf (fp, ",\n      \"allocated_bytes\": %" PRIu64
             ",\n      \"last_reason\": ", o->f.bytes);
    json_str (fp, o->ctr.last_reason ? fsc_reason_name (o->ctr.last_reason)
                                       : "none");
    tool_json_dirty (fp, o, "      ");
    fprintf (fp, ",\n      \"counters\": ");
    json_counters (fp, &o->ctr, "      ");
    fprintf (fp, "\n    }");
  }
  struct dirty_sum d;
  sum_dirty (v, n, &d);
  fprintf (fp, "%s],\n  \"dirty\": {\n    \"objects\": %" PRIu64
           ",\n    \"dirty_bytes\": %" PRIu64
           ",\n    \"dirty_epochs\": %" PRIu64
           ",\n    \"dirty_oldest_age_seconds\": %.3f\n  },"
           "\n  \"total\": ", n ? "\n  " : "", d.objects, d.bytes, d.epochs,
           d.age);
  json_counters (fp, &sum, "  ");
  fprintf (fp, "\n}\n");
}

static void
print_text (FILE *fp, const struct tool_cache *c, struct tool_object *const *v,
            size_t n, bool one, uint64_t fs_free, uint64_t fs_size)
{
  struct fsc_ostats sum;
  char s[16];
  sum_counters (v, n, &sum);
  fprintf (fp, "%-22s %s\n", "dir", c->dir);
  fprintf (fp, "%-22s %zu\n", "objects", c->n);
  fprintf (fp, "%-22s %" PRIu64 " (%s)\n", "allocated_bytes", c->total_bytes,
           fmt_size (c->total_bytes, s));
  fprintf (fp, "%-22s %" PRIu64 " (%s)\n", "filesystem_free_bytes", fs_free,
           fmt_size (fs_free, s));
  fprintf (fp, "%-22s %" PRIu64 "\n", "filesystem_size_bytes", fs_size);
  if (one) {
    const struct tool_object *o = v[0];
    char t[32];
    fprintf (fp, "%-22s %s\n", "object", o->f.name);
    fprintf (fp, "%-22s %s\n", "key", o->key);
    if (o->info.sb.label[0])
      fprintf (fp, "%-22s %s\n", "label", o->info.sb.label);
    fprintf (fp, "%-22s %s\n", "state", tool_state (o));
    fprintf (fp, "%-22s %s, %s\n", "counters_from", tool_source_name (o->src),
             fmt_time ((uint64_t) o->ctr_time, t));
    if (o->err == 0 && o->info.reason == FSC_OK)
      fprintf (fp, "%-22s %" PRIu64 "\n%-22s %" PRIu32 "\n", "size",
               o->info.sb.size, "block_size", o->info.sb.block_size);
    fprintf (fp, "%-22s %" PRIu64 "\n", "object_allocated_bytes", o->f.bytes);
    fprintf (fp, "%-22s %s\n", "last_reason", o->ctr.last_reason
             ? fsc_reason_name (o->ctr.last_reason) : "none");
    fprintf (fp, "%-22s %s\n", "write_log", tool_wlog_state (o));
    /* The miss-ratio curve: the hit ratio predicted at multiples of
     * what the object holds now (issue 45).
     */
    if (o->mrc_n && o->info.cached_bytes) {
      fprintf (fp, "%-22s since %s, %" PRIu64 " block reads\n",
               "predicted_hit_ratio", fmt_time (o->mrc_since, t), o->mrc_refs);
      for (unsigned i = 0; i < TOOL_MRC_SCALES; ++i) {
        double m = tool_mrc_scales[i];
        uint64_t b = (uint64_t) (o->info.cached_bytes * m);
        fprintf (fp, "  at %5.2fx (%s)%*s %.1f%%\n", m, fmt_size (b, s),
                 (int) (10 - strlen (s)), "", 100 * tool_mrc_at (o, b));
      }
      if (o->cap)
        fprintf (fp, "  at its cap (%s)%*s %.1f%%\n", fmt_size (o->cap, s),
                 (int) (7 - strlen (s)), "", 100 * tool_mrc_at (o, o->cap));
    }
    if (o->wlog_err == EUCLEAN)
      fprintf (fp, "%-22s record %" PRIu64 " at byte %" PRIu64 " of the "
               "log (covered by a marker up to %" PRIu64 "); %" PRIu64
               " intact records before it, %" PRIu64 " after\n",
               "write_log_damage", o->wlog.damage_seq, o->wlog.damage_pos,
               o->wlog.damage_cover, o->wlog.records, o->wlog.lost_records);
  }
  struct dirty_sum d;
  sum_dirty (v, n, &d);
  if (!one)
    fprintf (fp, "%-22s %" PRIu64 "\n", "dirty_objects", d.objects);
  fprintf (fp, "%-22s %" PRIu64 " (%s)\n", "dirty_bytes", d.bytes,
           fmt_size (d.bytes, s));
  fprintf (fp, "%-22s %" PRIu64 "\n", "dirty_epochs", d.epochs);
  fprintf (fp, "%-22s %.3f\n", "dirty_oldest_age_seconds", d.age);
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    fprintf (fp, "%-22s %" PRIu64 "\n", fsc_ostat_name (i), sum.v[i]);
}

int
fscache_cmd_stat (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { "json", no_argument, NULL, 'j' },
    { "prometheus", no_argument, NULL, 'p' },
    { "output", required_argument, NULL, 'o' },
    { NULL, 0, NULL, 0 },
  };
  struct stat_opts so = { false, false, NULL };
  struct tool_cache c;
  struct statvfs sv;
  int ret = EXIT_USAGE;

  int i = tool_getopt ("stat", STAT_USAGE, argc, argv, "d:hjpo:", longopts,
                       stat_opt, &so);
  if (argc - i > 1 || (so.json && so.prom) || (so.output && !so.prom)) {
    tool_error ("stat: %s", argc - i > 1 ? "more than one OBJECT"
                : so.output ? "--output goes with --prometheus"
                : "--json and --prometheus exclude each other");
    fprintf (stderr, "usage: " PROG " " STAT_USAGE "\n");
    return EXIT_USAGE;
  }
  if (tool_cache_open ("stat", tool_dir (), &c) == -1) {
    tool_error ("stat: %s: %m", tool_dir ());
    return EXIT_USAGE;
  }
  uint64_t fs_free = 0, fs_size = 0;
  if (fstatvfs (c.dirfd, &sv) == 0) {
    fs_free = (uint64_t) sv.f_bavail * sv.f_frsize;
    fs_size = (uint64_t) sv.f_blocks * sv.f_frsize;
  }
  CLEANUP_FREE struct tool_object **v = calloc (c.n ? c.n : 1, sizeof *v);
  size_t n = 0;
  if (v == NULL) {
    tool_error ("stat: %m");
    goto out;
  }
  if (i < argc) {
    if ((v[0] = tool_find ("stat", &c, argv[i])) == NULL) {
      ret = EXIT_FINDING;
      goto out;
    }
    n = 1;
  }
  else
    for (; n < c.n; ++n)
      v[n] = &c.v[n];

  CLEANUP_FREE char *tmp = NULL;
  FILE *fp = stdout;
  if (so.output) {
    /* A fresh file with an unpredictable name beside FILE (mkostemp:
     * exclusive, so never through a planted link), mode 0644 whatever
     * the umask, renamed over FILE; a FILE that is a link is refused.
     */
    struct stat ost;
    int tfd = -1;
    if (lstat (so.output, &ost) == 0 && !S_ISREG (ost.st_mode)) {
      tool_error ("stat: %s: not a regular file (a symlink?): refused",
                  so.output);
      goto out;
    }
    if (asprintf (&tmp, "%s.XXXXXX", so.output) == -1) {
      tmp = NULL;
      tool_error ("stat: %s: %m", so.output);
      goto out;
    }
    if ((tfd = mkostemp (tmp, O_CLOEXEC)) == -1 ||
        fchmod (tfd, 0644) == -1 || (fp = fdopen (tfd, "w")) == NULL) {
      tool_error ("stat: %s: %m", tmp);
      if (tfd >= 0) {
        close (tfd);
        unlink (tmp);
      }
      goto out;
    }
  }
  if (so.prom)
    tool_prometheus (fp, &c, v, n, fs_free, fs_size);
  else if (so.json)
    print_json (fp, &c, v, n, fs_free, fs_size);
  else
    print_text (fp, &c, v, n, i < argc, fs_free, fs_size);
  if (so.output) {
    if (fflush (fp) != 0 || fsync (fileno (fp)) == -1 || fclose (fp) != 0 ||
        rename (tmp, so.output) == -1) {
      tool_error ("stat: %s: %m", so.output);
      unlink (tmp);
      goto out;
    }
  }
  else if (fflush (stdout) != 0) {
    tool_error ("stat: stdout: %m");
    goto out;
  }
  ret = EXIT_SUCCESS;
 out:
  tool_cache_close (&c);
  return ret;
}
