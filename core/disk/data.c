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
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

int
fsc_data_open (struct fsc_object *o, bool *sizes_ok)
{
  o->files.nseg = fsc_seg_count (o->geom.size);
  o->files.dfds = malloc (o->files.nseg * sizeof *o->files.dfds);
  o->files.seg_dirty = calloc (o->files.nseg, 1);
  if (o->files.dfds == NULL || o->files.seg_dirty == NULL)
    return -1;
  for (uint64_t i = 0; i < o->files.nseg; ++i)
    o->files.dfds[i] = -1;
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
  free (o->files.dfds);
  free (o->files.seg_dirty);
  o->files.dfds = NULL;
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
    if (fsc_io_pwrite (&o->cache->io, FSC_FILE_DATA, o->files.dfds[i],
                       (const char *) buf + done, len,
                       pos % FSC_SEG_SIZE) == -1)
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
