#!/usr/bin/env bash
# Memory and start-up at scale (issues 5 and 10): an export of SIZE
# (default 1T; nbdkit null plugin) with SCATTER blocks of 64K cached at
# random places (default 16384 = 1 GiB), then a restart.  Prints the
# proxy's peak RSS (VmHWM) after the fill and after the restart, and
# the time from starting the restarted proxy to the first read served.
#
#   tools/bench/scale.sh [--size=SIZE] [SCATTER]
set -euo pipefail
cd "$(dirname "$0")/../.."
FILTER="${FILTER:-$PWD/plugin/.libs/nbdkit-fscache-filter.so}"
SIZE=1T SCATTER=16384
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    -*) echo "scale.sh: unknown option: $a" >&2; exit 2 ;;
    *) SCATTER="$a" ;;
  esac
done
BYTES=$(numfmt --from=iec "$SIZE")
PY=/usr/bin/python3
work="$(mktemp -d /tmp/fscache-scale.XXXXXX)"
cleanup () {
  for p in "$work"/*.pid; do [ -s "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

wait_pid () { while [ ! -s "$1" ]; do sleep 0.01; done; }
wait_gone () { while kill -0 "$1" 2>/dev/null; do sleep 0.05; done; }

nbdkit -U "$work/up.sock" -P "$work/up.pid" null "$BYTES"
proxy () {
  rm -f "$work/px.sock" "$work/px.pid"
  nbdkit -U "$work/px.sock" -P "$work/px.pid" --filter="$FILTER" \
    nbd socket="$work/up.sock" fscache-dir="$work/cache" \
    fscache-validate=size fscache-readahead=0
  wait_pid "$work/px.pid"
}

proxy
start=$(date +%s.%N)
$PY - "$work/px.sock" "$SCATTER" "$BYTES" <<'PY'
import nbd, random, sys
h = nbd.NBD(); h.connect_unix(sys.argv[1])
random.seed(1)
nblocks = int(sys.argv[3]) // 65536
for b in random.sample(range(nblocks), int(sys.argv[2])):
    h.pread(65536, b * 65536)
h.shutdown()
PY
fill=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { print a - b }')
hwm_fill=$(awk '/VmHWM/ {print $2}' /proc/"$(cat "$work/px.pid")"/status)
pid=$(cat "$work/px.pid"); kill "$pid"; wait_gone "$pid"

start=$(date +%s.%N)
proxy
$PY -c 'import nbd, sys; h = nbd.NBD(); h.connect_unix(sys.argv[1]); h.pread(65536, 0); h.shutdown()' "$work/px.sock"
ready=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { print a - b }')
# Read the cached blocks again after the restart, then measure memory.
$PY - "$work/px.sock" "$SCATTER" "$BYTES" <<'PY'
import nbd, random, sys
h = nbd.NBD(); h.connect_unix(sys.argv[1])
random.seed(1)
nblocks = int(sys.argv[3]) // 65536
for b in random.sample(range(nblocks), int(sys.argv[2])):
    h.pread(65536, b * 65536)
h.shutdown()
PY
hwm_restart=$(awk '/VmHWM/ {print $2}' /proc/"$(cat "$work/px.pid")"/status)
idx=$(du -k "$work"/cache/objects/*/*.idx | awk '{print $1}')
data=$(du -kc "$work"/cache/objects/*/*.data* | awk 'END {print $1}')
nseg=$(ls "$work"/cache/objects/*/*.data* | wc -l)

printf 'export %s, block 64K, %s blocks cached (%s MiB) at random places\n' \
  "$SIZE" "$SCATTER" $((SCATTER / 16))
printf 'fill time             %8.2f s\n' "$fill"
printf 'VmHWM after fill      %8d KiB\n' "$hwm_fill"
printf 'restart to first read %8.3f s\n' "$ready"
printf 'VmHWM after re-read   %8d KiB\n' "$hwm_restart"
printf 'index on disk         %8d KiB\n' "$idx"
printf 'data on disk          %8d KiB in %d segment files\n' "$data" "$nseg"
