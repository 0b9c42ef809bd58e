/* nbdkit-fscache-filter: what the filter's callbacks share: the
 * process's state and a connection's handle.  fscache.c has the
 * process's callbacks and the requests; connect.c a connection's
 * life (open, prepare with the object's open, finalize, close).
 */
#ifndef FSC_PLUGIN_HANDLE_H
#define FSC_PLUGIN_HANDLE_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

#include "fscache.h"
#include "readahead.h"
#include "upstream.h"

struct peer_export;
struct pool;
struct view;
struct wb;

/* The process's cache state, open from .config_complete to .cleanup
 * and shared by every connection (core/ locks what it needs).
 */
struct filter_state {
  struct fsc_cache *cache;
  struct fsc_trace *trace;      /* fscache-trace, or NULL */
  time_t skips_said_at;         /* last note of skipped fills (also
                                 * read without skips_lock), and */
  uint64_t skips_said;          /* fill_skipped_bytes then (skips_lock) */
};
extern struct filter_state state;

struct handle {
  struct fsc_object *obj;
  uint64_t size;                /* the export's size, fixed at .prepare */
  time_t err_said;              /* last upstream failure logged (atomic) */
  struct fsc_pattern pattern;   /* its reads' access pattern */
  unsigned err_unsaid;          /* failures since, not logged (atomic) */
  struct fsc_readahead *ra;     /* NULL if fscache-readahead=0 */
  struct upstream upstream;     /* this connection's own upstream
                                 * context, gated (unopened for a
                                 * peer's connection given U) */
  struct upstream *u;           /* the context its calls use: &upstream,
                                 * or for a peer's connection the
                                 * export's shared one (peerhost.c) */
  struct fsc_upstream up;       /* the same, for core/ */
  char *exportname;
  bool traced;                  /* its reads go into the trace */
  struct wb *wb;                /* writeback mode: the export's writer
                                 * and log (the process's, shared) */
  struct pool *pool;            /* its reads' pool of upstream contexts,
                                 * or NULL (pool.c) */
  bool need_view;               /* an upstream without multi-conn: once
                                 * written, one view for all (view.c) */
  struct view *view;            /* that view, once this connection has
                                 * seen it open, or NULL (atomic) */
  bool wbmode;                  /* writeback mode, and the upstream
                                 * can write (wb_wanted) */
  struct peer_export *fleet;    /* its misses ask the range's owner
                                 * among the peers (peers.c), or NULL */
  uint64_t peer_want;           /* a peer's connection: the identity it
                                 * asked for; 0 for a client's */
  bool peer_busy;               /* a peer's connection past
                                 * fscache-peer-max-inbound: every read
                                 * answers ESHUTDOWN ("busy": the asker
                                 * skips this node for the range) */
  bool peer_serving;            /* a peer's connection, accepted: its
                                 * misses go up the range's tree (T1) */
};

/* connect.c: the connection callbacks. */
extern void *fscache_open (nbdkit_next_open *next, nbdkit_context *nxdata,
                           int readonly, const char *exportname, int is_tls);
extern void fscache_close (void *handle);
extern int fscache_prepare (nbdkit_next *next, void *handle, int readonly);
extern int fscache_finalize (nbdkit_next *next, void *handle);

/* connect.c: where H's data calls go: its export's view once there is
 * one (view.c), else its own context.  A write that cannot open the
 * view gets NULL and *ERR (EIO).
 */
extern struct upstream *data_upstream (struct handle *h, bool writing,
                                       int *err);

/* report.c: log what H's object wants said once; write the stats
 * file; is the stats file refused (a symlink, or not a regular file)?
 */
extern void log_notices (struct handle *h);
extern void write_stats (void);
extern bool stats_file_refused (void);

#endif /* FSC_PLUGIN_HANDLE_H */
