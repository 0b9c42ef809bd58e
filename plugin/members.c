/* nbdkit-fscache-filter: the fleet's membership (fscache-peers), for
 * peers.c.
 *
 * fscache-peers=FILE lists one NBD URI per line (blank lines and lines
 * starting with '#' ignored), the same file on every node;
 * fscache-peer-self=URI is this node's line.  The file is read again
 * when its inode, size or mtime changes, checked at most every
 * CHECK_MS by the reads that need it (nbdkit ends on SIGHUP, so a
 * signal cannot be the trigger), and only once it is whole (issue 41):
 * a new inode (a file renamed over the old one, as a writer that means
 * it to be read whole does) is taken at once; a file changed in place
 * only once two stats at least CHECK_MS apart saw it the same and its
 * last line ends, so that a half-written file is not taken.
 * fscache-peers=dns:NAME:PORT or dns:NAME takes the members from a
 * name's addresses or SRV records instead (memberdns.c).  The list in use
 * is a reference-counted snapshot, replaced whole.
 *
 * Locks: the membership's lock guards the snapshot pointer, the
 * references and the reload; held across a stat, a file's read or a
 * name's lookup, by one read a CHECK_MS (or DNS_MS) at most.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "fscache.h"
#include "peertree.h"
#include "xxh.h"

#include "memberdns.h"
#include "members.h"
#include "params.h"
#include "peerlink.h"
#include "say.h"

#define MAX_MEMBERS 65536
#define MAX_LINE 4096
#define CHECK_MS 200            /* the peers file's stat, at most */

static struct {
  struct fsc_cache *cache;
  pthread_mutex_t lock;
  struct members *snap;         /* NULL: no fleet */
  struct stat st;               /* the file as last read */
  struct stat seen;             /* a change seen, not yet taken */
  bool pending;                 /* SEEN holds one */
  bool said_midline;            /* the note on a file ending mid-line */
  int64_t checked;              /* monotonic ms of the last stat */
  char *dns_text;               /* dns: the members last taken, as text */
  int64_t dns_ms;               /* dns: how often to resolve; 0: a file */
} fleet = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void
members_put_locked (struct members *ms)
{
  if (ms == NULL || --ms->refs > 0)
    return;
  for (size_t i = 0; i < ms->n; ++i) {
    free (ms->m[i].uri);
    free (ms->m[i].dial);
  }
  free (ms);
}

void
members_put (struct members *ms)
{
  pthread_mutex_lock (&fleet.lock);
  members_put_locked (ms);
  pthread_mutex_unlock (&fleet.lock);
}

/* What libnbd dials for URI: with a PSK, the TLS scheme of it. */
static char *
dial_uri (const char *uri)
{
  static const char *const plain[] = { "nbd://", "nbd+unix://",
                                       "nbd+vsock://" };
  if (params.peer_psk || params.peer_certs)
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; ++i) {
      size_t l = strlen (plain[i]);
      char *d;
      if (strncmp (uri, plain[i], l) == 0) {
        if (asprintf (&d, "nbds%s", uri + 3) == -1)
          return NULL;
        return d;
      }
    }
  return strdup (uri);
}

/* Parse FP into a new snapshot.  NULL with errno on failure; with
 * WHOLE_LINES, EAGAIN if the last line has no newline (a file being
 * written in place, caught mid-line).
 */
