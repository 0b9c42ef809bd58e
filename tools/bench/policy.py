#!/usr/bin/env python3
"""tools/bench/policy.py: a hot set plus periodic full scans.

The trace (deterministic, from --seed) is PERIODS periods of:

  - HOT_READS random 4 KiB reads of the hot set (the first HOT bytes
    of the export, at 4 KiB-aligned offsets), then
  - a full sequential scan of the export in 1 MiB reads, with
    SCAN_HOT random hot reads after each 1 MiB.

Two modes:

  policy.py replay URI [--periods-from K] [trace options]
      send the trace, one request at a time in trace order, through
      libnbd (so a real cache sees exactly the simulated order), from
      period K on (the earlier ones are generated, not sent, so the
      rest is the same trace); prints the bytes read.
  policy.py simulate lru|fifo|s3fifo --block B --cap BYTES [trace options]
      replay the trace through a simulated cache of cap // B blocks of
      B bytes (a miss fetches the whole block, as the filter does) and
      print, as "name value" lines, the same figures that policy.sh
      takes from the real filter: hit and miss bytes, upstream bytes,
      and the blocks of the hot set fetched after the first period.
      s3fifo is the paper's (SOSP '23): a small FIFO of 10% of the
      blocks, a main FIFO of 90% with 2-bit frequencies, and ghosts as
      many as the main FIFO holds; a reference for the filter's
      bitmap version, which has no fixed probation share.
"""
import argparse
import collections
import random
import sys

KiB, MiB = 1024, 1024 * 1024


def trace(a):
    rnd = random.Random(a.seed)
    hot_slots = a.hot // (4 * KiB)

    def hot():
        return (rnd.randrange(hot_slots) * 4 * KiB, 4 * KiB)

    for period in range(a.periods):
        for _ in range(a.hot_reads):
            yield period, hot()
        for off in range(0, a.size, MiB):
            yield period, (off, min(MiB, a.size - off))
            for _ in range(a.scan_hot):
                yield period, hot()


class Plain:
    """LRU (move to the end on a hit) or FIFO (never moves)."""

    def __init__(self, nblocks, lru):
        self.n, self.lru = nblocks, lru
        self.q = collections.OrderedDict()  # block -> None, oldest first

    def hit(self, b):
        if b not in self.q:
            return False
        if self.lru:
            self.q.move_to_end(b)
        return True

    def insert(self, b):
        self.q[b] = None
        if len(self.q) > self.n:
            self.q.popitem(last=False)


class S3FIFO:
    def __init__(self, nblocks):
        self.ns = max(nblocks // 10, 1)
        self.nm = max(nblocks - self.ns, 1)
        self.s = collections.OrderedDict()  # block -> freq
        self.m = collections.OrderedDict()
        self.g = collections.OrderedDict()

    def hit(self, b):
        for q in (self.s, self.m):
            if b in q:
                q[b] = min(q[b] + 1, 3)
                return True
        return False

    def evict_m(self):
        while True:
            b, f = self.m.popitem(last=False)
            if f == 0:
                return
            self.m[b] = f - 1

    def evict_s(self):
        b, f = self.s.popitem(last=False)
        if f > 0:
            self.m[b] = 0
            if len(self.m) > self.nm:
                self.evict_m()
        else:
            self.g[b] = None
            if len(self.g) > self.nm:
                self.g.popitem(last=False)

    def insert(self, b):
        if b in self.g:
            del self.g[b]
            self.m[b] = 0
            if len(self.m) > self.nm:
                self.evict_m()
        else:
            self.s[b] = 0
            if len(self.s) > self.ns:
                self.evict_s()


def simulate(a):
    nblocks = max(a.cap // a.block, 1)
    if a.policy == "s3fifo":
        cache = S3FIFO(nblocks)
    else:
        cache = Plain(nblocks, a.policy == "lru")
    hit = miss = up = hot_fetch_late = 0
    for period, (off, n) in trace(a):
        for b in range(off // a.block, (off + n - 1) // a.block + 1):
            s = max(off, b * a.block)
            e = min(off + n, (b + 1) * a.block)
            if cache.hit(b):
                hit += e - s
                continue
            miss += e - s
            up += min(a.block, a.size - b * a.block)
            if period > 0 and b * a.block < a.hot:
                hot_fetch_late += 1
            cache.insert(b)
    print("hit_bytes", hit)
    print("miss_bytes", miss)
    print("upstream_bytes", up)
    print("hot_fetches_after_first", hot_fetch_late)


def replay(a):
    import nbd
    h = nbd.NBD()
    h.connect_uri(a.uri)
    if h.get_size() < a.size:
        sys.exit("policy.py: the export is smaller than --size")
    total = 0
    for period, (off, n) in trace(a):
        if period < a.periods_from:
            continue
        h.pread(n, off)
        total += n
    h.shutdown()
    print("read_bytes", total)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["replay", "simulate"])
    p.add_argument("arg", help="URI (replay) or lru|fifo (simulate)")
    p.add_argument("--size", type=int, default=256 * MiB)
    p.add_argument("--hot", type=int, default=8 * MiB)
    p.add_argument("--periods", type=int, default=4)
    p.add_argument("--hot-reads", type=int, default=3000)
    p.add_argument("--scan-hot", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--block", type=int, default=64 * KiB)
    p.add_argument("--cap", type=int, default=0)
    p.add_argument("--periods-from", type=int, default=0)
    a = p.parse_args()
    if a.mode == "replay":
        a.uri = a.arg
        replay(a)
    else:
        if a.arg not in ("lru", "fifo", "s3fifo") or a.cap <= 0:
            p.error("simulate needs lru, fifo or s3fifo and --cap")
        a.policy = a.arg
        simulate(a)


if __name__ == "__main__":
    main()
