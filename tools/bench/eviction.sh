#!/usr/bin/env bash
# tools/bench/eviction.sh: the filter's eviction judged on a real block
# trace (issue 45).  The trace's reads are replayed through the filter
# (nbd-fscache replay: in order, one at a time) over nbdkit's pattern
# plugin, with fscache-block-size=4K, readahead off, the fill budget off
# (NBD_FSCACHE_TEST_BUDGET=0: every miss is stored) and fscache-max-size
# at a share of the trace's footprint; the filter's miss ratio is its
# upstream reads in blocks over the block accesses the trace makes (a
# request touches every block it overlaps: simulate.py's model).  Beside
# it, simulate.py's LRU, S3-FIFO, ARC and OPT at the same block size and
# capacity in blocks.
#
# Usage: tools/bench/eviction.sh [TRACE] [FRACTIONS...]
#   TRACE      default tests/data/cloudphysics-sample.trace.xz
#   FRACTIONS  default 0.01 0.05 0.1 0.25
# Environment: SIMULATE (simulate.py, the reference simulator beside the
# public traces: default ../shared/traces/simulate.py), OUT (a directory
# for the runs).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="$top_builddir/tools/nbd-fscache/nbd-fscache"
TRACE="${1:-$top_srcdir/tests/data/cloudphysics-sample.trace.xz}"
shift || true
FRACTIONS="${*:-0.01 0.05 0.1 0.25}"
SIMULATE="${SIMULATE:-$top_srcdir/../shared/traces/simulate.py}"
OUT="${OUT:-$(mktemp -d /tmp/fscache-eviction.XXXXXX)}"
BS=4096
mkdir -p "$OUT"
case "$TRACE" in
  *.xz) xzcat "$TRACE" > "$OUT/trace" ;;
  *.gz) zcat "$TRACE" > "$OUT/trace" ;;
  *) cp "$TRACE" "$OUT/trace" ;;
esac
# The footprint (distinct blocks read), the block accesses, the export's
# size (past the last byte read).
read -r footprint accesses size < <(python3 "$BENCH_DIR/trace-info.py" \
  footprint "$OUT/trace" "$BS")
echo "trace: $TRACE: $accesses block accesses, footprint $footprint blocks of $BS"
sim="$OUT/simulate.txt"
python3 "$SIMULATE" "$OUT/trace" --block-size "$BS" \
  --policies lru,s3fifo,arc,opt --fractions $FRACTIONS > "$sim"
printf "%-8s %8s %10s %8s %8s %8s %8s %8s\n" share blocks cap fscache lru \
  s3fifo arc opt
for f in $FRACTIONS; do
  blocks=$(python3 -c "print(round($f * $footprint))")
  cap=$((blocks * BS))
  d="$OUT/run-$f"
  rm -rf "$d"; mkdir -p -m 700 "$d/c"
  NBD_FSCACHE_TEST_BUDGET=0 nbdkit -U "$d/sock" -P "$d/pid" \
    --filter="$FILTER" pattern "$size" fscache-dir="$d/c" \
    fscache-block-size=4K fscache-readahead=0 fscache-max-size="$cap" \
    fscache-stats="$d/stats" fscache-key=trace
  for _ in $(seq 100); do [ -s "$d/pid" ] && break; sleep 0.1; done
  "$TOOL" replay "$OUT/trace" "nbd+unix:///?socket=$d/sock" > "$d/replay"
  kill "$(cat "$d/pid")"
  while kill -0 "$(cat "$d/pid")" 2>/dev/null; do sleep 0.1; done
  up=$(awk '$1 == "upstream_read_bytes" { print $2 }' "$d/stats")
  ours=$(python3 -c "print('%.4f' % ($up / $BS / $accesses))")
  row=$(python3 - "$sim" "$f" <<'PY'
import sys
# simulate.py's plain output: a header naming the policies, then a row
# per capacity, its first column the fraction.
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
head = next(l for l in lines if "lru" in l)
want = float(sys.argv[2])
for l in lines:
    try:
        if abs(float(l[0].rstrip("%")) / (100 if l[0].endswith("%") else 1) - want) < 1e-9:
            print(" ".join(l[head.index(p) - len(head) + len(l)] for p in ("lru", "s3fifo", "arc", "opt")))
            break
    except ValueError:
        pass
PY
)
  printf "%-8s %8s %10s %8s %8s %8s %8s %8s\n" "$f" "$blocks" "$cap" "$ours" $row
done
