#!/usr/bin/env bash
# tools/bench/share.sh: several proxy processes on one object (issue 19).
#
# The bandwidth-bound link of tools/bench/compare.sh: an nbdkit
# serving a random image of SIZE through the log, rate and delay
# filters (RATE bits/s for all connections together, DELAY_MS per
# read):
#
#   nbdkit --filter=log --filter=rate --filter=delay file IMG
#
# and proxies in front of it, each an nbdkit with the fscache filter on
# its own Unix socket, all with one cache directory and one fscache-key.
#
# (a) Cold, a fresh cache each time; every reader copies the whole
#     export (nbdcopy to null:), all readers started at once; the wall
#     time until the last one is done, and the bytes the upstream
#     served (its log filter), for:
#       shared    4 processes, 1 reader each (one object, shared)
#       single    1 process, 4 readers
#       today     the behaviour before sharing: the first process
#                 caches, the 3 others serve the export uncached.  By
#                 default emulated by 3 nbdkit processes without the
#                 filter (nbd plugin straight to the upstream: what an
#                 uncached proxy does); with --old-filter=SO, 4
#                 processes with that filter (a build from before
#                 sharing, e.g. commit 9868966), the real thing.
#     The first reader connects first (its process owns the object).
# (b) Warm random 4k hits: the object made whole first (one copy), then
#     fio (--ioengine=nbd, randread, bs 4k, iodepth IODEPTH, RUNTIME s,
#     time based) with:
#       1x1       1 process, 1 reader
#       1x4       1 process, 4 readers at once
#       4x1       4 processes, 1 reader each at once (the owner's
#                 reader is served in its process, the joiners' through
#                 the owner's socket)
#     IOPS per reader and in total; the upstream bytes read during the
#     phase (should be 0: hits).
#
# Every case runs ROUNDS times (default 3), the cases in a rotated
# order each round; the table gives the median and the spread
# (min..max).
#
# Options (or environment):
#   --size=SIZE        SIZE        image (default 256M)
#   --rate=BITS        RATE        link rate, bits/s (default 400M)
#   --delay-ms=N       DELAY_MS    per read (default 2)
#   --burstiness=S     BURSTINESS  rate filter bucket (default 0.1)
#   --rounds=N         ROUNDS      (default 3)
#   --runtime=S        RUNTIME     fio phases (default 10)
#   --iodepth=N        IODEPTH     fio (default 8)
#   --old-filter=SO    OLD_FILTER  the "today" case with this filter
#   --out=DIR          OUT         (default a new /tmp/fscache-share.XXXXXX)
#   -h, --help
# Filter: $FSCACHE_FILTER, else plugin/.libs/nbdkit-fscache-filter.so
# of the tree (copied to OUT first, so a rebuild cannot change it).
# Output: OUT/table.md (printed), OUT/results.tsv, OUT/raw/.

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
# The tests' helpers: log_read_bytes, cleanup_fn (and a $TMP, unused).
# shellcheck source=/dev/null
source "$top_srcdir/tests/functions.sh"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
SIZE="${SIZE:-256M}" RATE="${RATE:-400M}" DELAY_MS="${DELAY_MS:-2}"
BURSTINESS="${BURSTINESS:-0.1}" ROUNDS="${ROUNDS:-3}"
RUNTIME="${RUNTIME:-10}" IODEPTH="${IODEPTH:-8}"
OLD_FILTER="${OLD_FILTER:-}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --rate=*) RATE="${a#*=}" ;;
    --delay-ms=*) DELAY_MS="${a#*=}" ;;
    --burstiness=*) BURSTINESS="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --runtime=*) RUNTIME="${a#*=}" ;;
    --iodepth=*) IODEPTH="${a#*=}" ;;
    --old-filter=*) OLD_FILTER="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,56p' "$0"; exit 0 ;;
    *) echo "share.sh: unknown option: $a (see --help)" >&2; exit 2 ;;
  esac
