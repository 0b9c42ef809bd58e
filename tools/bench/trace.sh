#!/usr/bin/env bash
# tools/bench/trace.sh: warming from an access trace, against warming
# everything and against not warming, for a boot-like workload over a
# slow link.
#
# The link: nbdkit --filter=rate --filter=delay file IMG rate=RATE
# burstiness=BURSTINESS delay-read=DELAY_MS.  nbdkit's rate= is in bits
# per second: the default rate=200M is 25 MB/s (a "25M" would be 25
# Mbit/s, 3 MB/s, and a whole-export warm of 1 GiB would take six
# minutes a round), with 5 ms added to every read.  burstiness=0.1:
# the rate filter's bucket (default 2 s) refills while the link idles
# between scenarios, and would carry the first 50 MB of a warm for
# free.  One remote serves every scenario.
#
# The workload (boot-workload.py): one reader, one request at a time,
# READS (3000) reads of 4-64 KiB at seeded random offsets, ~5% of a
# 1 GiB export, THINK_MS (1) between reads.  Each scenario starts from
# an empty cache (a new fscache-dir) and a new proxy:
#
#   none    no warming: the workload alone (with fscache-trace=,
#           recording the trace scenario 3 replays)
#   whole   nbd-fscache warm URI (the whole export), then the workload
#   trace   nbd-fscache warm --trace (the trace of this round's "none"
#           run, recorded on its own cache dir), then the workload
#
# Options (or environment): --size=SIZE (SIZE, default 1G),
# --rate=BITS (RATE, 200M), --burstiness=SECS (BURSTINESS, 0.1),
# --delay-ms=N (DELAY_MS, 5), --reads=N
# (READS, 3000), --think-ms=N (THINK_MS, 1), --connections=N
# (CONNECTIONS, 4), --window=N (WINDOW, 16), --rounds=N (ROUNDS, 3),
# --out=DIR (OUT, default a new /tmp/fscache-trace.XXXXXX: results.tsv,
# table.md, raw/ with each command's output and the traces).
#
# Output: a markdown table of the medians over the rounds (and the
# spread, min..max): warm time, workload time, their total, bytes read
# upstream in all (the proxy's upstream_read_bytes), and of those by
# the workload (the total less the bytes the warm reported warmed: on
# an empty cache a warm fetches exactly what it warms).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
WARM="$top_builddir/tools/nbd-fscache/nbd-fscache"
SIZE="${SIZE:-1G}" RATE="${RATE:-200M}" BURSTINESS="${BURSTINESS:-0.1}"
DELAY_MS="${DELAY_MS:-5}"
READS="${READS:-3000}" THINK_MS="${THINK_MS:-1}"
CONNECTIONS="${CONNECTIONS:-4}" WINDOW="${WINDOW:-16}"
ROUNDS="${ROUNDS:-3}" OUT="${OUT:-}"
ORIG_ARGS="$*"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --rate=*) RATE="${a#*=}" ;;
    --burstiness=*) BURSTINESS="${a#*=}" ;;
    --delay-ms=*) DELAY_MS="${a#*=}" ;;
    --reads=*) READS="${a#*=}" ;;
    --think-ms=*) THINK_MS="${a#*=}" ;;
    --connections=*) CONNECTIONS="${a#*=}" ;;
    --window=*) WINDOW="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "trace.sh: unknown option: $a (see --help)" >&2; exit 2 ;;
  esac
done
for c in nbdkit python3 numfmt; do
  command -v "$c" >/dev/null || { echo "trace.sh: $c: not installed" >&2; exit 1; }
done
[ -f "$FILTER" ] || { echo "trace.sh: $FILTER: not built (./build.sh build)" >&2; exit 1; }
[ -x "$WARM" ] || { echo "trace.sh: $WARM: not built (./build.sh build)" >&2; exit 1; }
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
"$PY" -c 'import nbd' 2>/dev/null ||
  { echo "trace.sh: python3 has no libnbd bindings (python3-libnbd)" >&2; exit 1; }

nbdkit --filter="$FILTER" null --help 2>/dev/null | grep -q '^fscache-trace=' ||
  { echo "trace.sh: $FILTER has no fscache-trace=" >&2; exit 1; }

[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-trace.XXXXXX)"
mkdir -p "$OUT/raw" "$OUT/work"
OUT="$(cd "$OUT" && pwd)"
RAW="$OUT/raw" WORK="$OUT/work"

