/* libfscache: the public API, used by the nbdkit filter, the tools and
 * the unit tests.  No nbdkit headers here or anywhere in core/.
 *
 * The model follows FS-Cache (see ../shared/seeds and docs/design.md):
 *
 *   cache    a directory on local disk (fsc_cache_open), holding
 *            objects; one background thread commits their indexes.
 *   object   the cached copy of one upstream export, looked up by a key
 *            (the upstream's identity plus the client's export name) and
 *            checked against auxiliary coherency data (upstream size,
 *            generation, a fingerprint of sampled blocks).  States:
 *            LOOKING_UP -> (CREATING ->) AVAILABLE -> WITHDRAWN.
 *   ops      retrieval (fsc_object_read, fsc_object_prefetch), storage
 *            (fills on miss, fsc_object_write_*), invalidation, commit.
 *
 * Every function returns -1 and sets errno on error and prints nothing.
 * Errors of the cache's own I/O are never returned to the caller of a
 * read: the object withdraws (or stops filling, for ENOSPC) and the
 * request is served from upstream.  Only upstream errors come back.
 */
#ifndef FSC_FSCACHE_H
#define FSC_FSCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "index.h"
#include "io.h"
#include "stats.h"

struct fsc_cache;
struct fsc_object;

#define FSC_MAX_BLOCK_SIZE (4u << 20)

/* The largest export cached (1 EiB).  A larger one, up to nbdkit's
 * largest (2^63 - 1), is opened as a withdrawn object (the lookup
 * fails with EFBIG): it is served uncached, its group table a single
 * empty entry so that its memory does not grow with the size.
 */
#define FSC_OBJECT_SIZE_MAX (UINT64_C (1) << 60)
_Static_assert (FSC_MAX_BLOCK_SIZE == FSC_INDEX_BLOCK_MAX,
                "the index reads exactly the block sizes objects take");

/* Object states, as in the seed's object state machine. */
enum fsc_object_state {
  FSC_OBJ_LOOKING_UP = 0,
  FSC_OBJ_CREATING = 1,
  FSC_OBJ_AVAILABLE = 2,
  FSC_OBJ_WITHDRAWN = 3,        /* every request goes upstream */
};

struct fsc_cache_config {
  const char *dir;              /* the cache directory */
  bool create;                  /* create it (mode 0700) if missing */
  const char *faults;           /* fault spec for tests (io.h), or NULL */
  unsigned commit_interval_ms;  /* background commit period; 0: 2000 */
  unsigned min_free_pct;        /* store nothing below this % of free
                                 * blocks (fscache-min-free); 0: none */
  unsigned min_free_files_pct;  /* the same for inodes */
  bool existing;                /* only open an existing cache: a missing
                                 * or damaged header is an error (ENOENT,
                                 * EBADMSG), nothing is created or
                                 * rewritten (tools, the daemon) */
  char *why;                    /* if not NULL: why the directory was
                                 * refused, one line (WHY_LEN bytes) */
  size_t why_len;
};

/* The default cache directory, as nbdkit-fscache-filter(1) documents
 * it: $NBD_FSCACHE_DIR (made absolute), /var/cache/nbd-fscache for
 * root, $XDG_CACHE_HOME/nbd-fscache if that is absolute, else
 * ~/.cache/nbd-fscache.  Returns a malloc'd path, or NULL with errno
 * (ENOENT: none of those variables to default from).  Shared by the
 * filter and nbd-fscache(1), so that both find the same cache.
 */
extern char *fsc_default_dir (void);

/* Open (and with CONFIG->create, create) a cache directory.  With
 * CONFIG->existing, only a directory that already is a valid cache.  The
 * path is walked one component at a time (safeopen.h): a symlink on it
 * is followed only if root or we own it and nobody else can replace it;
 * everything inside is opened without following any.  Refuses a
 * directory that is not a directory (ENOTDIR), a path through a
 * directory another user owns or may write, a directory or objects/
 * not owned by the effective user or writable by its group or others
 * (EPERM, with the reason in CONFIG->why), or whose header was written
 * by a newer version (EPROTONOSUPPORT).
 */
extern int fsc_cache_open (const struct fsc_cache_config *config,
                           struct fsc_cache **cachep);

/* Start the background committer thread.  Call after any fork. */
extern int fsc_cache_start (struct fsc_cache *cache);

