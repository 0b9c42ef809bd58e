#!/usr/bin/env bash
# tools/bench/hitpath.sh: what the cap's policy costs on the hit path.
#
# Two proxies in front of the same local image (nbdkit file, SIZE,
# default 512M), each with its own cache directory, both made warm by
# one full nbdcopy pass:
#
#   nocap   fscache, no fscache-max-size
#   cap     fscache-max-size at twice SIZE: everything stays cached
#           (no eviction), but every hit does the policy's bookkeeping
#           (the reference bit, probation, the unread bit)
#
# Or any other second configuration: --b-name=NAME --b-args="PARAMS"
# (e.g. --b-name=nomrc --b-args=fscache-mrc=false: what the miss-ratio
# curve costs a hit).
#
# Then fio random 4k reads (randread-4k.fio: each 4 KiB block at most
# once, RUNTIME seconds) at IODEPTH 1 and 8, alternating nocap and cap,
# ROUNDS times each (default 5), and prints the median IOPS of each
# with the spread (min..max) and the ratio cap / nocap of the medians.
# Checks that each proxy read the image upstream exactly once.
#
# Options (or environment): --size=SIZE (SIZE), --runtime=S (RUNTIME,
# default 5), --rounds=N (ROUNDS), --out=DIR (OUT, default a new
# /tmp/fscache-hitpath.XXXXXX with fio's JSON and the table).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
SIZE="${SIZE:-512M}" RUNTIME="${RUNTIME:-5}" ROUNDS="${ROUNDS:-5}" OUT="${OUT:-}"
B_NAME="${B_NAME:-cap}" B_ARGS="${B_ARGS:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --runtime=*) RUNTIME="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    --b-name=*) B_NAME="${a#*=}" ;;
    --b-args=*) B_ARGS="${a#*=}" ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "hitpath.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
for c in nbdkit nbdcopy fio python3; do
  command -v "$c" >/dev/null || { echo "hitpath.sh: $c: not installed" >&2; exit 1; }
done
[ -f "$FILTER" ] || { echo "hitpath.sh: $FILTER: not built (./build.sh build)" >&2; exit 1; }

[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-hitpath.XXXXXX)"
mkdir -p "$OUT/raw"
pids=()
cleanup () { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

bytes=$(numfmt --from=iec "$SIZE")
head -c "$bytes" /dev/urandom > "$OUT/img"
for cfg in nocap cap; do
  extra=()
  if [ "$cfg" = cap ]; then
    extra=(fscache-max-size=$((2 * bytes)))
    [ -n "$B_ARGS" ] && read -r -a extra <<<"$B_ARGS"
  fi
  rm -f "$OUT/$cfg.sock"
  nbdkit -f -U "$OUT/$cfg.sock" --filter="$FILTER" --filter=log file "$OUT/img" \
    logfile="$OUT/raw/$cfg.log" fscache-dir="$OUT/cache-$cfg" \
    fscache-stats="$OUT/raw/$cfg.stats" "${extra[@]}" &
  pids+=($!)
done
for cfg in nocap cap; do
  for _ in $(seq 100); do [ -S "$OUT/$cfg.sock" ] && break; sleep 0.1; done
  nbdcopy "nbd+unix:///?socket=$OUT/$cfg.sock" null:
done

for r in $(seq "$ROUNDS"); do
  for qd in 1 8; do
    for cfg in nocap cap; do
      URI="nbd+unix:///?socket=$OUT/$cfg.sock" SIZE="$bytes" IODEPTH=$qd \
        RUNTIME="$RUNTIME" fio --output-format=json \
        --output="$OUT/raw/$cfg-qd$qd-$r.json" "$BENCH_DIR/randread-4k.fio"
    done
  done
done
# Stopped, the proxies write their stats: each read the image upstream
# exactly once (the warming pass), so every round was all hits.
kill "${pids[@]}"
wait "${pids[@]}" 2>/dev/null || true
pids=()
for cfg in nocap cap; do
  up=$(awk '$1 == "upstream_read_bytes" { print $2 }' "$OUT/raw/$cfg.stats")
  [ "$up" -eq "$bytes" ] ||
    echo "hitpath.sh: $cfg read $up bytes upstream, not $bytes: not all hits" >&2
done

python3 - "$OUT" "$ROUNDS" "$B_NAME" <<'PYEOF' | tee "$OUT/table.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def iops(cfg, qd):
    v = []
    for r in range(1, rounds + 1):
        j = json.load(open("%s/raw/%s-qd%d-%d.json" % (out, cfg, qd, r)))
        v.append(j["jobs"][0]["read"]["iops"])
    return v
b = sys.argv[3]
print("| warm random 4k | no cap IOPS | %s IOPS | %s / no cap |" % (b, b))
print("|---|---:|---:|---:|")
for qd in (1, 8):
    a, b = iops("nocap", qd), iops("cap", qd)
    ma, mb = statistics.median(a), statistics.median(b)
    print("| iodepth %d | %.0f (%.0f..%.0f) | %.0f (%.0f..%.0f) | %.2f |" %
          (qd, ma, min(a), max(a), mb, min(b), max(b), mb / ma))
PYEOF
echo "hitpath.sh: results in $OUT" >&2
