/* libfscache: an object's data segment files (data.c), for the other
 * files of core/.  Included by internal.h, after the structures it
 * names.
 */
#ifndef FSC_DATA_H
#define FSC_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fsc_cache;
struct fsc_object;
struct fsc_files;
struct fsc_io;
struct group;

/* data.c: the data in segment files of FSC_SEG_SIZE bytes: NAME.data
 * for the first, NAME.data.I for segment I >= 1 (their names, and
 * unlinking them, are files.h's).  Open (creating) them all, setting
 * *SIZES_OK if each has its length; truncate them to their lengths,
 * empty; close them; read, write (returns 0 or -1), sync what was
 * written, punch, and count allocated bytes.  All return -1 with errno
 * on failure; pread returns the bytes read, which may be short.
 */
/* Writes of at least FSC_DIRECT_MIN bytes, aligned to
 * FSC_DIRECT_ALIGN in memory, offset and length, bypass the page
 * cache (data.c says why and why not smaller ones).
 */
#define FSC_DIRECT_MIN ((size_t) 64 << 10)
#define FSC_DIRECT_ALIGN 4096

extern int fsc_data_open (struct fsc_object *o, bool *sizes_ok);
extern int fsc_data_reset (struct fsc_object *o);
extern void fsc_data_close (struct fsc_object *o);
extern ssize_t fsc_data_pread (struct fsc_object *o, void *buf, size_t n,
                               uint64_t off);
extern int fsc_data_pwrite (struct fsc_object *o, const void *buf, size_t n,
                            uint64_t off);
extern int fsc_data_sync (struct fsc_object *o);
extern int fsc_data_punch (struct fsc_object *o, uint64_t off, uint64_t len);
/* The same read and punch on the segments F alone, through IO: no
 * object, no not-clean mark (the tools' inspection, inspect.c).
 */
extern ssize_t fsc_segs_pread (struct fsc_io *io, const struct fsc_files *f,
                               void *buf, size_t n, uint64_t off);
extern int fsc_segs_punch (const struct fsc_files *f, uint64_t off,
                           uint64_t len);
extern uint64_t fsc_data_allocated (const struct fsc_object *o);

#endif /* FSC_DATA_H */
