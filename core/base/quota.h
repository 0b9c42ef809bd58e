/* libfscache: the per-object quota record, NAME.quota.
 *
 * A quota record is how a culling daemon (nbd-fscached) tells a
 * running filter that an object in use must shrink: the filter's
 * committer rereads it when its inode or mtime changes and keeps the
 * object's allocated bytes under min (fscache-max-size, budget).  The
 * record is 32 bytes, little-endian (docs/format.md, "Quota records"):
 *
 *   0   8  magic "NBDFSCQT"
 *   8   4  version (1)
 *   12  4  flags (0)
 *   16  8  budget in bytes
 *   24  8  XXH3-64 of bytes 0..23
 *
 * One codec for both sides, so that writer and reader cannot drift.
 */
#ifndef FSC_QUOTA_H
#define FSC_QUOTA_H

#include <stddef.h>
#include <stdint.h>

#define FSC_QUOTA_SIZE 32
#define FSC_QUOTA_VERSION 1

/* Encode a record for BUDGET into BUF. */
extern void fsc_quota_encode (unsigned char buf[FSC_QUOTA_SIZE],
                              uint64_t budget);

/* Decode the LEN bytes at BUF: 0 and *BUDGET, or -1 with errno EINVAL
 * if they are not a valid record (wrong size, magic, version, flags or
 * checksum).
 */
extern int fsc_quota_decode (const unsigned char *buf, size_t len,
                             uint64_t *budget);

#endif /* FSC_QUOTA_H */
