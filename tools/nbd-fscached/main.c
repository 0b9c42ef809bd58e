/* nbd-fscached: options, daemonising and the event loop.
 *
 *   nbd-fscached [-d]... [-s] [-n] [-f CONFIG] [-p PIDFILE]
 *
 * Start-up, in this order, so that every error reaches the terminal
 * and the exit status: parse the options (usage errors exit 2), read
 * and check the configuration (exit 1), take the cache directory (its
 * lock: one daemon per cache; the graveyard emptied), then fork into
 * the background unless -n.  The parent waits until the child has
 * written its pid file and exits 0 only then, so "the pid file
 * exists" means "the daemon runs and the graveyard is empty".
 *
 * The loop is libev's default loop with six watchers:
 *
 *   tick      ev_timer: one fscd_tick, which says when the next one is
 *   changes   ev_io on an inotify descriptor (watch.c): a change under
 *               objects/ brings the tick forward; then it sleeps until
 *               that tick, so a busy cache wakes us at most once a tick
 *   SIGTERM   ev_signal: stop (quota records and the stop mark are
 *   SIGINT      removed, the stats file written, the pid file removed)
 *   SIGHUP    ev_signal: reread the configuration; if it is invalid
 *               the error is logged and the old one kept
 *   SIGUSR1   ev_signal: log the counters and write the stats file
 *
 * No signal() or sigaction() anywhere: libev owns the signals.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>

#include "fscached.h"

#define DEFAULT_CONFIG "/etc/nbd-fscached.conf"

struct daemon {
  const char *config_file;      /* absolute once started */
  char *pidfile;                /* absolute, or NULL */
  unsigned opt_debug;           /* number of -d */
  bool to_stderr;               /* -s */
  struct fscd_config cfg;
  struct fscd_state st;
  struct ev_loop *loop;
  ev_timer tick;
  double last_tick;
  struct fscd_watch watch;
  ev_io changes;
  ev_signal sig_term, sig_int, sig_hup, sig_usr1;
};

static void
usage (FILE *fp)
{
  fprintf (fp,
"Usage: " PROG " [-d]... [-s] [-n] [-f CONFIG] [-p PIDFILE]\n"
"       " PROG " --help | --version\n"
"\n"
"Cull an nbd-fscache cache directory to keep free space and its size\n"
"within limits, as cachefilesd does for CacheFiles.\n"
"\n"
"  -d          more debug messages (repeatable)\n"
"  -s          messages to stderr instead of syslog\n"
"  -n          do not daemonise\n"
"  -f CONFIG   configuration file (default " DEFAULT_CONFIG ")\n"
"  -p PIDFILE  write the daemon's pid there once it runs\n"
"  --help      this text\n"
"  --version   the version\n"
"\n"
"See nbd-fscached(8) and nbd-fscached.conf(5).\n");
}

static void
apply_log (struct daemon *d)
{
  fscd_log_setup (d->to_stderr, d->opt_debug + d->cfg.debug, d->cfg.tag);
}

static void
log_config (const struct fscd_config *c)
{
  const unsigned *p = c->pct;
  char size[32] = "none";
  if (c->max_size)
    snprintf (size, sizeof size, "%" PRIu64, c->max_size);
  fscd_log (LOG_INFO, "cache %s: brun %u%% bcull %u%% bstop %u%% "
            "frun %u%% fcull %u%% fstop %u%% max-size %s culltable %u%s",
            c->dir, p[FSCD_BRUN], p[FSCD_BCULL], p[FSCD_BSTOP],
            p[FSCD_FRUN], p[FSCD_FCULL], p[FSCD_FSTOP], size, c->culltable,
            c->nocull ? " nocull" : "");
}

static void
tick_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct daemon *d = w->data;
  d->last_tick = ev_now (loop);
  double next = fscd_tick (&d->st, d->last_tick);
  w->repeat = next;
  ev_timer_again (loop, w);
  if (d->watch.fd >= 0)
    ev_io_start (loop, &d->changes);
}

