/* libfscache: object key to file name encoding.  See keyenc.h. */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "xxh.h"

#include "keyenc.h"

static bool
is_plain (unsigned char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
    (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static const char hexdigits[] = "0123456789abcdef";

void
fsc_key_hash (const void *key, size_t keylen, uint64_t *lo, uint64_t *hi)
{
  XXH128_hash_t h = XXH3_128bits (key, keylen);
  *lo = h.low64;
  *hi = h.high64;
}

void
fsc_key_encode (const void *key, size_t keylen, char *name, char *fan)
{
  const unsigned char *k = key;
  size_t len = 0;

  snprintf (fan, FSC_FAN_MAX + 1, "@%02x",
            (unsigned) (XXH3_64bits (key, keylen) & 0xff));

  name[len++] = 'k';
  for (size_t i = 0; i < keylen; ++i) {
    size_t need = is_plain (k[i]) ? 1 : 3;
    if (len - 1 + need > FSC_NAME_ESCAPED_MAX)
      goto hashed;
    if (need == 1)
      name[len++] = k[i];
    else {
      name[len++] = '=';
      name[len++] = hexdigits[k[i] >> 4];
      name[len++] = hexdigits[k[i] & 15];
    }
  }
  name[len] = '\0';
  return;

 hashed:;
  uint64_t lo, hi;
  fsc_key_hash (key, keylen, &lo, &hi);
  snprintf (name, FSC_NAME_MAX + 1, "h%016llx%016llx",
            (unsigned long long) hi, (unsigned long long) lo);
}

static int
hexval (char c)
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

ssize_t
fsc_key_decode (const char *name, void *key, size_t keysz)
{
  unsigned char *k = key;
  size_t len = 0;

  if (name[0] == 'h') {
    errno = ENOENT;
    return -1;
  }
  if (name[0] != 'k' || strlen (name) > FSC_NAME_MAX) {
    errno = EINVAL;
    return -1;
  }
  for (const char *p = name + 1; *p; ) {
    unsigned char c;
    if (*p == '=') {
      int h1 = hexval (p[1]), h2 = h1 >= 0 ? hexval (p[2]) : -1;
      if (h1 < 0 || h2 < 0) {
        errno = EINVAL;
        return -1;
      }
      c = h1 << 4 | h2;
      if (is_plain (c)) {       /* not canonical: refuse */
        errno = EINVAL;
        return -1;
      }
      p += 3;
    }
    else if (is_plain (*p))
      c = *p++;
    else {
      errno = EINVAL;
      return -1;
    }
    if (len >= keysz) {
      errno = ERANGE;
      return -1;
    }
    k[len++] = c;
  }
  return len;
}