/* Commit and close every object, stop the thread, free CACHE. */
extern void fsc_cache_close (struct fsc_cache *cache);

/* The cache's UUID as 36 characters and a NUL. */
extern void fsc_cache_uuid (const struct fsc_cache *cache, char out[37]);

/* Snapshot of the cache's counters. */
extern void fsc_cache_stats (struct fsc_cache *cache, struct fsc_stats *st);

/* For tests: the calls of OP (FSC_OP_*) on files of KIND (FSC_FILE_*)
 * made so far (io.h), e.g. the index reads an open costs.
 */
extern uint64_t fsc_cache_io_calls (struct fsc_cache *cache, int op,
                                    int kind);

/* For tests: call FN after every write and sync of a cache file (see
 * io.h).  Set it before any I/O is under way.
 */
/* The latency guard (core/ops/guard.c): hits read upstream while the
 * cache disk is slower than the upstream.  ON only where the upstream
 * holds every block the cache does (no write-back data: G1).  Set
 * before the first read; off by default.
 */
extern void fsc_cache_set_guard (struct fsc_cache *cache, bool on);

/* What fills cost the clients (core/base/cost.c): for a local upstream,
 * windows with fills and without are compared on the live stream, and
 * the fill budget engages while fills slow the clients.  On by default
 * (off under NBD_FSCACHE_TEST_BUDGET); set before the first read.
 */
extern void fsc_cache_set_fill_probe (struct fsc_cache *cache, bool on);

extern void fsc_cache_set_trace (struct fsc_cache *cache,
                                 fsc_io_trace_fn *fn, void *opaque);

/* Commit every object with pending changes now. */
extern void fsc_cache_commit_all (struct fsc_cache *cache);

/* Wait until every fill queued so far is written (fill.c), e.g. so
 * that the counters read next count them.  New ones may be queued
 * meanwhile by other threads; they are waited for too.
 */
extern void fsc_cache_drain (struct fsc_cache *cache);

struct fsc_object_params {
  const void *key;              /* any bytes */
  size_t key_len;               /* > 0 */
  uint32_t block_size;          /* power of 2, 4K .. FSC_MAX_BLOCK_SIZE */
  uint64_t size;                /* upstream size in bytes */
  bool verify;                  /* check each hit's checksum */
  int validate;                 /* enum fsc_validate */
  const char *generation;       /* NULL or at most FSC_GEN_MAX bytes */
  uint64_t fingerprint;         /* with FSC_VALIDATE_SAMPLE */
  uint64_t max_size;            /* cap on the object's allocated bytes
                                 * (fscache-max-size); 0: none */
  bool offline;                 /* the upstream cannot be reached: SIZE
                                 * comes from fsc_object_peek_size and
                                 * FINGERPRINT is unknown */
  uint64_t resident_groups;     /* groups of FSC_GROUP_BLOCKS blocks kept
                                 * in memory; 0: FSC_RESIDENT_DEFAULT */
  bool exclusive;               /* never join another process's copy
                                 * nor let others join ours (writeback) */
  const char *label;            /* what it caches, for people (no
                                 * secrets), or NULL; at most
                                 * FSC_LABEL_MAX bytes are kept */
  bool no_mrc;                  /* keep no miss-ratio curve (mrc.c):
                                 * its hash and tree on every client
                                 * read saved */
};

/* Groups kept in memory by default: about 760 bytes each, 12 MiB. */
#define FSC_RESIDENT_DEFAULT 16384

struct fsc_open_info {
  int state;                    /* AVAILABLE or WITHDRAWN */
  int reason;                   /* FSC_OK: reused; else why cold */
  bool unclean;                 /* last user did not close cleanly */
  bool busy;                    /* another process holds it: uncached */
  bool shared;                  /* already open in this process */
  int err;                      /* errno that made it uncached, or 0 */
  uint64_t present_blocks;      /* blocks cached at open; after a crash
                                 * only those counted so far (the census
                                 * runs in the background: groups.c) */
  unsigned old_version;         /* reused an index of this older format
                                 * version (now upgraded); 0 if not */
  bool joined;                  /* another process holds it: requests go
                                 * to that process (share-*.c) */
  bool refused;                 /* that process refused us: REASON says
                                 * why, the owner_* fields its settings */
  int owner_pid;                /* the holder, when joined or refused */
  uint32_t owner_block_size;
  int owner_validate;
};