static struct members *
members_read (FILE *fp, bool whole_lines)
{
  size_t cap = 16;
  struct members *ms = calloc (1, sizeof *ms + cap * sizeof ms->m[0]);
  if (ms == NULL)
    return NULL;
  ms->refs = 1;
  ms->self = -1;
  char line[MAX_LINE + 2];
  while (fgets (line, sizeof line, fp)) {
    size_t len = strlen (line);
    if (len > MAX_LINE && line[len - 1] != '\n') {
      errno = ENAMETOOLONG;
      goto fail;
    }
    if (whole_lines && line[len - 1] != '\n' && feof (fp)) {
      errno = EAGAIN;
      goto fail;
    }
    char *s = line, *e = line + len;
    while (*s == ' ' || *s == '\t')
      s++;
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' ||
                     e[-1] == '\t'))
      e--;
    *e = 0;
    if (*s == 0 || *s == '#')
      continue;
    if (ms->n == MAX_MEMBERS) {
      errno = E2BIG;
      goto fail;
    }
    if (ms->n == cap) {
      cap *= 2;
      struct members *b = realloc (ms, sizeof *ms + cap * sizeof ms->m[0]);
      if (b == NULL)
        goto fail;
      ms = b;
    }
    struct member *m = &ms->m[ms->n];
    m->uri = strdup (s);
    m->dial = m->uri ? dial_uri (s) : NULL;
    if (m->dial == NULL) {
      free (m->uri);
      goto fail;
    }
    m->seed = XXH3_64bits (s, strlen (s));
    if (ms->self == -1 && strcmp (s, params.peer_self) == 0)
      ms->self = ms->n;
    ms->n++;
  }
  if (ferror (fp)) {
    errno = EIO;
    goto fail;
  }
  return ms;
 fail:;
  int e = errno;
  members_put_locked (ms);
  errno = e;
  return NULL;
}

