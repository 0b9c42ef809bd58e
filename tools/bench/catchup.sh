#!/usr/bin/env bash
# tools/bench/catchup.sh: what a fast upstream leaves cached, and how
# the catch-up worker makes up the skipped fills once clients are idle.
#
# The upstream is `nbdkit null` (SIZE, default 1T) in the proxy's own
# process: far faster than any disk, so the fill budget skips most
# fills.  fio (nbd engine, one connection) reads READ bytes (default
# 1G) in random 64 KiB blocks at iodepth 16, each block once, from a
# fresh cache; then the client is gone and the cache is watched: the
# bytes cached (nbd-fscache stat's cached_bytes, from the index on
# disk) as a share of what was read, at 0, 30, 60 and 90 s of idle.
# Then a second client reads 64k blocks at random elsewhere for
# RUNTIME seconds while a fresh catch-up runs, and once with
# fscache-catchup=false: its IOPS side by side (medians of ROUNDS).
#
# Options (or environment): --size=SIZE, --read=SIZE (READ),
# --rounds=N (ROUNDS, default 3), --runtime=S (RUNTIME, default 5),
# --out=DIR (OUT, default a new /tmp/fscache-catchup.XXXXXX).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="${FSCACHE_TOOL:-$top_builddir/tools/nbd-fscache/nbd-fscache}"
SIZE="${SIZE:-1T}" READ="${READ:-1G}" ROUNDS="${ROUNDS:-3}"
RUNTIME="${RUNTIME:-5}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --read=*) READ="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --runtime=*) RUNTIME="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "catchup.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-catchup.XXXXXX)"
mkdir -p "$OUT"
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
readb=$(numfmt --from=iec "$READ")

serve () {                      # CATCHUP
  rm -rf "$OUT/cache" "$OUT/s.sock" "$OUT/s.pid"
  nbdkit -U "$OUT/s.sock" -P "$OUT/s.pid" --filter="$FILTER" null "$SIZE" \
    fscache-dir="$OUT/cache" fscache-validate=size fscache-catchup="$1" \
    fscache-stats="$OUT/s.stats" 2>>"$OUT/nbdkit.log"
  for i in $(seq 100); do [ -s "$OUT/s.pid" ] && break; sleep 0.1; done
}
stop () {
  local p; p=$(cat "$OUT/s.pid")
  kill "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
}
cached () {
  "$TOOL" stat --dir "$OUT/cache" | awk '$1 == "cached_bytes" { print $2 }'
}
uri="nbd+unix:///?socket=$OUT/s.sock"
readfio () {                    # NAME OFFSET SIZE [fio options]
  local name=$1 off=$2 sz=$3; shift 3
  fio --name="$name" --ioengine=nbd --uri="$uri" --rw=randread --bs=64k \
      --iodepth=16 --offset="$off" --size="$sz" "$@" \
      --output-format=json --output="$OUT/$name.json" >/dev/null
}

echo "== what stays cached: $READ of random 64k reads from null $SIZE"
serve true
readfio first 0 "$readb"
for t in 0 30 60 90; do
  [ "$t" = 0 ] || sleep 30
  c=$(cached)
  echo "idle ${t}s: $c bytes cached, $((c * 100 / readb))% of what was read"
done
stop
grep -E '^(fill_skipped_bytes|catchup_)' "$OUT/s.stats"

echo "== a client reading during the catch-up (IOPS, median of $ROUNDS)"
for r in $(seq "$ROUNDS"); do
  for mode in true false; do
    serve "$mode"
    readfio "warm-$mode-$r" 0 "$readb"
    sleep 1                     # idle: the catch-up (if on) is running
    # Elsewhere in the export: its own misses, beside the catch-up.
    readfio "during-$mode-$r" $((readb * 4)) "$readb" \
      --runtime="$RUNTIME" --time_based
    stop
  done
done
$PY - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for mode, label in (("true", "catch-up running"), ("false", "catch-up off")):
    v = [json.load(open("%s/during-%s-%d.json" % (out, mode, r)))["jobs"][0]["read"]["iops"]
         for r in range(1, rounds + 1)]
    print("%-18s %7.0f IOPS (%.0f..%.0f)" % (label, statistics.median(v),
                                            min(v), max(v)))
EOF
echo "raw results in $OUT"