static void
changes_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct daemon *d = w->data;
  unsigned n = fscd_watch_drain (&d->watch);

  /* Until the next tick, events only queue in the kernel. */
  ev_io_stop (loop, w);
  double when = d->last_tick + d->st.min_gap - ev_now (loop);
  if (when < 0.)
    when = 0.;
  if (when < ev_timer_remaining (loop, &d->tick)) {
    fscd_debug (3, "%u changes: next tick in %.3f s", n, when);
    ev_timer_stop (loop, &d->tick);
    ev_timer_set (&d->tick, when, d->tick.repeat);
    ev_timer_start (loop, &d->tick);
  }
}

/* Watch the cache directory D->cfg.dir (see watch.c); on failure the
 * timer alone drives the ticks.
 */
static void
watch_start (struct daemon *d)
{
  if (fscd_watch_open (&d->watch, d->cfg.dir) == -1) {
    fscd_log (LOG_WARNING, "%s/objects: inotify: %s; checking on a timer "
              "only", d->cfg.dir, strerror (errno));
    return;
  }
  ev_io_init (&d->changes, changes_cb, d->watch.fd, EV_READ);
  d->changes.data = d;
  ev_io_start (d->loop, &d->changes);
}

static void
watch_stop (struct daemon *d)
{
  if (d->watch.fd >= 0) {
    ev_io_stop (d->loop, &d->changes);
    fscd_watch_close (&d->watch);
  }
}

static void
stop_cb (struct ev_loop *loop, ev_signal *w, int revents)
{
  fscd_log (LOG_NOTICE, "signal %d: stopping", w->signum);
  ev_break (loop, EVBREAK_ALL);
}

static void
usr1_cb (struct ev_loop *loop, ev_signal *w, int revents)
{
  struct daemon *d = w->data;
  fscd_counters_log (LOG_NOTICE, &d->st.ctr);
  if (fscd_counters_write (d->st.dirfd, &d->st.ctr) == -1)
    fscd_log (LOG_WARNING, "%s/nbd-fscached.stats: %s", d->cfg.dir,
              strerror (errno));
}

static void
hup_cb (struct ev_loop *loop, ev_signal *w, int revents)
{
  struct daemon *d = w->data;
  struct fscd_config ncfg;
  char err[1024];

  fscd_log (LOG_NOTICE, "SIGHUP: rereading %s", d->config_file);
  if (fscd_config_read (d->config_file, &ncfg, err, sizeof err) == -1) {
    fscd_log (LOG_ERR, "%s; keeping the previous configuration", err);
    return;
  }
  if (strcmp (ncfg.dir, d->cfg.dir) != 0) {
    struct fscd_state nst;
    if (fscd_state_open (&nst, &ncfg, err, sizeof err) == -1) {
      fscd_log (LOG_ERR, "%s; keeping the previous configuration", err);
      fscd_config_free (&ncfg);
      return;
    }
    watch_stop (d);
    fscd_state_close (&d->st);
    d->st = nst;
    /* Said once the old directory is released (its lock dropped). */
    fscd_log (LOG_NOTICE, "leaving %s for %s", d->cfg.dir, ncfg.dir);
  }
  bool rewatch = d->watch.fd < 0 || strcmp (ncfg.dir, d->cfg.dir) != 0;
  fscd_config_free (&d->cfg);
  d->cfg = ncfg;
  d->st.cfg = &d->cfg;
  if (rewatch) {
    watch_stop (d);
    watch_start (d);
  }
  apply_log (d);
  log_config (&d->cfg);
  /* Act on the new limits now. */
  ev_timer_stop (loop, &d->tick);
  ev_timer_set (&d->tick, 0., 1.);
  ev_timer_start (loop, &d->tick);
}

