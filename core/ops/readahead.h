/* libfscache: sequential readahead for one stream of reads.
 *
 * One fsc_readahead per client connection.  The connection reports
 * each read as it arrives (fsc_readahead_observe).  A stream's front is
 * the furthest end of its reads; reads may arrive out of order by up
 * to sixteen reads' worth (a client's queue, raced over by the
 * server's threads) and still belong to it.  After three reads in a row
 * that push the front on, the bytes beyond the front are queued (one
 * chunk, doubling with each further read, up to WINDOW) in chunks and fetched into the cache by background threads (at most
 * the caller's limit, itself at most FSC_RA_THREADS, started on first
 * need) through fsc_object_prefetch.
 * Blocks already present, or being fetched by a demand miss, are
 * skipped there; a demand miss on a block being prefetched waits for
 * that fetch instead of repeating it.  A read elsewhere drops what is
 * still queued.  Never past the end of the export.
 *
 * The stream's lock guards only its queue and counters; no lock is
 * held while prefetching.
 */
#ifndef FSC_READAHEAD_H
#define FSC_READAHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "fscache.h"

#define FSC_RA_THREADS 4         /* over a parallel upstream */
#define FSC_RA_THREADS_MAX 16     /* over a pool of contexts (the
                                   * filter's pool.c), one per context */
#define FSC_RA_CHUNK (1024 * 1024)

/* The access pattern of one connection's reads: the one place that
 * tells a stream from random reads (readahead below tracks the same
 * stream to run ahead of it).  Zeroed at the start; updated with
 * atomics, so that concurrent reads of the connection need no lock.
 */
struct fsc_pattern {
  uint64_t last_end;            /* end of the last read */
  bool last_near;               /* the last read was near the one before */
};

/* Classify a read of [OFFSET, OFFSET+COUNT) as it arrives: the flags
 * of fsc_object_read.  FSC_READ_SEQUENTIAL if it starts where the
 * last one ended (its hits then do not protect blocks from eviction);
 * FSC_READ_NEAR as well, or if it and the read before each started
 * near where the one before them ended (its misses then fetch whole
 * blocks).
 */
extern unsigned fsc_pattern_classify (struct fsc_pattern *p, uint64_t offset,
                                      uint32_t count);

struct fsc_readahead;

/* A stream reading OBJ through UP (which must stay valid until
 * fsc_readahead_free).  WINDOW is how far ahead to read; 0 disables.
 * At most MAX_THREADS (1 .. FSC_RA_THREADS_MAX) prefetches run at once:
 * an upstream that takes one request at a time gains nothing from
 * more.  Returns NULL with errno on error.
 */
extern struct fsc_readahead *fsc_readahead_new (struct fsc_object *obj,
                                                uint64_t window,
                                                unsigned max_threads,
                                                const struct fsc_upstream *up);

/* A client read of [OFFSET, OFFSET+COUNT) arrives: call before serving
 * it, so that readahead runs ahead of the client's queue, not behind.
 */
extern void fsc_readahead_observe (struct fsc_readahead *ra,
                                   uint64_t offset, uint32_t count);

/* Stop the threads (waiting for prefetches under way) and free RA. */
extern void fsc_readahead_free (struct fsc_readahead *ra);

#endif /* FSC_READAHEAD_H */
