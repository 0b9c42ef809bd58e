/* nbdkit-fscache-filter: the fscache-* parameters.
 *
 * All of them live in one struct, PARAMS, the only instance: set by
 * params_config (nbdkit's .config, one parameter at a time, in the
 * order given), checked and completed by params_config_complete, and
 * read-only from then until params_free (.unload).  Every other file
 * of the filter reads them there and never writes them, so no lock is
 * needed: nbdkit calls .config and .config_complete before any
 * connection or thread of ours exists.
 *
 * Parameters that are not fscache-* belong to the plugin; they go
 * into the derived key (the upstream's default identity, see
 * identity.h) before being passed on.
 */
#ifndef FSCACHE_PLUGIN_PARAMS_H
#define FSCACHE_PLUGIN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* fscache-mode: what a client write does to the cache. */
enum mode {
  MODE_WRITETHROUGH,            /* the written blocks stay cached */
  MODE_WRITEAROUND,             /* the written blocks are dropped */
  MODE_WRITEBACK,               /* writes logged in the cache, written
                                 * back in flush order (writeback.c) */
};

struct fsc_manifest;

struct fscache_params {
  char *dir;                    /* fscache-dir, absolute; after
                                 * config_complete never NULL */
  char *key;                    /* fscache-key, or NULL */
  char *derived_key;            /* from the plugin parameters; after
                                 * config_complete only their hash,
                                 * "params-HEX" (they may hold
                                 * passwords) */
  size_t derived_len;
  uint32_t block_size;          /* fscache-block-size */
  enum mode mode;               /* fscache-mode */
  char *generation;             /* fscache-generation, or NULL */
  int validate;                 /* fscache-validate: FSC_VALIDATE_* */
  bool verify;                  /* fscache-verify */
  char *stats_file;             /* fscache-stats, absolute, or NULL */
  uint64_t readahead;           /* fscache-readahead, bytes, 0: off */
  bool offline;                 /* fscache-offline */
  uint64_t resident_groups;     /* test knob NBD_FSCACHE_RESIDENT_GROUPS:
                                 * groups kept in memory (0: default) */
  uint64_t max_size;            /* fscache-max-size, 0: none */
  unsigned min_free;            /* fscache-min-free, % of blocks */
  unsigned min_free_inodes;     /* fscache-min-free-inodes, % */
  char *trace_file;             /* fscache-trace, absolute, or NULL */
  uint64_t trace_max;           /* fscache-trace-max, bytes */
  uint64_t dirty_max;           /* fscache-dirty-max, bytes */
  unsigned writeback_drain;     /* fscache-writeback-drain, seconds */
  bool mrc;                     /* fscache-mrc: keep the miss-ratio
                                 * curve (nbd-fscache advise) */
  bool latency_guard;           /* fscache-latency-guard: hits read
                                 * upstream while the cache disk is the
                                 * slower path (core/ops/guard.c) */
  bool fill_probe;              /* fscache-fill-probe: skip fills while
                                 * they slow the clients (core/base/
                                 * cost.c) */
  bool catchup;                 /* fscache-catchup: make up skipped
                                 * fills when idle (catchup.c) */
  unsigned worker_yield;        /* fscache-worker-yield, microseconds
                                 * (yield.c); 0: never */
  unsigned upstream_connections; /* fscache-upstream-connections: the
                                 * pool's size (pool.c), 0: none */
  bool upstream_connections_given; /* ... given on the command line:
                                 * a pool over a parallel plugin too */
  char *peers_file;             /* fscache-peers, absolute, or NULL:
                                 * no peer tier (peers.c) */
  char *peer_self;              /* fscache-peer-self: this node's line */
  char *peer_psk;               /* fscache-peer-tls-psk, absolute, or
                                 * NULL: peers speak plain NBD */
  char *peer_certs;             /* fscache-peer-tls-certificates: a
                                 * directory, absolute, or NULL */
  bool peer_only;               /* fscache-peer-only: serve peers'
                                 * connections alone (a fleet's listener,
                                 * nbd-fscache-proxy's peer-listen=) */
  unsigned peer_fanout;         /* fscache-peer-fanout: askers per
                                 * range and member, 0: flat */
  unsigned peer_stripes;        /* fscache-peer-stripes: trees per
                                 * object, 0: one per range */
  unsigned peer_max_inbound;    /* fscache-peer-max-inbound: peers'
                                 * connections served at once */
  char *manifest_file;          /* fscache-manifest, absolute, or NULL */
  struct fsc_manifest *manifest; /* ... read at config_complete: every
                                 * block from a peer is checked (peers.c) */
};

/* The parameters, with their defaults until .config changes them. */
extern struct fscache_params params;

/* The .config_help text: one line per fscache-* parameter. */
extern const char params_help[];

/* .config for one KEY=VALUE.  Returns 0 if it was an fscache-*
 * parameter and is set, -1 (said with nbdkit_error) if it is malformed
 * or an unknown fscache-*, and 1 if it is the plugin's: then it has
 * been added to the derived key and the caller passes it on.
 */
extern int params_config (const char *k, const char *value);

/* .config_complete's checks: defaults fscache-dir, requires a key
 * (given or derived) and replaces the derived key by its hash.
 * Returns 0, or -1 said with nbdkit_error.
 */
extern int params_config_complete (void);

/* .unload: frees every string of PARAMS. */
extern void params_free (void);

#endif /* FSCACHE_PLUGIN_PARAMS_H */
