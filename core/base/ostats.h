/* libfscache: the counters of one object, kept with its index.
 *
 * Unlike struct fsc_stats (one cache, one process, lost at exit), these
 * belong to an object and outlive the processes that use it: each
 * superblock write saves them (index.c, "Object counters" in
 * docs/format.md), the next open loads them, and an object discarded
 * for a coherency reason keeps them across its cold restart (counting
 * the invalidation).  A running proxy also publishes them, live, in
 * NAME.stats (core/base/ostats.c).  nbd-fscache(1) reads both.
 *
 * The order of FSC_OSTATS_FIELDS is the on-disk order: append only.
 * Counters are monotonic; the ones marked "gauge" and "time" are not.
 */
#ifndef FSC_OSTATS_H
#define FSC_OSTATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
  X (cached_bytes)        /* gauge: bytes those blocks hold */         \
  X (fill_skipped_bytes)  /* read upstream, not stored: disk slower */\
  X (peer_bytes)          /* of upstream_bytes, from fleet peers */       \
  X (peer_served_bytes)   /* bytes served to other nodes' proxies */      \
  X (peer_errors)         /* failed peer reads and connects */

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

/* The rest of a NAME.stats file (docs/format.md, "Live statistics"). */
struct fsc_live_head {
  long pid;                     /* the process that wrote it */
  uint64_t updated_ms;          /* when, ms since the epoch */
  uint64_t interval_s;          /* seconds between rewrites while open */
  bool open;                    /* the object is open */
  bool have_key;                /* key_hash was there (parse only) */
  uint64_t key_hash_hi, key_hash_lo;
  uint64_t incarnation;
  uint64_t size;
  uint32_t block_size;
  uint64_t cap;                 /* the object's size cap in bytes (its
                                 * fscache-max-size or its quota, the
                                 * smaller), written as "cap BYTES";
                                 * 0: none */
  /* The miss-ratio curve (mrc.c), written as "mrc BYTES HIT_RATIO"
   * lines: the predicted hit ratio of a cache of BYTES, at each half
   * octave of the block size up to the export's size; with when it
   * started (mrc_since, seconds since the epoch) and the accesses it
   * stands for.  MRC_N 0: none.  Parsed back too (tools).
   */
#define FSC_LIVE_MRC_MAX 96
  unsigned mrc_n;
  uint64_t mrc_since, mrc_refs;
  uint64_t mrc_bytes[FSC_LIVE_MRC_MAX];
  double mrc_hit[FSC_LIVE_MRC_MAX];
};

/* live.c: the text of a NAME.stats file with H and the counters S,
 * to FP.  Also for tools that write an object's history.
 */
extern void fsc_live_format (FILE *fp, const struct fsc_live_head *h,
                             const struct fsc_ostats *s);

/* live.c: write that text to DIRFD/NAME.stats (NAME without suffix)
 * through NAME.stats.tmp.PID and rename, so that readers see a whole
 * file.  0, or -1 with errno.
 */
extern int fsc_live_write (int dirfd, const char *name,
                           const struct fsc_live_head *h,
                           const struct fsc_ostats *s);

/* live.c: read a NAME.stats file from FP into *H and *S (lines not
 * known are skipped).  0, or -1 if it is not a format 1 stats file.
 */
extern int fsc_live_parse (FILE *fp, struct fsc_live_head *h,
                           struct fsc_ostats *s);

/* live.c: open DIRFD/NAME.stats (never following a symlink) and
 * parse it as fsc_live_parse does.  0, or -1 (absent, unreadable or
 * not a stats file).
 */
extern int fsc_live_read (int dirfd, const char *name,
                          struct fsc_live_head *h, struct fsc_ostats *s);

#endif /* FSC_OSTATS_H */
