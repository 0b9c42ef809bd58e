#!/usr/bin/env bash
# tools/bench/mrc.sh: the live miss-ratio curve's prediction against
# measured hit ratios (issue 45), drawn as an SVG.
#
# The shared CloudPhysics trace's reads (tests/data) are replayed with
# nbd-fscache replay through a proxy with no cap (4 KiB blocks, no
# readahead, every miss stored, over nbdkit's pattern plugin): its
# object's NAME.stats holds the predicted curve.  Then the trace is
# replayed again on fresh caches with fscache-max-size at CAPS (shares
# of the trace's footprint, default "0.01 0.02 0.05 0.1 0.25 0.5 1"):
# each measured hit ratio (blocks not read upstream over block
# accesses) beside the prediction at that size, in a table and in
# OUT/mrc.svg (tools/bench/mrc-plot.py).
#
# Options (or environment): --caps="..." (CAPS), --out=DIR (OUT).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="$top_builddir/tools/nbd-fscache/nbd-fscache"
CAPS="${CAPS:-0.01 0.02 0.05 0.1 0.25 0.5 1}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --caps=*) CAPS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    *) echo "$0: unknown option $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-mrc.XXXXXX)"
mkdir -p "$OUT"
xzcat "$top_srcdir/tests/data/cloudphysics-sample.trace.xz" > "$OUT/trace"
BS=4096
read -r footprint accesses size < <(python3 "$BENCH_DIR/trace-info.py" \
  footprint "$OUT/trace" "$BS")
export NBD_FSCACHE_TEST_BUDGET=0
run ()                          # run NAME [CAP]: prints the miss ratio
{
  local d="$OUT/$1" cap=()
  [ -n "${2:-}" ] && cap=(fscache-max-size="$2")
  rm -rf "$d"; mkdir -p -m 700 "$d"
  nbdkit -f -U "$d/sock" -P "$d/pid" --filter="$FILTER" pattern "$size" \
    fscache-dir="$d/c" fscache-block-size=4K fscache-readahead=0 \
    fscache-stats="$d/stats" fscache-key=trace "${cap[@]}" 2>"$d/err" &
  local pid=$!
  while [ ! -s "$d/pid" ]; do sleep 0.05; done
  "$TOOL" replay "$OUT/trace" "nbd+unix:///?socket=$d/sock" > "$d/replay"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "print('%.4f' % ($(awk '$1 == "upstream_read_bytes" { print $2 }' "$d/stats") / $BS / $accesses))"
}
run free > /dev/null
stats=$(ls "$OUT"/free/c/objects/*/*.stats)
predict () { python3 "$BENCH_DIR/trace-info.py" predict "$stats" "$1"; }
echo "# bytes,hit_ratio (measured)" > "$OUT/measured.csv"
printf '| cap (share of footprint) | bytes | predicted hits | measured hits | error |\n|---:|---:|---:|---:|---:|\n' | tee "$OUT/table.md"
for f in $CAPS; do
  blocks=$(python3 -c "print(max(1, round($f * $footprint)))")
  bytes=$((blocks * BS))
  want=$(predict "$bytes")
  got=$(python3 -c "print('%.4f' % (1 - $(run "cap$f" "$bytes")))")
  echo "$bytes,$got" >> "$OUT/measured.csv"
  python3 -c "print('| %s | %d | %s | %s | %+.3f |' % ('$f', $bytes, '$want', '$got', $got - $want))" | tee -a "$OUT/table.md"
done
python3 "$BENCH_DIR/mrc-plot.py" "$stats" "$OUT/measured.csv" "$OUT/mrc.svg" \
  "CloudPhysics sample: predicted (no cap) and measured (capped) hit ratio"
echo "mrc.sh: $OUT/table.md, $OUT/mrc.svg" >&2