done
for c in nbdkit nbdcopy fio python3; do
  command -v "$c" >/dev/null || { echo "share.sh: $c: not installed" >&2; exit 1; }
done
[ -f "$FILTER" ] || { echo "share.sh: $FILTER: not built (./build.sh build)" >&2; exit 1; }
[ -z "$OLD_FILTER" ] || [ -f "$OLD_FILTER" ] ||
  { echo "share.sh: --old-filter: $OLD_FILTER: no such file" >&2; exit 1; }

[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-share.XXXXXX)"
mkdir -p "$OUT/raw" "$OUT/work"
cp "$FILTER" "$OUT/work/fscache.so"
FILTER="$OUT/work/fscache.so"
if [ -n "$OLD_FILTER" ]; then
  cp "$OLD_FILTER" "$OUT/work/fscache-old.so"
  OLD_FILTER="$OUT/work/fscache-old.so"
fi
bytes=$(numfmt --from=iec "$SIZE")
img="$OUT/work/img"
head -c "$bytes" /dev/urandom > "$img"
{
  echo "size=$SIZE rate=$RATE delay_ms=$DELAY_MS burstiness=$BURSTINESS"
  echo "rounds=$ROUNDS runtime=$RUNTIME iodepth=$IODEPTH old_filter=${OLD_FILTER:-emulated}"
  echo "filter=$FILTER ($(git -C "$top_srcdir" describe --always --dirty 2>/dev/null || echo ?))"
  nbdkit --version; fio --version; nproc; uname -r
} > "$OUT/env.txt"

pids=()
cleanup ()
{
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
cleanup_fn cleanup

# start NAME ARGS...: nbdkit on $OUT/work/NAME.sock, once it serves.
start ()
{
  local name="$1" i
  shift
  rm -f "$OUT/work/$name.sock" "$OUT/work/$name.pid"
  echo "nbdkit -U $OUT/work/$name.sock $*" >> "$OUT/raw/commands.txt"
  nbdkit -U "$OUT/work/$name.sock" -P "$OUT/work/$name.pid" "$@" \
    2>>"$OUT/raw/nbdkit-$name.log"
  for (( i=0; i<300; i++ )); do [ -s "$OUT/work/$name.pid" ] && break; sleep 0.05; done
  [ -s "$OUT/work/$name.pid" ] || { echo "share.sh: $name did not start" >&2; exit 1; }
  pids+=("$(cat "$OUT/work/$name.pid")")
}
# stop NAME: SIGTERM, and wait until it is gone (its cache closed).
stop ()
{
  local p i
  p=$(cat "$OUT/work/$1.pid")
  kill "$p" 2>/dev/null || true
  for (( i=0; i<600; i++ )); do
    kill -0 "$p" 2>/dev/null || return 0
    case "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo gone)" in
      Z|X|gone) return 0 ;;
    esac
    sleep 0.05
  done
  echo "share.sh: $1 ($p) did not exit" >&2
  exit 1
}
uri () { echo "nbd+unix:///?socket=$OUT/work/$1.sock"; }

