/* libfscache: an object's miss-ratio curve, gathered live (mrc.c). */
#ifndef FSC_MRC_H
#define FSC_MRC_H

#include <stdint.h>

struct fsc_mrc;

/* A new curve, the same size whatever the export's; NULL with errno
 * ENOMEM.
 */
extern struct fsc_mrc *fsc_mrc_new (void);
extern void fsc_mrc_free (struct fsc_mrc *m);

/* A client read of BLOCK.  Thread-safe (a leaf lock of its own, taken
 * once per batch of a thread's sampled accesses: a thread's last few
 * count once its batch fills, or at fsc_mrc_flush).
 */
extern void fsc_mrc_access (struct fsc_mrc *m, uint64_t block);

/* Apply the calling thread's pending accesses of M now.
 * fsc_mrc_hit_ratio does, for its caller's.
 */
extern void fsc_mrc_flush (struct fsc_mrc *m);

/* The predicted hit ratio (0 to 1) of an LRU cache of SIZE blocks, for
 * the accesses seen so far; *REFS (if not NULL) the accesses the curve
 * stands for (sampled, scaled).  0 if none seen yet.
 */
extern double fsc_mrc_hit_ratio (struct fsc_mrc *m, uint64_t size,
                                 uint64_t *refs);

/* The sampling rate now: 1 while every block is kept, then the share
 * of the hash space under the threshold, which is the largest hash
 * kept (the blocks kept are those of the smallest hashes seen).
 */
extern double fsc_mrc_rate (struct fsc_mrc *m);   /* flushes too */

#endif /* FSC_MRC_H */