static bool
same_stat (const struct stat *a, const struct stat *b)
{
  return a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
    a->st_size == b->st_size &&
    a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
    a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int install_locked (struct members *ms);

/* The depth of MS's trees: the hops from the last place of a range's
 * ranking (us too, if not a member) to its first.
 */
static uint64_t
tree_depth (const struct members *ms)
{
  size_t n = ms->n + (ms->self < 0);
  return n ? fsc_peer_depth (n - 1, params.peer_fanout) : 0;
}

/* fscache-peers=dns:...: the members from the name system
 * (memberdns.c), resolved again every DNS_MS (NBD_FSCACHE_TEST_PEER_
 * DNS_MS for tests), from the reads that need it; a new snapshot only
 * if the list changed.  A failed lookup keeps the last list.
 */
#define DNS_MS 5000

/* Take the members of TEXT (a peers file's) as the snapshot, if they
 * differ from the last text taken (or FORCE).  Under fleet.lock.
 */
static int
take_text_locked (char *text, bool force)
{
  if (!force && fleet.dns_text && strcmp (fleet.dns_text, text) == 0) {
    free (text);
    return 0;
  }
  FILE *fp = fmemopen (text, strlen (text), "r");
  struct members *ms = fp ? members_read (fp, false) : NULL;
  int e = errno;
  if (fp)
    fclose (fp);
  if (ms == NULL) {
    free (text);
    errno = e;
    return -1;
  }
  free (fleet.dns_text);
  fleet.dns_text = text;
  return install_locked (ms);
}

/* Read the file again if it changed and is whole (or FORCE).  Under
 * fleet.lock.  Returns 0, or -1 with errno (the old snapshot stays).
 */
static int
reload_locked (bool force)
{
  if (strncmp (params.peers_file, "dns:", 4) == 0) {
    char *text = member_dns_text (params.peers_file);
    if (text == NULL)
      return -1;
    return take_text_locked (text, force);
  }
  struct stat st;
  if (stat (params.peers_file, &st) == -1)
    return -1;
  if (!force) {
    if (same_stat (&st, &fleet.st)) {
      fleet.pending = false;
      return 0;
    }
    /* Changed in place: taken once a second stat saw it the same. */
    if (st.st_ino == fleet.st.st_ino &&
        (!fleet.pending || !same_stat (&st, &fleet.seen))) {
      fleet.seen = st;
      fleet.pending = true;
      return 0;
    }
  }
  fleet.pending = false;
  FILE *fp = fopen (params.peers_file, "re");
  if (fp == NULL)
    return -1;
  /* Changed in place and still ending mid-line: a writer stopped
   * between two writes (two equal stats do not tell it from a whole
   * file): not taken until the line ends.
   */
  bool in_place = !force && st.st_ino == fleet.st.st_ino;
  struct members *ms = members_read (fp, in_place);
  int e = errno;
  fclose (fp);
  if (ms == NULL && e == EAGAIN) {
    if (!fleet.said_midline) {
      fleet.said_midline = true;
      say_note ("fscache-peers=%s ends mid-line: taken once its last line "
                "ends (a newline), or once it is replaced whole (renamed)",
                params.peers_file);
    }
    return 0;
  }
  if (ms == NULL) {
    errno = e;
    return -1;
  }
  fleet.said_midline = false;
  fleet.st = st;
  return install_locked (ms);
}

/* MS becomes the snapshot in use.  Under fleet.lock. */
static int
install_locked (struct members *ms)
{
  members_put_locked (fleet.snap);
  fleet.snap = ms;
  size_t others = ms->n - (ms->self >= 0);
  if (fleet.cache) {
    fsc_cache_set_peers_known (fleet.cache, others);
    fsc_cache_set_peer_tree_depth (fleet.cache, tree_depth (ms));
  }
  if (ms->self >= 0)
    nbdkit_debug ("fscache-peers=%s: %zu other peers", params.peers_file,
                  others);
  else
    say_warning ("fscache-peers=%s: fscache-peer-self=%s "
                 "is not one of its %zu members: no node asks this one, "
                 "and it asks the others", params.peers_file,
                 params.peer_self, ms->n);
  return 0;
}

/* The snapshot in use, with a reference (NULL: none), after a reload
 * if the file changed and it was not checked within CHECK_MS.
 */
struct members *
members_get (void)
{
  int64_t now = peer_now_ms ();
  struct members *ms;
  pthread_mutex_lock (&fleet.lock);
  if (now - fleet.checked >= (fleet.dns_ms ? fleet.dns_ms : CHECK_MS)) {
    fleet.checked = now;
    if (reload_locked (false) == -1)
      nbdkit_debug ("fscache-peers=%s: not read again: %m; keeping the "
                    "last list", params.peers_file);
  }
  ms = fleet.snap;
  if (ms)
    ms->refs++;
  pthread_mutex_unlock (&fleet.lock);
  return ms;
}

void
members_ref (struct members *ms)
{
  pthread_mutex_lock (&fleet.lock);
  ms->refs++;
  pthread_mutex_unlock (&fleet.lock);
}

int
members_start (void)
{
  if (strncmp (params.peers_file, "dns:", 4) == 0) {
    const char *d = getenv ("NBD_FSCACHE_TEST_PEER_DNS_MS");
    fleet.dns_ms = d && atoi (d) > 0 ? atoi (d) : DNS_MS;
  }
  pthread_mutex_lock (&fleet.lock);
  int r = reload_locked (true);
  pthread_mutex_unlock (&fleet.lock);
  if (r == -1) {
    nbdkit_error ("fscache-peers=%s: %m", params.peers_file);
    return -1;
  }
  return 0;
}

void
members_bind (struct fsc_cache *cache)
{
  pthread_mutex_lock (&fleet.lock);
  fleet.cache = cache;
  if (fleet.snap) {
    fsc_cache_set_peers_known (cache, fleet.snap->n -
                               (fleet.snap->self >= 0));
    fsc_cache_set_peer_tree_depth (cache, tree_depth (fleet.snap));
  }
  pthread_mutex_unlock (&fleet.lock);
}

void
members_stop (void)
{
  pthread_mutex_lock (&fleet.lock);
  members_put_locked (fleet.snap);
  fleet.snap = NULL;
  fleet.cache = NULL;
  free (fleet.dns_text);
  fleet.dns_text = NULL;
  pthread_mutex_unlock (&fleet.lock);
}
