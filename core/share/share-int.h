/* libfscache: one object for the whole host; what the share files
 * share, and nobody else.  This is the overview; each file says more
 * of its own part:
 *
 *   share-wire.c    the socket: its address, messages, sends and
 *                   receives with deadlines, who may be at the other end
 *   share-epochs.c  the NAME.epochs file: what makes a joiner's maps stale
 *   share-owner.c   the owner: listening, accepting, serving joiners'
 *                   requests (and fetching their misses through them)
 *   share-link.c    a joiner's link to its owner: the pool of sockets,
 *                   the watch, rejoining and taking over, one request
 *   share-direct.c  a joiner's own hits, from the shared files
 *   share-joiner.c  a joiner's object: joining, leaving, and its reads,
 *                   prefetches, writes and commits
 *
 * Several processes (one nbdkit per VM or per CI job) open the same
 * object: same cache directory, same key.  One of them holds it, as
 * before: it has the index's flock and the object's state in memory
 * (the owner).  The others join it: their object is a shell whose
 * misses, writes and flushes go to the owner over a Unix socket beside
 * the object's files (HASH.sock, sh_sock_addr), and the owner serves them
 * with the same code as its own clients' requests.  Hits a joiner
 * serves itself from the shared files, checked against maps of groups
 * the owner gives it and epochs the owner bumps (sh_direct_read).
 * So every rule of a single process holds for the host: a block
 * several processes miss at once is fetched once (the owner's claims,
 * retrieve.c), the cap and quotas hold for the object as a whole
 * (evict.c), a write through any process drops the blocks it touches
 * before it goes upstream (store.c), commits and counters are the
 * owner's.
 *
 * Why this design, of the three (docs/design.md, "One cache for the
 * whole host"): the state that makes the cache correct (present bits,
 * claims, checksums, the eviction policy, the dirty groups of the next
 * commit) lives in the owner's memory, under its locks, paged
 * (groups.c).  Putting it in shared memory would mean robust
 * cross-process locks around every structure and a second, shared
 * format for all of it; a daemon owning every object would put a
 * second process in every request even when one process is alone.
 * Here a process alone pays nothing, and a joiner pays a round trip
 * on a local socket per miss (and per map of a group).
 *
 * Trust (docs/design.md, "Trust model, deadlines and limits"): only
 * our own user or root, on either end (sh_check_peer); every wait on a
 * peer has a deadline (the hello, sends, a joiner's fetch: the claim
 * it holds is given back, fetch_from_joiner; a joiner's wait for its
 * owner), and everything a peer can make the owner hold is bounded
 * (connections, pending hellos, message sizes, ranges).  The deadlines
 * and limits are below, in one place.
 *
 * Which file defines each function declared here is said above its
 * declaration.  The files call each other in layers: wire and epochs
 * below the owner and the link, the link below the direct path, and
 * both below the joiner's object.
 */
#ifndef FSC_SHARE_INT_H
#define FSC_SHARE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "internal.h"

#define SHARE_MAGIC 0x46534831u         /* "FSH1" */
#define SHARE_VERSION 1
#define SHARE_MAX_COUNT (64u << 20)     /* nbdkit's largest request */
#define RETRY_MS 10                     /* between tries to rejoin */
#define RETRY_AFTER_MS 1000             /* after a wait that failed */
#define TAKEOVER_MS 2000                /* how long a request waits for
                                         * a new owner's socket */
#define EPOCH_SLOTS 65536               /* the epochs file: slot 0 for the
                                         * object, the others for groups
                                         * (hashed) */
#define NMAPS 1024                      /* group maps a joiner keeps */
#define REF_BATCH 256                   /* block numbers a joiner sends at
                                         * a time */
#define MAP_FRESH_MS 50                 /* a map showing a block absent
                                         * is taken again after this */

/* Deadlines and limits: what a peer of the share socket can make the
 * other end wait for or hold (docs/design.md, "One cache for the whole
 * host", the trust model).
 */
#define HELLO_MS 2000                   /* a connection's hello, and the
                                         * welcome to it */
