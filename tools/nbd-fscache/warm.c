/* nbd-fscache warm: a placeholder until the real subcommand (warming
 * a range through a running proxy with NBD_CMD_CACHE) replaces this
 * file.
 */
#include <config.h>

#include <stdio.h>

#include "nbd-fscache.h"

int
fscache_cmd_warm (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, PROG ": warm: not built yet\n");
  return 2;
}
