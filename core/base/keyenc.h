/* libfscache: mapping object keys (any byte string) to file names.
 *
 * As in CacheFiles, an object's files live in a fan-out subdirectory
 * chosen by a hash of the key ("@00" to "@ff") so that no directory
 * grows huge, under a name derived from the key:
 *
 *   k<escaped key>   when the escaped key is at most FSC_NAME_ESCAPED_MAX
 *                    bytes: bytes in [A-Za-z0-9_-] stand for themselves,
 *                    every other byte is "=" and two lower-case hex
 *                    digits.  Reversible (fsc_key_decode).
 *   h<32 hex>        otherwise: the XXH3-128 hash of the key.  The index
 *                    stores the key's hash and length, so a collision or
 *                    a foreign file is detected when the object opens.
 *
 * The name never contains '/', '.', NUL, or anything a shell or a
 * filesystem treats specially, and never starts with '-', whatever
 * bytes the key holds (export names come from untrusted clients).
 */
#ifndef FSC_KEYENC_H
#define FSC_KEYENC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FSC_NAME_ESCAPED_MAX 200
#define FSC_NAME_MAX (1 + FSC_NAME_ESCAPED_MAX)   /* without the NUL */
#define FSC_FAN_MAX 3                             /* "@xx" */

/* Encode KEY into NAME (at least FSC_NAME_MAX+1 bytes) and FAN (at
 * least FSC_FAN_MAX+1 bytes).  Cannot fail.
 */
extern void fsc_key_encode (const void *key, size_t keylen,
                            char *name, char *fan);

/* Decode a "k..." NAME back into KEY (KEYSZ bytes).  Returns the key
 * length, or -1 with errno EINVAL (not a valid name), ENOENT (a hashed
 * name, which cannot be reversed) or ERANGE (KEYSZ too small).
 */
extern ssize_t fsc_key_decode (const char *name, void *key, size_t keysz);

/* XXH3-128 of the key, as two 64-bit halves (stored in the index). */
extern void fsc_key_hash (const void *key, size_t keylen,
                          uint64_t *lo, uint64_t *hi);

#endif /* FSC_KEYENC_H */