# Our servers, stopped by pid at exit; the image and caches removed.
pids=()
cleanup ()
{
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# A private copy of the filter: the tree may be rebuilt during the run.
cp "$FILTER" "$WORK/filter.so"

bytes=$(numfmt --from=iec "$SIZE")
echo "trace.sh: output in $OUT; creating a $SIZE random image"
head -c "$bytes" /dev/urandom > "$WORK/image.img"

{
  echo "date	$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command	$0 $ORIG_ARGS"
  echo "SIZE	$SIZE ($bytes bytes)"
  echo "link	rate=$RATE (bits/s) burstiness=$BURSTINESS delay-read=${DELAY_MS}ms"
  echo "workload	$READS reads of 4-64 KiB, think ${THINK_MS} ms, seed 1"
  echo "warm	--connections $CONNECTIONS; trace --window $WINDOW"
  echo "trace	recorded by fscache-trace="
  echo "nbdkit	$(nbdkit --version)"
  echo "git	$(git -C "$top_srcdir" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "cpus	$(nproc)"
} > "$OUT/env.txt"

# start NAME ARGS...: an nbdkit on $WORK/NAME.sock, waited for.
start ()
{
  local name="$1" i
  shift
  rm -f "$WORK/$name.sock" "$WORK/$name.pid"
  echo "$name: nbdkit $*" >> "$RAW/commands.txt"
  nbdkit -U "$WORK/$name.sock" -P "$WORK/$name.pid" "$@" 2>>"$RAW/$name.log"
  for (( i=0; i<200; i++ )); do [ -s "$WORK/$name.pid" ] && break; sleep 0.05; done
  [ -s "$WORK/$name.pid" ] || { echo "trace.sh: nbdkit $name did not start" >&2; exit 1; }
  pids+=("$(cat "$WORK/$name.pid")")
}

# stop NAME: SIGTERM, and wait until it has exited (its stats written).
stop ()
{
  local pid i state
  pid=$(cat "$WORK/$1.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for (( i=0; i<1200; i++ )); do
    state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) || state=gone
    if [ "$state" = Z ] || [ "$state" = gone ]; then
      local keep=() p
      for p in "${pids[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
      pids=("${keep[@]}")
      return 0
    fi
    sleep 0.05
  done
  echo "trace.sh: nbdkit $1 did not exit" >&2
  exit 1
}

start remote --filter=rate --filter=delay file "$WORK/image.img" \
  rate="$RATE" burstiness="$BURSTINESS" delay-read="${DELAY_MS}ms"

# proxy [ARGS...]: a fresh proxy on an empty cache.
proxy ()
{
  rm -rf "$WORK/cache" "$WORK/px.stats"
  start px --filter="$WORK/filter.so" nbd socket="$WORK/remote.sock" \
    fscache-dir="$WORK/cache" fscache-key=bench-trace \
    fscache-stats="$WORK/px.stats" "$@"
}
PX="nbd+unix:///?socket=$WORK/px.sock"
upstream_bytes () { awk '$1 == "upstream_read_bytes" { print $2; f = 1 } END { if (!f) print 0 }' "$WORK/px.stats"; }
now () { date +%s.%N; }
since () { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f\n", b - a }'; }
workload ()
{
  "$PY" "$BENCH_DIR/boot-workload.py" "$PX" "$bytes" --reads="$READS" \
    --think-ms="$THINK_MS" "$@"
}

printf 'round\tscenario\twarm_s\tworkload_s\ttotal_s\tupstream_bytes\twarmed_bytes\n' > "$OUT/results.tsv"
row () { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$OUT/results.tsv"; echo "  $*"; }
warmed () { awk '$1 == "warmed" { print $2; f = 1 } END { if (!f) print 0 }' "$1"; }

# warm_then_workload ROUND NAME WARM-ARGS...: a fresh proxy, `nbd-fscache
# warm WARM-ARGS`, then the workload; one row.
warm_then_workload ()
{
  local r="$1" name="$2" t0 ws w
  shift 2
  proxy
  t0=$(now)
  "$WARM" warm "$PX" --connections "$CONNECTIONS" "$@" \
    > "$RAW/r$r.$name.out" 2> "$RAW/r$r.$name.err"
  ws=$(since "$t0")
  w=$(workload)
  stop px
  row "$r" "$name" "$ws" "$w" \
    "$(awk -v a="$ws" -v b="$w" 'BEGIN { printf "%.2f", a + b }')" \
    "$(upstream_bytes)" "$(warmed "$RAW/r$r.$name.out")"
}

for (( r=1; r<=ROUNDS; r++ )); do
  echo "round $r"
  tr="$RAW/r$r.trace"

  # 1. No warming (recording the trace).
  proxy fscache-trace="$tr"
  w=$(workload)
  stop px
  row "$r" none 0 "$w" "$w" "$(upstream_bytes)" 0

  # 2. The whole export, then the workload.
  warm_then_workload "$r" whole

  # 3. The trace, then the workload.
  warm_then_workload "$r" trace --trace "$tr" --window "$WINDOW"
done
stop remote

"$PY" - "$OUT/results.tsv" "$OUT/env.txt" > "$OUT/table.md" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
env = dict(l.rstrip("\n").split("\t", 1) for l in open(sys.argv[2]))
names = [("none", "no warming"), ("whole", "`warm` whole export"),
         ("trace", "`warm --trace`")]
rounds = len(set(r[0] for r in rows))
print("%s; link %s; workload %s; %s; trace %s; %d round%s, medians "
      "(min..max)" % (env["SIZE"], env["link"], env["workload"], env["warm"],
                     env["trace"], rounds, "" if rounds == 1 else "s"))
print()
print("| scenario | warm s | workload s | total s | upstream MiB | of which the workload |")
print("|---|---:|---:|---:|---:|---:|")
def cell(vals, fmt="%.2f"):
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt % m
    return (fmt + " (" + fmt + ".." + fmt + ")") % (m, min(vals), max(vals))
for key, label in names:
    rs = [r for r in rows if r[1] == key]
    if not rs:
        continue
    col = lambda i: [float(r[i]) for r in rs]
    up = [v / 1048576 for v in col(5)]
    wl = [(a - b) / 1048576 for a, b in zip(col(5), col(6))]
    print("| %s | %s | %s | %s | %s | %s |" % (
        label, cell(col(2)) if key != "none" else "-", cell(col(3)),
        cell(col(4)), cell(up, "%.1f"), cell(wl, "%.1f")))
EOF
cat "$OUT/table.md"
echo "results in $OUT"
