/* Tests: rewrite the format version of an object's index in place,
 * as an older (or a future) nbd-fscache would have written it.  Each
 * superblock slot with the right magic gets VERSION and a checksum
 * made anew (docs/format.md); group records are left alone, so only a
 * version whose records read the same (1: whole blocks only) is
 * honest.  Returns 0 or -1 with errno.
 */
#ifndef TESTS_INDEX_PATCH_H
#define TESTS_INDEX_PATCH_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

static inline int
set_index_version (const char *idx, uint32_t version)
{
  int fd = open (idx, O_RDWR);
  if (fd == -1)
    return -1;
  for (int slot = 0; slot < 2; ++slot) {
    unsigned char sb[4096];
    if (pread (fd, sb, sizeof sb, slot * 4096) != (ssize_t) sizeof sb ||
        memcmp (sb, "NBDFSCIX", 8) != 0)
      continue;
    for (int i = 0; i < 4; ++i)
      sb[8 + i] = version >> (8 * i);
    uint64_t h = XXH3_64bits (sb, 4088);
    for (int i = 0; i < 8; ++i)
      sb[4088 + i] = h >> (8 * i);
    if (pwrite (fd, sb, sizeof sb, slot * 4096) != (ssize_t) sizeof sb) {
      int e = errno;
      close (fd);
      errno = e;
      return -1;
    }
  }
  if (fsync (fd) == -1) {
    int e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  return close (fd);
}

#endif /* TESTS_INDEX_PATCH_H */
