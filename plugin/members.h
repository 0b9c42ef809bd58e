/* nbdkit-fscache-filter: the fleet's membership (members.c). */
#ifndef FSC_PLUGIN_MEMBERS_H
#define FSC_PLUGIN_MEMBERS_H

#include <stddef.h>
#include <stdint.h>

struct fsc_cache;

struct member {
  char *uri;                    /* as in the file */
  char *dial;                   /* what libnbd is given (nbds with PSK) */
  uint64_t seed;                /* the URI's hash */
};

/* A snapshot of the membership, replaced whole. */
struct members {
  unsigned refs;                /* under the membership's lock */
  size_t n;
  long self;                    /* our index, or -1 */
  struct member m[];
};

/* .config_complete: read fscache-peers (or resolve its name); 0, or
 * -1 (said).  members_bind: the cache whose peers_known gauge follows
 * the membership.  members_stop: drop it all (.cleanup).
 */
extern int members_start (void);
extern void members_bind (struct fsc_cache *cache);
extern void members_stop (void);

/* The snapshot in use, with a reference (NULL: none), read again first
 * if due and changed.  members_ref takes one more reference,
 * members_put drops one (NULL: nothing).
 */
extern struct members *members_get (void);
extern void members_ref (struct members *ms);
extern void members_put (struct members *ms);

#endif /* FSC_PLUGIN_MEMBERS_H */