#define SEND_MS 10000                   /* a peer that reads nothing */
#define FETCH_FLOOR_MS 2000             /* a joiner's fetch: at least this
                                         * or 4 times the slowest recent
                                         * latency, ... */
#define FETCH_FLOOR_MS_PER_MIB 1000     /* ...plus per MiB at least this
                                         * (1 MiB/s) or 4 times the
                                         * slowest recent time per MiB */
#define FETCH_SLOW_FACTOR 4
#define FETCH_SLOW_CAP_MS 60000         /* how far timeouts raise them */
#define REPLY_MS 60000                  /* a joiner waits for its owner's
                                         * next message at most this */
#define MAX_CONNS 1024                  /* share sockets an owner serves */
#define MAX_PENDING 32                  /* of which not past their hello */
#define JOIN_MAX_CONNS 64               /* sockets a joiner opens to its
                                         * owner: more requests wait */
#define MAX_REF_BLOCKS REF_BATCH        /* blocks in one hit report */
#define MAX_REF_REQUESTS 65536          /* hits counted in one report */

/* The messages (share-wire.c; docs/format.md, "The share socket"). */
enum {
  MSG_HELLO = 1,        /* J->O: struct hello, key, generation */
  MSG_WELCOME,          /* O->J: err = 0 or an FSC_REJ_* reason;
                         * struct welcome */
  MSG_READ,             /* J->O: offset, count, flags */
  MSG_PREFETCH,         /* J->O: offset, count, flags */
  MSG_WBEGIN,           /* J->O: offset, count, flags (FSC_WRITE_*) */
  MSG_WEND,             /* J->O: flags WEND_*, data if WEND_DATA */
  MSG_COMMIT,           /* J->O */
  MSG_FETCH,            /* O->J: read offset, count upstream */
  MSG_FETCHED,          /* J->O: err, or count bytes */
  MSG_DONE,             /* O->J: err; a READ's data, a MAP's map */
  MSG_MAP,              /* J->O: the map of group offset */
  MSG_REF,              /* J->O: hits served here: u64 requests, u64
                         * bytes, then u64 block numbers */
};
#define WEND_OK   1u    /* the upstream write succeeded */
#define WEND_DATA 2u    /* the written data follows (else: zeroes) */
#define DONE_HIT  1u    /* a READ served from the cache: a joiner's map
                         * that showed it absent is out of date */

struct msg {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint32_t count;
  int32_t err;
  uint64_t offset;
};

struct hello {
  uint32_t version;
  uint32_t block_size;
  uint64_t size;
  uint64_t fingerprint;
  int32_t validate;
  int32_t pid;
  uint32_t key_len;
  uint32_t gen_len;
};

struct welcome {
  int32_t pid;                  /* the owner's */
  uint32_t block_size;          /* the owner's settings, for messages */
  int32_t validate;
  uint32_t pad;
  uint64_t present_blocks;
};

/* A group's map, for a joiner's own hits: what was present, with
 * the epochs read before it was taken.
 */
struct gmap {
  uint64_t gi;                  /* UINT64_MAX: empty slot */
  uint32_t epoch;               /* the object's (slot 0) */
  uint32_t gepoch;              /* the group's slot */
  uint64_t present;
  uint64_t zero;
  uint64_t csum[FSC_GROUP_BLOCKS];
  uint16_t pieces[FSC_GROUP_BLOCKS];
  uint64_t taken_ms;            /* joiner's: when it came */
};

/* The owner's side (share-owner.c): a listening socket, and a thread
 * per joiner's socket.
 */
struct share_conn {
  struct share_conn *next;
  int fd;
};

struct share_server {
  uint32_t *ep;                 /* the epochs file, mapped */
  uint64_t slow_ms;             /* the slowest recent joiner's fetch of
                                 * up to 1 MiB (decaying) ... */
  uint64_t slow_ms_per_mib;     /* ... and per MiB of larger ones: for
                                 * fetch_deadline; under lock */
  long refused_uid;             /* the last other user refused, or -1 */
  int lfd;
  pthread_t listener;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stopping;
  unsigned nconns;
  unsigned npending;            /* of nconns, still before the hello */
  struct share_conn *conns;
};

