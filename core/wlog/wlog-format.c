/* libfscache: the write log's bytes on disk (wlog.c has the overview;
 * docs/format.md, "Write log", has the layout).
 *
 * The header (two slots at the start of the file, the newer valid one
 * wins; its checksum an XXH3 of the slot) and the record headers (each
 * with its units' hashes, and a checksum seeded with the log's
 * incarnation, so that no record of an earlier log can pass for one
 * of this), encoded for the log (wlog.c) and decoded for recovery
 * (wlog-recover.c).
 *
 * A file of its own so that each encoder sits by its decoder, and
 * because it is pure: no I/O, no locks, no state; nothing here calls
 * another file of the log.
 */
#include <config.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "xxh.h"

#include "wlog-int.h"

/*----------------------------------------------------------------------
 * Header.
 */

/* Encode WL's header (gen GEN) into the slot buffer P. */
void
wl_encode_header (const struct fsc_wlog *wl, uint64_t gen, unsigned char *p)
{
  memset (p, 0, WL_SLOT);
  memcpy (p, WL_MAGIC, 8);
  put_le32 (p + 8, WL_VERSION);
  put_le32 (p + 12, FSC_WLOG_UNIT);
  put_le64 (p + 16, gen);
  put_le64 (p + 24, wl->incarnation);
  put_le64 (p + 32, wl->key_lo);
  put_le64 (p + 40, wl->key_hi);
  put_le64 (p + 48, wl->key_len);
  put_le64 (p + 56, wl->size);
  put_le64 (p + 64, wl->tail_pos);
  put_le64 (p + 72, wl->tail_seq);
  put_le64 (p + 80, wl->epoch);
  put_le32 (p + 88, wl->sample.n);
  put_le32 (p + 92, wl->has_generation ? strlen (wl->generation)
            : UINT32_MAX);
  for (unsigned i = 0; i < FSC_WLOG_SAMPLES; ++i) {
    put_le64 (p + 96 + 8 * i, wl->sample.off[i]);
    put_le32 (p + 160 + 4 * i, wl->sample.len[i]);
    put_le64 (p + 192 + 8 * i, wl->sample.hash[i]);
  }
  if (wl->has_generation)
    memcpy (p + 256, wl->generation, strlen (wl->generation));
  put_le64 (p + WL_SLOT - 8, XXH3_64bits (p, WL_SLOT - 8));
}

/* Decode slot P into WL's fields; false if it is not a valid header. */
bool
wl_decode_header (struct fsc_wlog *wl, const unsigned char *p, uint64_t *gen)
{
  if (memcmp (p, WL_MAGIC, 8) != 0 ||
      get_le64 (p + WL_SLOT - 8) != XXH3_64bits (p, WL_SLOT - 8) ||
      get_le32 (p + 8) != WL_VERSION || get_le32 (p + 12) != FSC_WLOG_UNIT)
    return false;
  uint32_t n = get_le32 (p + 88), glen = get_le32 (p + 92);
  if (n > FSC_WLOG_SAMPLES || (glen != UINT32_MAX && glen > FSC_GEN_MAX))
    return false;
  *gen = get_le64 (p + 16);
  wl->incarnation = get_le64 (p + 24);
  wl->key_lo = get_le64 (p + 32);
  wl->key_hi = get_le64 (p + 40);
  wl->key_len = get_le64 (p + 48);
  wl->size = get_le64 (p + 56);
  wl->tail_pos = get_le64 (p + 64);
  wl->tail_seq = get_le64 (p + 72);
  wl->epoch = get_le64 (p + 80);
  wl->sample.n = n;
  for (unsigned i = 0; i < FSC_WLOG_SAMPLES; ++i) {
    wl->sample.off[i] = get_le64 (p + 96 + 8 * i);
    wl->sample.len[i] = get_le32 (p + 160 + 4 * i);
    wl->sample.hash[i] = get_le64 (p + 192 + 8 * i);
  }
  wl->has_generation = glen != UINT32_MAX;
  memset (wl->generation, 0, sizeof wl->generation);
  if (wl->has_generation)
    memcpy (wl->generation, p + 256, glen);
  return wl->tail_pos >= WL_START && wl->tail_seq >= 1;
}

