/* tests/write-trace: write an access trace (docs/format.md, "Access
 * traces") for the tests of nbd-fscache warm, independently of the
 * filter's writer, so that a test can make any trace it needs.
 *
 *   write-trace SIZE [PER_CHUNK] < ENTRIES > FILE
 *
 * ENTRIES: one "OFFSET LENGTH" per line (decimal bytes, written as they
 * are, unchecked: a test may want a bad one), PER_CHUNK entries per
 * chunk (default 4096).  The header names an export of SIZE bytes.
 */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"
#include "utils.h"

static void
put (const unsigned char *p, size_t n)
{
  if (fwrite (p, 1, n, stdout) != n) {
    perror ("write-trace: stdout");
    exit (1);
  }
}

static void
flush_chunk (unsigned char *chunk, uint32_t n)
{
  if (n == 0)
    return;
  memcpy (chunk, "FTRC", 4);
  put_le32 (chunk + 4, n);
  size_t body = 8 + (size_t) n * 16;
  put_le64 (chunk + body, XXH3_64bits (chunk, body));
  put (chunk, body + 8);
}

int
main (int argc, char **argv)
{
  if (argc < 2 || argc > 3) {
    fprintf (stderr, "usage: write-trace SIZE [PER_CHUNK] < ENTRIES\n");
    return 2;
  }
  uint64_t size = strtoull (argv[1], NULL, 10);
  uint32_t per = argc == 3 ? strtoul (argv[2], NULL, 10) : 4096;
  if (per < 1 || per > 4096) {
    fprintf (stderr, "write-trace: PER_CHUNK must be 1..4096\n");
    return 2;
  }

  unsigned char h[64] = { 0 };
  memcpy (h, "NBDFSTRC", 8);
  put_le32 (h + 8, 1);
  put_le32 (h + 12, 64);
  put_le64 (h + 16, size);
  put_le32 (h + 24, 65536);
  put_le32 (h + 28, 4096);
  put_le64 (h + 56, XXH3_64bits (h, 56));
  put (h, 64);

  static unsigned char chunk[8 + 4096 * 16 + 8];
  uint32_t n = 0;
  uint64_t off, len;
  while (scanf ("%" SCNu64 " %" SCNu64, &off, &len) == 2) {
    unsigned char *e = chunk + 8 + (size_t) n * 16;
    put_le64 (e, off);
    put_le32 (e + 8, len);
    put_le32 (e + 12, n);
    if (++n == per) {
      flush_chunk (chunk, n);
      n = 0;
    }
  }
  flush_chunk (chunk, n);
  if (fflush (stdout) != 0) {
    perror ("write-trace: stdout");
    return 1;
  }
  return 0;
}