/* Look up or create the object for PARAMS.  Returns 0 and an object in
 * *OBJP (possibly WITHDRAWN, i.e. uncached, as INFO says), or -1 with
 * errno only for invalid parameters, no memory, or EPERM: another
 * process holds the object with another block size or validation mode
 * (INFO->refused, INFO->reason and the owner_* fields say which).
 *
 * If another process holds it, the object returned joins that one's
 * (INFO->joined; share-joiner.c): its requests are served by that process.
 *
 * With PARAMS->offline the recorded copy is taken as it is, without the
 * fingerprint comparison (nothing upstream to sample), and nothing is
 * ever created or discarded: a copy that fails any other check (key,
 * block size, size, generation, validate mode, writes not closed
 * cleanly, damage) makes the object WITHDRAWN with INFO->reason saying
 * why and INFO->err ESTALE, and leaves the files as they were.
 */
extern int fsc_object_open (struct fsc_cache *cache,
                            const struct fsc_object_params *params,
                            struct fsc_object **objp,
                            struct fsc_open_info *info);

/* The upstream size recorded in the index of the object for KEY with
 * BLOCK_SIZE, for opening it while the upstream is unreachable.  Reads
 * the index without locking or changing anything.  Returns 0, or -1
 * with errno ENOENT (no index, or none with a valid superblock for this
 * key and block size) or the error of reading it.
 */
extern int fsc_object_peek_size (struct fsc_cache *cache, const void *key,
                                 size_t key_len, uint32_t block_size,
                                 uint64_t *size);

/* If the object for PARAMS (key, block size and size) is already open
 * in this process, return a new reference to it, else NULL.  Lets a
 * caller skip work (like sampling the upstream) that only the first
 * opener needs.
 */
extern struct fsc_object *fsc_object_get (struct fsc_cache *cache,
                                          const struct fsc_object_params *p);

/* Take another reference on OBJ (returned). */
extern struct fsc_object *fsc_object_ref (struct fsc_object *obj);

/* Drop a reference; the last one commits, marks the index clean and
 * closes the files.
 */
extern void fsc_object_close (struct fsc_object *obj);

/* How a read reaches the upstream: read COUNT bytes at OFFSET into
 * BUF, return 0 or -1 with errno.  Called without any lock held, from
 * several threads at once.
 */
struct fsc_upstream {
  int (*pread) (void *opaque, void *buf, uint32_t count, uint64_t offset);
  void *opaque;
};

/* Flags of fsc_object_read. */
#define FSC_READ_SEQUENTIAL 1u  /* continues a sequential stream: its
                                 * hits do not count as references for
                                 * eviction (scan resistance) */
#define FSC_READ_NEAR 2u        /* near where the last read ended: its
                                 * misses fetch whole blocks, not only
                                 * the pieces asked for */

/* Read [OFFSET, OFFSET+COUNT) into BUF: hits from the cache (verified),
 * misses from upstream, which then fill the cache: whole blocks for a
 * sequential or near read (FSC_READ_SEQUENTIAL, FSC_READ_NEAR), else
 * only the pieces of a block the read covers.
 * Returns 0, or -1 with errno only if the upstream failed.
 */
extern int fsc_object_read (struct fsc_object *obj, void *buf,
                            uint32_t count, uint64_t offset,
                            const struct fsc_upstream *up, unsigned flags);

/* Flags of fsc_object_prefetch. */
#define FSC_PREFETCH_EXACT 4u   /* fetch only the pieces the range
                                 * covers in its end blocks, as a
                                 * random read would (NBD_CMD_CACHE of a
                                 * recorded trace); else whole blocks */
#define FSC_PREFETCH_SPECULATIVE 8u /* nobody asked for it (readahead):
                                 * before the fill and upstream rates
                                 * are known, only within the fills'
                                 * first budget, as a client's miss */

/* Make [OFFSET, OFFSET+COUNT) present without copying it anywhere
 * (NBD_CMD_CACHE, readahead).  Blocks already present or being
 * fetched are skipped.  Returns 0 or -1 with errno (upstream error).
 */
extern int fsc_object_prefetch (struct fsc_object *obj, uint64_t offset,
                                uint64_t count,
                                const struct fsc_upstream *up,
                                unsigned flags);

