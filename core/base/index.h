/* libfscache: the on-disk index of one object (docs/format.md).
 *
 * An object's index file holds two superblock slots and then two
 * record slots per group of FSC_GROUP_BLOCKS blocks:
 *
 *   0      superblock slot 0 (FSC_SB_SIZE bytes)
 *   4096   superblock slot 1
 *   8192   group 0 slot 0, group 0 slot 1, group 1 slot 0, ...
 *          (each FSC_GREC_SIZE bytes)
 *
 * Every superblock and group record carries a magic, a sequence number
 * and an XXH3-64 checksum of its own bytes, all little-endian.  An
 * update always writes the slot that does not hold the newest valid
 * version, so a crash or a torn write at any moment leaves the other,
 * complete version; a reload picks the newest valid slot of each.
 * Records of groups with nothing ever cached are holes.
 *
 * This file only encodes, decodes and validates; object.c decides
 * what to write and when.
 */
#ifndef FSC_INDEX_H
#define FSC_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "io.h"
#include "ostats.h"

#define FSC_INDEX_VERSION 3     /* saved on disk; 2 added pieces, 3
                                 * zero blocks */
#define FSC_INDEX_VERSION_MIN 1 /* oldest still read: a version 1
                                 * index is a version 2 index with
                                 * every present block whole, a
                                 * version 2 one a version 3 index
                                 * without zero blocks */
#define FSC_SB_SIZE 4096
#define FSC_GROUP_BLOCKS 64
#define FSC_GREC_SIZE 1024
#define FSC_GROUPS_OFFSET ((uint64_t) 2 * FSC_SB_SIZE)
#define FSC_GEN_MAX 255         /* longest fscache-generation */
#define FSC_INDEX_BLOCK_MAX (4u << 20)  /* largest block size read: what
                                         * the sums code holds (and the
                                         * filter accepts) */
#define FSC_SB_KEY_PREFIX 3072  /* key bytes kept for tools */
#define FSC_LABEL_MAX 255       /* what the object caches, for people */
#define FSC_SEQ_MAX (UINT64_C (1) << 62)  /* larger sequence numbers are
                                           * rejected as forged */

