#!/usr/bin/env bash
# tools/bench/serial.sh: hits beside misses on a serial upstream.
#
# The upstream is nginx on 127.0.0.1 serving a random image, reached
# through nbdkit's curl plugin, which in nbdkit 1.32 takes one request
# at a time per connection (serialize_requests), with the delay filter
# adding DELAY_MS to every read to make it a remote:
#
#   fio -> nbdkit --filter=fscache --filter=delay curl url=http://127.0.0.1:PORT/img
#
# The first half of the export is made warm (one sequential pass), then
# in alternating rounds (ROUNDS, default 3) of RUNTIME seconds each:
#
#   hot-alone    random 4k reads of the warm half, iodepth 8, alone
#   hot+cold     the same, while a second fio (its own connection)
#                reads 64k blocks of the cold half at random, each at
#                most once (fio's random map), so every read misses;
#                each round has its own slice of the cold half
#   cold         the cold reader's IOPS in that phase
#   nocache      the same 64k reads straight through curl + delay (the
#                link without any cache)
#
# and prints the median IOPS of each with the spread (min..max).  If
# hits took turns with misses on the upstream, hot+cold would fall to
# the cold reader's rate; it should stay near hot-alone.
#
# Options (or environment): --size=SIZE (SIZE, default 512M),
# --delay-ms=N (DELAY_MS, default 5), --runtime=S (RUNTIME, default 5),
# --rounds=N (ROUNDS, default 3), --out=DIR (OUT, default a new
# /tmp/fscache-serial.XXXXXX with fio's JSON and the table).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
# cleanup_fn, start_nginx and a private $TMP, removed at exit.
# shellcheck source=/dev/null
source "$top_srcdir/tests/functions.sh"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
SIZE="${SIZE:-512M}" DELAY_MS="${DELAY_MS:-5}" RUNTIME="${RUNTIME:-5}"
ROUNDS="${ROUNDS:-3}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --delay-ms=*) DELAY_MS="${a#*=}" ;;
    --runtime=*) RUNTIME="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "serial.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
for c in nginx nbdkit fio python3; do
  command -v "$c" >/dev/null || { echo "serial.sh: $c: not installed" >&2; exit 1; }
done
[ -f "$FILTER" ] || { echo "serial.sh: $FILTER: not built (./build.sh build)" >&2; exit 1; }

[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-serial.XXXXXX)"
mkdir -p "$OUT/raw" "$OUT/www"
pids=()
cleanup () { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
cleanup_fn cleanup

bytes=$(numfmt --from=iec "$SIZE")
half=$((bytes / 2 / 1048576 * 1048576))
head -c "$bytes" /dev/urandom > "$OUT/www/img"

# nginx without an access log (tests/functions.sh), stopped at exit.
start_nginx "$OUT/www" off

# start NAME ARGS...: an nbdkit on $OUT/NAME.sock, waited for.
start () {
  local name="$1"; shift
  rm -f "$OUT/$name.sock" "$OUT/$name.pid"
  nbdkit -U "$OUT/$name.sock" -P "$OUT/$name.pid" "$@" 2>>"$OUT/raw/$name.log"
  for i in $(seq 100); do [ -s "$OUT/$name.pid" ] && break; sleep 0.1; done
  pids+=("$(cat "$OUT/$name.pid")")
}
url="http://127.0.0.1:$PORT/img"
start px --filter="$FILTER" --filter=delay curl url="$url" \
  delay-read="${DELAY_MS}ms" fscache-dir="$OUT/cache" fscache-key=serial \
  fscache-validate=size
start nocache --filter=delay curl url="$url" delay-read="${DELAY_MS}ms"
px="nbd+unix:///?socket=$OUT/px.sock"
nocache="nbd+unix:///?socket=$OUT/nocache.sock"

# fio_rand NAME URI OFFSET SIZE BS: random reads for RUNTIME seconds.
# The 4k hot reads repeat (time_based); the 64k cold ones stop when the
# slice is covered, so none repeats.
fio_rand () {
  local tb=--time_based
  [ "$5" = 4k ] || tb=
  fio --name="$1" --ioengine=nbd --uri="$2" --rw=randread --bs="$5" \
      --iodepth=8 --offset="$3" --size="$4" --runtime="$RUNTIME" $tb \
      --output-format=json --output="$OUT/raw/$1.json" >/dev/null
}
iops () { $PYTHON -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"]))' "$1"; }

echo "warming the first half ($half bytes) ..."
fio --name=warm --ioengine=nbd --uri="$px" --rw=read --bs=1M --iodepth=4 \
    --size="$half" --output="$OUT/raw/warm.txt" >/dev/null

: > "$OUT/results.tsv"
slice=$(( (bytes - half) / ROUNDS / 1048576 * 1048576 ))
for r in $(seq "$ROUNDS"); do
  cold_off=$((half + (r - 1) * slice))
  fio_rand "hot-alone-$r" "$px" 0 "$half" 4k
  fio_rand "hot-$r" "$px" 0 "$half" 4k & a=$!
  fio_rand "cold-$r" "$px" "$cold_off" "$slice" 64k & b=$!
  wait "$a" "$b"
  fio_rand "nocache-$r" "$nocache" "$cold_off" "$slice" 64k
  printf '%s\t%s\t%s\t%s\n' "$(iops "$OUT/raw/hot-alone-$r.json")" \
    "$(iops "$OUT/raw/hot-$r.json")" "$(iops "$OUT/raw/cold-$r.json")" \
    "$(iops "$OUT/raw/nocache-$r.json")" >> "$OUT/results.tsv"
  echo "round $r: $(tail -1 "$OUT/results.tsv")"
done

$PYTHON - "$OUT/results.tsv" "$DELAY_MS" "$SIZE" > "$OUT/table.md" <<'EOF'
import statistics, sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
names = ["4k hits alone (warm half)", "4k hits beside cold misses",
         "64k cold misses (other connection)", "64k, no cache, same link"]
print("curl over nginx + delay-read=%sms, %s image, iodepth 8, "
      "%d rounds" % (sys.argv[2], sys.argv[3], len(rows)))
print()
print("| phase | median IOPS | spread |")
print("|---|---:|---:|")
for i, n in enumerate(names):
    col = [r[i] for r in rows]
    print("| %s | %d | %d..%d |" % (n, statistics.median(col), min(col), max(col)))
hot = statistics.median(r[1] for r in rows) / statistics.median(r[0] for r in rows)
print()
print("hits beside misses / hits alone: %.2f" % hot)
EOF
cat "$OUT/table.md"
echo "results in $OUT"
