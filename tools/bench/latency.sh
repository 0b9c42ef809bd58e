#!/usr/bin/env bash
# tools/bench/latency.sh: hits' latency while the cache works (issue 44).
#
# One proxy, nbdkit --filter=fscache --filter=rate file dir=IMGS (the
# link, RATE, default 1600M bits/s), two exports: "warm" (WARM, default
# 256M, read whole first, so every read of it is a hit) and "cold"
# (COLD, default 2G, never read before).  fio random 4 KiB reads of
# "warm" for SECONDS at iodepth 1 and 8, in these conditions:
#
#   idle     nothing else
#   fills    a second client copies "cold" through the same proxy
#            (nbdcopy): the cache fills at the link's speed
#
# and, as the limit, the local file plugin (nbdkit file WARM-IMAGE, no
# cache) idle and beside a writer that writes what the fills write (fio
# sequential 1 MiB writes at the fills' measured rate, fdatasync every
# 64 MiB, on the same file system).  Reports p50, p99 and p99.9 of
# fio's completion latency (µs), medians of ROUNDS, and the ratios
# fscache / local in the same condition.
#
# Options (or environment): --rate=BITS, --warm=SIZE, --cold=SIZE,
# --seconds=S (8), --rounds=N (3), --out=DIR.

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
RATE="${RATE:-1600M}" WARM="${WARM:-256M}" COLD="${COLD:-2G}"
SECONDS_="${SECONDS_:-8}" ROUNDS="${ROUNDS:-3}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --rate=*) RATE="${a#*=}" ;;
    --warm=*) WARM="${a#*=}" ;;
    --cold=*) COLD="${a#*=}" ;;
    --seconds=*) SECONDS_="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    *) echo "$0: unknown option $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-latency.XXXXXX)"
mkdir -p "$OUT/imgs"
head -c "$(numfmt --from=iec "$WARM")" /dev/urandom > "$OUT/imgs/warm"
head -c "$(numfmt --from=iec "$COLD")" /dev/urandom > "$OUT/imgs/cold"
pids=()
cleanup () { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start ()                        # start NAME ARGS...: nbdkit on OUT/NAME.sock
{
  local name=$1; shift
  rm -f "$OUT/$name.sock" "$OUT/$name.pid"
  nbdkit -f -U "$OUT/$name.sock" -P "$OUT/$name.pid" "$@" 2>>"$OUT/nbdkit.err" &
  pids+=($!)
  while [ ! -s "$OUT/$name.pid" ]; do sleep 0.05; done
}
stop () { kill "$(cat "$OUT/$1.pid")"; while kill -0 "$(cat "$OUT/$1.pid")" 2>/dev/null; do sleep 0.05; done; }

fio_lat ()                      # fio_lat URI QD TAG: prints p50 p99 p99.9 (µs)
{
  fio --name=l --ioengine=nbd --uri="$1" --rw=randread --bs=4k \
    --iodepth="$2" --time_based --runtime="$SECONDS_" --randrepeat=0 \
    --output-format=json > "$OUT/$3.json" 2>/dev/null
  python3 - "$OUT/$3.json" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
p = json.loads(t[t.index("{"):])["jobs"][0]["read"]["clat_ns"]["percentile"]
print("%.0f %.0f %.0f" % (p["50.000000"] / 1e3, p["99.000000"] / 1e3,
                          p["99.900000"] / 1e3))
PY
}

: > "$OUT/results"
for r in $(seq "$ROUNDS"); do
  rm -rf "$OUT/cache"; mkdir -m 700 "$OUT/cache"
  start px --filter="$FILTER" --filter=rate file dir="$OUT/imgs" \
    rate="$RATE" fscache-dir="$OUT/cache" fscache-stats="$OUT/px.stats"
  warm="nbd+unix:///warm?socket=$OUT/px.sock"
  cold="nbd+unix:///cold?socket=$OUT/px.sock"
  nbdcopy "$warm" null:
  nbdcopy "$warm" null:           # what the first skipped, if anything
  for qd in 1 8; do
    echo "fscache idle $qd $(fio_lat "$warm" $qd fi$qd-$r)" >> "$OUT/results"
  done
  # Fills: the cold copy runs through both measurements.
  t0=$(date +%s.%N)
  nbdcopy "$cold" null: & cp=$!
  sleep 1
  for qd in 1 8; do
    echo "fscache fills $qd $(fio_lat "$warm" $qd ff$qd-$r)" >> "$OUT/results"
  done
  wait $cp
  t1=$(date +%s.%N)
  stop px
  fill=$(awk '$1 == "fill_bytes" { print $2 }' "$OUT/px.stats")
  warmb=$(numfmt --from=iec "$WARM")
  # The fills' rate during the cold copy (what the local writer gets).
  wrate=$(python3 -c "print(max(1, int(($fill - $warmb) / ($t1 - $t0) / 1048576)))")
  echo "round $r: fills at $wrate MiB/s during the cold copy" >&2
  start local file "$OUT/imgs/warm"
  lw="nbd+unix:///?socket=$OUT/local.sock"
  for qd in 1 8; do
    echo "local idle $qd $(fio_lat "$lw" $qd li$qd-$r)" >> "$OUT/results"
  done
  fio --name=w --rw=write --bs=1M --rate="${wrate}m" --fdatasync=64 \
    --size=4G --time_based --runtime=$((2 * SECONDS_ + 2)) \
    --filename="$OUT/writer.dat" >/dev/null 2>&1 & wp=$!
  sleep 1
  for qd in 1 8; do
    echo "local fills $qd $(fio_lat "$lw" $qd lf$qd-$r)" >> "$OUT/results"
  done
  kill $wp 2>/dev/null || true; wait $wp 2>/dev/null || true
  rm -f "$OUT/writer.dat"
  stop local
done
python3 - "$OUT/results" <<'PY' | tee "$OUT/table.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    cfg, cond, qd, *v = line.split()
    rows[(cfg, cond, int(qd))].append([float(x) for x in v])
print("| condition | iodepth | fscache p50/p99/p99.9 (µs) | local p50/p99/p99.9 (µs) | p99 ratio | p99.9 ratio |")
print("|---|---:|---:|---:|---:|---:|")
for cond in ("idle", "fills"):
    for qd in (1, 8):
        f = [statistics.median(c) for c in zip(*rows[("fscache", cond, qd)])]
        l = [statistics.median(c) for c in zip(*rows[("local", cond, qd)])]
        print("| %s | %d | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f | %.2f | %.2f |"
              % (cond, qd, *f, *l, f[1] / l[1], f[2] / l[2]))
PY
echo "latency.sh: $OUT" >&2