/*----------------------------------------------------------------------
 * Records.
 */

uint64_t
wl_hdr_bytes (const struct wl_entry *e)
{
  return WL_REC_HDR + 8 * (uint64_t) e->nunits;
}

uint64_t
wl_rec_size (uint32_t nunits, uint64_t datalen)
{
  return ROUND_UP (WL_REC_HDR + 8 * (uint64_t) nunits + datalen,
                   (uint64_t) 8);
}

/* Header bytes of E (with hashes already at P + WL_REC_HDR), and its
 * checksum.
 */
void
wl_encode_rec (const struct fsc_wlog *wl, const struct wl_entry *e,
               unsigned char *p)
{
  memset (p, 0, WL_REC_HDR);
  put_le32 (p, WL_REC_MAGIC);
  p[4] = e->type;
  put_le64 (p + 8, e->seq);
  put_le64 (p + 16, e->epoch);
  put_le64 (p + 24, e->off);
  put_le64 (p + 32, e->type == WL_VOID ? e->rsize : e->len);
  put_le32 (p + 40, e->nunits);
  put_le64 (p + 48, e->time_ms);
  for (uint32_t i = 0; i < e->nunits; ++i)
    put_le64 (p + WL_REC_HDR + 8 * i, e->hashes[i]);
  put_le64 (p + 56, XXH3_64bits_withSeed (p, 56, wl->incarnation) ^
            XXH3_64bits_withSeed (p + WL_REC_HDR, 8 * (size_t) e->nunits,
                                  wl->incarnation));
}

/* Decode a record header at P (WL_REC_HDR bytes) without the
 * checksum, which needs the hashes: false if malformed.
 */
bool
wl_decode_rec_head (const struct fsc_wlog *wl, const unsigned char *p,
                    struct wl_entry *e)
{
  if (get_le32 (p) != WL_REC_MAGIC)
    return false;
  e->type = p[4];
  e->seq = get_le64 (p + 8);
  e->epoch = get_le64 (p + 16);
  e->off = get_le64 (p + 24);
  e->len = get_le64 (p + 32);
  e->nunits = get_le32 (p + 40);
  e->time_ms = get_le64 (p + 48);
  /* A marker's offset is the sequence number up to which (exclusive)
   * the log was synced before it was written.
   */
  if (e->type == WL_FLUSH)
    return e->off <= e->seq && e->len == 0 && e->nunits == 0;
  /* A void record's length is its slot's: a header at least, whole
   * 8-byte words, at most the largest record.
   */
  if (e->type == WL_VOID)
    return e->off == 0 && e->nunits == 0 && e->len >= WL_REC_HDR &&
      e->len % 8 == 0 &&
      e->len <= wl_rec_size (WL_REC_UNITS, (uint64_t) WL_REC_UNITS *
                          FSC_WLOG_UNIT);
  /* Whole units, but for a range that ends at the export's end. */
  if (e->len == 0 || e->off % FSC_WLOG_UNIT || e->off >= wl->size ||
      e->len > wl->size - e->off ||
      (e->len % FSC_WLOG_UNIT && e->off + e->len != wl->size))
    return false;
  /* The length first: near 2^64 its unit count would wrap. */
  if (e->type == WL_DATA)
    return e->len <= (uint64_t) WL_REC_UNITS * FSC_WLOG_UNIT &&
      e->nunits == DIV_ROUND_UP (e->len, FSC_WLOG_UNIT);
  return (WL_IS_ZERO (e->type) || e->type == WL_TRIM) && e->nunits == 0;
}

bool
wl_rec_csum_ok (const struct fsc_wlog *wl, const unsigned char *p,
                uint32_t nunits)
{
  return get_le64 (p + 56) ==
    (XXH3_64bits_withSeed (p, 56, wl->incarnation) ^
     XXH3_64bits_withSeed (p + WL_REC_HDR, 8 * (size_t) nunits,
                           wl->incarnation));
}
