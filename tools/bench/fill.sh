#!/usr/bin/env bash
# tools/bench/fill.sh: how much of a cold random read a link of a given
# speed leaves cached, against what the cache's file system takes.
#
# The upstream is `nbdkit null 1T` behind nbdkit's rate filter at each
# of RATES (bits/s) and its delay filter at RTT per read (default 2ms:
# a link has a round trip; 16 reads of 64 KiB in flight over 2 ms still
# carry 500 MB/s), in the proxy's own process.  fio (nbd engine, one
# connection) reads READ bytes (default 2G) in random 64 KiB blocks at
# iodepth 16, each block once, from a fresh cache; after a clean stop,
# the share of what was read that the cache holds (nbd-fscache ls's
# cached_bytes of that export; the rate filter's initial burst is
# drained first through another export), with fscache-catchup=false so
# that only the fills of the read itself count; the fills' rate is the
# process's fill_bytes over fill_busy_us (the drain's fills included,
# a rate either way).  The ceiling: fio's
# random 64 KiB writes with an fdatasync every 256 on the cache's file
# system.
#
# Side by side in one run, ROUNDS times (medians, min..max): "nocache"
# (the same link with no filter: what the link gives a client) and each
# build named in VARIANTS ("name:path/to/filter.so ...", default the
# tree's build as "fscache").
#
# Options (or environment): --read=SIZE (READ), --rates="800M 1600M
# 3200M" (RATES), --rtt=TIME (RTT), --rounds=N (ROUNDS, default 1),
# --variant=NAME:SO (VARIANTS, repeatable), --out=DIR (OUT, default
# /tmp/fscache-fill.XXXXXX).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="${FSCACHE_TOOL:-$top_builddir/tools/nbd-fscache/nbd-fscache}"
READ="${READ:-2G}" RATES="${RATES:-800M 1600M 3200M}" OUT="${OUT:-}"
ROUNDS="${ROUNDS:-1}" VARIANTS="${VARIANTS:-}" RTT="${RTT:-2ms}"
for a in "$@"; do
  case "$a" in
    --read=*) READ="${a#*=}" ;;
    --rates=*) RATES="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --rtt=*) RTT="${a#*=}" ;;
    --variant=*) VARIANTS="$VARIANTS ${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
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

[ -n "${VARIANTS// /}" ] || VARIANTS="fscache:$FILTER"
: > "$OUT/results"
for round in $(seq "$ROUNDS"); do
 for rate in $RATES; do
  for v in nocache $VARIANTS; do
    name="${v%%:*}"
    rm -rf "$OUT/cache" "$OUT/s.sock" "$OUT/s.pid" "$OUT/s.stats"
    if [ "$name" = nocache ]; then
      nbdkit -U "$OUT/s.sock" -P "$OUT/s.pid" --filter=rate \
        --filter=delay null 1T rate="$rate" delay-read="$RTT" \
        2>>"$OUT/nbdkit.log"
    else
      nbdkit -U "$OUT/s.sock" -P "$OUT/s.pid" --filter="${v#*:}" \
        --filter=rate --filter=delay null 1T rate="$rate" \
        delay-read="$RTT" fscache-dir="$OUT/cache" \
        fscache-validate=size fscache-catchup=false \
        fscache-stats="$OUT/s.stats" 2>>"$OUT/nbdkit.log"
    fi
    for i in $(seq 100); do [ -s "$OUT/s.pid" ] && break; sleep 0.1; done
    # The rate filter starts with a full bucket: about 2 s of its rate
    # come at memory speed (a link never does that), which the budget
    # rightly takes for a local upstream.  Drained first, through an
    # export of its own (another object), so that the read measured
    # sees the link alone.
    fio --name=drain --ioengine=nbd \
        --uri="nbd+unix:///drain?socket=$OUT/s.sock" --rw=read --bs=1M \
        --iodepth=8 --size=64G --runtime=4 --time_based \
        --output-format=terse >/dev/null
    fio --name=r --ioengine=nbd --uri="nbd+unix:///?socket=$OUT/s.sock" \
        --rw=randread --bs=64k --iodepth=16 --size="$READ" \
        --output-format=json --output="$OUT/r.json" >/dev/null
    p=$(cat "$OUT/s.pid"); kill "$p"
    while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
    bw=$(python3 "$BENCH_DIR/report.py" fio "$OUT/r.json" |
           awk '{ printf "%.0f", $1 }')
    c=0 fb=-
    if [ "$name" != nocache ]; then
      c=$("$TOOL" ls --dir "$OUT/cache" --json | python3 -c 'import json,sys; print(sum(o["cached_bytes"] for o in json.load(sys.stdin)["objects"] if o["export"] == ""))')
      c=$((c * 100 / readb))
      fb=$(awk '$1 == "fill_bytes" { b = $2 } $1 == "fill_busy_us" { u = $2 } END { if (u) printf "%.0f", b / u * 1e6 / 1048576; else print "-" }' "$OUT/s.stats")
    fi
    echo "$rate $name $bw $c $fb" >> "$OUT/results"
    echo "round $round, link $rate, $name: client $bw MiB/s, cached $c% at the clean stop, fills $fb MiB/s of their busy time"
  done
 done
done
python3 - "$OUT/results" <<'PY'
import sys, statistics
rows = {}
order = []
for line in open(sys.argv[1]):
    rate, name, bw, c, fb = line.split()
    k = (rate, name)
    if k not in rows:
        rows[k] = []; order.append(k)
    rows[k].append((float(bw), float(c), None if fb == "-" else float(fb)))
def m(v):
    v = [x for x in v if x is not None]
    if not v: return "-"
    return "%.0f (%.0f..%.0f)" % (statistics.median(v), min(v), max(v))
print("| link | build | client MiB/s | cached at the clean stop, % | fills, MiB/s of busy time |")
print("|---|---|---:|---:|---:|")
for k in order:
    r = rows[k]
    print("| %s | %s | %s | %s | %s |" % (k[0], k[1], m([x[0] for x in r]),
          "-" if k[1] == "nocache" else m([x[1] for x in r]), m([x[2] for x in r])))
PY
echo "raw results in $OUT"
