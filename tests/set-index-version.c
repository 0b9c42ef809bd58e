/* Tests: set-index-version IDX VERSION rewrites the format version of
 * the index IDX (tests/index-patch.h), for the shell tests of older
 * and newer formats.
 */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index-patch.h"

int
main (int argc, char *argv[])
{
  char *end;
  if (argc != 3) {
    fprintf (stderr, "usage: set-index-version IDX VERSION\n");
    return 2;
  }
  unsigned long v = strtoul (argv[2], &end, 10);
  if (*argv[2] == '\0' || *end != '\0' || v > UINT32_MAX) {
    fprintf (stderr, "set-index-version: %s: not a version\n", argv[2]);
    return 2;
  }
  if (set_index_version (argv[1], v) == -1) {
    fprintf (stderr, "set-index-version: %s: %s\n", argv[1], strerror (errno));
    return 1;
  }
  return 0;
}
