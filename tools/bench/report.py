#!/usr/bin/env python3
"""Helpers of tools/bench/compare.sh.

  report.py fio FILE.json   print "mib_s iops io_bytes runtime_ms lat_mean_us"
                            (tab separated) of the read side of a fio
                            --output-format=json result
  report.py table OUT       the phase x configuration table of
                            OUT/results.tsv, with the target checks
  report.py markdown OUT    the same as Markdown
"""

import json
import sys

CONFIGS = ["nocache", "proxy", "nbdcache", "fscache", "local"]

# (phase, what the fscache figure is compared to, minimum ratio, label)
TARGETS = [
    ("warm-rand-4k", "local", 0.9, "warm random 4k >= 0.9x local"),
    ("warm-seq-1m", "local", 0.9, "warm sequential 1M >= 0.9x local"),
    ("restart-seq-1m", "local", 0.9, "after restart seq 1M >= 0.9x local"),
    ("cold-seq-1m", "nocache", 1.0, "cold sequential 1M >= 1.0x no cache"),
    ("cold-rand-64k-qd16", "nocache", 0.9,
     "cold 64k random qd16, latency link >= 0.9x no cache"),
    ("cold-seq-64k-qd1", "nocache", 10.0,
     "64k seq qd1, latency link (readahead) >= 10x no cache"),
    ("cold-rand-4k-bw", "nocache", 0.9,
     "cold random 4k, bw link, default settings >= 0.9x no cache"),
]


def load_fio(path):
    with open(path) as f:
        text = f.read()
    # fio may print notices before the JSON document.
    return json.loads(text[text.index("{"):])


def cmd_fio(path):
    d = load_fio(path)
    jobs = d["jobs"]
    if not jobs or any(j.get("error", 0) for j in jobs):
        sys.exit("fio reported an error in " + path)
    bw = sum(j["read"]["bw_bytes"] for j in jobs)
    iops = sum(j["read"]["iops"] for j in jobs)
    io_bytes = sum(j["read"]["io_bytes"] for j in jobs)
    runtime = max(j["read"]["runtime"] for j in jobs)
    lat = jobs[0]["read"].get("lat_ns", {}).get("mean", 0) / 1000.0
    if io_bytes == 0:
        sys.exit("fio read nothing in " + path)
    print("%.2f\t%.1f\t%d\t%d\t%.1f" % (bw / 1048576.0, iops, io_bytes,
                                         runtime, lat))


def read_env(out):
    env = {}
    try:
        with open(out + "/env.txt") as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("\t")
                env[k] = v
    except OSError:
        pass
    return env


def read_results(out):
    rows = []
    with open(out + "/results.tsv") as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            rows.append(dict(zip(header, line.rstrip("\n").split("\t"))))
    return rows


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def human(n):
    n = num(n)
    if n is None:
        return "-"
    if n == 0:
        return "0"
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else \
                ("%.1f %s" % (n, unit))
        n /= 1024.0


def ratio(a, b):
    a, b = num(a), num(b)
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_ratio(r):
    return "-" if r is None else ("%.2f" % r if r < 100 else "%.0f" % r)


def median(v):
    v = sorted(v)
    n = len(v)
    if n == 0:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def fmt_spread(v, fmt):
    """The median of V with its spread: "m (lo..hi)", or "m" alone."""
    v = [x for x in v if x is not None]
    if not v:
        return "-"
    m = fmt % median(v)
    if len(v) == 1:
        return m
    return "%s (%s..%s)" % (m, fmt % min(v), fmt % max(v))


def fmt_ratios(v, fmt=fmt_ratio):
    v = [x for x in v if x is not None]
    if not v:
        return "-"
    m = fmt(median(v))
    if len(v) == 1:
        return m
    return "%s (%s..%s)" % (m, fmt(min(v)), fmt(max(v)))


def fmt3(r):
    """Target checks: enough digits that a miss never reads as 1.00."""
    return "%.3f" % r if r < 100 else "%.0f" % r


