/* nbd-fscache warm: reading an access trace written by the filter's
 * fscache-trace=FILE (the format is docs/format.md, "Access traces").
 *
 * The file is a 64-byte header and then chunks, each with its own
 * magic, count and XXH3-64 checksum.  The filter writes a chunk with
 * one write(2), so a crash or a copy taken while it runs leaves a
 * file whose last chunk may be cut anywhere; every chunk before it is
 * whole.  Hence two kinds of damage, treated differently:
 *
 *  1. A bad header (magic, version, header_size, unit, checksum) means
 *     this is not a trace we understand: an error, nothing replayed.
 *  2. A bad chunk (truncated, wrong magic, count outside 1..4096,
 *     checksum mismatch, or an entry that breaks the format's rules:
 *     unaligned, empty, or past the export) ends the trace there: the
 *     entries of the chunks before it are kept and the caller warns.
 *     Nothing after a bad chunk is trusted, even if later bytes happen
 *     to look like a chunk: the order of the entries is the point of a
 *     trace, and a hole in it would replay a different order.
 *
 * Lengths are clipped to the export's size here (the format allows the
 * last entry to reach the export's size rounded up to 4 KiB), so the
 * caller can send them as they are.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xxh.h"
#include "utils.h"

#include "trace.h"
#include "trace-read.h"

/* The layout is core/base/trace.h's (the filter's writer uses it too). */

static void
seterr (char *errbuf, size_t errlen, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  vsnprintf (errbuf, errlen, fmt, ap);
  va_end (ap);
}

/* The whole file in memory: traces are small (16 bytes per first-touched
 * range, 4 MiB for a gigabyte touched 4 KiB at a time).
 */
static unsigned char *
slurp (const char *file, size_t *len, char *errbuf, size_t errlen)
{
  int fd = open (file, O_RDONLY | O_CLOEXEC);
  if (fd == -1) {
    seterr (errbuf, errlen, "%s", strerror (errno));
    return NULL;
  }
  struct stat st;
  if (fstat (fd, &st) == -1) {
    seterr (errbuf, errlen, "%s", strerror (errno));
    close (fd);
    return NULL;
  }
  if (!S_ISREG (st.st_mode) || (uint64_t) st.st_size > SIZE_MAX - 1) {
    seterr (errbuf, errlen, "not a regular file");
    close (fd);
    return NULL;
  }
  size_t want = st.st_size;
  unsigned char *buf = malloc (want + 1);
  if (buf == NULL) {
    seterr (errbuf, errlen, "%s", strerror (errno));
    close (fd);
    return NULL;
  }
  /* The file may still be growing (a trace being recorded): read what
   * fstat saw, no more, so the length is one consistent snapshot.
   */
  size_t got = 0;
  while (got < want) {
    ssize_t r = read (fd, buf + got, want - got);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1) {
      seterr (errbuf, errlen, "%s", strerror (errno));
      free (buf);
      close (fd);
      return NULL;
    }
    if (r == 0)
      break;
    got += r;
  }
  close (fd);
  *len = got;
  return buf;
}

static int
parse_header (const unsigned char *p, size_t len, struct trace *t,
              char *errbuf, size_t errlen)
{
  if (len < FSC_TRACE_HEADER_SIZE) {
    seterr (errbuf, errlen, "not an access trace (%zu bytes, shorter than "
            "the %d-byte header)", len, FSC_TRACE_HEADER_SIZE);
    return -1;
  }
  if (memcmp (p + FSC_TH_MAGIC, FSC_TRACE_MAGIC, 8) != 0) {
    seterr (errbuf, errlen, "not an access trace (no %s magic)",
            FSC_TRACE_MAGIC);
    return -1;
  }
  if (get_le64 (p + FSC_TH_CHECKSUM) != XXH3_64bits (p, FSC_TH_CHECKSUM)) {
    seterr (errbuf, errlen, "the trace header fails its checksum");
    return -1;
  }
  uint32_t version = get_le32 (p + FSC_TH_VERSION);
  if (version != FSC_TRACE_VERSION) {
    seterr (errbuf, errlen, "trace format version %u, this nbd-fscache "
            "reads version %d", version, FSC_TRACE_VERSION);
    return -1;
  }
  if (get_le32 (p + FSC_TH_HEADER_SIZE) != FSC_TRACE_HEADER_SIZE) {
    seterr (errbuf, errlen, "trace header_size %u, expected %d",
            get_le32 (p + FSC_TH_HEADER_SIZE), FSC_TRACE_HEADER_SIZE);
    return -1;
  }
  if (get_le32 (p + FSC_TH_UNIT) != FSC_TRACE_UNIT) {
    seterr (errbuf, errlen, "trace unit %u, expected %d",
            get_le32 (p + FSC_TH_UNIT), FSC_TRACE_UNIT);
    return -1;
  }
  t->size = get_le64 (p + FSC_TH_SIZE);
  t->block_size = get_le32 (p + FSC_TH_BLOCK_SIZE);
  t->unit = FSC_TRACE_UNIT;
  t->started_ms = get_le64 (p + FSC_TH_STARTED);
  return 0;
}

