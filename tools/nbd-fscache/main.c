/* nbd-fscache: the command-line tool, a placeholder dispatcher.
 *
 * The real tool (its other subcommands, this file and Makefile.inc)
 * is written on the `tool` branch; this minimal main only lets the
 * `warm` subcommand (warm.c) be built and tested on its own branch.
 * When the branches meet, theirs replaces it.
 */
#include <config.h>

#include <stdio.h>
#include <string.h>

int fscache_cmd_warm (int argc, char **argv);

int
main (int argc, char **argv)
{
  if (argc >= 2 && strcmp (argv[1], "warm") == 0)
    return fscache_cmd_warm (argc - 1, argv + 1);
  fprintf (stderr, "nbd-fscache: usage: nbd-fscache warm URI [OPTIONS] "
           "(see nbd-fscache warm --help)\n");
  return 2;
}
