# nbd-fscache tests: a writing client for the writeback tests
# (tests/test-wb-*.sh) that keeps its own model of the export.
#
#   wb-client.py URI IMAGE OUT SEED [OPTIONS]
#
# The model starts as IMAGE (the export's content before this client
# writes) and follows every write and zero this client makes; each is
# read back at once and compared with the model, and any error or
# difference exits non-zero.  At the end the client flushes, reads its
# whole region back, compares it, and writes the model (the whole
# export) to OUT.
#
#   --region I/N     write only in the I-th N-th of the export, so that
#                    several clients never race (default: everything)
#   --count N        N writes (default 0: until --stop FILE exists)
#   --stop FILE      stop once FILE exists (with --count 0)
#   --progress FILE  the number of writes done so far, rewritten often
#   --units A-B      each write covers A to B 4 KiB units (default 1-8)
#   --unaligned      also unaligned writes and zeroes (these read the
#                    rest of a unit from the upstream)
#   --zero           some requests are zeroes
#   --flush-every F  a flush after every F writes (default 8)
#   --sleep S        pause S seconds between writes (default 0)
#   --mark FILE      while FILE exists, remember the ranges written ...
#   --check FILE     ... and once FILE exists, read them all back again,
#                    compare them with the model and create FILE.done
#   --no-final-read  skip the final read of the whole region
import argparse
import os
import random
import sys
import time

import nbd

UNIT = 4096
ap = argparse.ArgumentParser()
ap.add_argument("uri")
ap.add_argument("image")
ap.add_argument("out")
ap.add_argument("seed", type=int)
ap.add_argument("--region", default="0/1")
ap.add_argument("--count", type=int, default=0)
ap.add_argument("--stop")
ap.add_argument("--progress")
ap.add_argument("--units", default="1-8")
ap.add_argument("--unaligned", action="store_true")
ap.add_argument("--zero", action="store_true")
ap.add_argument("--flush-every", type=int, default=8)
ap.add_argument("--sleep", type=float, default=0)
ap.add_argument("--mark")
ap.add_argument("--check")
ap.add_argument("--no-final-read", action="store_true")
a = ap.parse_args()

model = bytearray(open(a.image, "rb").read())
h = nbd.NBD()
h.connect_uri(a.uri)
size = h.get_size()
if size != len(model):
    sys.exit("wb-client: the export has %d bytes, the image %d"
             % (size, len(model)))
ri, rn = map(int, a.region.split("/"))
lo = size * ri // rn // UNIT * UNIT
hi = size * (ri + 1) // rn // UNIT * UNIT
umin, umax = map(int, a.units.split("-"))
rnd = random.Random(a.seed)


def progress(n):
    if a.progress:
        tmp = a.progress + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % n)
        os.replace(tmp, a.progress)


def compare(off, n, what):
    got = h.pread(n, off)
    if got != model[off:off + n]:
        bad = next(i for i in range(n) if got[i] != model[off + i])
        sys.exit("wb-client: %s: read %d+%d differs from what was written "
                 "(first difference at %d)" % (what, off, n, off + bad))


marked = []
n = 0
while True:
    if a.count and n >= a.count:
        break
    if not a.count and a.stop and os.path.exists(a.stop):
        break
    k = rnd.randint(umin, umax) * UNIT
    k = min(k, hi - lo)
    off = lo + rnd.randrange(0, (hi - lo - k) // UNIT + 1) * UNIT
    if a.unaligned and rnd.random() < 0.3:
        d = rnd.randrange(1, UNIT)
        off += d if off + d + k <= hi else 0
        k -= rnd.randrange(0, min(k, UNIT))
        k = max(k, 1)
        if off + k > hi:
            k = hi - off
    if a.zero and rnd.random() < 0.2:
        h.zero(k, off)
        model[off:off + k] = bytes(k)
    else:
        data = os.urandom(k)
        h.pwrite(data, off)
        model[off:off + k] = data
    compare(off, k, "after write %d" % (n + 1))
    n += 1
    if a.mark and os.path.exists(a.mark):
        marked.append((off, k))
    if a.flush_every and n % a.flush_every == 0:
        h.flush()
    if a.check and marked and os.path.exists(a.check) \
       and not os.path.exists(a.check + ".done"):
        for off, k in marked:
            compare(off, k, "re-reading the writes made while marked")
        open(a.check + ".done", "w").write("%d\n" % len(marked))
    progress(n)
    if a.sleep:
        time.sleep(a.sleep)

h.flush()
if not a.no_final_read:
    off = lo
    while off < hi:
        k = min(1 << 20, hi - off)
        compare(off, k, "final read")
        off += k
h.shutdown()
with open(a.out + ".tmp", "wb") as f:
    f.write(model)
os.replace(a.out + ".tmp", a.out)
print("wb-client: %d writes, %d marked" % (n, len(marked)))