/* Superblock flags, saved on disk. */
#define FSC_SB_CLEAN    1u      /* closed cleanly, nothing pending */
#define FSC_SB_FP_STALE 2u      /* written through: fingerprint unknown */
#define FSC_SB_WRITTEN  4u      /* written through since it was created
                                 * (this generation's copy): a fleet's
                                 * peers may hold older ranges */

/* Coherency modes (fscache-validate), saved on disk. */
enum fsc_validate {
  FSC_VALIDATE_NONE = 0,
  FSC_VALIDATE_SIZE = 1,
  FSC_VALIDATE_SAMPLE = 2,
};

/* Why an index, or a whole object, was not trusted.  Saved on disk as
 * an object's last invalidation reason (docs/format.md, "Object
 * counters"): append only; keep fsc_reason_name in step.
 */
enum fsc_reason {
  FSC_OK = 0,
  FSC_REJ_NEW,              /* no index yet: created cold */
  FSC_REJ_SHORT,            /* truncated superblock */
  FSC_REJ_MAGIC,            /* not an fscache index */
  FSC_REJ_CHECKSUM,         /* neither slot has a valid checksum */
  FSC_REJ_VERSION,          /* written by a newer format */
  FSC_REJ_GEOMETRY,         /* impossible sizes or counts */
  FSC_REJ_KEY,              /* belongs to another key */
  FSC_REJ_BLOCK_SIZE,       /* block size differs from the parameter */
  FSC_REJ_DATA_SIZE,        /* data file has the wrong size */
  FSC_REJ_UPSTREAM_SIZE,    /* coherency: upstream size changed */
  FSC_REJ_GENERATION,       /* coherency: fscache-generation changed */
  FSC_REJ_FINGERPRINT,      /* coherency: sampled blocks changed */
  FSC_REJ_FP_STALE,         /* coherency: writes not closed cleanly */
  FSC_REJ_VALIDATE,         /* coherency: validate mode changed */
  FSC_REJ_IO,               /* could not read the index */
  FSC_REJ_FOREIGN,          /* another process wrote upstream while
                             * this object was locked by us */
  FSC_REJ_INVALIDATED,      /* discarded by nbd-fscache invalidate */
  FSC_REASONS
};

/* A short, stable name for REASON (for logs and stats). */
extern const char *fsc_reason_name (int reason);

struct fsc_sb {
  uint32_t version;               /* as found on disk; always written as
                                   * FSC_INDEX_VERSION */
  uint64_t seq;
  uint32_t block_size;
  uint32_t flags;                 /* FSC_SB_* */
  uint64_t size;                  /* upstream size in bytes */
  uint64_t nblocks;
  uint64_t incarnation;           /* random, new each time the object
                                   * is created cold */
  uint64_t key_hash_lo, key_hash_hi;
  uint32_t key_len;
  uint64_t created;               /* unix time */
  uint32_t validate;              /* enum fsc_validate */
  uint64_t fingerprint;
  uint32_t gen_len;
  char generation[FSC_GEN_MAX + 1];
  uint32_t key_prefix_len;
  unsigned char key_prefix[FSC_SB_KEY_PREFIX];
  /* What the object caches, for people (the plugin and the parameter
   * that names the image, no secrets: the filter's label.c): kept at
   * the end of the key prefix's field, which the key then leaves
   * free (added within version 3: builds before it leave zeros
   * there, read as no label).  "" when none.
   */
  char label[FSC_LABEL_MAX + 1];
  /* Object counters (ostats.h): NCOUNTERS of them were on disk (0 for
   * an index written before they existed), as of COUNTERS_TIME (unix
   * seconds).  Always written as FSC_OSTATS_COUNT, or more if a newer
   * build left more (kept as they were).
   */
  uint32_t ncounters;
  uint64_t counters_time;
  struct fsc_ostats ostats;
};

struct fsc_grec {
  uint64_t group;
  uint64_t seq;
  uint64_t incarnation;
  uint64_t present;               /* bit i: block group*64+i present */
  uint64_t csum[FSC_GROUP_BLOCKS];  /* XXH3-64 of each present block */
  uint16_t pieces[FSC_GROUP_BLOCKS];  /* of a present block, the pieces
                                       * held (bit j: piece j); 0 means
                                       * the whole block */
  uint64_t zero;                  /* bit i: block group*64+i is present
                                   * and all zeroes, a hole in the data
                                   * file never read (version 3; older
                                   * versions wrote 0 there) */
};

/* Encode SB into BUF (FSC_SB_SIZE bytes), checksum included. */
extern void fsc_sb_encode (const struct fsc_sb *sb, unsigned char *buf);

/* Decode and validate one superblock slot.  Returns FSC_OK or the
 * reason it is invalid.
 */
extern int fsc_sb_decode (const unsigned char *buf, struct fsc_sb *sb);

/* Read both superblock slots of FD; on success fill SB with the newest
 * valid one, set *SLOT to its slot and return FSC_OK.  Otherwise
 * return the reason (the worse of the two slots').
 */
extern int fsc_sb_load (struct fsc_io *io, int fd, struct fsc_sb *sb,
                        int *slot);

/* Encode a group record into BUF (FSC_GREC_SIZE bytes). */
extern void fsc_grec_encode (const struct fsc_grec *g, unsigned char *buf);

/* Decode and validate one group record slot.  Returns true if valid. */
extern bool fsc_grec_decode (const unsigned char *buf, struct fsc_grec *g);

/* Of the two slots of group GROUP at BUF (2 * FSC_GREC_SIZE bytes),
 * the newest valid one of INCARNATION and that group: its number, its
 * contents in G; or -1 if neither is.
 */
extern int fsc_grec_pick (const unsigned char *buf, uint64_t group,
                          uint64_t incarnation, struct fsc_grec *g);

/* File offset of group GROUP's slot SLOT. */
static inline uint64_t
fsc_grec_offset (uint64_t group, int slot)
{
  return FSC_GROUPS_OFFSET + group * 2 * FSC_GREC_SIZE
    + (uint64_t) slot * FSC_GREC_SIZE;
}

/* Called by fsc_grec_scan for each group with a valid record: the
 * newest valid slot's contents in G, that slot in SLOT.  Return -1 to
 * stop the scan.
 */
typedef int (*fsc_grec_fn) (void *opaque, const struct fsc_grec *g,
                            int slot);

/* Scan the group records of FD for NGROUPS groups, skipping holes, and
 * call FN for each group whose newest valid record belongs to
 * INCARNATION and to that group.  Returns 0, or -1 with errno on an
 * I/O error or if FN returned -1.
 */
extern int fsc_grec_scan (struct fsc_io *io, int fd, uint64_t ngroups,
                          uint64_t incarnation, fsc_grec_fn fn,
                          void *opaque);

#endif /* FSC_INDEX_H */
