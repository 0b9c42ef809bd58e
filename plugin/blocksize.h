/* nbdkit-fscache-filter: data calls on an upstream that keep its
 * block-size constraints whatever the range asked (blocksize.c).  Same
 * signatures and errors as upstream_pread and the others.
 */
#ifndef FSC_PLUGIN_BLOCKSIZE_H
#define FSC_PLUGIN_BLOCKSIZE_H

#include <stdint.h>

struct upstream;

extern int bs_pread (struct upstream *u, void *buf, uint32_t count,
                     uint64_t offset, uint32_t flags, int *err);
extern int bs_pwrite (struct upstream *u, const void *buf, uint32_t count,
                      uint64_t offset, uint32_t flags, int *err);
extern int bs_zero (struct upstream *u, uint32_t count, uint64_t offset,
                    uint32_t flags, int *err);
extern int bs_trim (struct upstream *u, uint32_t count, uint64_t offset,
                    uint32_t flags, int *err);

/* Say once per process if BLOCK_SIZE (fscache-block-size) does not fit
 * U's constraints: fills then read more than a block, or in pieces.
 */
extern void bs_check_block_size (struct upstream *u, uint32_t block_size);

#endif /* FSC_PLUGIN_BLOCKSIZE_H */
