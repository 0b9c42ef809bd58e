#!/usr/bin/env python3
"""tools/bench/mrc-plot.py: draw a predicted miss-ratio curve against
measured points as an SVG, with nothing but the standard library.

  mrc-plot.py STATS MEASURED.csv OUT.svg [TITLE]

STATS is an object's NAME.stats file (its "mrc BYTES HIT_RATIO"
lines: the curve core/base/mrc.c predicts); MEASURED.csv has lines of
"BYTES,HIT_RATIO" (replays with fscache-max-size at BYTES).  The x
axis is the cache's size on a log scale, the y axis the hit ratio.
"""
import math
import sys


def main():
    stats, measured, out = sys.argv[1:4]
    title = sys.argv[4] if len(sys.argv) > 4 else "predicted and measured hit ratio"
    curve = [(int(l.split()[1]), float(l.split()[2]))
             for l in open(stats) if l.startswith("mrc ")]
    points = [tuple(map(float, l.strip().split(",")))
              for l in open(measured) if l.strip() and not l.startswith("#")]
    curve = [p for p in curve if p[0] > 0]
    xs = [p[0] for p in curve] + [p[0] for p in points]
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    ymax = max([p[1] for p in curve] + [p[1] for p in points] + [0.05])
    ymax = math.ceil(ymax * 10) / 10
    W, H, L, R, T, B = 720, 440, 70, 20, 40, 60

    def X(b):
        return L + (math.log10(b) - lo) / (hi - lo or 1) * (W - L - R)

    def Y(h):
        return H - B - h / ymax * (H - T - B)

    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'font-family="sans-serif" font-size="12">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="20" font-size="14">%s</text>' % (L, title)]
    # Axes and grid.
    s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'
             % (L, H - B, W - R, H - B))
    s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'
             % (L, T, L, H - B))
    for e in range(math.floor(lo / math.log10(2)),
                   math.ceil(hi / math.log10(2)) + 1):
        if e % 2 == 0:          # every other power of 2: 4 KiB, 16 KiB...
            b = 2 ** e
            if lo <= math.log10(b) <= hi:
                x = X(b)
                s.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" '
                         'stroke="#ddd"/>' % (x, T, x, H - B))
                label = ("%g GiB" % (b / 2**30) if b >= 2**30 else
                         "%g MiB" % (b / 2**20) if b >= 2**20 else
                         "%g KiB" % (b / 2**10))
                s.append('<text x="%.1f" y="%d" text-anchor="middle">%s'
                         '</text>' % (x, H - B + 16, label))
    k = 0.0
    while k <= ymax + 1e-9:
        y = Y(k)
        s.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                 % (L, y, W - R, y))
        s.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>'
                 % (L - 6, y + 4, k))
        k += 0.1
    s.append('<text x="%d" y="%d" text-anchor="middle">cache size (log)'
             '</text>' % ((L + W - R) / 2, H - 20))
    s.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" '
             'text-anchor="middle">hit ratio</text>' % ((T + H - B) / 2,
                                                         (T + H - B) / 2))
    # The predicted curve, the measured points.
    s.append('<polyline fill="none" stroke="#1f77b4" stroke-width="2" '
             'points="%s"/>' % " ".join("%.1f,%.1f" % (X(b), Y(h))
                                        for b, h in curve))
    for b, h in points:
        s.append('<circle cx="%.1f" cy="%.1f" r="5" fill="#d62728"/>'
                 % (X(b), Y(h)))
    s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#1f77b4" '
             'stroke-width="2"/><text x="%d" y="%d">predicted (mrc lines)'
             '</text>' % (L + 20, T + 10, L + 50, T + 10, L + 56, T + 14))
    s.append('<circle cx="%d" cy="%d" r="5" fill="#d62728"/><text x="%d" '
             'y="%d">measured (fscache-max-size)</text>'
             % (L + 35, T + 30, L + 56, T + 34))
    s.append('</svg>')
    open(out, "w").write("\n".join(s) + "\n")


if __name__ == "__main__":
    main()
