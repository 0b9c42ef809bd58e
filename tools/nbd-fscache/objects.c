/* nbd-fscache: a cache directory's objects, as the tool sees them.
 *
 * The listing is the daemon's scan (tools/common/scan.c): every
 * NAME.* of the fan-out directories, and whether NAME.idx is locked
 * per /proc/locks, read without taking any lock so that looking never
 * makes a proxy find its object busy.  Each index is then read with
 * core/inspect/inspect.h (never fsc_object_open, which would discard an index
 * it does not like) and closed again at once.
 *
 * Keys for humans: the key is IDENTITY NUL "export=" EXPORT
 * (docs/format.md).  An identity given as fscache-key is shown as it
 * is, followed by "/EXPORT" when the export name is not empty.  One
 * the filter derived from the plugin's parameters ("params-" and a
 * hash), one with bytes that are not printable, one longer than a
 * table column, or one the superblock keeps only a prefix of, is
 * shown as "#" and the first 12 hex digits of the key's hash.
 */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd-fscache.h"

#define KEY_SHOW_MAX 48         /* longest identity shown as it is */

/* Bytes as text: printable ASCII as is, others as \xHH. */
static char *
escape (const unsigned char *p, size_t n)
{
  char *s = malloc (4 * n + 1), *q = s;
  if (s == NULL)
    return NULL;
  for (size_t i = 0; i < n; ++i) {
    if (isprint (p[i]) && p[i] != '\\')
      *q++ = (char) p[i];
    else
      q += sprintf (q, "\\x%02x", p[i]);
  }
  *q = '\0';
  return s;
}

static void
key_show (struct tool_object *o)
{
  const struct fsc_sb *sb = &o->info.sb;
  const unsigned char *k = sb->key_prefix;
  size_t n = sb->key_prefix_len;
  const unsigned char *nul = memchr (k, '\0', n);
  bool whole = sb->key_prefix_len == sb->key_len;
  size_t ilen = nul ? (size_t) (nul - k) : n;
  bool plain = whole && nul && n - ilen - 1 >= 7 &&
    memcmp (nul + 1, "export=", 7) == 0 && ilen <= KEY_SHOW_MAX &&
    strncmp ((const char *) k, "params-", 7) != 0;

  for (size_t i = 0; plain && i < n; ++i)
    plain = k[i] == '\0' || (isprint (k[i]) && !isspace (k[i]));
  if (whole && nul) {
    o->identity = escape (k, ilen);
    size_t elen = n - ilen - 1;
    if (elen >= 7 && memcmp (nul + 1, "export=", 7) == 0)
      o->export = escape (nul + 8, elen - 7);
  }
  if (plain && o->export)
    snprintf (o->key, sizeof o->key, "%s%s%s", o->identity,
              *o->export ? "/" : "", o->export);
  /* A hash for a key (no fscache-key): what the filter says the object
   * caches, if it said (issue 45: every such object was "#" and 12
   * hex digits).
   */
  else if (sb->label[0])
    snprintf (o->key, sizeof o->key, "%s", sb->label);
  else
    snprintf (o->key, sizeof o->key, "#%012" PRIx64,
              sb->key_hash_hi >> 16);
}

int
tool_open_fan (const struct tool_cache *c, const struct tool_object *o)
{
  char name[4];
  return fscd_open_fan (c->objdirfd, o->f.fan, name);
}

static void
load (struct tool_cache *c, struct tool_object *o)
{
  struct fsc_inspect *ins;
  int fanfd = tool_open_fan (c, o);

  free (o->identity);
  free (o->export);
  o->identity = o->export = NULL;
  o->err = 0;
  memset (&o->info, 0, sizeof o->info);
  snprintf (o->key, sizeof o->key, "?");
  if (fanfd == -1) {
    o->err = errno;
    return;
  }
  if (fsc_inspect_open (fanfd, o->f.name, false, &ins, &o->info) == -1)
    o->err = errno;
  else {
    fsc_inspect_close (ins);
    if (o->info.reason == FSC_OK)
      key_show (o);
  }
  tool_load_counters (fanfd, o);
  /* The write log, read as it is (a proxy may be appending). */
  memset (&o->wlog, 0, sizeof o->wlog);
  o->wlog_err = ENOENT;
  if (fsc_wlog_inspect (fanfd, o->f.name, &o->wlog) == 0)
    o->wlog_err = 0;
  else
    o->wlog_err = errno;
  close (fanfd);
}

/* A write log that may hold flushed data and cannot be read whole:
 * damaged in the middle (EUCLEAN, Rule 7 of core/wlog/wlog.c) or its
 * header unreadable.  Never clean, never discarded without --force.
 */
bool
tool_wlog_damaged (const struct tool_object *o)
{
  return o->wlog_err == EUCLEAN || o->wlog_err == EBADMSG;
}

const char *
tool_wlog_state (const struct tool_object *o)
{
  return o->wlog_err == 0 ? "ok" : o->wlog_err == ENOENT ? "none"
    : tool_wlog_damaged (o) ? "damaged" : "unreadable";
}

bool
tool_dirty (const struct tool_object *o)
{
  return o->wlog_err == 0 ? o->wlog.records > 0 : o->wlog_err != ENOENT;
}

