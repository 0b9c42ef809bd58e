/* libfscache: the ground floor's file names (files.c).
 *
 * An object's files are NAME+SUFFIX in its fan-out directory: NAME.idx,
 * NAME.sums, NAME.data (and NAME.data.I for data segment I >= 1, of
 * FSC_SEG_SIZE bytes each), and the stale mark NAME.stale
 * (docs/format.md).  Naming, opening and unlinking them calls nothing
 * else of libfscache, so that every layer above (the data segments,
 * lookup, eviction, withdrawal, the epochs of sharing) may use them.
 */
#ifndef FSC_FILES_H
#define FSC_FILES_H

#include <stdbool.h>
#include <stdint.h>

#include "fscache.h"
#include "keyenc.h"

struct fsc_object;
struct fsc_files;             /* internal.h */

/* Longest name of an object's file: NAME and a suffix. */
#define FILE_NAME_MAX (FSC_NAME_MAX + 32)

/* Data segments: FSC_SEG_SIZE bytes each (data.c says why). */
#define FSC_SEG_SHIFT 40
#define FSC_SEG_SIZE (UINT64_C (1) << FSC_SEG_SHIFT)
#define FSC_SEG_SUFFIX_MAX 28

/* The name of the object's file with SUFFIX (".idx", ".data", ".sums",
 * ".stale") in its fan-out directory, in BUF.
 */
extern const char *fsc_file_name (const struct fsc_files *f,
                                  const char *suffix,
                                  char buf[FILE_NAME_MAX]);

/* Data segments of an export of SIZE bytes: at least one, an empty
 * NAME.data for an empty export.
 */
static inline uint64_t
fsc_seg_count (uint64_t size)
{
  return size ? (size - 1) / FSC_SEG_SIZE + 1 : 1;
}

/* The suffix of data segment I: ".data" for 0, ".data.I" after. */
extern void fsc_seg_suffix (uint64_t i, char buf[FSC_SEG_SUFFIX_MAX]);

/* Open (creating if needed, mode 0600 whatever the umask) the object's
 * file NAME+SUFFIX, refusing symlinks (ELOOP) and anything not our own
 * regular file with one link (EPERM; a FIFO or a device is never
 * waited on: safeopen.h).  Returns the descriptor or -1 with errno.
 */
extern int fsc_open_file (const struct fsc_files *f, const char *suffix);
/* The same with open FLAGS of the caller's (O_RDONLY, say: tools that
 * must not create anything, inspect.c).
 */
extern int fsc_open_file_flags (const struct fsc_files *f,
                                const char *suffix, int flags);
/* The same for file NAME in directory DIRFD. */
extern int fsc_openat_own (int dirfd, const char *name, int flags);

/* Unlink the object's file with SUFFIX; every data segment (by name,
 * opened or not).  Best effort.
 */
extern void fsc_unlink_file (const struct fsc_files *f, const char *suffix);
extern void fsc_data_unlink (const struct fsc_object *o);

/* Does the stale mark (NAME.stale) exist?  Leave it, for the process
 * holding O (we wrote upstream while it held the object).
 */
extern bool fsc_stale_marked (const struct fsc_files *f);
extern void fsc_mark_stale (const struct fsc_files *f);

#endif /* FSC_FILES_H */
