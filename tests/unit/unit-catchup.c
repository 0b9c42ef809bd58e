/* Unit test of core/base/catchup.c: skipped fills remembered whole
 * (issue 44).
 *
 *  scattered  100,000 single blocks, every other one of an export of
 *             200,000 (more than the 64 Ki ranges the old list held):
 *             every one comes back (each take one block: no neighbours),
 *             none twice, nothing dropped; noted = done + pending at
 *             every step.
 *  runs       a stream's skips (neighbours) come back as runs of up to
 *             MAX bytes; a block noted twice while pending counts once.
 *  tail       the export's short last block counts its own bytes.
 *  off        disabled: nothing noted, and disabling forgets.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fscache.h"
#include "internal.h"
#include "unit.h"

#define BS 4096

int
main (void)
{
  char dir[64];
  snprintf (dir, sizeof dir, "/tmp/unit-catchup-XXXXXX");
  CHECK (mkdtemp (dir) != NULL);
  strcat (dir, "/cache");
  struct fsc_cache_config cfg = { .dir = dir, .create = true };
  struct fsc_cache *c;
  CHECK (fsc_cache_open (&cfg, &c) == 0);
  const uint64_t nb = 200000, size = nb * BS - 1000;   /* a short tail */
  struct fsc_object *o;
  struct fsc_open_info info;
  struct fsc_object_params p = {
    .key = "cu\0export=", .key_len = 10, .block_size = BS, .size = size,
    .validate = FSC_VALIDATE_SIZE,
  };
  CHECK (fsc_object_open (c, &p, &o, &info) == 0);

  /* off */
  fsc_catchup_note (o, 0, BS);
  CHECK_EQ (fsc_catchup_pending (o), 0);
  fsc_catchup_enable (o, true);

  /* scattered */
  for (uint64_t b = 0; b < nb; b += 2)
    fsc_catchup_note (o, b * BS, BS);
  CHECK_EQ (fsc_catchup_pending (o), (nb / 2) * (uint64_t) BS);
  unsigned char *seen = calloc (nb, 1);
  uint64_t off, len, got = 0;
  while (fsc_catchup_take (o, 1 << 20, &off, &len)) {
    CHECK (off % BS == 0 && len == BS);
    CHECK ((off / BS) % 2 == 0);
    CHECK (!seen[off / BS]);
    seen[off / BS] = 1;
    got++;
  }
  CHECK_EQ (got, nb / 2);
  CHECK_EQ (fsc_catchup_pending (o), 0);
  struct fsc_stats st;
  fsc_cache_stats (c, &st);
  CHECK_EQ (st.catchup_dropped_bytes, 0);
  CHECK_EQ (st.catchup_noted_bytes, (nb / 2) * (uint64_t) BS);

  /* runs: 1000 neighbouring blocks, some noted twice. */
  fsc_catchup_note (o, 5000 * BS, 1000 * BS);
  fsc_catchup_note (o, 5100 * BS, 10 * BS);
  CHECK_EQ (fsc_catchup_pending (o), 1000 * (uint64_t) BS);
  uint64_t total = 0, takes = 0, expect = 5000 * BS;
  while (fsc_catchup_take (o, 256 * BS, &off, &len)) {
    CHECK_EQ (off, expect);
    CHECK (len <= 256 * BS);
    expect += len;
    total += len;
    takes++;
  }
  CHECK_EQ (total, 1000 * (uint64_t) BS);
  CHECK_EQ (takes, 4);

  /* tail */
  fsc_catchup_note (o, (nb - 1) * BS, BS);
  CHECK_EQ (fsc_catchup_pending (o), BS - 1000);
  fsc_catchup_note (o, (nb - 1) * BS, BS);          /* again: once */
  CHECK_EQ (fsc_catchup_pending (o), BS - 1000);
  CHECK (fsc_catchup_take (o, 1 << 20, &off, &len));
  CHECK_EQ (off, (nb - 1) * BS);
  CHECK_EQ (len, BS - 1000);

  /* disabling forgets */
  fsc_catchup_note (o, 0, 64 * BS);
  fsc_catchup_enable (o, false);
  CHECK_EQ (fsc_catchup_pending (o), 0);
  CHECK (!fsc_catchup_take (o, 1 << 20, &off, &len));

  free (seen);
  fsc_object_close (o);
  fsc_cache_close (c);
  printf ("unit-catchup: OK\n");
  return 0;
}
