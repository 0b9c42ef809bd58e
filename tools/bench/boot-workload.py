#!/usr/bin/env python3
# tools/bench/boot-workload.py: a boot-like read workload for trace.sh.
#
#   boot-workload.py URI SIZE [--seed=N] [--reads=N] [--think-ms=MS]
#
# One reader, one connection, one request at a time (a boot reads what
# it needs, then uses it): READS reads (default 3000) of 4-64 KiB at
# random 4 KiB aligned offsets of an export of SIZE bytes, sizes drawn
# from 4, 4, 8, 8, 16, 32, 64 KiB (mean 19.4 KiB: ~57 MB, about 5% of
# a 1 GiB export), THINK_MS (default 1) of sleep between reads.  The
# seed (default 1) fixes the list, so every run reads the same bytes
# in the same order.  Prints the elapsed seconds (from the first read
# to the last reply) on stdout.
import sys
import time
import random
import nbd

args = [a for a in sys.argv[1:] if not a.startswith("--")]
opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1")
            for a in sys.argv[1:] if a.startswith("--"))
if len(args) != 2:
    sys.exit("usage: boot-workload.py URI SIZE [--seed=N] [--reads=N] "
             "[--think-ms=MS]")
uri, size = args[0], int(args[1])
seed = int(opts.get("seed", 1))
nreads = int(opts.get("reads", 3000))
think = float(opts.get("think-ms", 1)) / 1000

rnd = random.Random(seed)
sizes = [4096, 4096, 8192, 8192, 16384, 32768, 65536]
reads = []
for _ in range(nreads):
    n = rnd.choice(sizes)
    off = rnd.randrange(0, (size - n) // 4096 + 1) * 4096
    reads.append((off, n))

h = nbd.NBD()
h.connect_uri(uri)
if h.get_size() != size:
    sys.exit("boot-workload.py: export is %d bytes, not %d"
             % (h.get_size(), size))
t0 = time.monotonic()
for i, (off, n) in enumerate(reads):
    if i and think:
        time.sleep(think)
    h.pread(n, off)
el = time.monotonic() - t0
h.shutdown()
print("%.3f" % el)