/* The joiner's side (share-link.c, share-direct.c, share-joiner.c). */
struct fsc_join {
  pthread_mutex_t lock;         /* the pool, broken, local */
  int *idle;                    /* sockets with no request in flight */
  size_t nidle, cap;
  unsigned nbusy;               /* sockets with a request in flight */
  pthread_cond_t freed;         /* one of them came back */
  bool broken;                  /* the owner went away */
  uint64_t retry_at;            /* ms: next try to rejoin or take over */
  struct fsc_object *local;     /* taken over: forward to it */
  struct fsc_object_params p;   /* ours, for rejoining and taking over */
  const uint32_t *ep;           /* the epochs file, mapped, or NULL */
  uint64_t refs[REF_BATCH];     /* blocks hit here, not yet reported */
  unsigned nrefs;
  uint64_t hit_requests, hit_bytes;     /* the same, counted */
  struct gmap *maps;            /* NMAPS, by group number; under lock */
  bool files;                   /* the data and sums files are open */
  bool direct_off;              /* the files are not the owner's now */
  dev_t ids[6];                 /* the files' (device, inode) pairs */
  int watch;                    /* a socket to the owner that carries no
                                 * request: it ends when the owner does
                                 * (sh_owner_alive_locked), or -1 */
  uint32_t *seen;               /* EPOCH_SLOTS: the highest epoch seen in
                                 * each slot, to tell a rollback */
};

/* share-wire.c: the socket and its messages. */
extern int sh_sock_addr (const struct fsc_object *o, struct sockaddr_un *sa,
                         char *name, size_t namelen);
extern int sh_send_all (int fd, const void *buf, size_t len);
extern int sh_recv_all_until (int fd, void *buf, size_t len,
                              uint64_t deadline);
extern int sh_recv_all (int fd, void *buf, size_t len);
extern void sh_set_send_timeout (int fd);
extern int sh_check_peer (int fd, uid_t *uid);
extern int sh_send_msg (int fd, unsigned type, unsigned flags,
                        uint32_t count, int err, uint64_t offset,
                        const void *payload, size_t plen);
extern int sh_recv_msg (int fd, struct msg *m);
extern int sh_recv_msg_until (int fd, struct msg *m, uint64_t deadline);

/* share-epochs.c: the epochs file. */
extern uint32_t *sh_map_epochs (struct fsc_object *o, bool writable,
                                bool create);
extern void sh_ensure_epochs (struct fsc_object *o);

/* The slot of group GI in the epochs file. */
static inline size_t
sh_slot_of (uint64_t gi)
{
  return 1 + gi % (EPOCH_SLOTS - 1);
}

/* share-link.c: a joiner's link to its owner. */
extern bool sh_owner_alive_locked (struct fsc_join *j);
extern int sh_join_connect (struct fsc_object *o,
                            const struct fsc_object_params *p, int *reason,
                            struct welcome *wel);
extern bool sh_file_ids (struct fsc_object *o, dev_t ids[6]);
extern int sh_get_conn (struct fsc_object *o, struct fsc_object **local);
extern void sh_put_conn (struct fsc_object *o, int fd, bool ok);
extern int sh_run (struct fsc_object *o, int fd, unsigned type,
                   unsigned flags, uint64_t offset, uint32_t count,
                   const void *payload, uint32_t plen, void *buf,
                   const struct fsc_upstream *up, int *err,
                   unsigned *dflags);

/* share-direct.c: a joiner's own hits. */
enum direct { DIRECT_SERVED, DIRECT_ABSENT, DIRECT_NO };
extern void sh_setup_direct (struct fsc_object *o, struct fsc_join *j);
extern enum direct sh_direct_read (struct fsc_object *o, void *buf,
                                   uint32_t count, uint64_t offset,
                                   unsigned flags);
extern void sh_report_hits (struct fsc_object *o, bool force);
extern void sh_forget_maps (struct fsc_object *o, uint64_t offset,
                            uint32_t count);

#endif /* FSC_SHARE_INT_H */
