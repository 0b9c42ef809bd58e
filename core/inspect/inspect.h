/* libfscache: looking at one object's files from outside, for tools
 * (nbd-fscache ls, stat, check).
 *
 * The filter opens an object with fsc_object_open, which checks its
 * index against the parameters and, if anything does not match,
 * discards it and starts it cold.  A tool must not: it has no key or
 * parameters, and looking must change nothing.  So this opens the
 * files of an object by NAME in its fan-out directory, loads the
 * superblock (both slots, the newest valid one wins) and the group
 * records (the newest valid slot of each group, of the superblock's
 * incarnation) with the same decoders as the filter (index.c), and
 * verifies blocks with the same checksum functions (sums.c).  Nothing
 * is written, except by fsc_inspect_drop (check --repair), which
 * follows commit.c's rules: the new record goes into the slot that
 * does not hold the newest version, with the next sequence number,
 * and the index is synced before the dropped blocks' space is
 * punched, so that no durable record ever names punched data.
 *
 * Nothing here locks the object (fsc_inspect_lock does, on request):
 * a process using it may change the files while they are read, and
 * a check of an object in use can report what was only a race.
 */
#ifndef FSC_INSPECT_H
#define FSC_INSPECT_H

#include <stdbool.h>
#include <stdint.h>

#include "index.h"

struct fsc_inspect;

/* What fsc_inspect_open found. */
struct fsc_inspect_info {
  int reason;                   /* FSC_OK, or why the index would be
                                 * discarded on its own (enum fsc_reason;
                                 * FSC_REJ_BLOCK_SIZE: a block size no
                                 * filter uses).  If not FSC_OK, only
                                 * slot_reason, idx_size, allocated and
                                 * stale mean anything */
  int slot_reason[2];           /* each superblock slot's verdict */
  int sb_slot;                  /* the slot that won */
  struct fsc_sb sb;             /* its contents */
  uint64_t idx_size;            /* NAME.idx's length */
  uint64_t ngroups;
  uint64_t records;             /* groups with a valid record */
  uint64_t damaged_groups;      /* groups with bytes in the index but no
                                 * valid record of this incarnation: their
                                 * blocks are lost (not served) */
  uint64_t present_blocks;      /* as the filter would load them */
  uint64_t cached_bytes;        /* the bytes those blocks hold */
  uint64_t bad_pieces;          /* present blocks with pieces they cannot
                                 * have, or a zero mark they cannot
                                 * have (with pieces, or a checksum not
                                 * that of zeroes): dropped on load,
                                 * never served */
  uint64_t zero_blocks;         /* of present_blocks, zero blocks (no
                                 * data, docs/format.md) */
  uint64_t nseg;                /* data segments (NAME.data, .data.I) */
  uint64_t bad_segments;        /* of them missing, not ours, or of the
                                 * wrong length (data-file-size) */
  bool sums_ok;                 /* NAME.sums ours, of the right length */
  bool stale;                   /* NAME.stale exists */
  uint64_t allocated;           /* bytes NAME.idx, .data*, .sums allocate */
};

/* Open object NAME (without suffix) in the fan-out directory FANDIRFD,
 * read-only, or with WRITABLE for fsc_inspect_drop, and fill *INFO.
 * An index that is not valid is not an error (INFO->reason says why).
 * Returns 0 and *INSP, or -1 with errno: ENOENT (no NAME.idx), EPERM
 * (not our regular file with one link, or a symlink), ENOMEM, or an
 * I/O error.  Never creates, truncates or rewrites anything.
 */
extern int fsc_inspect_open (int fandirfd, const char *name, bool writable,
                             struct fsc_inspect **insp,
                             struct fsc_inspect_info *info);

extern void fsc_inspect_close (struct fsc_inspect *ins);

/* Take the object's lock as the filter and the daemon do (an exclusive
 * flock on NAME.idx, not waiting).  0, or -1 with errno (EWOULDBLOCK:
 * a running process holds the object).  Released by fsc_inspect_close.
 */
extern int fsc_inspect_lock (struct fsc_inspect *ins);

/* Called by fsc_inspect_groups for each group with a valid record: the
 * newest valid slot's record in REC (present bits past the export's
 * end already cleared), that slot in SLOT.  Return -1 to stop.
 */
typedef int (*fsc_inspect_group_fn) (void *opaque,
                                     const struct fsc_grec *rec, int slot);

/* Call FN for each group with a valid record, in order.  Only with
 * INFO->reason FSC_OK.  0, or -1 with errno (or if FN returned -1).
 */
extern int fsc_inspect_groups (struct fsc_inspect *ins,
                               fsc_inspect_group_fn fn, void *opaque);

/* The groups fsc_inspect_open counted in damaged_groups, at most N of
 * them into GROUPS; returns how many.
 */
extern uint64_t fsc_inspect_damaged (const struct fsc_inspect *ins,
                                     uint64_t *groups, uint64_t n);

/* Block I of REC as the filter loads it: false if it is not present,
 * or its pieces are ones it cannot have, or it is marked zero with
 * pieces or a checksum other than that of zeroes (damage: the filter
 * drops it); else true and *PIECES (0: whole), *ZERO (a zero block:
 * all zeroes, nothing in the data file) and *BYTES, the bytes it holds
 * in the data file.
 */
extern bool fsc_inspect_block (const struct fsc_inspect *ins,
                               const struct fsc_grec *rec, unsigned i,
                               unsigned *pieces, bool *zero,
                               uint64_t *bytes);

/* Export offset and length of block B. */
extern void fsc_inspect_block_range (const struct fsc_inspect *ins,
                                     uint64_t b, uint64_t *off,
                                     uint64_t *len);

/* Results of fsc_inspect_verify, a bit mask. */
#define FSC_INSPECT_BAD_DATA 1  /* the data does not give the checksum */
#define FSC_INSPECT_BAD_SUMS 2  /* the sums file's sub-block hashes do not
                                 * give it (partial hits would fail) */

/* Verify present block B, whose record says CSUM and PIECES, exactly
 * as a hit does: hash the bytes of the pieces it holds from the data
 * file, and its sub-block hashes from the sums file; for a zero block
 * (ZERO), only compare CSUM with the checksum of zeroes, reading
 * nothing.  Returns 0 (both give CSUM), a mask of FSC_INSPECT_BAD_*,
 * or -1 with errno (a read failed).
 */
extern int fsc_inspect_verify (struct fsc_inspect *ins, uint64_t b,
                               uint64_t csum, unsigned pieces, bool zero);

/* Drop the blocks BITS of group REC->group, whose newest record is
 * REC in SLOT (REC NULL and SLOT -1: a group without a valid record,
 * which gets an empty one): write the record without them into the
 * other slot with the next sequence number and sync the index, then
 * punch their data and sums.  Needs WRITABLE.  0, or -1 with errno.
 */
extern int fsc_inspect_drop (struct fsc_inspect *ins,
                             const struct fsc_grec *rec, int slot,
                             uint64_t group, uint64_t bits);

#endif /* FSC_INSPECT_H */
