/* nbdkit-fscache-filter: an export's identity and coherency data.
 *
 * The object key says which upstream export a cache object holds (the
 * cookie's key in FS-Cache terms); the fingerprint says whether that
 * upstream still holds what was cached (the auxiliary data).  Both are
 * saved in the object's index, so both must stay exactly as computed
 * today: a change to either makes every existing cache start cold (a
 * different key) or be discarded (a different fingerprint).
 *
 * The fingerprint, for fscache-validate=sample, is XXH3 of the
 * export's size and of SAMPLE_COUNT regions of at most SAMPLE_SIZE
 * bytes, each with its offset: the first, the last, and positions
 * drawn from a generator seeded by the key (so they are the same at
 * every open, and differ between exports).  The regions are also
 * available one by one, with a hash each, for callers that must know
 * which part of the sample changed.
 */
#ifndef FSCACHE_PLUGIN_IDENTITY_H
#define FSCACHE_PLUGIN_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "upstream.h"

#define SAMPLE_SIZE 4096
#define SAMPLE_COUNT 8          /* first, last and 6 fixed per object */

/* The sample of one export: N regions (fewer than SAMPLE_COUNT only
 * when the export is empty: then none), in the order they enter the
 * fingerprint.  Regions may overlap on small exports.
 */
struct fscache_sample_set {
  unsigned n;
  uint64_t off[SAMPLE_COUNT];   /* the last region ends at the size;
                                 * the others start at a multiple of
                                 * SAMPLE_SIZE */
  uint32_t len[SAMPLE_COUNT];   /* SAMPLE_SIZE, less at the end */
  uint64_t hash[SAMPLE_COUNT];  /* XXH3_64bits of the region's bytes */
};

/* What lies below this filter, for the derived key: two lines,
 * "nbdkit-plugin=NAME" and "nbdkit-filters-below=A,B" (the filters
 * after this one on nbdkit's command line, in order; empty if none),
 * NAME being the short name (memory, not nbdkit-memory-plugin.so; "?"
 * if no plugin is found).  Returns a malloc'd string or NULL (ENOMEM).
 */
extern char *identity_stack (void);

/* The object key of EXPORTNAME: fscache-key (or the derived key, see
 * params.h), NUL, "export=", the export name; not NUL-terminated, its
 * length in *LEN.  Needs params_config_complete to have run.  Returns
 * NULL (errno ENOMEM) if out of memory.  The caller frees it.
 */
extern char *object_key (const char *exportname, size_t *len);

/* The regions of the sample of an export of SIZE bytes whose object
 * key is K (KLEN bytes): fills SET's n, off and len, zeroes its hash.
 * Reads nothing.
 */
extern void sample_regions (const void *k, size_t klen, uint64_t size,
                            struct fscache_sample_set *set);

/* Reads the sample regions from UP (in parallel when its thread model
 * allows) and sets *FP to the fingerprint and SET to the regions, each
 * with its hash.  At most SAMPLE_COUNT * SAMPLE_SIZE = 32 KiB read.
 * Returns 0, or -1 with errno set (the first failed read's, or ENOMEM)
 * and *FP and SET's hashes unset.  Says nothing.
 */
extern int fingerprint_regions (struct upstream *up, const void *k,
                                size_t klen, uint64_t size,
                                struct fscache_sample_set *set,
                                uint64_t *fp);

/* fingerprint_regions without the regions. */
extern int fingerprint (struct upstream *up, const void *k, size_t klen,
                        uint64_t size, uint64_t *fp);

#endif /* FSCACHE_PLUGIN_IDENTITY_H */
