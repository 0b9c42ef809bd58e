/* nbdkit-fscache-filter: nbdkit's false alarm about the filter's own
 * opens kept out of the log (issue 40).
 *
 * The nbd plugin asks nbdkit for the client's export name in every
 * .open, even when it serves its own export= and does not use the
 * answer (and the sh and eval plugins ask to tell their script).  On a
 * context the filter opens for itself (pool, catch-up, shared view,
 * writeback writer, a peer's host context) there is no connection, and
 * nbdkit 1.32's nbdkit_export_name () logs
 *
 *   nbdkit: nbd[1]: error: no connection in this thread
 *
 * from inside the server (server/public.c), where no filter can catch
 * it: an "error" for something that did not fail, which is the line an
 * operator greps for.  A context cannot be opened on a client's
 * connection instead (ownctx.c says why).
 *
 * So while such a context opens, the filter owns the server's stderr:
 * descriptor 2 points at a pipe, and a thread of ours passes every line
 * it reads on to the real stderr, in order, except that line.  When
 * the open returns, descriptor 2 is the real stderr again; the pipe
 * then has no writer left, and the thread passes on what remains and
 * ends at its end of file.
 *
 * Invariants (tests/filter/test-fscache-quiet.sh breaks them):
 *
 *   Q1  Nothing else written to stderr in the window is lost: every
 *       line but the dropped ones reaches the real stderr, in the order
 *       written (one pipe, one reader).  A line written just as the
 *       window closes may come before the window's last lines.
 *   Q2  Only nbdkit's own line is dropped ("nbdkit: " at its start,
 *       "error: no connection in this thread" at its end), and no more
 *       of them than opens the window covered: a second such line in an
 *       open of ours would be somebody else's.
 *
 * Only when nbdkit logs to stderr (say_to_stderr): to syslog the line
 * goes where the filter cannot reach, and ownctx.c says in a note that
 * it is expected.  Opens of our own may overlap (upstream.c opens them
 * in parallel unless U1 needs them one at a time): the window is one,
 * counted.  A child a plugin starts in the window would keep the pipe
 * open; none does (the nbd plugin's command= implies shared=true, which
 * opens nothing per context; the sh plugin's scripts write into pipes
 * of nbdkit's own), and the reader stops waiting for it after a
 * second all the same.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "utils.h"

#include "quiet.h"
#include "say.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned active;         /* opens in the window */
static unsigned expected;       /* opens the window covered (Q2) */
static int saved = -1;          /* the real stderr */
static int rfd = -1;            /* the pipe's read end */
static pthread_t reader_thread;
static bool closing;            /* the window is closing (atomic) */

static const char head[] = "nbdkit: ";
static const char tail[] = "error: no connection in this thread";

/* The reader's state: a line being gathered. */
struct gather {
  char line[4096];
  size_t len;
  unsigned dropped;
};

static void
put (const char *p, size_t n)
{
  while (n > 0) {
    ssize_t w = write (saved, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return;                   /* stderr gone: nothing to tell */
    p += w;
    n -= w;
  }
}

/* Pass the gathered line on, or drop it if it is nbdkit's (Q2). */
static void
line_done (struct gather *g)
{
  size_t n = g->len;
  size_t body = n > 0 && g->line[n - 1] == '\n' ? n - 1 : n;
  unsigned limit = __atomic_load_n (&expected, __ATOMIC_ACQUIRE);
  if (body >= sizeof head - 1 + sizeof tail - 1 &&
      memcmp (g->line, head, sizeof head - 1) == 0 &&
      memcmp (g->line + body - (sizeof tail - 1), tail,
              sizeof tail - 1) == 0 &&
      g->dropped < limit)
    g->dropped++;
  else
    put (g->line, n);
  g->len = 0;
}

static void
feed (struct gather *g, const char *p, size_t n)
{
  for (size_t i = 0; i < n; ++i) {
    g->line[g->len++] = p[i];
    if (p[i] == '\n')
      line_done (g);
    else if (g->len == sizeof g->line) {
      put (g->line, g->len);    /* too long to be the line: pass it on */
      g->len = 0;
    }
  }
}

static void *
reader (void *arg)
{
  struct gather *g = arg;
  fsc_thread_name ("fsc-quiet");
  char buf[4096];
  for (;;) {
    bool ending = __atomic_load_n (&closing, __ATOMIC_ACQUIRE);
    struct pollfd p = { .fd = rfd, .events = POLLIN };
    int r = poll (&p, 1, ending ? 1000 : 200);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0) {
      if (ending)
        break;                  /* a writer we do not know kept it open */
      continue;
    }
    ssize_t n = read (rfd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;                    /* end of file: the window is closed */
    feed (g, buf, n);
  }
  if (g->len > 0)
    put (g->line, g->len);
  return NULL;
}

static struct gather gathered;

bool
quiet_begin (void)
{
  int p[2] = { -1, -1 };
  pthread_mutex_lock (&lock);
  if (active > 0)
    goto counted;
  if (!say_to_stderr ())
    goto fail;
  if (pipe2 (p, O_CLOEXEC) == -1)
    goto fail;
  saved = fcntl (STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  if (saved == -1)
    goto fail;
  rfd = p[0];
  gathered.len = 0;
  gathered.dropped = 0;
  expected = 0;
  __atomic_store_n (&closing, false, __ATOMIC_RELEASE);
  if (pthread_create (&reader_thread, NULL, reader, &gathered) != 0)
    goto fail;
  if (dup2 (p[1], STDERR_FILENO) == -1) {
    close (p[1]);               /* the reader sees its end of file */
    pthread_join (reader_thread, NULL);
    p[1] = -1;
    goto fail;
  }
  close (p[1]);
 counted:
  active++;
  __atomic_add_fetch (&expected, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock (&lock);
  return true;

 fail:
  if (p[1] >= 0)
    close (p[1]);
  if (p[0] >= 0)
    close (p[0]);
  if (saved >= 0)
    close (saved);
  saved = rfd = -1;
  pthread_mutex_unlock (&lock);
  return false;
}

void
quiet_end (void)
{
  pthread_mutex_lock (&lock);
  if (active > 0 && --active == 0) {
    /* Descriptor 2 was the pipe's last writer: the reader gets its end
     * of file once it has passed everything on.
     */
    dup2 (saved, STDERR_FILENO);
    __atomic_store_n (&closing, true, __ATOMIC_RELEASE);
    pthread_join (reader_thread, NULL);
    close (rfd);
    close (saved);
    saved = rfd = -1;
  }
  pthread_mutex_unlock (&lock);
}
