#!/usr/bin/env python3
"""tools/bench/fleet-model.py: the peer tier at fleet sizes this machine
cannot run (1,000 nodes), on paper.

Two parts:

1. Ownership, simulated: rendezvous hashing of (key, range) over N
   member URIs, as plugin/peers.c does (there with XXH3 seeded by the
   URI's hash; here with BLAKE2b of the same triple, which has the same
   statistics).  Reports how evenly an image's 1 MiB ranges spread
   (ranges per owner: mean, max, max/mean), and the share of ranges
   that move when one member leaves (ideal: 1/N).

2. Time and origin load, modelled: an image of S bytes, an origin link
   of B bit/s shared by the fleet, each node's own link L bit/s both
   ways.  Without peers every node reads S from the origin: origin
   load N x S, and the last node finishes after N*S/B.  With peers the
   origin sends each range once (S, plus 32 KiB of identity samples per
   node), and the last node finishes after the slowest of: the origin
   sending S (S/B), a node receiving S (S/L), and the busiest owner
   sending its share to N-1 askers (max_share * (N-1) / L).

3. A lockstep boot, modelled for both designs (issue 41): every node
   reads the same ranges in the same order at the same time, W ranges
   in flight per node.  Flat (fscache-peer-fanout=0): a range's owner
   serves it to all N-1 others at once, and only the owners of the W
   ranges in flight are busy, so each range takes (N-1) R / L on its
   owner's link and the boot S / (W R) of those: S (N-1) / (W L).
   Tree (K children per node per range): a range goes down a K-ary
   tree of depth d = ceil(log_K N), each node sending it to at most K,
   pipelined: S K / (W L) plus the depth's latency d (R / L + RTT).
   Both bounded below by the origin sending S once (S / B) and a node
   receiving S (S / L).  Connections per node: flat, an asker holds one
   to each owner of the ranges it reads, up to N-1, and serves N-1; a
   tree node serves at most K per range, but over all ranges most
   nodes ask it for some (N-1 at worst, as measured: docs/benchmarks.md).
   The model ignores CPU (the measured 8-32 node runs on 2 cores are
   CPU-bound, so they cannot calibrate it) and the deadlines: a flat
   owner whose range takes longer than the 10 s peer deadline sets its
   askers off to the next owner and the origin, which the "deadline"
   column flags.

Usage: fleet-model.py [--nodes=1000] [--image=10G] [--origin=200M]
                      [--link=10G] [--window=8] [--fanout=8] [--rtt=0.0005]
"""
import math
import hashlib
import statistics
import sys


def size(s):
    mult = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def bits(s):
    mult = {'K': 1e3, 'M': 1e6, 'G': 1e9}
    return float(s[:-1]) * mult[s[-1]] if s[-1] in mult else float(s)


def owner(members, key, r):
    best, best_score = None, -1
    for m in members:
        h = hashlib.blake2b(f"{key}/{r}/{m}".encode(), digest_size=8)
        score = int.from_bytes(h.digest(), 'little')
        if score > best_score:
            best, best_score = m, score
    return best


def main():
    opts = {'nodes': '1000', 'image': '10G', 'origin': '200M',
            'link': '10G', 'window': '8', 'fanout': '8', 'rtt': '0.0005'}
    for a in sys.argv[1:]:
        k, _, v = a.lstrip('-').partition('=')
        if k not in opts:
            sys.exit(__doc__)
        opts[k] = v
    n = int(opts['nodes'])
    s = size(opts['image'])
    b = bits(opts['origin'])
    link = bits(opts['link'])
    ranges = s >> 20
    members = [f"nbd://10.0.{i // 256}.{i % 256}:10809" for i in range(n)]

    owners = [owner(members, "key", r) for r in range(ranges)]
    per = [0] * n
    index = {m: i for i, m in enumerate(members)}
    for o in owners:
        per[index[o]] += 1
    mean = statistics.mean(per)
    gone = members[0]
    rest = members[1:]
    moved = sum(1 for r in range(ranges)
                if owners[r] != gone and owner(rest, "key", r) != owners[r])
    print(f"ownership: {n} nodes, {ranges} ranges of 1 MiB: per owner mean "
          f"{mean:.1f}, max {max(per)} ({max(per) / mean:.2f}x the mean); "
          f"one node leaving moves {per[0]} ranges (its own) and "
          f"{moved} others")

    alone_origin = n * s
    alone_time = n * s * 8 / b
    peers_origin = s + n * 32 * 1024
    share = max(per) << 20
    peers_time = max(s * 8 / b, s * 8 / link, share * (n - 1) * 8 / link)
    gib = 1 << 30
    print(f"origin load: without peers {alone_origin / gib:,.0f} GiB "
          f"({n}x the image); with peers {peers_origin / gib:,.2f} GiB "
          f"({peers_origin / s:.3f}x)")
    print(f"time to the last node: without peers {alone_time:,.0f} s "
          f"({alone_time / 3600:.1f} h); with peers {peers_time:,.0f} s "
          f"(origin {s * 8 / b:,.0f} s, own link {s * 8 / link:,.1f} s, "
          f"busiest owner {share * (n - 1) * 8 / link:,.1f} s)")
    lockstep(s, b, link, int(opts['window']), int(opts['fanout']),
             float(opts['rtt']))


def lockstep(s, b, link, w, k, rtt):
    r = 1 << 20
    print(f"lockstep boot of {s / (1 << 30):.0f} GiB, {w} ranges in flight "
          f"per node, links {link / 1e9:g} Gbit/s, origin {b / 1e6:g} "
          f"Mbit/s, K = {k}:")
    print(f"  {'nodes':>6} {'flat (s)':>10} {'deadline':>9} {'tree (s)':>10} "
          f"{'depth':>6} {'tree/flat':>10} {'origin (x)':>11}")
    floor = max(s * 8 / b, s * 8 / link)
    for n in (8, 16, 32, 64, 1000, 10000):
        per_range_flat = (n - 1) * r * 8 / link
        flat = max(floor, s * (n - 1) * 8 / (w * link))
        d = max(1, math.ceil(math.log(n, k))) if n > 1 else 0
        tree = max(floor, s * min(k, n - 1) * 8 / (w * link)
                   + d * (r * 8 / link + rtt))
        late = "past 10 s" if per_range_flat > 10 else "-"
        print(f"  {n:>6} {flat:>10,.1f} {late:>9} {tree:>10,.1f} {d:>6} "
              f"{tree / flat:>10.3f} {1 + n * 32 * 1024 / s:>11.4f}")


if __name__ == '__main__':
    main()
