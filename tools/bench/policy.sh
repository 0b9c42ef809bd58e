#!/usr/bin/env bash
# tools/bench/policy.sh: the cap's policy against plain LRU and FIFO.
#
# Workload (tools/bench/policy.py): a hot set (HOT, default 8M, the
# start of the export) read at random in 4 KiB reads, and full
# sequential scans of the export in 1 MiB reads with hot reads in
# between; PERIODS (default 4) periods of 3000 hot reads then a scan
# with 2 hot reads after every 1 MiB.  The export is SIZE (default
# 256M) of random data from nbdkit's file plugin; the cap is 10% of it.
#
# The real filter (fscache-max-size=CAP, default block size 64K) gets
# the trace through libnbd, one request at a time; the upstream reads
# are counted by nbdkit's log filter beneath it, the hit and miss bytes
# by fscache-stats.  It runs twice: with the default readahead and
# with fscache-readahead=0.  LRU, FIFO and the paper's S3-FIFO are
# simulated on the same trace with CAP / 64K blocks.  Printed as a markdown table:
#
#   hit ratio         hit bytes / bytes read, over the whole trace
#   upstream MiB      bytes fetched from upstream
#   hot refetches     hot-set blocks fetched again after the first
#                     period (the hot set is 128 blocks: each full
#                     refetch of it is 128)
#
# Options (or environment): --size=BYTES (SIZE), --hot=BYTES (HOT),
# --periods=N (PERIODS), --out=DIR (OUT, default a new
# /tmp/fscache-policy.XXXXXX with the logs and the table).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
SIZE="${SIZE:-$((256 * 1024 * 1024))}" HOT="${HOT:-$((8 * 1024 * 1024))}"
PERIODS="${PERIODS:-4}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --hot=*) HOT="${a#*=}" ;;
    --periods=*) PERIODS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "policy.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
for c in nbdkit python3; do
  command -v "$c" >/dev/null || { echo "policy.sh: $c: not installed" >&2; exit 1; }
done
[ -f "$FILTER" ] || { echo "policy.sh: $FILTER: not built (./build.sh build)" >&2; exit 1; }
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
"$PY" -c 'import nbd' 2>/dev/null ||
  { echo "policy.sh: python3-libnbd: not installed" >&2; exit 1; }

BLOCK=65536
CAP=$((SIZE / 10))
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-policy.XXXXXX)"
mkdir -p "$OUT"
pidfile="$OUT/px.pid"
cleanup () { [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true; }
trap cleanup EXIT
TRACE=(--size="$SIZE" --hot="$HOT" --periods="$PERIODS" --block="$BLOCK")

head -c "$SIZE" /dev/urandom > "$OUT/img"

# Bytes of the upstream log's reads after line SKIP: all, and those
# inside the hot set, in blocks.
upstream ()              # LOG SKIP
{
  "$PY" - "$1" "$2" "$HOT" "$BLOCK" <<'PYEOF'
import re, sys
log, skip, hot, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tot = late_hot = 0
for i, line in enumerate(open(log)):
    m = re.search(r" Read id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)", line)
    if not m or "...Read" in line:
        continue
    off, n = int(m.group(1), 16), int(m.group(2), 16)
    tot += n
    if i >= skip:
        late_hot += max(0, min(off + n, hot) - off) // block
print(tot, late_hot)
PYEOF
}

real ()                  # NAME EXTRA-PARAMS...
{
  local name="$1"; shift
  local log="$OUT/$name.log" stats="$OUT/$name.stats" sock="$OUT/px.sock"
  rm -rf "$OUT/cache" "$log" "$sock"
  nbdkit -P "$pidfile" -U "$sock" --filter="$FILTER" --filter=log \
    file "$OUT/img" logfile="$log" fscache-dir="$OUT/cache" \
    fscache-max-size="$CAP" fscache-stats="$stats" "$@"
  local uri="nbd+unix:///?socket=$sock"
  "$PY" "$BENCH_DIR/policy.py" replay "$uri" "${TRACE[@]}" --periods=1 >/dev/null
  local skip
  skip=$(wc -l < "$log")
  "$PY" "$BENCH_DIR/policy.py" replay "$uri" "${TRACE[@]}" --periods-from=1 >/dev/null
  local pid; pid=$(cat "$pidfile")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  read -r up late < <(upstream "$log" "$skip")
  local hit miss
  hit=$(awk '$1 == "hit_bytes" { print $2 }' "$stats")
  miss=$(awk '$1 == "miss_bytes" { print $2 }' "$stats")
  row "$name" "$hit" "$miss" "$up" "$late"
}

sim ()                   # POLICY
{
  local out
  out=$("$PY" "$BENCH_DIR/policy.py" simulate "$1" "${TRACE[@]}" --cap="$CAP")
  get () { awk -v k="$1" '$1 == k { print $2 }' <<< "$out"; }
  row "$1 (simulated)" "$(get hit_bytes)" "$(get miss_bytes)" \
    "$(get upstream_bytes)" "$(get hot_fetches_after_first)"
}

row ()                   # NAME HIT MISS UPSTREAM LATEHOT
{
  awk -v n="$1" -v h="$2" -v m="$3" -v u="$4" -v l="$5" 'BEGIN {
    printf "| %s | %.3f | %.1f | %d |\n", n, h / (h + m), u / 1048576, l }'
}

{
  echo "Export $((SIZE / 1048576)) MiB, cap $CAP bytes (10%), hot set" \
       "$((HOT / 1048576)) MiB ($((HOT / BLOCK)) blocks), $PERIODS periods"
  echo
  echo "| policy | hit ratio | upstream MiB | hot refetches |"
  echo "|---|---:|---:|---:|"
  real "fscache-max-size (S3-FIFO-like)"
  real "fscache-max-size, fscache-readahead=0" fscache-readahead=0
  sim lru
  sim fifo
  sim s3fifo
} | tee "$OUT/table.md"
echo "policy.sh: results in $OUT" >&2