# The link, with a fresh log: upstream bytes are per phase.
start_upstream ()               # LOG
{
  start up --filter=log --filter=rate --filter=delay file "$img" \
    logfile="$1" rate="$RATE" burstiness="$BURSTINESS" \
    delay-read="${DELAY_MS}ms"
}
upstream_bytes () { log_read_bytes "$1"; }     # LOG
proxy ()                        # NAME CACHE [FILTER]
{
  start "$1" --filter="${3:-$FILTER}" nbd socket="$OUT/work/up.sock" \
    fscache-dir="$2" fscache-key=share-bench \
    fscache-stats="$OUT/raw/$1.stats"
}
now () { date +%s.%N; }
since () { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f\n", b - a }'; }

# First reader connects first: its process owns the object (the others
# then start at once).
first_connects ()               # NAME
{
  "$PYTHON" -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pread(4096, 0); h.shutdown()' "$(uri "$1")"
}

# ---- (a) cold ------------------------------------------------------------
cold ()                         # CASE ROUND
{
  local c="$1" r="$2" dir="$OUT/work/cache-$1-$2" names=() n t0 t p rc=0
  local log="$OUT/raw/up-$c-$r.log"
  rm -rf "$dir"
  start_upstream "$log"
  case "$c" in
    shared) for n in 1 2 3 4; do proxy "p$n" "$dir"; names+=("p$n"); done ;;
    single) proxy p1 "$dir"; names=(p1 p1 p1 p1) ;;
    today)
      if [ -n "$OLD_FILTER" ]; then
        for n in 1 2 3 4; do proxy "p$n" "$dir" "$OLD_FILTER"; names+=("p$n"); done
      else
        proxy p1 "$dir"
        for n in 2 3 4; do start "p$n" nbd socket="$OUT/work/up.sock"; done
        names=(p1 p2 p3 p4)
      fi ;;
  esac
  t0=$(now)
  first_connects p1
  local cp=()
  for n in "${names[@]}"; do
    nbdcopy "$(uri "$n")" null: & cp+=($!)
  done
  for p in "${cp[@]}"; do wait "$p" || rc=1; done
  t=$(since "$t0")
  [ $rc -eq 0 ] || { echo "share.sh: cold $c round $r: an nbdcopy failed" >&2; exit 1; }
  for n in $(printf '%s\n' "${names[@]}" | sort -u); do stop "$n"; done
  stop up
  printf 'cold\t%s\t%s\ttime_s\t%s\n' "$c" "$r" "$t" >> "$OUT/results.tsv"
  printf 'cold\t%s\t%s\tupstream_bytes\t%s\n' "$c" "$r" "$(upstream_bytes "$log")" \
    >> "$OUT/results.tsv"
  echo "cold $c round $r: ${t}s, $(upstream_bytes "$log") bytes upstream"
}

# ---- (b) warm random 4k --------------------------------------------------
warm ()                         # CASE ROUND
{
  local c="$1" r="$2" dir="$OUT/work/cache-warm" n jobs=() names=()
  local log="$OUT/raw/up-warm-$c-$r.log"
  start_upstream "$log"
  case "$c" in
    1x1) proxy p1 "$dir"; names=(p1) ;;
    1x4) proxy p1 "$dir"; names=(p1 p1 p1 p1) ;;
    4x1) for n in 1 2 3 4; do proxy "p$n" "$dir"; done; names=(p1 p2 p3 p4) ;;
  esac
  # A connection to p1 first (the owner), held during the run.
  "$PYTHON" -c '
import nbd, os, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pread(4096, 0)
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]): time.sleep(0.05)
h.shutdown()' "$(uri p1)" "$OUT/work/held" "$OUT/work/release" &
  local holder=$!
  while [ ! -e "$OUT/work/held" ]; do sleep 0.05; done
  local b0
  b0=$(upstream_bytes "$log")
  n=0
  for p in "${names[@]}"; do
    n=$((n + 1))
    jobs+=(--name="r$n-$p" --uri="$(uri "$p")")
  done
  fio --ioengine=nbd --rw=randread --bs=4k --iodepth="$IODEPTH" \
      --size="$bytes" --runtime="$RUNTIME" --time_based \
      --output-format=json --output="$OUT/raw/fio-$c-$r.json" \
      "${jobs[@]}" > /dev/null
  local up=$(( $(upstream_bytes "$log") - b0 ))
  touch "$OUT/work/release"
  wait $holder || true
  rm -f "$OUT/work/held" "$OUT/work/release"
  for n in $(printf '%s\n' "${names[@]}" | sort -u); do stop "$n"; done
  stop up
  "$PYTHON" - "$OUT/raw/fio-$c-$r.json" "$c" "$r" "$up" >> "$OUT/results.tsv" <<'EOF'
