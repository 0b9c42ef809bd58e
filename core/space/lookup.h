/* libfscache: finding an object on disk (lookup.c). */
#ifndef FSC_LOOKUP_H
#define FSC_LOOKUP_H

#include <stdbool.h>
#include <stdint.h>

#include "fscache.h"

struct fsc_object;

/* Set the object up on disk.  Returns 0 (AVAILABLE) or -1 with errno
 * (the caller makes it uncached); INFO says what was found.
 */
extern int fsc_lookup (struct fsc_object *o,
                       const struct fsc_object_params *p,
                       struct fsc_open_info *info);

/* Check a loaded superblock SB against P (DATA_OK: the data files are
 * there; SUMS_SIZE: the sums file's): the reason to discard it, or
 * FSC_OK.  In the order of the seed's check_aux: identity, then
 * coherency.
 */
struct fsc_sb;
extern int fsc_check_sb (const struct fsc_object *o, const struct fsc_sb *sb,
                         const struct fsc_object_params *p, bool data_ok,
                         uint64_t sums_size);

#endif /* FSC_LOOKUP_H */
