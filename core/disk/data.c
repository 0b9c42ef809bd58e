/* libfscache: an object's data, in segment files.
 *
 * The data of an object is the export's bytes at their own offsets,
 * holes meaning "not cached" (docs/format.md).  One file per object
 * would stop at the file system's largest file: 16 TiB on ext4 with
 * 4 KiB blocks, which an EBS volume exceeds.  So the data is always
 * split into segments of FSC_SEG_SIZE (1 TiB) bytes: segment 0 is
 * NAME.data, segment i >= 1 is NAME.data.i, and each is exactly as
 * long as its share of the export.  Always, and at a fixed size,
 * rather than only when a file system refuses a size: the layout then
 * depends on the export alone, a cache moved between file systems
 * stays valid, and every export up to 1 TiB (nearly all) keeps the
 * single NAME.data it always had.  Blocks (at most 64 MiB, aligned)
 * never straddle a segment; runs of blocks may, and the calls here
 * split them.
 *
 * Every read, write and sync goes through io.c (fault injection and
 * tracing; a trace names the offset within the segment, which for
 * every export up to 1 TiB is the export offset).
 *
 * Big writes bypass the page cache.  Each segment is also opened with
 * O_DIRECT, and a write of FSC_DIRECT_MIN (64 KiB: a block of the
 * default size, a miss run of whole blocks, a readahead chunk) or
 * more, aligned to 4 KiB in memory, offset and length (fills of whole
 * blocks from the buffers of bufs.c always are, and so are the
 * writeback writer's copies of what it drained, from the same buffers
 * since stop 57), goes through that descriptor.  A buffered
 * write copies every byte into the page cache: a fill thread
 * streaming 1 MiB blocks spent half its process's CPU in that copy
 * (perf: copy_folio_from_iter_atomic under ext4's buffered write),
 * the kernel's writeback then wrote it out again, and a cold stream
 * from a fast upstream waited on that one thread (issues 42 and 44,
 * docs/benchmarks.md).  A direct write moves the bytes to the disk
 * with no copy and no dirty pages to flush later; and the page cache
 * keeps what clients read again rather than what was only filled.
 * Smaller writes (pieces, caches of 4 KiB blocks) stay buffered: a
 * thread writing them directly waits a disk round trip each (fio,
 * psync, random writes on this machine's disk: 60 MB/s at 4 KiB, 211
 * at 16 KiB, 549 at 64 KiB, 2,073 at 1 MiB; 538 buffered at 4 KiB),
 * where the page cache batches them.  From 64 KiB, with the fill
 * threads (fill.c, FSC_FILLERS) writing that many at once, a random
 * read from a fast upstream ran at 0.93 of the bare proxy against 0.85
 * from 256 KiB (tools/bench/fastup.sh, stop 58): the copies of its
 * buffered 64 KiB fills were 7% of the machine's CPU.  (From 64 KiB
 * with one fill thread, behind a cache disk slower than its link,
 * tests/filter/test-fscache-slow-disk.sh, one run stored only the fill
 * budget's burst: the direct writes waited on the device one by one,
 * and the fill meter took that for the disk's speed.)
 * Coherency holds across the two descriptors: a direct write flushes
 * and drops the page cache's copy of its range (the kernel's rule for
 * O_DIRECT), and a block is read only once its fill has returned;
 * commit.c's sync is per file, not per descriptor, so rule 1 (data
 * before the records) is unchanged.  A file system that refuses
 * O_DIRECT at open (or a write of it with EINVAL) leaves the object
 * buffered.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "utils.h"

static uint64_t
seg_len (const struct fsc_object *o, uint64_t i)
{
  return MIN (FSC_SEG_SIZE, o->geom.size - i * FSC_SEG_SIZE);
}

/* The segment SUFFIX, whose buffered descriptor's stat is ST, opened
 * again with O_DIRECT; -1 if the file system refuses it, or if the
 * name now holds another file (renamed over between the two opens:
 * writes must go to the file the object holds).
 */
