#!/usr/bin/env bash
# tools/bench/writeback.sh: writes over a slow link (issue 17).
#
# The remote: nbdkit --filter=delay file IMG delay-write=D delay-read=D
# (the "10 ms link", D = DELAY_MS), on a Unix socket.  Configurations,
# all in the same run, in a rotated order each round:
#
#   nocache       fio -> remote
#   writethrough  fio -> nbdkit --filter=fscache (default mode) nbd -> remote
#   writeback     fio -> nbdkit --filter=fscache fscache-mode=writeback nbd
#                 -> remote
#   nbdcache      fio -> nbdkit --filter=cache cache=writeback nbd -> remote
#   local         fio -> nbdkit file IMG (no delay: the limit)
#
# Phases:
#   w4k-qd1, w4k-qd16, w4k-qd64
#                 fio randwrite bs=4k fsync=16 at iodepth 1, 16, 64,
#                 time_based RUNTIME s; write IOPS
#   mix           the image is read once through the configuration
#                 (warm caches), then fio randrw rwmixread=70 bs=4k
#                 fsync=16 iodepth=16 for RUNTIME s; read+write IOPS
#   fua-qd1, fua-qd16
#                 FUA_WRITES random 4 KiB writes, every other one with
#                 FUA, one flush at the end (tests/wb-oracle write
#                 --fua-every 2 --flush-every 0, at depth 1 and 16: fio's
#                 nbd engine cannot send FUA); writes per second.  Since
#                 rule 6 (core/wlog/writeback.c) each completed FUA write ends
#                 a writeback epoch
#   fua-drain     writeback and nocache only: the fua-qd1 workload, the
#                 time from its start until everything is on the remote
#                 (writeback: the log empty again); writes per second.
#                 What the epoch per FUA write costs the writer: each
#                 epoch is written back, then flushed upstream, before
#                 the next is sent
#   drain         writeback only, on a bandwidth-bound link (RATE bits/s,
#                 rate filter): DRAIN_SIZE of random data written with
#                 nbdcopy through a writeback proxy; the time from the
#                 start until the log is empty again (everything on the
#                 remote, remote-flushed), against nbdcopy of the same
#                 data straight to the same remote (the link's speed)
#
# Every phase runs ROUNDS times (default 3); the report gives medians
# and spreads (min..max) and each ratio within a round before its
# median.  The proxies are stopped with SIGTERM at the end of each
# phase, the writeback proxy with fscache-writeback-drain=0 (what is
# dirty then stays in its cache, which the next phase deletes): the
# drain phase measures the writer.
#
# Output: OUT (default a new /tmp/fscache-wbbench.XXXXXX): results.tsv,
# table.md, raw fio JSON and server logs.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
export top_srcdir top_builddir

usage ()
{
  cat <<EOF
Usage: $0 [--size=256M] [--runtime=8] [--rounds=3] [--delay-ms=10]
          [--rate=200M] [--drain-size=1G] [--fua-writes=2000]
          [--configs="A B"] [--phases="A B"] [--out=DIR]
Configs: nocache writethrough writeback nbdcache local
Phases:  w4k-qd1 w4k-qd16 w4k-qd64 mix fua-qd1 fua-qd16 fua-drain drain
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --size=*)       SIZE="${1#*=}" ;;
    --runtime=*)    RUNTIME="${1#*=}" ;;
    --rounds=*)     ROUNDS="${1#*=}" ;;
    --delay-ms=*)   DELAY_MS="${1#*=}" ;;
    --rate=*)       RATE="${1#*=}" ;;
    --drain-size=*) DRAIN_SIZE="${1#*=}" ;;
    --fua-writes=*) FUA_WRITES="${1#*=}" ;;
    --configs=*)    CONFIGS="${1#*=}" ;;
    --phases=*)     PHASES="${1#*=}" ;;
    --out=*)        OUT="${1#*=}" ;;
    -h|--help)      usage; exit 0 ;;
    *) echo "$0: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
: "${SIZE:=256M}" "${RUNTIME:=8}" "${ROUNDS:=3}" "${DELAY_MS:=10}"
: "${RATE:=200M}" "${DRAIN_SIZE:=1G}" "${FUA_WRITES:=2000}"
: "${CONFIGS:=nocache writethrough writeback nbdcache local}"
: "${PHASES:=w4k-qd1 w4k-qd16 w4k-qd64 mix fua-qd1 fua-qd16 fua-drain drain}"

source "$top_srcdir/tests/functions.sh"
for cmd in nbdkit fio nbdcopy python3; do
  command -v "$cmd" >/dev/null || { echo "$0: $cmd is required" >&2; exit 2; }
done
[ -f "$FILTER" ] || { echo "$0: no filter at $FILTER" >&2; exit 2; }
ORACLE="$top_builddir/tests/wb-oracle"
case " $PHASES " in
  *" fua-"*)
    [ -x "$ORACLE" ] ||
      { echo "$0: $ORACLE is not built (make check TESTS=)" >&2; exit 2; } ;;
