/* nbd-fscache: formatting for humans and for JSON, and messages.
 *
 * Sizes in tables are powers of 1024 with one decimal ("16.0M"),
 * times local and to the second; JSON gets the exact numbers instead,
 * so that nothing a script reads was rounded.
 */
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nbd-fscache.h"

const char *
fmt_size (uint64_t bytes, char buf[16])
{
  static const char units[] = "KMGTPE";
  if (bytes < 1024) {
    snprintf (buf, 16, "%uB", (unsigned) bytes);
    return buf;
  }
  double v = bytes;
  unsigned u = 0;
  for (v /= 1024; v >= 1024 && u + 1 < sizeof units - 1; v /= 1024)
    u++;
  snprintf (buf, 16, "%.1f%c", v, units[u]);
  return buf;
}

const char *
fmt_time (uint64_t t, char buf[32])
{
  time_t tt = (time_t) t;
  struct tm tm;
  if (t == 0 || localtime_r (&tt, &tm) == NULL ||
      strftime (buf, 32, "%Y-%m-%d %H:%M:%S", &tm) == 0)
    snprintf (buf, 32, "-");
  return buf;
}

void
json_str (FILE *fp, const char *s)
{
  fputc ('"', fp);
  for (const unsigned char *p = (const unsigned char *) s; *p; ++p) {
    if (*p == '"' || *p == '\\')
      fprintf (fp, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f)
      fprintf (fp, "\\u%04x", *p);
    else
      fputc (*p, fp);
  }
  fputc ('"', fp);
}

void
tool_json_dirty (FILE *fp, const struct tool_object *o, const char *indent)
{
  fprintf (fp, ",\n%s\"write_log\": ", indent);
  json_str (fp, tool_wlog_state (o));
  fprintf (fp, ",\n%s\"dirty\": %s", indent,
           tool_dirty (o) ? "true" : "false");
  fprintf (fp, ",\n%s\"dirty_bytes\": %" PRIu64
           ",\n%s\"dirty_epochs\": %" PRIu64
           ",\n%s\"dirty_oldest_age_seconds\": %.3f",
           indent, o->wlog_err ? 0 : o->wlog.dirty_bytes,
           indent, o->wlog_err ? 0 : o->wlog.epochs,
           indent, tool_dirty_age (o));
}

static void
vmsg (const char *fmt, va_list ap)
{
  fprintf (stderr, PROG ": ");
  vfprintf (stderr, fmt, ap);
  fputc ('\n', stderr);
}

void
tool_error (const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  vmsg (fmt, ap);
  va_end (ap);
}

/* The shared code of tools/common reports through these. */
void
fscd_log (int prio, const char *fmt, ...)
{
  va_list ap;
  (void) prio;
  va_start (ap, fmt);
  vmsg (fmt, ap);
  va_end (ap);
}

void
fscd_debug (unsigned level, const char *fmt, ...)
{
  (void) level;
  (void) fmt;
}