/* Write "PID\n" to FILE atomically. */
static int
write_pidfile (const char *file)
{
  char *tmp;
  char buf[32];
  int n = snprintf (buf, sizeof buf, "%ld\n", (long) getpid ());

  if (asprintf (&tmp, "%s.tmp.%ld", file, (long) getpid ()) == -1)
    return -1;
  int fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                 0644);
  if (fd == -1 || write (fd, buf, (size_t) n) != n || close (fd) == -1 ||
      rename (tmp, file) == -1) {
    int e = errno;
    unlink (tmp);
    free (tmp);
    errno = e;
    return -1;
  }
  free (tmp);
  return 0;
}

static void
remove_pidfile (const char *file)
{
  char buf[32];
  FILE *fp = fopen (file, "re");
  if (fp == NULL)
    return;
  bool ours = fgets (buf, sizeof buf, fp) && atol (buf) == (long) getpid ();
  fclose (fp);
  if (ours)
    unlink (file);
}

/* Fork into the background.  Returns in the child, with READY the
 * pipe to write one byte to once it runs; the parent exits with 0 if
 * it gets the byte, 1 if the child died first.
 */
static int
daemonise (void)
{
  int p[2];
  char c;

  if (pipe2 (p, O_CLOEXEC) == -1)
    return -1;
  pid_t pid = fork ();
  if (pid == -1)
    return -1;
  if (pid > 0) {
    close (p[1]);
    ssize_t n;
    while ((n = read (p[0], &c, 1)) == -1 && errno == EINTR)
      ;
    _exit (n == 1 ? EXIT_SUCCESS : EXIT_CONFIG);
  }
  close (p[0]);
  if (setsid () == -1)
    return -1;
  return p[1];
}

static void
detach_stdio (bool keep_stderr)
{
  int fd = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (fd == -1)
    return;
  dup2 (fd, STDIN_FILENO);
  dup2 (fd, STDOUT_FILENO);
  if (!keep_stderr)
    dup2 (fd, STDERR_FILENO);
  if (fd > STDERR_FILENO)
    close (fd);
}

