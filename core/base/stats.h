/* libfscache: counters of one cache, shared by its objects.
 *
 * Plain uint64_t fields updated with relaxed atomics: no lock, and a
 * snapshot may mix instants, which is fine for statistics.  The names
 * printed by fsc_stats_format are stable (tests and tools parse them).
 */
#ifndef FSC_STATS_H
#define FSC_STATS_H

#include <stddef.h>
#include <stdint.h>

#define FSC_STATS_FIELDS(X)                                               \
  X (read_requests)       /* client reads */                              \
  X (hit_bytes)           /* bytes served from the cache */               \
  X (hits_rerouted)       /* hits read upstream instead: the cache disk
                           * slower than the upstream (guard.c) */      \
  X (hits_rerouted_bytes) /* their bytes (not in hit_bytes) */          \
  X (guard_switches)      /* objects' hit routes changed (guard.c) */   \
  X (miss_bytes)          /* bytes served from upstream */                \
  X (upstream_reads)      /* read requests sent upstream */               \
  X (upstream_read_bytes) /* bytes read upstream */                       \
  X (fill_bytes)          /* bytes written into data files */             \
  X (fill_errors)         /* failed data file writes */                   \
  X (verify_failures)     /* hits whose checksum did not match */         \
  X (read_errors)         /* failed data file reads */                    \
  X (dedup_waits)         /* misses that waited for another's fetch */    \
  X (dedup_wakeups)       /* ... and woke (each looks again) */           \
  X (prefetch_bytes)      /* bytes fetched by prefetch/readahead */       \
  X (commits)             /* index commits */                             \
  X (commit_errors)       /* failed commits */                            \
  X (withdrawals)         /* objects withdrawn on cache errors */         \
  X (nofill_events)       /* fills stopped for lack of space */           \
  X (objects_opened)      /* objects looked up */                         \
  X (objects_reused)      /* opened with a valid index */                 \
  X (objects_created)     /* started cold */                              \
  X (objects_discarded)   /* existing index rejected */                   \
  X (objects_busy)        /* held by another process: uncached */         \
  X (unclean_opens)       /* previous user crashed */                     \
  X (invalidated_blocks)  /* present blocks dropped by writes */          \
  X (stored_blocks)       /* blocks stored by writethrough */         \
  X (evicted_blocks)      /* blocks evicted to keep a size cap */         \
  X (evicted_bytes)       /* their bytes (space punched out) */          \
  X (evicted_main)        /* of those, from the main set (not probation) */\
  X (promoted_blocks)     /* probation blocks hit again: into main */     \
  X (eviction_rounds)     /* evictions (each one commit) */               \
  X (cap_skips)           /* fills not stored: nothing to evict */        \
  X (lowspace_skips)      /* fills not stored, misses read around
                           * the cache: the free space floor */           \
  X (lowspace_ms)         /* time spent below the free space floor */     \
  X (quota_changes)       /* quota records taken up or dropped */         \
  X (reclaimed_bytes)     /* unindexed space punched at an unclean open */\
  X (piece_fills)         /* blocks filled with only some of their pieces */\
  X (objects_upgraded)    /* reused from an older index format */   \
  X (zero_blocks)         /* of stored_blocks, zero blocks (no data) */ \
  X (fill_skipped)        /* misses not stored: the disk the bottleneck */\
  X (fill_skipped_bytes)  /* their bytes, read upstream and not stored */\
  X (catchup_noted_bytes) /* skipped, remembered to be made up */       \
  X (catchup_done_bytes)  /* of those, filled later (catch-up) */       \
  X (catchup_dropped_bytes) /* of those, forgotten (memory, failure) */ \
  X (pending_hit_bytes)   /* of hit_bytes, served from fills not written */\
  X (upstream_busy_us)    /* time with upstream reads in flight */     \
  X (fill_busy_us)        /* time with fills written or synced */      \
  X (fill_depth_max)      /* the most fills the fill threads wrote at
                           * once (a maximum, not a sum) */             \
  X (commit_us)           /* time spent in commits, microseconds */       \
  X (commit_max_us)       /* the longest commit (a maximum, not a sum) */ \
  X (share_joins)         /* opens that joined another process's object */\
  X (share_served)        /* requests served for other processes */       \
  X (share_direct_bytes)  /* joined: bytes served from the files directly */\
  X (share_fallbacks)     /* joined requests served uncached: no owner */ \
  X (share_takeovers)     /* objects taken over from a gone owner */      \
  X (share_refused)       /* joins refused: settings or upstream differ */\
  X (share_timeouts)      /* joiners' fetches given up: past the deadline */\
  X (share_peers_refused) /* share sockets refused: another user, too many
                           * connections, no hello in time, bad messages */\
  X (peer_reads)          /* misses asked of a fleet peer (peer tier) */  \
  X (peer_read_bytes)     /* their bytes: of upstream_read_bytes, those
                           * that came from peers, not the origin */       \
  X (peer_errors)         /* peer reads and connects that failed */      \
  X (peer_backoffs)       /* peers set aside for a while after errors */ \
  X (peer_served)         /* reads served to other nodes' proxies */     \
  X (peer_served_bytes)   /* their bytes */                              \
  X (peer_refused)        /* peer connections refused: another image,
                           * no TLS, writeback, not in a fleet */          \
  X (peers_known)         /* other nodes in fscache-peers (a gauge) */  \
  X (peer_busy)           /* peers' reads answered busy (served: past
                           * fscache-peer-max-inbound; asked: skipped) */\
  X (peer_fallbacks)      /* ranges read from the origin after every peer
                           * asked for them failed */                   \
  X (peer_fallbacks_waited) /* of which waited for the export's budget
                           * of fallbacks in flight (peers.c) */        \
  X (peer_tree_depth)     /* hops from the deepest node of a range's tree
                           * to the origin's reader (a gauge) */       \
  X (peers_aside)         /* peers set aside now (a gauge) */           \
  X (peer_probes)         /* set-aside peers dialled in the background,
                           * before their time was up */                \
  X (peer_probes_failed)  /* of which found still down: set aside
                           * again, no client read paying for it */    \
  X (peer_bad_data)       /* peers' answers that failed the manifest */ \
  X (peer_hops)           /* of peer_reads, the hops from this node to
                           * the range's origin reader, summed */\
  X (fill_cost_samples)   /* windows with fills and without compared
                           * (cost.c) */                                \
  X (fill_cost_changes)   /* the verdict changed: fills slow the clients,
                           * or no longer */                           \
  X (fill_cost_pm)        /* the last comparison: served per second
                           * without fills over with, per mille (a gauge) */\
  X (fill_costly)         /* 1: fills slow the clients, the budget is
                           * engaged (a gauge) */                      \
  X (worker_yields)       /* the filter's workers offered their CPU
                           * after a budget of back-to-back reads */