esac
OUT="${OUT:-$(mktemp -d /tmp/fscache-wbbench.XXXXXX)}"
mkdir -p "$OUT/raw"
OUT="$(cd "$OUT" && pwd)"
cp "$FILTER" "$OUT/filter.so"
FILTER="$OUT/filter.so"
bytes () { numfmt --from=iec "$1"; }
SIZE_B=$(bytes "$SIZE")
DRAIN_B=$(bytes "$DRAIN_SIZE")
: > "$OUT/results.tsv"
echo "size=$SIZE runtime=$RUNTIME rounds=$ROUNDS delay_ms=$DELAY_MS" \
     "rate=$RATE drain=$DRAIN_SIZE fua_writes=$FUA_WRITES" \
     "$(nbdkit --version | head -1)" \
     "$(fio --version)" > "$OUT/env.txt"

# Servers in the foreground of a background job, so that their exit
# (after a writeback drain) can be waited for.
srv_start ()            # NAME ARGS...: nbdkit -f on $TMP/NAME.sock
{
  local name="$1"; shift
  rm -f "$TMP/$name.sock" "$TMP/$name.pid"
  nbdkit -f -P "$TMP/$name.pid" -U "$TMP/$name.sock" "$@" \
    2>>"$OUT/raw/nbdkit-$name.log" &
  wait_until test -S "$TMP/$name.sock"
  wait_until test -s "$TMP/$name.pid"
}
srv_stop ()             # NAME: SIGTERM, wait until it has exited
{
  local pid
  pid="$(cat "$TMP/$1.pid" 2>/dev/null)" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$TMP/$1.pid"
}

remote_start ()         # [RATE]: the slow remote on up.sock
{
  local rate=() rparams=()
  if [ -n "${1:-}" ]; then
    rate=(--filter=rate)
    rparams=(rate="$1" burstiness=0.1)
  fi
  srv_start up "${rate[@]}" --filter=delay file "$TMP/img" \
    delay-write="${DELAY_MS}ms" delay-read="${DELAY_MS}ms" "${rparams[@]}"
}

config_start ()         # CONFIG: the server fio talks to, as cfg.sock
{
  local up="socket=$TMP/up.sock"
  case "$1" in
    nocache)      srv_start cfg nbd "$up" ;;
    writethrough) srv_start cfg --filter="$FILTER" nbd "$up" \
                    fscache-dir="$TMP/cache" fscache-key=bench ;;
    writeback)    srv_start cfg --filter="$FILTER" nbd "$up" \
                    fscache-dir="$TMP/cache" fscache-key=bench \
                    fscache-mode=writeback fscache-writeback-drain=0 ;;
    nbdcache)     srv_start cfg --filter=cache nbd "$up" cache=writeback ;;
    local)        srv_start cfg file "$TMP/img" ;;
  esac
}

fio_iops ()             # OUTNAME FIO-ARGS...: prints read+write IOPS
{
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$TMP/cfg.sock" \
      --size="$SIZE_B" --bs=4k --time_based --runtime="$RUNTIME" \
      --output-format=json "${@:2}" > "$OUT/raw/$1.json" 2>/dev/null
  python3 - "$OUT/raw/$1.json" <<'EOF'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index('{'):])['jobs'][0]
print(round(j['read']['iops'] + j['write']['iops']))
EOF
}

fresh_image () { rm -f "$TMP/img"; truncate -s "$1" "$TMP/img"; }

