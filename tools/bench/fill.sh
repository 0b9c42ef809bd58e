#!/usr/bin/env bash
# tools/bench/fill.sh: how much of a cold random read a link of a given
# speed leaves cached, against what the cache's file system takes.
#
# The upstream is `nbdkit null 1T` behind nbdkit's rate filter at each
# of RATES (bits/s), in the proxy's own process.  fio (nbd engine, one
# connection) reads READ bytes (default 2G) in random 64 KiB blocks at
# iodepth 16, each block once, from a fresh cache; after a clean stop,
# the share of what was read that the cache holds (nbd-fscache stat's
# cached_bytes), with fscache-catchup=false so that only the fills of
# the read itself count.  The ceiling: fio's random 64 KiB writes with
# an fdatasync every 256 on the cache's file system.
#
# Options (or environment): --read=SIZE (READ), --rates="800M 1600M
# 3200M" (RATES), --out=DIR (OUT, default /tmp/fscache-fill.XXXXXX).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="${FSCACHE_TOOL:-$top_builddir/tools/nbd-fscache/nbd-fscache}"
READ="${READ:-2G}" RATES="${RATES:-800M 1600M 3200M}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --read=*) READ="${a#*=}" ;;
    --rates=*) RATES="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "fill.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-fill.XXXXXX)"
mkdir -p "$OUT"
readb=$(numfmt --from=iec "$READ")

fio --name=ceiling --filename="$OUT/fio.tmp" --rw=randwrite --bs=64k \
    --size="$READ" --fdatasync=256 --output-format=json \
    --output="$OUT/ceiling.json" >/dev/null
rm -f "$OUT/fio.tmp"
python3 -c 'import json,sys; print("ceiling: fio random 64k writes, fdatasync/256: %.0f MiB/s" % (json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw"] / 1024))' "$OUT/ceiling.json"

for rate in $RATES; do
  rm -rf "$OUT/cache" "$OUT/s.sock" "$OUT/s.pid"
  nbdkit -U "$OUT/s.sock" -P "$OUT/s.pid" --filter="$FILTER" --filter=rate \
    null 1T rate="$rate" fscache-dir="$OUT/cache" fscache-validate=size \
    fscache-catchup=false fscache-stats="$OUT/s.stats" 2>>"$OUT/nbdkit.log"
  for i in $(seq 100); do [ -s "$OUT/s.pid" ] && break; sleep 0.1; done
  fio --name=r --ioengine=nbd --uri="nbd+unix:///?socket=$OUT/s.sock" \
      --rw=randread --bs=64k --iodepth=16 --size="$READ" \
      --output-format=json --output="$OUT/r-$rate.json" >/dev/null
  p=$(cat "$OUT/s.pid"); kill "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  c=$("$TOOL" stat --dir "$OUT/cache" | awk '$1 == "cached_bytes" { print $2 }')
  bw=$(python3 -c 'import json,sys; print("%.0f" % (json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw"] / 1024))' "$OUT/r-$rate.json")
  fb=$(awk '$1 == "fill_bytes" { b = $2 } $1 == "fill_busy_us" { u = $2 } END { if (u) printf "%.0f", b / u * 1e6 / 1048576; else print "-" }' "$OUT/s.stats")
  echo "link $rate: client $bw MiB/s, cached $((c * 100 / readb))% at the clean stop, fills $fb MiB/s of their busy time"
done
echo "raw results in $OUT"
