/* libfscache: the counters of one object, kept with its index.
 *
 * Unlike struct fsc_stats (one cache, one process, lost at exit), these
 * belong to an object and outlive the processes that use it: each
 * superblock write saves them (index.c, "Object counters" in
 * docs/format.md), the next open loads them, and an object discarded
 * for a coherency reason keeps them across its cold restart (counting
 * the invalidation).  A running proxy also publishes them, live, in
 * NAME.stats (core/ostats.c).  nbd-fscache(1) reads both.
 *
 * The order of FSC_OSTATS_FIELDS is the on-disk order: append only.
 * Counters are monotonic; the ones marked "gauge" and "time" are not.
 */
#ifndef FSC_OSTATS_H
#define FSC_OSTATS_H

#include <stddef.h>
#include <stdint.h>

#define FSC_OSTATS_FIELDS(X)                                              \
  X (opens)               /* times the object was opened */               \
  X (hit_requests)        /* client reads served wholly from the cache */ \
  X (hit_bytes)           /* bytes served from the cache */               \
  X (miss_requests)       /* client reads that needed upstream */         \
  X (miss_bytes)          /* bytes of them served from upstream */        \
  X (upstream_reads)      /* read requests sent upstream */               \
  X (upstream_bytes)      /* bytes read upstream (misses, prefetch) */    \
  X (prefetch_bytes)      /* of those, fetched ahead (readahead, CACHE) */\
  X (stored_blocks)       /* blocks (or pieces of them) stored */         \
  X (stored_bytes)        /* bytes written into the data files */         \
  X (evicted_blocks)      /* blocks evicted for a cap or quota */         \
  X (evicted_bytes)       /* their bytes */                               \
  X (invalidations)       /* cached data discarded (see last_reason) */   \
  X (invalidated_blocks)  /* blocks dropped by writes */                  \
  X (write_requests)      /* client writes, trims, zeroes passed on */    \
  X (write_bytes)         /* their bytes */                               \
  X (verify_failures)     /* hits whose checksum did not match */         \
  X (io_errors)           /* failed cache file reads, writes, syncs */    \
  X (withdrawals)         /* times the object was withdrawn */            \
  X (last_use)            /* time: unix seconds of the last read */       \
  X (last_invalidation)   /* time: unix seconds of the last invalidation */\
  X (present_blocks)      /* gauge: blocks cached, whole or in pieces */  \
  X (cached_bytes)        /* gauge: bytes those blocks hold */

enum fsc_ostat {
#define FSC_OSTATS_ENUM(name) FSC_OSTAT_##name,
  FSC_OSTATS_FIELDS (FSC_OSTATS_ENUM)
#undef FSC_OSTATS_ENUM
  FSC_OSTATS_COUNT
};

/* Room in the superblock: 3456 + 8 * 78 <= 4088 (index.c). */
#define FSC_OSTATS_MAX 78
_Static_assert (FSC_OSTATS_COUNT <= FSC_OSTATS_MAX,
                "too many object counters for the superblock");

struct fsc_ostats {
  uint64_t v[FSC_OSTATS_MAX];   /* by enum fsc_ostat */
  uint32_t last_reason;         /* enum fsc_reason of the last
                                 * invalidation; 0 if none */
};

/* The name of counter I (an enum fsc_ostat), or NULL. */
extern const char *fsc_ostat_name (unsigned i);

/* The counter named NAME, or -1. */
extern int fsc_ostat_index (const char *name);

#endif /* FSC_OSTATS_H */