int
main (int argc, char *argv[])
{
  static const struct option longopts[] = {
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  struct daemon d = { .config_file = DEFAULT_CONFIG, .watch.fd = -1 };
  bool foreground = false;
  const char *pidfile = NULL;
  char err[1024];
  int opt, ready = -1;

  opterr = 0;
  while ((opt = getopt_long (argc, argv, ":dsnf:p:", longopts, NULL)) != -1) {
    switch (opt) {
    case 'd': d.opt_debug++; break;
    case 's': d.to_stderr = true; break;
    case 'n': foreground = true; break;
    case 'f': d.config_file = optarg; break;
    case 'p': pidfile = optarg; break;
    case 'h': usage (stdout); exit (EXIT_SUCCESS);
    case 'V': printf ("%s %s\n", PROG, PACKAGE_VERSION); exit (EXIT_SUCCESS);
    case ':':
      fprintf (stderr, "%s: %s: option requires an argument\n"
               "Try '%s --help'.\n", PROG, argv[optind - 1], PROG);
      exit (EXIT_USAGE);
    default:
      if (optopt)
        fprintf (stderr, "%s: -%c: unknown option\n", PROG, optopt);
      else
        fprintf (stderr, "%s: %s: unknown option\n", PROG, argv[optind - 1]);
      fprintf (stderr, "Try '%s --help'.\n", PROG);
      exit (EXIT_USAGE);
    }
  }
  if (optind < argc) {
    fprintf (stderr, "%s: %s: unexpected argument\nTry '%s --help'.\n",
             PROG, argv[optind], PROG);
    exit (EXIT_USAGE);
  }

  /* Start-up errors go to stderr, whatever -s says. */
  fscd_log_setup (true, d.opt_debug, NULL);
  if (fscd_config_read (d.config_file, &d.cfg, err, sizeof err) == -1) {
    fprintf (stderr, "%s: %s\n", PROG, err);
    exit (EXIT_CONFIG);
  }
  /* Absolute paths: the daemon changes to / and rereads on SIGHUP. */
  char *abs = realpath (d.config_file, NULL);
  if (abs)
    d.config_file = abs;
  if (pidfile) {
    if (pidfile[0] == '/')
      d.pidfile = strdup (pidfile);
    else {
      char *cwd = getcwd (NULL, 0);
      if (cwd && asprintf (&d.pidfile, "%s/%s", cwd, pidfile) == -1)
        d.pidfile = NULL;
      free (cwd);
    }
    if (d.pidfile == NULL) {
      fprintf (stderr, "%s: %s: %s\n", PROG, pidfile, strerror (errno));
      exit (EXIT_CONFIG);
    }
  }
  if (fscd_state_open (&d.st, &d.cfg, err, sizeof err) == -1) {
    fprintf (stderr, "%s: %s\n", PROG, err);
    exit (EXIT_CONFIG);
  }
  d.st.cfg = &d.cfg;

  if (!foreground) {
    ready = daemonise ();
    if (ready == -1) {
      fprintf (stderr, "%s: fork: %s\n", PROG, strerror (errno));
      exit (EXIT_CONFIG);
    }
    if (chdir ("/") == -1) {
      fprintf (stderr, "%s: chdir /: %s\n", PROG, strerror (errno));
      exit (EXIT_CONFIG);
    }
  }
  if (d.pidfile && write_pidfile (d.pidfile) == -1) {
    fprintf (stderr, "%s: %s: %s\n", PROG, d.pidfile, strerror (errno));
    fscd_state_close (&d.st);
    exit (EXIT_CONFIG);
  }
  apply_log (&d);

  d.loop = ev_default_loop (EVFLAG_AUTO);
  if (d.loop == NULL) {
    fscd_log (LOG_ERR, "cannot start the event loop");
    if (d.pidfile)
      remove_pidfile (d.pidfile);
    exit (EXIT_CONFIG);
  }
  ev_timer_init (&d.tick, tick_cb, 0., 1.);
  d.tick.data = &d;
  ev_timer_start (d.loop, &d.tick);
  ev_signal_init (&d.sig_term, stop_cb, SIGTERM);
  ev_signal_init (&d.sig_int, stop_cb, SIGINT);
  ev_signal_init (&d.sig_hup, hup_cb, SIGHUP);
  ev_signal_init (&d.sig_usr1, usr1_cb, SIGUSR1);
  d.sig_term.data = d.sig_int.data = d.sig_hup.data = d.sig_usr1.data = &d;
  ev_signal_start (d.loop, &d.sig_term);
  ev_signal_start (d.loop, &d.sig_int);
  ev_signal_start (d.loop, &d.sig_hup);
  ev_signal_start (d.loop, &d.sig_usr1);
  watch_start (&d);

  fscd_log (LOG_NOTICE, "%s %s started%s%s", PROG, PACKAGE_VERSION,
            d.cfg.tag ? ", tag " : "", d.cfg.tag ? d.cfg.tag : "");
  log_config (&d.cfg);
  if (ready >= 0) {
    /* Only now does the parent exit (0): we run. */
    char c = 1;
    if (write (ready, &c, 1) != 1)
      fscd_log (LOG_WARNING, "cannot tell the parent we run: %s",
                strerror (errno));
    close (ready);
    detach_stdio (d.to_stderr);
  }

  ev_run (d.loop, 0);

  fscd_counters_log (LOG_NOTICE, &d.st.ctr);
  watch_stop (&d);
  fscd_state_close (&d.st);
  fscd_config_free (&d.cfg);
  if (d.pidfile) {
    remove_pidfile (d.pidfile);
    free (d.pidfile);
  }
  fscd_log (LOG_NOTICE, "stopped");
  ev_loop_destroy (d.loop);
  if (abs)
    free (abs);
  return EXIT_SUCCESS;
}