static int
open_direct (const struct fsc_files *f, const char *suffix,
             const struct stat *st)
{
  struct stat dst;
  int fd = fsc_open_file_flags (f, suffix, O_RDWR | O_DIRECT);
  if (fd == -1)
    return -1;
  if (fstat (fd, &dst) == -1 ||
      dst.st_ino != st->st_ino || dst.st_dev != st->st_dev) {
    close (fd);
    return -1;
  }
  return fd;
}

int
fsc_data_open (struct fsc_object *o, bool *sizes_ok)
{
  o->files.nseg = fsc_seg_count (o->geom.size);
  o->files.direct_off = false;
  o->files.dfds = malloc (o->files.nseg * sizeof *o->files.dfds);
  o->files.ddfds = malloc (o->files.nseg * sizeof *o->files.ddfds);
  o->files.seg_dirty = calloc (o->files.nseg, 1);
  if (o->files.dfds == NULL || o->files.ddfds == NULL ||
      o->files.seg_dirty == NULL)
    return -1;
  for (uint64_t i = 0; i < o->files.nseg; ++i)
    o->files.dfds[i] = o->files.ddfds[i] = -1;
  *sizes_ok = true;
  for (uint64_t i = 0; i < o->files.nseg; ++i) {
    char suffix[FSC_SEG_SUFFIX_MAX];
    struct stat st;
    fsc_seg_suffix (i, suffix);
    o->files.dfds[i] = fsc_open_file (&o->files, suffix);
    if (o->files.dfds[i] == -1 || fstat (o->files.dfds[i], &st) == -1)
      return -1;
    if ((uint64_t) st.st_size != (o->geom.size ? seg_len (o, i) : 0))
      *sizes_ok = false;
    o->files.ddfds[i] = open_direct (&o->files, suffix, &st);
  }
  return 0;
}

int
fsc_data_reset (struct fsc_object *o)
{
  for (uint64_t i = 0; i < o->files.nseg; ++i) {
    uint64_t len = o->geom.size ? seg_len (o, i) : 0;
    if (ftruncate (o->files.dfds[i], 0) == -1 ||
        ftruncate (o->files.dfds[i], (off_t) len) == -1 ||
        fsync (o->files.dfds[i]) == -1)
      return -1;
  }
  return 0;
}

void
fsc_data_close (struct fsc_object *o)
{
  for (uint64_t i = 0; o->files.dfds && i < o->files.nseg; ++i)
    if (o->files.dfds[i] >= 0)
      close (o->files.dfds[i]);
  for (uint64_t i = 0; o->files.ddfds && i < o->files.nseg; ++i)
    if (o->files.ddfds[i] >= 0)
      close (o->files.ddfds[i]);
  free (o->files.dfds);
  free (o->files.ddfds);
  free (o->files.seg_dirty);
  o->files.dfds = o->files.ddfds = NULL;
  o->files.seg_dirty = NULL;
}

ssize_t
fsc_data_pread (struct fsc_object *o, void *buf, size_t n, uint64_t off)
{
  return fsc_segs_pread (&o->cache->io, &o->files, buf, n, off);
}

ssize_t
fsc_segs_pread (struct fsc_io *io, const struct fsc_files *f, void *buf,
                size_t n, uint64_t off)
{
  size_t done = 0;
  while (done < n) {
    uint64_t pos = off + done, i = pos / FSC_SEG_SIZE;
    if (i >= f->nseg)
      break;
    size_t len = MIN (n - done, FSC_SEG_SIZE - pos % FSC_SEG_SIZE);
    ssize_t r = fsc_io_pread (io, FSC_FILE_DATA, f->dfds[i],
                              (char *) buf + done, len, pos % FSC_SEG_SIZE);
    if (r == -1)
      return -1;
    done += r;
    if ((size_t) r < len)
      break;
  }
  return done;
}