double
tool_dirty_age (const struct tool_object *o)
{
  struct timespec now;
  if (o->wlog_err || o->wlog.oldest_ms == 0)
    return 0;
  clock_gettime (CLOCK_REALTIME, &now);
  double age = (double) now.tv_sec + now.tv_nsec / 1e9 -
    (double) o->wlog.oldest_ms / 1000.0;
  return age > 0 ? age : 0;
}

void
tool_reload (struct tool_cache *c, struct tool_object *o)
{
  load (c, o);
}

static int
by_name (const void *a, const void *b)
{
  const struct tool_object *x = a, *y = b;
  int r = strcmp (x->f.name, y->f.name);
  return r ? r : (x->f.fan > y->f.fan) - (x->f.fan < y->f.fan);
}

int
tool_cache_open (const char *cmd, const char *dir, struct tool_cache *c)
{
  return tool_cache_open_checking (cmd, dir, c, NULL);
}

int
tool_cache_open_checking (const char *cmd, const char *dir,
                          struct tool_cache *c, bool *bad_header)
{
  char why[512];
  struct fscd_scan s;

  memset (c, 0, sizeof *c);
  c->dir = dir;
  c->dirfd = c->objdirfd = -1;
  if (bad_header)
    *bad_header = false;
  if (fscd_check_dir (dir, why, sizeof why) == -1) {
    if (bad_header && errno == EBADMSG)
      *bad_header = true;       /* objects/ was there: go on */
    else {
      tool_error ("%s: %s", cmd, why);
      exit (EXIT_USAGE);
    }
  }
  c->dirfd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (c->dirfd == -1)
    return -1;
  c->objdirfd = openat (c->dirfd, "objects",
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (c->objdirfd == -1 || fscd_scan (c->objdirfd, SIZE_MAX, &s) == -1)
    return -1;
  c->total_bytes = s.total_bytes;
  c->locks_known = s.locks_known;
  c->n = s.ncand + s.npinned + s.ndirty;
  c->v = calloc (c->n ? c->n : 1, sizeof *c->v);
  if (c->v == NULL) {
    fscd_scan_free (&s);
    return -1;
  }
  /* The names move from the scan to us. */
  for (size_t i = 0; i < s.ncand; ++i)
    c->v[i].f = s.cand[i];
  for (size_t i = 0; i < s.npinned; ++i)
    c->v[s.ncand + i].f = s.pinned[i];
  for (size_t i = 0; i < s.ndirty; ++i)
    c->v[s.ncand + s.npinned + i].f = s.dirty[i];
  s.ncand = s.npinned = s.ndirty = 0;
  fscd_scan_free (&s);
  /* NAME.stats alone is the history a discarded object leaves for
   * its next incarnation (invalidate.c), not an object.
   */
  size_t kept = 0;
  for (size_t i = 0; i < c->n; ++i) {
    if (c->v[i].f.files == FSCD_F_STATS)
      free (c->v[i].f.name);
    else
      c->v[kept++] = c->v[i];
  }
  c->n = kept;
  qsort (c->v, c->n, sizeof *c->v, by_name);
  for (size_t i = 0; i < c->n; ++i)
    load (c, &c->v[i]);
  return 0;
}

void
tool_cache_close (struct tool_cache *c)
{
  for (size_t i = 0; i < c->n; ++i) {
    free (c->v[i].f.name);
    free (c->v[i].identity);
    free (c->v[i].export);
  }
  free (c->v);
  if (c->objdirfd >= 0)
    close (c->objdirfd);
  if (c->dirfd >= 0)
    close (c->dirfd);
  memset (c, 0, sizeof *c);
}

struct tool_object *
tool_find (const char *cmd, struct tool_cache *c, const char *arg)
{
  struct tool_object *found = NULL;
  size_t nprefix = 0, alen = strlen (arg);

  /* Exact matches first: a name, the key as shown, an identity. */
  for (size_t i = 0; i < c->n; ++i) {
    struct tool_object *o = &c->v[i];
    if (strcmp (o->f.name, arg) == 0 || strcmp (o->key, arg) == 0 ||
        (o->identity && o->export && *o->export == '\0' &&
         strcmp (o->identity, arg) == 0))
      return o;
  }
  for (size_t i = 0; i < c->n; ++i)
    if (strncmp (c->v[i].f.name, arg, alen) == 0) {
      found = &c->v[i];
      nprefix++;
    }
  if (nprefix == 1)
    return found;
  if (nprefix > 1)
    tool_error ("%s: %s: ambiguous, %zu objects' names start so", cmd, arg,
                nprefix);
  else
    tool_error ("%s: %s: no such object in %s", cmd, arg, c->dir);
  return NULL;
}

const char *
tool_state (const struct tool_object *o)
{
  if (o->f.locked)
    return "in use";
  if (tool_wlog_damaged (o))
    return "damaged";
  if (tool_dirty (o))
    return "dirty";
  if (o->err || o->info.reason != FSC_OK || o->info.stale ||
      !(o->info.sb.flags & FSC_SB_CLEAN) ||
      (o->f.files & (FSCD_F_DATA | FSCD_F_SUMS)) !=
      (FSCD_F_DATA | FSCD_F_SUMS))
    return "needs check";
  return "idle";
}
