/* libfscache: an image's manifest, a SHA-256 per block (manifest.c). */
#ifndef FSC_MANIFEST_H
#define FSC_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#define FSC_MANIFEST_HEADER 512         /* bytes before the digests */
#define FSC_MANIFEST_DIGEST 32          /* SHA-256 */
#define FSC_MANIFEST_MIN_SHIFT 12       /* 4 KiB blocks at least */
#define FSC_MANIFEST_MAX_SHIFT 25       /* 32 MiB: one NBD request */

struct fsc_manifest;

/* Read and check the manifest at PATH (its magic, version, fields and
 * root).  0, or -1 with errno: EINVAL malformed or of another version,
 * EBADMSG its root does not match its contents, ENOMEM, or the open's
 * or read's.
 */
extern int fsc_manifest_open (const char *path, struct fsc_manifest **out);
extern void fsc_manifest_close (struct fsc_manifest *m);

extern uint64_t fsc_manifest_size (const struct fsc_manifest *m);
extern uint32_t fsc_manifest_block_size (const struct fsc_manifest *m);
/* "" when it names none. */
extern const char *fsc_manifest_generation (const struct fsc_manifest *m);
/* The root (SHA-256 of the header's fields and the digests) as 64 hex
 * digits and a NUL; and its first 8 bytes as a number.
 */
extern void fsc_manifest_root_hex (const struct fsc_manifest *m,
                                   char out[65]);
extern uint64_t fsc_manifest_root64 (const struct fsc_manifest *m);

/* Check LEN bytes of the image at OFFSET, in BUF, against M: OFFSET a
 * multiple of the block size, LEN whole blocks or up to the image's
 * end.  0 if every block matches; -1 with errno EBADMSG (the first
 * bad block's offset in *BAD) or EINVAL (not whole blocks).
 */
extern int fsc_manifest_check (const struct fsc_manifest *m, uint64_t offset,
                               const void *buf, uint64_t len, uint64_t *bad);

/* Writing one: the digests, set in any order, then written whole. */
struct fsc_manifest_writer;
/* For an image of SIZE bytes in blocks of 2^SHIFT, generation GEN ("" or
 * NULL for none, at most 255 bytes).  -1 with errno EINVAL or ENOMEM.
 */
extern int fsc_manifest_writer_new (uint64_t size, unsigned shift,
                                    const char *gen,
                                    struct fsc_manifest_writer **out);
/* Block INDEX's bytes (the whole block, or the rest of the image for
 * the last).  -1 with errno EINVAL (index or length).
 */
extern int fsc_manifest_writer_add (struct fsc_manifest_writer *w,
                                    uint64_t index, const void *data,
                                    size_t len);
/* Write it to FD (every block must have been added: EINVAL if not) and
 * free W, whatever the outcome.  0 or -1 with errno.
 */
extern int fsc_manifest_writer_finish (struct fsc_manifest_writer *w, int fd,
                                       char root_hex[65]);
extern void fsc_manifest_writer_free (struct fsc_manifest_writer *w);

#endif /* FSC_MANIFEST_H */
