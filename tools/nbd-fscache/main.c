/* nbd-fscache: the dispatcher.
 *
 *   nbd-fscache [--dir DIR] SUBCOMMAND [OPTIONS] [ARGS]
 *   nbd-fscache --help | --version
 *
 * Global options come before the subcommand (parsing stops at the
 * first non-option, so a subcommand's options are its own); every
 * subcommand also takes --dir and --help itself.  As in libnbd's tools
 * (nbdinfo, nbdcopy), a usage error prints one line and a hint, and
 * exits 2.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fscache.h"
#include "nbd-fscache.h"

static const char *dir;         /* --dir, or NULL: the default */

static const struct {
  const char *name;
  int (*fn) (int argc, char **argv);
  const char *what;
} commands[] = {
  { "ls", fscache_cmd_ls, "list the objects of the cache" },
  { "stat", fscache_cmd_stat, "counters of an object, or of the cache" },
  { "check", fscache_cmd_check, "verify objects (and --repair them)" },
  { "invalidate", fscache_cmd_invalidate, "discard objects safely" },
  { "warm", fscache_cmd_warm, "warm a range through a running proxy" },
  { "writeback", fscache_cmd_writeback,
    "write an object's dirty data back without a proxy" },
  { "manifest", fscache_cmd_manifest,
    "write an image's manifest, for fscache-manifest" },
  { "advise", fscache_cmd_advise,
    "how big each object's cache should be, from its clients' reads" },
  { "replay", fscache_cmd_replay,
    "send a block trace through a proxy, in order" },
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: " PROG " [--dir DIR] SUBCOMMAND [OPTIONS] [ARGS]\n"
           "       " PROG " --help | --version\n"
           "\n"
           "Inspect and maintain an nbdkit-fscache-filter cache directory.\n"
           "\n"
           "Subcommands:\n");
  for (size_t i = 0; i < NCOMMANDS; ++i)
    fprintf (fp, "  %-12s %s\n", commands[i].name, commands[i].what);
  fprintf (fp,
           "\n"
           "  --dir DIR    the cache directory (default: as the filter's\n"
           "               fscache-dir, currently %s)\n"
           "\n"
           "'" PROG " SUBCOMMAND --help' describes each one; see also "
           PROG "(1).\n", tool_dir ());
}

void
tool_set_dir (const char *d)
{
  dir = d;
}

/* The filter's default fscache-dir (nbdkit-fscache-filter(1)):
 * $NBD_FSCACHE_DIR, /var/cache/nbd-fscache for root, else
 * $XDG_CACHE_HOME/nbd-fscache (if absolute) or ~/.cache/nbd-fscache.
 */
const char *
tool_dir (void)
{
  static char *def;

  if (dir)
    return dir;
  if (def)
    return def;
  def = fsc_default_dir ();
  if (def == NULL && errno == ENOENT) {
    tool_error ("no --dir, and no NBD_FSCACHE_DIR, XDG_CACHE_HOME or HOME "
                "to default from");
    exit (EXIT_USAGE);
  }
  if (def == NULL) {
    tool_error ("%s", strerror (errno));
    exit (EXIT_USAGE);
  }
  return def;
}

int
tool_getopt (const char *cmd, const char *usage_text, int argc, char **argv,
             const char *shortopts, const struct option *longopts,
             int (*opt) (int c, const char *arg, void *opaque), void *opaque)
{
  int c;

  optind = 0;                   /* glibc: start again, permuting */
  opterr = 0;
  while ((c = getopt_long (argc, argv, shortopts, longopts, NULL)) != -1) {
    switch (c) {
    case 'd':
      tool_set_dir (optarg);
      break;
    case 'h':
      printf ("usage: " PROG " %s\n", usage_text);
      exit (EXIT_SUCCESS);
    case '?':
      /* getopt sets optopt to the option missing its argument, or to
       * an unknown short option (0 for an unknown long one).
       */
      if (optopt && strchr (shortopts, optopt))
        tool_error ("%s: %s: needs an argument", cmd, argv[optind - 1]);
      else
        tool_error ("%s: %s: unknown option", cmd, argv[optind - 1]);
      goto bad;
    default:
      if (opt == NULL || opt (c, optarg, opaque) == -1)
        goto bad;
      break;
    }
  }
  return optind;

 bad:
  fprintf (stderr, "usage: " PROG " %s\n", usage_text);
  exit (EXIT_USAGE);
}

int
main (int argc, char **argv)
{
  static const struct option longopts[] = {
    { "dir", required_argument, NULL, 'd' },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  int c;

  opterr = 0;
  while ((c = getopt_long (argc, argv, "+d:hV", longopts, NULL)) != -1) {
    switch (c) {
    case 'd':
      dir = optarg;
      break;
    case 'h':
      usage (stdout);
      exit (EXIT_SUCCESS);
    case 'V':
      printf (PROG " %s\n", PACKAGE_VERSION);
      exit (EXIT_SUCCESS);
    default:
      if (optopt == 'd' || (optind > 0 && optind <= argc &&
                            strncmp (argv[optind - 1], "--dir", 5) == 0))
        tool_error ("%s: needs an argument", argv[optind - 1]);
      else
        tool_error ("%s: unknown option", argv[optind - 1]);
      fprintf (stderr, "Try '" PROG " --help'.\n");
      exit (EXIT_USAGE);
    }
  }
  if (optind >= argc) {
    tool_error ("no subcommand given");
    fprintf (stderr, "Try '" PROG " --help'.\n");
    exit (EXIT_USAGE);
  }
  for (size_t i = 0; i < NCOMMANDS; ++i)
    if (strcmp (argv[optind], commands[i].name) == 0)
      return commands[i].fn (argc - optind, argv + optind);
  tool_error ("%s: unknown subcommand", argv[optind]);
  fprintf (stderr, "Try '" PROG " --help'.\n");
  exit (EXIT_USAGE);
}
