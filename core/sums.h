/* libfscache: checksums of blocks and sub-blocks, and the hash cache
 * of sub-block hashes (sums.c).  Included by internal.h, after the
 * structures it names.
 */
#ifndef FSC_SUMS_H
#define FSC_SUMS_H

#include <stdint.h>
#include <stddef.h>

/* sums.c: hash each 4 KiB sub-block of LEN bytes at P into OUT;
 * returns how many (the last may be short).
 */
extern unsigned fsc_sub_hashes (const unsigned char *p, uint64_t len,
                                uint64_t *out);

/* sums.c: the index checksum of a block from its K sub-block hashes. */
extern uint64_t fsc_sums_csum (const uint64_t *sums, unsigned k);

/* sums.c: the index checksum of a whole block of LEN bytes at P. */
extern uint64_t fsc_block_csum (const unsigned char *p, uint64_t len);

/* sums.c: set O->zcsum and O->zcsum_last from its geometry (block_size,
 * size, nblocks).
 */
extern void fsc_zero_csums (struct fsc_object *o);

/* sums.c: copy into SUMS the K hashes of block B kept from an earlier
 * check against CSUM with PIECES, and return true; or false if none are
 * kept.  Remember them after a check.  Take o->lock (the _locked one:
 * the caller holds it).
 */
extern bool fsc_scache_get_locked (struct fsc_object *o, uint64_t b,
                                   uint64_t csum, unsigned pieces,
                                   uint64_t *sums, unsigned k);
extern bool fsc_scache_get (struct fsc_object *o, uint64_t b, uint64_t csum,
                            unsigned pieces, uint64_t *sums, unsigned k);
extern void fsc_scache_put (struct fsc_object *o, uint64_t b, uint64_t csum,
                            unsigned pieces, const uint64_t *sums,
                            unsigned k);

/* sums.c: zero the K sub-block hashes of a block at SUMS that lie in
 * none of its pieces P (0: the whole block, nothing to zero), as the
 * index checksum of a block held in pieces counts them.
 */
extern void fsc_sums_mask (const struct fsc_object *o, uint64_t *sums,
                           unsigned k, unsigned p);

#endif /* FSC_SUMS_H */