struct fsc_stats {
#define FSC_STATS_DECL(name) uint64_t name;
  FSC_STATS_FIELDS (FSC_STATS_DECL)
#undef FSC_STATS_DECL
};

#define FSC_STAT_ADD(st, field, n) \
  __atomic_add_fetch (&(st)->field, (n), __ATOMIC_RELAXED)

/* Raise ST->FIELD to at least N (a maximum, not a counter). */
#define FSC_STAT_MAX(st, field, n)                                      \
  do {                                                                  \
    uint64_t fsc_n_ = (n);                                              \
    uint64_t fsc_o_ = __atomic_load_n (&(st)->field, __ATOMIC_RELAXED); \
    while (fsc_o_ < fsc_n_ &&                                           \
           !__atomic_compare_exchange_n (&(st)->field, &fsc_o_, fsc_n_, \
                                         true, __ATOMIC_RELAXED,        \
                                         __ATOMIC_RELAXED))             \
      ;                                                                 \
  } while (0)

/* Copy ST field by field with atomic loads. */
extern void fsc_stats_snapshot (const struct fsc_stats *st,
                                struct fsc_stats *out);

/* Format ST as "name value\n" lines into BUF.  Returns the length that
 * was needed (like snprintf).
 */
extern size_t fsc_stats_format (const struct fsc_stats *st,
                                char *buf, size_t size);

#endif /* FSC_STATS_H */