/* Skipped fills (catchup.c).  Noting is off until enabled; disabling
 * forgets what was noted.  fsc_catchup_take pops up to MAX bytes of
 * neighbouring whole blocks, the first at or after where the last take
 * ended (wrapping), into *OFFSET, *LEN (1), or returns 0 if none is
 * left; the taker fills them with fsc_object_prefetch
 * and counts them with fsc_catchup_done (FILLED, or given up: counted
 * as dropped).  fsc_catchup_pending
 * is the bytes noted and not taken yet.
 */
extern void fsc_catchup_enable (struct fsc_object *obj, bool on);
extern int fsc_catchup_take (struct fsc_object *obj, uint64_t max,
                             uint64_t *offset, uint64_t *len);
extern void fsc_catchup_done (struct fsc_object *obj, uint64_t bytes,
                              bool filled);
extern uint64_t fsc_catchup_pending (struct fsc_object *obj);

/* Make every change so far durable (client FLUSH).  Returns 0, or -1
 * if the cache failed (the object is then withdrawn).
 */
extern int fsc_object_commit (struct fsc_object *obj);

/* A write, trim or zero of [offset, offset+count) going upstream. */
struct fsc_write {
  uint64_t offset;
  uint64_t count;
  bool keep;                    /* store the written blocks afterwards */
  bool counted;                 /* counted in the groups' writers */
  uint64_t first_group, ngroups;
  uint32_t *epochs;             /* epoch of each group after invalidating */
  void *head, *tail;            /* old contents of partial end blocks */
  struct fsc_object *local;     /* share-joiner.c: the object a joined write
                                 * went to, once taken over */
  int join_fd;                  /* share-joiner.c: the socket a joined write
                                 * holds until its end, or -1 */
};

/* Before the upstream write: drop every block the range touches and
 * make that durable, so no crash can leave a block present whose
 * upstream content changed.  With KEEP (writethrough), remember what is
 * needed to store the new data afterwards.  Returns 0; -1 only for
 * ENOMEM.  Always pair with fsc_object_write_end.
 */
extern int fsc_object_write_begin (struct fsc_object *obj, uint64_t offset,
                                   uint64_t count, bool keep,
                                   struct fsc_write *w);
/* The same with FLAGS: FSC_WRITE_KEEP is KEEP; FSC_WRITE_NOSYNC does
 * not wait for the drop to be durable (the caller commits before it
 * relies on it: the writeback writer, whose write log covers the
 * bytes until then).
 */
#define FSC_WRITE_KEEP   1u
#define FSC_WRITE_NOSYNC 2u
extern int fsc_object_write_begin_flags (struct fsc_object *obj,
                                         uint64_t offset, uint64_t count,
                                         unsigned flags, struct fsc_write *w);

/* After the upstream write.  If UPSTREAM_OK and W->keep, store BUF (the
 * data written) into the blocks nobody touched meanwhile.  BUF NULL is
 * a zero request: the whole blocks it covers are stored as zero blocks
 * (present, no data: their space punched, hits serve zeroes without
 * reading), a partly covered end block that was held whole gets the
 * zeroes merged in like a write's.  BUF NULL without W->keep (a trim,
 * writearound) stores nothing.  Frees what begin allocated.
 */
extern void fsc_object_write_end (struct fsc_object *obj, struct fsc_write *w,
                                  const void *buf, bool upstream_ok);

/* Wait until the fills queued for OBJ's misses are done. */
extern void fsc_object_drain (struct fsc_object *obj);

/* True if the object saw writes and this is its last reference, i.e.
 * the caller should pass a fresh fingerprint to
 * fsc_object_set_fingerprint before closing.
 */
extern bool fsc_object_needs_fingerprint (struct fsc_object *obj);
extern void fsc_object_set_fingerprint (struct fsc_object *obj, uint64_t fp);

/* Events the caller should log once (fsc_object_take_notices). */
#define FSC_NOTICE_WITHDRAWN 1u /* cache I/O failed: now uncached */
#define FSC_NOTICE_NOFILL    2u /* cache full: fills paused */
#define FSC_NOTICE_BADQUOTA  4u /* NAME.quota is malformed: ignored */
#define FSC_NOTICE_SKIPPED   8u /* fills skipped: the disk is slower
                                 * (fill_skipped_bytes); raised at every
                                 * skip, so the caller rate-limits it */
