# A streaming, checking reader: the whole export in order, 16 reads of
# 256 KiB in flight on one libnbd connection, each compared with IMAGE
# as it arrives.
#
#   stream-reader.py URI IMAGE
#
# Prints the seconds the reads took, from the first request to the last
# reply (the connection's open is not counted); exits non-zero, naming
# the first, if a read failed or differed from IMAGE.
import mmap
import sys
import time

import nbd

uri, img_path = sys.argv[1:]
f = open(img_path, "rb")
img = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
bufs = {}
bad = []


def done(off, err):
    b = bufs.pop(off)
    if err.value:
        bad.append("read at %d failed: %d" % (off, err.value))
    elif b.to_bytearray() != img[off:off + b.size()]:
        bad.append("read at %d differs from the image" % off)
    return 1


t0 = time.monotonic()
off = 0
while off < size or h.aio_in_flight() > 0:
    while off < size and h.aio_in_flight() < 16:
        n = min(256 * 1024, size - off)
        bufs[off] = nbd.Buffer(n)
        h.aio_pread(bufs[off], off,
                    completion=lambda err, o=off: done(o, err))
        off += n
    h.poll(-1)
print("%.2f" % (time.monotonic() - t0))
h.shutdown()
if bad:
    sys.exit("%d bad reads, first: %s" % (len(bad), bad[0]))