import json, sys
f, c, r, up = sys.argv[1:]
jobs = json.load(open(f))["jobs"]
iops = [j["read"]["iops"] for j in jobs]
print("warm\t%s\t%s\ttotal_iops\t%.0f" % (c, r, sum(iops)))
print("warm\t%s\t%s\tfirst_iops\t%.0f" % (c, r, iops[0]))
others = iops[1:] or iops
print("warm\t%s\t%s\tother_iops\t%.0f" % (c, r, sum(others) / len(others)))
print("warm\t%s\t%s\tupstream_bytes\t%s" % (c, r, up))
EOF
  echo "warm $c round $r: $(awk -v c="$c" -v r="$r" '$1 == "warm" && $2 == c && $3 == r && $4 == "total_iops" { print $5 }' "$OUT/results.tsv") IOPS in total"
}

: > "$OUT/results.tsv"
cold_cases=(shared single today)
warm_cases=(1x1 1x4 4x1)
for (( r=1; r<=ROUNDS; r++ )); do
  for (( i=0; i<3; i++ )); do
    cold "${cold_cases[$(( (i + r - 1) % 3 ))]}" "$r"
  done
done
# The warm object: one whole copy through one process.
start_upstream "$OUT/raw/up-warm-fill.log"
proxy p1 "$OUT/work/cache-warm"
nbdcopy "$(uri p1)" null:
stop p1
stop up
for (( r=1; r<=ROUNDS; r++ )); do
  for (( i=0; i<3; i++ )); do
    warm "${warm_cases[$(( (i + r - 1) % 3 ))]}" "$r"
  done
done

# ---- the table -----------------------------------------------------------
"$PYTHON" - "$OUT/results.tsv" "$bytes" > "$OUT/table.md" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
size = int(sys.argv[2])
def vals(phase, case, key):
    return [float(r[4]) for r in rows if r[0] == phase and r[1] == case and r[3] == key]
def fmt(v, f="%.2f"):
    if not v:
        return "-"
    return (f % statistics.median(v)) + " (" + (f % min(v)) + ".." + (f % max(v)) + ")"
print("| cold, all readers at once | processes x readers | time, s | upstream bytes (x export) |")
print("|---|---|---:|---:|")
names = {"shared": ("shared object", "4 x 1"),
         "single": ("one process", "1 x 4"),
         "today": ("before sharing: later processes uncached", "4 x 1")}
for c in ("shared", "single", "today"):
    t = vals("cold", c, "time_s")
    b = vals("cold", c, "upstream_bytes")
    print("| %s | %s | %s | %s (%.2fx) |" % (names[c][0], names[c][1], fmt(t),
          "%d" % statistics.median(b) if b else "-",
          statistics.median(b) / size if b else 0))
print()
print("| warm random 4k hits | processes x readers | IOPS, total | IOPS, first reader | IOPS, each other reader | upstream bytes |")
print("|---|---|---:|---:|---:|---:|")
wn = {"1x1": "1 x 1", "1x4": "1 x 4", "4x1": "4 x 1 (first: the owner's)"}
for c in ("1x1", "1x4", "4x1"):
    up = vals("warm", c, "upstream_bytes")
    print("| %s | %s | %s | %s | %s | %s |" % (
        "one process" if c != "4x1" else "shared object", wn[c],
        fmt(vals("warm", c, "total_iops"), "%.0f"),
        fmt(vals("warm", c, "first_iops"), "%.0f"),
        fmt(vals("warm", c, "other_iops"), "%.0f") if c != "1x1" else "-",
        "%d" % max(up) if up else "-"))
EOF
echo
echo "medians of $ROUNDS rounds (min..max); $SIZE image, ${RATE} bit/s + ${DELAY_MS} ms per read"
cat "$OUT/table.md"
echo
echo "share.sh: results in $OUT"