#define FSC_NOTICE_PEER     16u /* the share socket refused a process of
                                 * another user (fsc_share_refused_uid) */

/* The uid of the last process of another user that the share socket
 * of OBJ refused (FSC_NOTICE_PEER), or -1.
 */
extern long fsc_share_refused_uid (struct fsc_object *obj);

/* Return the notices raised since the last call (and clear them), and
 * in *ERR the errno behind a withdrawal.
 */
extern unsigned fsc_object_take_notices (struct fsc_object *obj, int *err);

/* Wait until OBJ's background walk for space no index names (started
 * at open after a crash, or when the data files hold clearly more than
 * the blocks) has ended.  Requests need not wait for it; tests and
 * tools that count space do.
 */
extern void fsc_object_wait_reclaim (struct fsc_object *obj);

/* A 64-bit value the netfs attaches to an open object and reads back
 * while it stays open (as FS-Cache's netfs data on a cookie): the
 * filter keeps there the identity its fleet peers compare, computed
 * by the connection that opened the object, so that the ones joining
 * it need not read the upstream again.  0 until set.
 */
extern void fsc_object_set_tag (struct fsc_object *obj, uint64_t tag);
extern uint64_t fsc_object_tag (struct fsc_object *obj);

/* The peer tier's counters (the filter's peers.c), kept with the
 * cache's and OBJ's own so that one stats file, nbd-fscache stat and
 * one Prometheus scrape show them: add DELTA to the counter named as
 * in stats.h (peer_*; the object's variant also to OBJ's peer_bytes,
 * peer_served_bytes and peer_errors, ostats.h), or set the cache's
 * gauge peers_known.
 */
enum fsc_peer_stat {
  FSC_PEER_READS, FSC_PEER_READ_BYTES, FSC_PEER_ERRORS, FSC_PEER_BACKOFFS,
  FSC_PEER_SERVED, FSC_PEER_SERVED_BYTES, FSC_PEER_REFUSED,
  FSC_PEER_FALLBACKS, FSC_PEER_BUSY, FSC_PEER_PROBES,
  FSC_PEER_PROBES_FAILED, FSC_PEER_BAD_DATA, FSC_PEER_HOPS,
  FSC_PEER_FALLBACKS_WAITED,
};
extern void fsc_cache_count_peer (struct fsc_cache *cache,
                                  enum fsc_peer_stat which, uint64_t delta);
/* Has OBJ been written through since it was created (by any process,
 * before any restart: FSC_SB_WRITTEN)?  A fleet node does not ask
 * peers for such an object.
 */
extern bool fsc_object_written_ever (struct fsc_object *obj);
extern void fsc_object_count_peer (struct fsc_object *obj,
                                   enum fsc_peer_stat which, uint64_t delta);
extern void fsc_cache_set_peers_known (struct fsc_cache *cache, uint64_t n);
/* A worker thread of the caller's offered its CPU (the filter's
 * fscache-worker-yield): counted in worker_yields.
 */
extern void fsc_cache_count_yield (struct fsc_cache *cache);
extern void fsc_cache_set_peers_aside (struct fsc_cache *cache, uint64_t n);
extern void fsc_cache_set_peer_tree_depth (struct fsc_cache *cache,
                                           uint64_t depth);

/* The upstream is no longer the one OBJ caches (a context reopened on
 * it reports another size): withdraw OBJ (uncached from now on, its
 * files removed, joiners told), with ERR (ESTALE) as the reason its
 * notices give.  Idempotent.
 */
extern void fsc_object_withdraw (struct fsc_object *obj, int err);

/* Introspection. */
extern int fsc_object_state (struct fsc_object *obj);
extern uint64_t fsc_object_size (struct fsc_object *obj);
extern uint64_t fsc_object_present_blocks (struct fsc_object *obj);

/* OBJ's own counters (ostats.h: persistent across opens, unlike the
 * cache's), with the gauges counted now.
 */
extern void fsc_object_counters (struct fsc_object *obj,
                                 struct fsc_ostats *out);
extern bool fsc_object_block_present (struct fsc_object *obj, uint64_t blk);

#endif /* FSC_FSCACHE_H */
