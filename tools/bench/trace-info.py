#!/usr/bin/env python3
"""tools/bench/trace-info.py: what a block trace's reads touch, and
what a miss-ratio curve predicts at a size.  Shared by
tools/bench/eviction.sh, tools/bench/mrc.sh and
tests/tools/test-tool-advise.sh.

  trace-info.py footprint TRACE BLOCK_SIZE
      prints the footprint (distinct blocks read), the block accesses
      and an export size past the last byte read (rounded up to 1 MiB
      with at least 1 MiB to spare), of TRACE's "OFFSET LENGTH R|W"
      lines, reads only.
  trace-info.py predict STATS BYTES
      prints the hit ratio STATS's "mrc BYTES HIT_RATIO" lines (an
      object's NAME.stats) predict at BYTES, interpolated on the log
      of the size; past the last point, the last.
  trace-info.py lru TRACE BLOCK_SIZE BLOCKS
      prints the hit ratio of an exact LRU cache of BLOCKS blocks over
      TRACE's reads: what the curve (an LRU curve, sampled) predicts,
      computed the plain way.
"""
import collections
import math
import sys


def blocks(path, bs):
    """Each block TRACE's reads touch, in order, with the read's end."""
    for line in open(path):
        o, n, op = line.split()
        if op != "R":
            continue
        o, n = int(o), int(n)
        for b in range(o // bs, (o + n - 1) // bs + 1):
            yield b, o + n


def footprint(path, bs):
    seen = set()
    acc = end = 0
    for b, e in blocks(path, bs):
        seen.add(b)
        acc += 1
        end = max(end, e)
    print(len(seen), acc, (end + (1 << 20)) & ~((1 << 20) - 1))


def lru(path, bs, cap):
    cache = collections.OrderedDict()
    acc = hits = 0
    for b, _ in blocks(path, bs):
        acc += 1
        if b in cache:
            hits += 1
            cache.move_to_end(b)
        else:
            cache[b] = True
            if len(cache) > cap:
                cache.popitem(last=False)
    print("%.4f" % (hits / acc if acc else 0))


def predict(stats, x):
    pts = [(int(l.split()[1]), float(l.split()[2]))
           for l in open(stats) if l.startswith("mrc ")]
    for i in range(1, len(pts)):
        if x <= pts[i][0]:
            a, b = math.log(pts[i - 1][0]), math.log(pts[i][0])
            t = (math.log(x) - a) / (b - a)
            print("%.4f" % (pts[i - 1][1] + t * (pts[i][1] - pts[i - 1][1])))
            return
    print("%.4f" % pts[-1][1])


if __name__ == "__main__":
    if sys.argv[1] == "footprint":
        footprint(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "predict":
        predict(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "lru":
        lru(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("trace-info.py: footprint TRACE BS | predict STATS BYTES"
                 " | lru TRACE BS BLOCKS")
