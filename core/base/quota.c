/* libfscache: encoding and decoding quota records (see quota.h). */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "xxh.h"

#include "quota.h"
#include "utils.h"

static const unsigned char quota_magic[8] = "NBDFSCQT";

void
fsc_quota_encode (unsigned char buf[FSC_QUOTA_SIZE], uint64_t budget)
{
  memset (buf, 0, FSC_QUOTA_SIZE);
  memcpy (buf, quota_magic, sizeof quota_magic);
  put_le32 (buf + 8, FSC_QUOTA_VERSION);
  put_le32 (buf + 12, 0);
  put_le64 (buf + 16, budget);
  put_le64 (buf + 24, XXH3_64bits (buf, 24));
}

int
fsc_quota_decode (const unsigned char *buf, size_t len, uint64_t *budget)
{
  if (len != FSC_QUOTA_SIZE ||
      memcmp (buf, quota_magic, sizeof quota_magic) != 0 ||
      get_le32 (buf + 8) != FSC_QUOTA_VERSION || get_le32 (buf + 12) != 0 ||
      get_le64 (buf + 24) != XXH3_64bits (buf, 24)) {
    errno = EINVAL;
    return -1;
  }
  *budget = get_le64 (buf + 16);
  return 0;
}