/* Validate the chunk at P (LEN bytes left in the file).  Returns its
 * length in bytes and its entry count in *COUNT, or 0 with *WHY set.
 */
static size_t
check_chunk (const unsigned char *p, size_t len, const struct trace *t,
             uint32_t *count, const char **why)
{
  if (len < FSC_TRACE_CHUNK_HEAD) {
    *why = "truncated chunk";
    return 0;
  }
  if (memcmp (p, FSC_TRACE_CHUNK_MAGIC, 4) != 0) {
    *why = "bad chunk magic";
    return 0;
  }
  uint32_t n = get_le32 (p + 4);
  if (n < 1 || n > FSC_TRACE_CHUNK_MAX) {
    *why = "bad chunk count";
    return 0;
  }
  /* n <= 4096: no overflow. */
  size_t body = FSC_TRACE_CHUNK_HEAD + (size_t) n * FSC_TRACE_ENTRY;
  if (len < body + 8) {
    *why = "truncated chunk";
    return 0;
  }
  if (get_le64 (p + body) != XXH3_64bits (p, body)) {
    *why = "chunk checksum mismatch";
    return 0;
  }
  /* The format's rules on entries (docs/format.md): a chunk breaking
   * them was not written by the filter, whatever its checksum says.
   */
  uint64_t end_max = ROUND_UP (t->size, (uint64_t) t->unit);
  if (end_max < t->size) {      /* size within 4 KiB of 2^64 */
    *why = "bad export size";
    return 0;
  }
  for (uint32_t i = 0; i < n; i++) {
    const unsigned char *e =
      p + FSC_TRACE_CHUNK_HEAD + (size_t) i * FSC_TRACE_ENTRY;
    uint64_t off = get_le64 (e);
    uint64_t len32 = get_le32 (e + 8);
    uint64_t end;
    if (!IS_ALIGNED (off, t->unit) || !IS_ALIGNED (len32, t->unit) ||
        len32 == 0 || off >= t->size ||
        ADD_OVERFLOW (off, len32, &end) || end > end_max) {
      *why = "entry outside the export or not 4 KiB aligned";
      return 0;
    }
  }
  *count = n;
  return body + 8;
}

int
trace_read (const char *file, struct trace *t, char *errbuf, size_t errlen)
{
  memset (t, 0, sizeof *t);
  size_t len;
  CLEANUP_FREE unsigned char *buf = slurp (file, &len, errbuf, errlen);
  if (buf == NULL)
    return -1;
  if (parse_header (buf, len, t, errbuf, errlen) == -1)
    return -1;

  /* First pass: how many entries the good chunks hold. */
  size_t pos = FSC_TRACE_HEADER_SIZE, nr = 0;
  while (pos < len) {
    uint32_t n;
    const char *why;
    size_t clen = check_chunk (buf + pos, len - pos, t, &n, &why);
    if (clen == 0) {
      t->stopped = why;
      t->stopped_at = pos;
      break;
    }
    nr += n;
    t->good_chunks++;
    pos += clen;
  }

  t->entries = calloc (nr ? nr : 1, sizeof *t->entries);
  if (t->entries == NULL) {
    seterr (errbuf, errlen, "%s", strerror (errno));
    return -1;
  }
  /* Second pass over the chunks already checked. */
  pos = FSC_TRACE_HEADER_SIZE;
  for (size_t c = 0; c < t->good_chunks; c++) {
    uint32_t n = get_le32 (buf + pos + 4);
    for (uint32_t i = 0; i < n; i++) {
      const unsigned char *e =
        buf + pos + FSC_TRACE_CHUNK_HEAD + (size_t) i * FSC_TRACE_ENTRY;
      struct trace_entry *te = &t->entries[t->nr_entries++];
      te->offset = get_le64 (e);
      te->length = MIN ((uint64_t) get_le32 (e + 8), t->size - te->offset);
      t->total_bytes += te->length;
    }
    pos += FSC_TRACE_CHUNK_HEAD + (size_t) n * FSC_TRACE_ENTRY + 8;
  }
  return 0;
}

void
trace_free (struct trace *t)
{
  free (t->entries);
  t->entries = NULL;
  t->nr_entries = 0;
}