fua_load ()             # OUTNAME DEPTH SOCKET: FUA_WRITES writes, every
{                       # other one with FUA; prints the seconds taken
  local t0 t1
  t0=$(date +%s.%N)
  "$ORACLE" write "nbd+unix:///?socket=$3" "$OUT/raw/$1.log" \
    --writes "$FUA_WRITES" --fua-every 2 --flush-every 0 --depth "$2" \
    2>>"$OUT/raw/$1.err" ||
    { echo "$0: $1: wb-oracle write failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}

log_empty ()            # the writeback log of $TMP/cache rewound
{
  local wlog
  wlog="$(find "$TMP/cache/objects" -name '*.wlog')"
  [ "$(stat -c %s "$wlog")" -le 8192 ]
}

run_phase ()            # PHASE CONFIG ROUND
{
  local phase="$1" c="$2" r="$3" v
  rm -rf "$TMP/cache"
  case "$phase" in
    w4k-qd*)
      fresh_image "$SIZE_B"
      remote_start; config_start "$c"
      v=$(fio_iops "$phase-$c-$r" --rw=randwrite --fsync=16 \
            --iodepth="${phase#w4k-qd}")
      srv_stop cfg; srv_stop up ;;
    fua-qd*)
      fresh_image "$SIZE_B"
      remote_start; config_start "$c"
      local secs
      secs=$(fua_load "$phase-$c-$r" "${phase#fua-qd}" "$TMP/cfg.sock")
      v=$(python3 -c "print(round($FUA_WRITES / $secs))")
      srv_stop cfg; srv_stop up ;;
    fua-drain)
      [ "$c" = writeback ] || [ "$c" = nocache ] || return 0
      fresh_image "$SIZE_B"
      remote_start
      local secs t0
      if [ "$c" = nocache ]; then
        secs=$(fua_load "$phase-$c-$r" 1 "$TMP/up.sock")
      else
        srv_start cfg --filter="$FILTER" nbd "socket=$TMP/up.sock" \
          fscache-dir="$TMP/cache" fscache-key=bench fscache-mode=writeback \
          fscache-writeback-drain=3600
        t0=$(date +%s.%N)
        fua_load "$phase-$c-$r" 1 "$TMP/cfg.sock" >/dev/null
        while ! log_empty; do sleep 0.05; done
        secs=$(python3 -c "print($(date +%s.%N) - $t0)")
        srv_stop cfg
      fi
      srv_stop up
      v=$(python3 -c "print(round($FUA_WRITES / $secs))") ;;
    mix)
      fresh_image "$SIZE_B"
      remote_start; config_start "$c"
      nbdcopy --connections=4 "nbd+unix:///?socket=$TMP/cfg.sock" null:
      v=$(fio_iops "$phase-$c-$r" --rw=randrw --rwmixread=70 --fsync=16 \
            --iodepth=16)
      srv_stop cfg; srv_stop up ;;
    drain)
      [ "$c" = writeback ] || [ "$c" = nocache ] || return 0
      fresh_image "$DRAIN_B"
      [ -f "$TMP/data" ] || head -c "$DRAIN_B" /dev/urandom > "$TMP/data"
      remote_start "$RATE"
      local t0 t1
      if [ "$c" = nocache ]; then
        t0=$(date +%s.%N)
        nbdcopy "$TMP/data" "nbd+unix:///?socket=$TMP/up.sock"
        t1=$(date +%s.%N)
      else
        # Room for all of it: this measures the writer, not the bound.
        srv_start cfg --filter="$FILTER" nbd "socket=$TMP/up.sock" \
          fscache-dir="$TMP/cache" fscache-key=bench fscache-mode=writeback \
          fscache-dirty-max=$((DRAIN_B * 2)) fscache-writeback-drain=3600
        t0=$(date +%s.%N)
        nbdcopy "$TMP/data" "nbd+unix:///?socket=$TMP/cfg.sock"
        # Empty again: the writer rewinds the log to its two header
        # slots (8192 bytes) once everything is written back.
        local wlog
        wlog="$(find "$TMP/cache/objects" -name '*.wlog')"
        while [ "$(stat -c %s "$wlog")" -gt 8192 ]; do sleep 0.05; done
        t1=$(date +%s.%N)
        srv_stop cfg
      fi
      srv_stop up
      cmp -n "$DRAIN_B" "$TMP/data" "$TMP/img" ||
        { echo "$0: drain: the remote does not hold the data" >&2; exit 1; }
      v=$(python3 -c "print(round($DRAIN_B / 1048576 / ($t1 - $t0), 2))") ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$phase" "$c" "$r" "$v" >> "$OUT/results.tsv"
  printf '%-10s %-13s round %s: %s\n' "$phase" "$c" "$r" "$v"
}

read -r -a cfgs <<< "$CONFIGS"
for phase in $PHASES; do
  for (( r=1; r<=ROUNDS; r++ )); do
    n=${#cfgs[@]}
    for (( i=0; i<n; i++ )); do
      run_phase "$phase" "${cfgs[$(( (i + r - 1) % n ))]}" "$r"
    done
  done
done

python3 - "$OUT/results.tsv" > "$OUT/table.md" <<'EOF'
import statistics, sys
from collections import defaultdict
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1]) if l.strip()]
v = defaultdict(dict)
for ph, c, r, x in rows:
    v[(ph, c)][int(r)] = float(x)
phases = list(dict.fromkeys(p for p, _, _, _ in rows))
configs = list(dict.fromkeys(c for _, c, _, _ in rows))
def med(xs):
    return "%g (%g..%g)" % (statistics.median(xs), min(xs), max(xs))
print("| phase | unit | " + " | ".join(configs) +
      " | writeback / local | writeback / no cache |")
print("|---|---|" + "---:|" * (len(configs) + 2))
for ph in phases:
    unit = "MiB/s" if ph == "drain" else \
        "writes/s" if ph.startswith("fua-") else "IOPS"
    cells = []
    for c in configs:
        d = v.get((ph, c))
        cells.append(med(list(d.values())) if d else "-")
    def ratio(a, b):
        if (ph, a) not in v or (ph, b) not in v:
            return "-"
        rs = [v[(ph, a)][r] / v[(ph, b)][r]
              for r in v[(ph, a)] if r in v[(ph, b)] and v[(ph, b)][r]]
        return "%.2f (%.2f..%.2f)" % (statistics.median(rs), min(rs),
                                      max(rs)) if rs else "-"
    print("| %s | %s | %s | %s | %s |" % (ph, unit, " | ".join(cells),
                                          ratio("writeback", "local"),
                                          ratio("writeback", "nocache")))
EOF
cat "$OUT/table.md"
echo "results in $OUT"