def build(out):
    """Per phase and configuration, the medians over the rounds and
    their spread; ratios are taken within a round first."""
    rows = read_results(out)
    phases = []
    by = {}                     # (phase, config) -> {round: row}
    for r in rows:
        if r["phase"] not in phases:
            phases.append(r["phase"])
        by.setdefault((r["phase"], r["config"]), {})[r.get("round", "1")] = r

    def ok(r):
        return r is not None and r["status"] == "ok"

    def ratios(p, c, ref, field="mib_s"):
        mine, theirs = by.get((p, c), {}), by.get((p, ref), {})
        return [ratio(mine[k][field], theirs[k][field])
                for k in mine if k in theirs and ok(mine[k]) and
                ok(theirs[k])]

    table = []
    for p in phases:
        for c in CONFIGS:
            rounds = by.get((p, c))
            if not rounds:
                continue
            good = [r for r in rounds.values() if ok(r)]
            errs = len(rounds) - len(good)
            upv = [num(r["upstream_bytes"]) for r in good
                   if num(r["upstream_bytes"]) is not None]
            up = human(median(upv)) if upv else "-"
            if c == "fscache":
                per = [ratio(r["upstream_bytes"], r["io_bytes"]) for r in good]
                if any(x is not None for x in per):
                    up += " (%sx read)" % fmt_ratio(
                        median([x for x in per if x is not None]))
            mib = fmt_spread([num(r["mib_s"]) for r in good], "%.1f")
            iops = fmt_spread([num(r["iops"]) for r in good], "%.0f")
            if errs:
                mib += " %d ERR" % errs
            table.append([
                p, c, mib, iops,
                fmt_ratios(ratios(p, c, "nocache")),
                fmt_ratios(ratios(p, c, "local")),
                up,
            ])
    checks = []
    for phase, ref, minimum, label in TARGETS:
        v = [x for x in ratios(phase, "fscache", ref) if x is not None]
        if not v:
            continue
        m = median(v)
        verdict = "met" if m >= minimum else "MISSED"
        checks.append([label, fmt_ratios(v, fmt3), verdict])
    # Upstream cost of the cold random 4k phase: at most 1.1x what was
    # read (a whole 64K block per 4K read is 16x).
    cr = [r for r in by.get(("cold-rand-4k-bw", "fscache"), {}).values()
          if ok(r)]
    v = [ratio(r["upstream_bytes"], r["io_bytes"]) for r in cr]
    v = [x for x in v if x is not None]
    if v:
        checks.append(["cold random 4k, bw link: upstream <= 1.1x read",
                       fmt_ratios(v, fmt3),
                       "met" if median(v) <= 1.1 else "MISSED"])
    return table, checks


HEAD = ["phase", "config", "MiB/s", "IOPS", "x nocache", "x local",
        "upstream read"]
# Every figure is the median over the rounds, with (min..max).


KNOBS = ["SIZE", "RATE", "BURSTINESS", "DELAY_MS", "LAT_DELAY_MS", "IODEPTH",
         "LAT_IODEPTH", "RUNTIME", "SEQ_RUNTIME", "ROUNDS", "BLOCK_SIZE", "READAHEAD",
         "VALIDATE", "FSCACHE_ARGS"]


def knobs(env):
    return " ".join("%s=%s" % (k, env.get(k, "?")) for k in KNOBS)


def warnings(out):
    """Cold sequential passes that did not read the whole image: the
    warm phases after them are then not fully warm."""
    env = read_env(out)
    size = num(env.get("SIZE_BYTES"))
    w = []
    for r in read_results(out):
        if r["phase"] == "cold-seq-1m" and r["config"] in ("nbdcache",
                                                          "fscache"):
            b = num(r["io_bytes"])
            if size and b is not None and b < size:
                w.append("warning: %s cold-seq-1m read %d of %d bytes "
                         "(SEQ_RUNTIME too short): its warm phases are not "
                         "fully warm" % (r["config"], b, size))
    return w


def cmd_table(out):
    env = read_env(out)
    table, checks = build(out)
    print()
    print(knobs(env))
    widths = [max(len(str(x[i])) for x in table + [HEAD])
              for i in range(len(HEAD))]
    line = "  ".join("%%-%ds" % w if i < 2 or i == 6 else "%%%ds" % w
                     for i, w in enumerate(widths))
    print(line % tuple(HEAD))
    last = None
    for row in table:
        if last is not None and row[0] != last:
            print()
        last = row[0]
        print(line % tuple(row))
    print()
    print("fscache targets (READAHEAD=%s):" % env.get("READAHEAD", "?"))
    for label, r, verdict in checks:
        print("  %-60s %22s  %s" % (label, r, verdict))
    for w in warnings(out):
        print(w)


def cmd_markdown(out):
    env = read_env(out)
    table, checks = build(out)
    print("| " + " | ".join(HEAD) + " |")
    print("|" + "|".join(["---", "---", "---:", "---:", "---:", "---:",
                          "---:"]) + "|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print()
    print("| fscache target (READAHEAD=%s) | measured ratio | verdict |"
          % env.get("READAHEAD", "?"))
    print("|---|---:|---|")
    for label, r, verdict in checks:
        print("| %s | %s | %s |" % (label.replace(">=", "≥"), r, verdict))
    for w in warnings(out):
        print()
        print(w)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("fio", "table", "markdown"):
        sys.exit(__doc__)
    {"fio": cmd_fio, "table": cmd_table,
     "markdown": cmd_markdown}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
