/* libfscache: checksums of blocks and sub-blocks, and the hash cache
 * of sub-block hashes (sums.c).  Included by internal.h, after the
 * structures it names.
 */
#ifndef FSC_SUMS_H
#define FSC_SUMS_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/* sums.c: hash each 4 KiB sub-block of LEN bytes at P into OUT;
 * returns how many (the last may be short).
 */
extern unsigned fsc_sub_hashes (const unsigned char *p, uint64_t len,
                                uint64_t *out);

/* sums.c: the index checksum of a block from its K sub-block hashes. */
extern uint64_t fsc_sums_csum (const uint64_t *sums, unsigned k);

/* sums.c: the index checksum of a whole block of LEN bytes at P. */
extern uint64_t fsc_block_csum (const unsigned char *p, uint64_t len);

/* sums.c: set G->zcsum and G->zcsum_last from the geometry (block_size,
 * size, nblocks).
 */
extern void fsc_zero_csums (struct fsc_geom *g);

/* sums.c: copy into SUMS the K hashes of block B kept from an earlier
 * check against CSUM with PIECES, and return true; or false if none are
 * kept.  Remember them after a check.  Take o->lock (the _locked one:
 * the caller holds it).
 */
extern bool fsc_scache_get_locked (struct fsc_object *o, uint64_t b,
                                   uint64_t csum, unsigned pieces,
                                   uint64_t *sums, unsigned k);
/* Start bringing block B's entry into the CPU's cache, without the
 * lock (sums.c says why).
 */
extern void fsc_scache_prefetch (const struct fsc_object *o, uint64_t b);
extern bool fsc_scache_get (struct fsc_object *o, uint64_t b, uint64_t csum,
                            unsigned pieces, uint64_t *sums, unsigned k);
extern void fsc_scache_put (struct fsc_object *o, uint64_t b, uint64_t csum,
                            unsigned pieces, const uint64_t *sums,
                            unsigned k);

/* sums.c: zero the K sub-block hashes of a block at SUMS that lie in
 * none of its pieces P (0: the whole block, nothing to zero), as the
 * index checksum of a block held in pieces counts them.
 */
extern void fsc_sums_mask (const struct fsc_geom *g, uint64_t *sums,
                           unsigned k, unsigned p);

/* sums.c: read the K sub-block hashes of block B from the sums file
 * of F through IO into SUMS; the bytes a short read leaves are zero,
 * which fails any check.  Returns the bytes read (8 * K unless short),
 * or -1 with errno.  The hits of the object's owner (hit.c) and of its
 * joiners (share-direct.c), stores (store.c) and the tools' checks
 * (inspect.c) all read the hashes here, through io.c.
 */
extern ssize_t fsc_sums_read (struct fsc_io *io, const struct fsc_files *f,
                              const struct fsc_geom *g, uint64_t b,
                              unsigned k, uint64_t *sums);

/* sums.c: do the LEN bytes at DATA, from the start of sub-block S0 of
 * a block, hash to SUMS[S0], SUMS[S0 + 1]... (the last may be short)?
 * The check of a hit that serves part of a block, the owner's and a
 * joiner's alike.
 */
extern bool fsc_sums_check_subs (const uint64_t *sums, unsigned s0,
                                 const unsigned char *data, uint64_t len);

#endif /* FSC_SUMS_H */
