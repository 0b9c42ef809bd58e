/* nbdkit-fscache-filter: fscache-mode=writeback, the filter's side.
 *
 * core/wlog/wlog.c keeps the write log and core/wlog/writeback.c writes it back;
 * this file gives them what only the filter has: a connection to the
 * upstream that outlives every client (a shared context opened from
 * .after_fork's backend, gated like a connection by upstream.c), the
 * messages, and the rules for who may use an object that has a log:
 *
 * - In writeback mode the first connection to an export opens its log
 *   (creating it), checks it against the upstream, opens the object
 *   and starts the writer; later connections of the process share all
 *   of it.  The writer's state (struct wb) stays until .cleanup, so
 *   dirty data keeps draining between clients; .cleanup drains for up
 *   to fscache-writeback-drain seconds and leaves the rest on disk.
 * - Any mode refuses an export whose log another process holds (a
 *   writeback proxy: serving the upstream's blocks would be stale), and
 *   a proxy not in writeback mode refuses one whose log holds dirty
 *   data (it would serve stale data too), saying how to get out.
 */
#ifndef FSCACHE_PLUGIN_WRITEBACK_H
#define FSCACHE_PLUGIN_WRITEBACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fscache.h"
#include "wlog.h"

#include "identity.h"
#include "upstream.h"

struct wb;

/* .after_fork: the backend the writers open their upstream from. */
extern void wb_set_backend (nbdkit_backend *backend);

/* .prepare of a connection whose object is not open in this process
 * yet, before fsc_object_open, in any mode: refuse (-1, said) if the
 * object's write log forbids this proxy to open it (see above).  If
 * WBMODE (writeback mode over an upstream that can write), open the
 * log, creating it, into *WLP (the caller passes it to wb_start).
 * SET: the upstream's sample regions now (n = 0 if not sampled).
 */
extern int wb_check_log (struct fsc_cache *cache, const char *exportname,
                         const void *k, size_t klen, uint64_t size,
                         const struct fscache_sample_set *set, bool wbmode,
                         struct fsc_wlog **wlp);

/* Writeback mode, after fsc_object_open: start the writer of WL for
 * OBJ (which must be the process's only user of the object: INFO->busy
 * is refused).  Returns the state, or NULL (said; WL closed).
 */
extern struct wb *wb_start (struct fsc_cache *cache, const char *exportname,
                            const void *k, size_t klen,
                            struct fsc_wlog *wl, struct fsc_object *obj,
                            const struct fsc_open_info *info);

/* The writeback state of the export with key K, if this process has
 * one (a later connection), else NULL.
 */
extern struct wb *wb_find (const void *k, size_t klen);

/* The log of WB, for the client's operations. */
extern struct fsc_wlog *wb_log (struct wb *wb);

/* Say what the log and its writer want said (failures, outages,
 * backpressure), rate-limited.
 */
extern void wb_log_notices (struct wb *wb);

/* The client's requests, as nbdkit's callbacks take them (FLAGS: FUA),
 * through the log.  Return 0 or -1 with *ERR; wb_pread returns
 * WB_DAMAGED (*ERR EIO) when the log's own copy was bad: already said
 * loudly, and not the upstream's failure.
 */
#define WB_DAMAGED (-2)
extern int wb_pread (struct wb *wb, struct fsc_object *obj,
                     const struct fsc_upstream *up, void *buf,
                     uint32_t count, uint64_t offset, unsigned rflags,
                     int *err);
extern int wb_pwrite (struct wb *wb, struct fsc_object *obj,
                      const struct fsc_upstream *up, const void *buf,
                      uint32_t count, uint64_t offset, uint32_t flags,
                      int *err);
extern int wb_zero (struct wb *wb, struct fsc_object *obj,
                    const struct fsc_upstream *up, uint32_t count,
                    uint64_t offset, uint32_t flags, int *err);
extern int wb_trim (struct wb *wb, uint32_t count, uint64_t offset,
                    uint32_t flags, int *err);
extern int wb_flush (struct wb *wb, int *err);

/* .cleanup: drain every writer for up to fscache-writeback-drain
 * seconds, log what is left, refresh fingerprints, close.
 */
extern void wb_shutdown_all (void);

#endif /* FSCACHE_PLUGIN_WRITEBACK_H */
