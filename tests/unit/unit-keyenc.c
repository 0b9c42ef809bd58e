/* Unit test: object keys map to safe file names and back. */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keyenc.h"
#include "unit.h"

static void
check_safe (const char *name, const char *fan)
{
  CHECK (name[0] == 'k' || name[0] == 'h');
  CHECK (strlen (name) <= FSC_NAME_MAX);
  for (const char *p = name; *p; ++p)
    CHECK ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
           (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' || *p == '=');
  CHECK (strlen (fan) == 3 && fan[0] == '@');
}

static void
round_trip (const void *key, size_t len)
{
  char name[FSC_NAME_MAX + 1], fan[FSC_FAN_MAX + 1];
  unsigned char back[4096];

  fsc_key_encode (key, len, name, fan);
  check_safe (name, fan);
  ssize_t r = fsc_key_decode (name, back, sizeof back);
  if (name[0] == 'k') {
    CHECK_EQ (r, len);
    CHECK (memcmp (back, key, len) == 0);
  }
  else {
    CHECK (r == -1 && errno == ENOENT);
    CHECK_EQ (strlen (name), 33);
  }
}

int
main (void)
{
  const char *hostile[] = {
    "", ".", "..", "../x", "../../etc/passwd", "a/b", "%2e%2e",
    "-rf", "name\nwith\nnewlines", "=41", "tab\there", "\xff\xfe",
    "plain_name-1",
  };
  for (size_t i = 0; i < sizeof hostile / sizeof *hostile; ++i)
    round_trip (hostile[i], strlen (hostile[i]));

  /* Keys with NUL bytes (our keys contain one) and every byte value. */
  unsigned char all[256];
  for (int i = 0; i < 256; ++i)
    all[i] = i;
  round_trip (all, 256);                /* too long escaped: hashed */
  round_trip (all, 60);                 /* 60 * 3 + 1 <= 200: reversible */

  /* Long keys hash, and different long keys hash differently. */
  char a[4096], b[4096];
  memset (a, 'x', sizeof a);
  memcpy (b, a, sizeof b);
  b[4095] = 'y';
  char na[FSC_NAME_MAX + 1], nb[FSC_NAME_MAX + 1], fa[4], fb[4];
  fsc_key_encode (a, sizeof a, na, fa);
  fsc_key_encode (b, sizeof b, nb, fb);
  check_safe (na, fa);
  CHECK (strcmp (na, nb) != 0);

  /* Escaping is injective: "=" itself is escaped. */
  fsc_key_encode ("=41", 3, na, fa);
  fsc_key_encode ("A", 1, nb, fb);
  CHECK (strcmp (na, nb) != 0);

  /* Random keys of random lengths. */
  srand (42);
  for (int i = 0; i < 10000; ++i) {
    unsigned char k[300];
    size_t len = rand () % sizeof k;
    for (size_t j = 0; j < len; ++j)
      k[j] = rand () % (i & 1 ? 256 : 64) + (i & 1 ? 0 : 40);
    round_trip (k, len);
  }

  /* Decoding refuses what encoding never produces. */
  unsigned char back[16];
  CHECK (fsc_key_decode ("x", back, sizeof back) == -1 && errno == EINVAL);
  CHECK (fsc_key_decode ("k=4", back, sizeof back) == -1 && errno == EINVAL);
  CHECK (fsc_key_decode ("k=41", back, sizeof back) == -1 && errno == EINVAL);
  CHECK (fsc_key_decode ("k.", back, sizeof back) == -1 && errno == EINVAL);
  CHECK (fsc_key_decode ("k/", back, sizeof back) == -1 && errno == EINVAL);
  CHECK (fsc_key_decode ("kaaaaaaaaaaaaaaaaaaaa", back, sizeof back) == -1 &&
         errno == ERANGE);
  return 0;
}