/* Write LEN bytes at P to segment I at OFF: directly when it is big
 * and aligned enough (the top of this file), else through the page
 * cache.  A direct write the file system refuses (EINVAL: an alignment
 * it wants bigger than FSC_DIRECT_ALIGN) is written buffered, and so are
 * all later ones of the object.
 */
static int
write_seg (struct fsc_object *o, uint64_t i, const char *p, size_t len,
           uint64_t off)
{
  int dfd = o->files.ddfds[i];
  if (dfd >= 0 && len >= o->cache->direct_min &&
      (((uintptr_t) p | off | len) & (FSC_DIRECT_ALIGN - 1)) == 0 &&
      !__atomic_load_n (&o->files.direct_off, __ATOMIC_RELAXED)) {
    if (fsc_io_pwrite (&o->cache->io, FSC_FILE_DATA, dfd, p, len, off) == 0)
      return 0;
    if (errno != EINVAL)
      return -1;
    __atomic_store_n (&o->files.direct_off, true, __ATOMIC_RELAXED);
  }
  return fsc_io_pwrite (&o->cache->io, FSC_FILE_DATA, o->files.dfds[i],
                        p, len, off);
}

int
fsc_data_pwrite (struct fsc_object *o, const void *buf, size_t n,
                 uint64_t off)
{
  size_t done = 0;
  if (fsc_object_mark_in_use (o) == -1) {
    errno = EIO;
    return -1;
  }
  while (done < n) {
    uint64_t pos = off + done, i = pos / FSC_SEG_SIZE;
    if (i >= o->files.nseg) {
      errno = EFBIG;
      return -1;
    }
    size_t len = MIN (n - done, FSC_SEG_SIZE - pos % FSC_SEG_SIZE);
    const char *p = (const char *) buf + done;
    if (write_seg (o, i, p, len, pos % FSC_SEG_SIZE) == -1)
      return -1;
    /* Marked only once written: a sync that takes the mark after this
     * covers these bytes (rule 1, commit.c: data before the records
     * that name it).  Marked before the write, a sync could take the
     * mark, finish before the write, and the next sync skip it.
     */
    __atomic_store_n (&o->files.seg_dirty[i], 1, __ATOMIC_RELEASE);
    done += len;
  }
  return 0;
}

int
fsc_data_sync (struct fsc_object *o)
{
  for (uint64_t i = 0; i < o->files.nseg; ++i) {
    if (!__atomic_exchange_n (&o->files.seg_dirty[i], 0, __ATOMIC_ACQ_REL))
      continue;
    if (fsc_io_sync (&o->cache->io, FSC_FILE_DATA, o->files.dfds[i]) == -1) {
      __atomic_store_n (&o->files.seg_dirty[i], 1, __ATOMIC_RELAXED);
      return -1;
    }
  }
  return 0;
}

int
fsc_data_punch (struct fsc_object *o, uint64_t off, uint64_t len)
{
  /* (Every punch of the sums file follows one of the data file.) */
  if (len > 0 && fsc_object_mark_in_use (o) == -1) {
    errno = EIO;
    return -1;
  }
  return fsc_segs_punch (&o->files, off, len);
}

int
fsc_segs_punch (const struct fsc_files *f, uint64_t off, uint64_t len)
{
  while (len > 0) {
    uint64_t i = off / FSC_SEG_SIZE;
    uint64_t n = MIN (len, FSC_SEG_SIZE - off % FSC_SEG_SIZE);
    if (i >= f->nseg)
      return 0;
    if (punch_hole (f->dfds[i], off % FSC_SEG_SIZE, n) == -1)
      return -1;
    off += n;
    len -= n;
  }
  return 0;
}

uint64_t
fsc_data_allocated (const struct fsc_object *o)
{
  uint64_t total = 0;
  for (uint64_t i = 0; o->files.dfds && i < o->files.nseg; ++i)
    total += fd_allocated (o->files.dfds[i]);
  return total;
}
