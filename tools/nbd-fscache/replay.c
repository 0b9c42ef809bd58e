/* nbd-fscache replay: send a block trace through an NBD server (a
 * proxy), one request at a time, in the trace's order (issue 45).
 *
 * The trace is text, one request per line: OFFSET LENGTH R|W, in bytes
 * (the public block traces converted so, as ../shared/traces/ has
 * one).  It is the check of the eviction policy and of sizing advice
 * against real workloads: a proxy with fscache-max-size replays the
 * trace, and its counters (upstream reads against the bytes asked
 * for) are compared with a simulator's miss ratios for the same block
 * size and capacity.  One request at a time, so that the order of the
 * cache's hits and misses is the trace's and nothing else's.
 *
 * Reads only by default, as simulators count; --writes sends the W
 * lines as writes (of a fixed pattern).  Requests past the export's
 * end are cut to it (or skipped if they start past it), counted.
 *
 * Exit status: 0 replayed, 1 a failure (connection, request, an
 * unreadable trace line), 2 a usage error.
 */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libnbd.h>

#include "utils.h"

#include "nbd-fscache.h"

#define PROG "nbd-fscache"
#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define REQ_MAX (32 * 1024 * 1024)

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: " PROG " replay [--writes] [--max-requests N] TRACE URI\n"
           "\n"
           "Send the block trace TRACE (lines OFFSET LENGTH R|W, in bytes;\n"
           "- for stdin) to the NBD URI, one request at a time, in order;\n"
           "reads only unless --writes.  Prints what was sent and how long\n"
           "it took.\n");
}

int
fscache_cmd_replay (int argc, char **argv)
{
  static const struct option long_opts[] = {
    { "writes", no_argument, NULL, 'w' },
    { "max-requests", required_argument, NULL, 'm' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 }
  };
  bool writes = false;
  uint64_t max = UINT64_MAX;
  int c;
  optind = 1;
  while ((c = getopt_long (argc, argv, "wm:h", long_opts, NULL)) != -1) {
    switch (c) {
    case 'w':
      writes = true;
      break;
    case 'm':
      if (tool_parse_size (optarg, &max) == -1 || max == 0) {
        fprintf (stderr, PROG ": replay: --max-requests %s: not a positive "
                 "number\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'h':
      usage (stdout);
      return 0;
    default:
      usage (stderr);
      return EXIT_USAGE;
    }
  }
  if (optind != argc - 2) {
    usage (stderr);
    return EXIT_USAGE;
  }
  const char *trace = argv[optind], *uri = argv[optind + 1];
  FILE *fp = strcmp (trace, "-") == 0 ? stdin : fopen (trace, "re");
  if (fp == NULL) {
    tool_error ("replay: %s: %s", trace, strerror (errno));
    return EXIT_FAILED;
  }
  int status = EXIT_FAILED;
  char *buf = malloc (REQ_MAX);
  struct nbd_handle *nbd = nbd_create ();
  if (buf == NULL || nbd == NULL || nbd_connect_uri (nbd, uri) == -1) {
    tool_error ("replay: %s: %s", uri, nbd ? nbd_get_error ()
                : strerror (ENOMEM));
    goto out;
  }
  memset (buf, 0xa5, REQ_MAX);
  int64_t size = nbd_get_size (nbd);
  if (size == -1) {
    tool_error ("replay: %s: %s", uri, nbd_get_error ());
    goto out;
  }
  uint64_t reads = 0, read_bytes = 0, wr = 0, wr_bytes = 0, skipped = 0;
  uint64_t cut = 0, line = 0, sent = 0;
  struct timespec t0, t1;
  clock_gettime (CLOCK_MONOTONIC, &t0);
  char text[256];
  while (sent < max && fgets (text, sizeof text, fp)) {
    line++;
    uint64_t off, len;
    char op;
    if (sscanf (text, "%" SCNu64 " %" SCNu64 " %c", &off, &len, &op) != 3 ||
        (op != 'R' && op != 'W') || len == 0 || len > REQ_MAX) {
      tool_error ("replay: %s:%" PRIu64 ": not OFFSET LENGTH R|W (a length "
                  "of 1 to 32 MiB)", trace, line);
      goto out;
    }
    if (op == 'W' && !writes)
      continue;
    if (off >= (uint64_t) size) {
      skipped++;
      continue;
    }
    if (len > (uint64_t) size - off) {
      len = (uint64_t) size - off;
      cut++;
    }
    int r = op == 'R' ? nbd_pread (nbd, buf, len, off, 0)
      : nbd_pwrite (nbd, buf, len, off, 0);
    if (r == -1) {
      tool_error ("replay: %s:%" PRIu64 ": %s at %" PRIu64 ": %s", trace,
                  line, op == 'R' ? "read" : "write", off, nbd_get_error ());
      goto out;
    }
    if (op == 'R') {
      reads++;
      read_bytes += len;
    }
    else {
      wr++;
      wr_bytes += len;
    }
    sent++;
  }
  if (ferror (fp)) {
    tool_error ("replay: %s: %s", trace, strerror (errno));
    goto out;
  }
  clock_gettime (CLOCK_MONOTONIC, &t1);
  double s = (double) (t1.tv_sec - t0.tv_sec) +
    (double) (t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf ("reads %" PRIu64 " read_bytes %" PRIu64 " writes %" PRIu64
          " write_bytes %" PRIu64 " past_end %" PRIu64 " cut %" PRIu64
          " seconds %.3f\n", reads, read_bytes, wr, wr_bytes, skipped, cut,
          s);
  status = 0;
 out:
  if (fp != stdin)
    fclose (fp);
  if (nbd) {
    if (status == 0)
      nbd_shutdown (nbd, 0);
    nbd_close (nbd);
  }
  free (buf);
  return status;
}
