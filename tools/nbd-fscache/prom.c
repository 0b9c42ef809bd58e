/* nbd-fscache stat --prometheus: the Prometheus text exposition format
 * (version 0.0.4), for node_exporter's textfile collector.
 *
 * Names start nbd_fscache_, in base units (bytes, seconds); counters
 * end in _total, times are gauges ending _timestamp_seconds, each
 * family has its # HELP and # TYPE lines and all of its samples
 * together.  The write log's figures (fscache-mode=writeback) are
 * gauges: dirty_bytes, dirty_epochs, dirty_oldest_age_seconds.  Every object's samples carry object="NAME" and
 * key="KEY" (as ls shows it), escaped as the format wants.
 */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nbd-fscache.h"

static void
label (FILE *fp, const char *s)
{
  fputc ('"', fp);
  for (; *s; ++s) {
    if (*s == '\\' || *s == '"')
      fprintf (fp, "\\%c", *s);
    else if (*s == '\n')
      fputs ("\\n", fp);
    else
      fputc (*s, fp);
  }
  fputc ('"', fp);
}

static void
family (FILE *fp, const char *name, const char *type, const char *help)
{
  fprintf (fp, "# HELP nbd_fscache_%s %s\n# TYPE nbd_fscache_%s %s\n",
           name, help, name, type);
}

static void
sample (FILE *fp, const char *name, const struct tool_object *o, uint64_t v)
{
  fprintf (fp, "nbd_fscache_%s{object=", name);
  label (fp, o->f.name);
  fprintf (fp, ",key=");
  label (fp, o->key);
  fprintf (fp, "} %" PRIu64 "\n", v);
}

static void
sample_f (FILE *fp, const char *name, const struct tool_object *o, double v)
{
  fprintf (fp, "nbd_fscache_%s{object=", name);
  label (fp, o->f.name);
  fprintf (fp, ",key=");
  label (fp, o->key);
  fprintf (fp, "} %.3f\n", v);
}

void
tool_prometheus (FILE *fp, const struct tool_cache *c,
                 struct tool_object *const *v, size_t n,
                 uint64_t fs_free, uint64_t fs_size)
{
  char name[96];

  family (fp, "objects", "gauge", "Objects in the cache directory.");
  fprintf (fp, "nbd_fscache_objects %zu\n", c->n);
  family (fp, "allocated_bytes", "gauge",
          "Bytes allocated by the files of all objects.");
  fprintf (fp, "nbd_fscache_allocated_bytes %" PRIu64 "\n", c->total_bytes);
  family (fp, "filesystem_free_bytes", "gauge",
          "Bytes available on the cache's file system.");
  fprintf (fp, "nbd_fscache_filesystem_free_bytes %" PRIu64 "\n", fs_free);
  family (fp, "filesystem_size_bytes", "gauge",
          "Size of the cache's file system in bytes.");
  fprintf (fp, "nbd_fscache_filesystem_size_bytes %" PRIu64 "\n", fs_size);
  if (n == 0)
    return;

  family (fp, "object_size_bytes", "gauge", "Size of the export in bytes.");
  for (size_t k = 0; k < n; ++k)
    sample (fp, "object_size_bytes", v[k],
            v[k]->err == 0 && v[k]->info.reason == FSC_OK
            ? v[k]->info.sb.size : 0);
  family (fp, "object_allocated_bytes", "gauge",
          "Bytes allocated by the object's files.");
  for (size_t k = 0; k < n; ++k)
    sample (fp, "object_allocated_bytes", v[k], v[k]->f.bytes);
  family (fp, "object_in_use", "gauge",
          "1 while a running process holds the object.");
  for (size_t k = 0; k < n; ++k)
    sample (fp, "object_in_use", v[k], v[k]->f.locked);
  family (fp, "dirty_bytes", "gauge",
          "Bytes written in writeback mode and not yet written back.");
  for (size_t k = 0; k < n; ++k)
    sample (fp, "dirty_bytes", v[k],
            v[k]->wlog_err ? 0 : v[k]->wlog.dirty_bytes);
  family (fp, "dirty_epochs", "gauge",
          "Flush epochs of the write log waiting to be written back.");
  for (size_t k = 0; k < n; ++k)
    sample (fp, "dirty_epochs", v[k], v[k]->wlog_err ? 0 : v[k]->wlog.epochs);
  family (fp, "dirty_oldest_age_seconds", "gauge",
          "Age of the oldest write not yet written back, 0 if none.");
  for (size_t k = 0; k < n; ++k)
    sample_f (fp, "dirty_oldest_age_seconds", v[k], tool_dirty_age (v[k]));

  /* The miss-ratio curve (issue 45): the hit ratio predicted at
   * multiples of what each object holds now, a "scale" label each.
   */
  family (fp, "predicted_hit_ratio", "gauge",
          "Hit ratio an LRU cache of scale times the cached bytes would "
          "have had for the clients' reads since the object was opened.");
  for (size_t k = 0; k < n; ++k) {
    const struct tool_object *o = v[k];
    if (o->mrc_n == 0 || o->info.cached_bytes == 0)
      continue;
    for (unsigned i = 0; i < TOOL_MRC_SCALES; ++i) {
      double m = tool_mrc_scales[i];
      fprintf (fp, "nbd_fscache_predicted_hit_ratio{object=");
      label (fp, o->f.name);
      fprintf (fp, ",key=");
      label (fp, o->key);
      fprintf (fp, ",scale=\"%g\"} %.4f\n", m,
               tool_mrc_at (o, (uint64_t) (o->info.cached_bytes * m)));
    }
  }
  family (fp, "predicted_hit_ratio_at_cap", "gauge",
          "Hit ratio an LRU cache of the object's size cap "
          "(fscache-max-size or its quota) would have had, as above.");
  for (size_t k = 0; k < n; ++k)
    if (v[k]->mrc_n && v[k]->cap)
      sample_f (fp, "predicted_hit_ratio_at_cap", v[k],
                tool_mrc_at (v[k], v[k]->cap));
  family (fp, "cap_bytes", "gauge",
          "The object's size cap when its statistics were written, 0 for "
          "none.");
  for (size_t k = 0; k < n; ++k)
    sample (fp, "cap_bytes", v[k], v[k]->cap);

  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i) {
    char kind = tool_ostat_kind (i);
    snprintf (name, sizeof name, "%s%s", fsc_ostat_name (i),
              kind == 'c' ? "_total" : kind == 't' ? "_timestamp_seconds" : "");
    family (fp, name, kind == 'c' ? "counter" : "gauge", tool_ostat_help (i));
    for (size_t k = 0; k < n; ++k)
      sample (fp, name, v[k], v[k]->ctr.v[i]);
  }
}
