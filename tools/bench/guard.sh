#!/usr/bin/env bash
# tools/bench/guard.sh: hits on a saturated cache disk (issue 44, the
# latency guard, core/ops/guard.c).
#
# The cache directory is on an ext4 file system on a loop device whose
# reads the blkio controller holds to IOPS a second (default 50: a disk
# that answers a random read in about 20 ms, as one saturated by other
# work does).  The upstream is a file behind nbdkit's delay filter
# (RDELAY, default 1ms: a server on the LAN).  The whole export is
# cached first (the throttle off), the cache files' pages are dropped,
# the throttle is set, and fio reads random 4 KiB blocks at queue
# depth 1 for SECONDS through:
#
#   upstream   nbdkit --filter=delay file IMG (no cache: the limit)
#   guard      the proxy, fscache-latency-guard=true (the default)
#   noguard    the proxy, fscache-latency-guard=false
#
# each ROUNDS times, alternating, the pages dropped before each; it
# reports IOPS and completion latency p50, p99 and p99.9 (fio's), the
# medians over rounds, and the proxy's hits_rerouted and guard_switches.
# Needs root, a loop device and cgroup v1's blkio throttle.
#
# Options (or environment): --size=SIZE (64M), --iops=N (50),
# --rdelay=D (1ms), --seconds=S (10), --rounds=N (3), --out=DIR.

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="$top_builddir/tools/nbd-fscache/nbd-fscache"
SIZE="${SIZE:-64M}" IOPS="${IOPS:-50}" RDELAY="${RDELAY:-1ms}"
SECONDS_="${SECONDS_:-10}" ROUNDS="${ROUNDS:-3}" OUT="${OUT:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --iops=*) IOPS="${a#*=}" ;;
    --rdelay=*) RDELAY="${a#*=}" ;;
    --seconds=*) SECONDS_="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    *) echo "$0: unknown option $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/guard-bench.XXXXXX)"
mkdir -p "$OUT"
throttle=/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device
[ -w "$throttle" ] || { echo "$0: needs $throttle (root, cgroup v1 blkio)" >&2; exit 2; }

pid=
cleanup ()
{
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  [ -n "${mm:-}" ] && echo "$mm 0" > "$throttle" 2>/dev/null || true
  mountpoint -q "$OUT/slow" && umount -l "$OUT/slow" || true
  [ -n "${loop:-}" ] && losetup -d "$loop" || true
}
trap cleanup EXIT

truncate -s 512M "$OUT/disk.img"
loop=$(losetup -f --show "$OUT/disk.img")
mm=$(lsblk -dno MAJ:MIN "$loop" | tr -d ' ')
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
mkdir -p "$OUT/slow"
mount "$loop" "$OUT/slow"
cache="$OUT/slow/cache"
img="$OUT/img"
bytes=$(numfmt --from=iec "$SIZE")
head -c "$bytes" /dev/urandom > "$img"
sock="$OUT/s.sock"
uri="nbd+unix:///?socket=$sock"

start ()                        # start CONFIG
{
  rm -f "$OUT/stats"
  local args=()
  case "$1" in
    upstream) args=(--filter=delay file "$img" rdelay="$RDELAY") ;;
    guard|noguard|warm)
      args=(--filter="$FILTER" --filter=delay file "$img" rdelay="$RDELAY"
            fscache-dir="$cache" fscache-validate=size
            fscache-stats="$OUT/stats" fscache-catchup=false)
      [ "$1" = noguard ] && args+=(fscache-latency-guard=false) ;;
  esac
  rm -f "$sock" "$OUT/pid"
  NBD_FSCACHE_TEST_BUDGET=0 nbdkit -f -U "$sock" -P "$OUT/pid" "${args[@]}" \
    2>>"$OUT/nbdkit.err" &
  pid=$!
  while [ ! -s "$OUT/pid" ]; do sleep 0.05; done
}
stop ()
{
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}
drop_pages ()
{
  sync
  find "$cache" -type f -print0 | xargs -0 python3 -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)'
}

# Cache it all, the throttle off.
start warm
nbdcopy "$uri" null:
stop
echo "cached: $("$TOOL" stat --dir "$cache" | awk '$1 == "cached_bytes" { print $2 }') of $bytes bytes"
echo "$mm $IOPS" > "$throttle"

printf '%-9s %8s %10s %10s %10s %9s %8s\n' config IOPS 'p50(us)' 'p99(us)' \
  'p99.9(us)' rerouted switches | tee "$OUT/results"
for round in $(seq "$ROUNDS"); do
  for cfg in upstream guard noguard; do
    drop_pages
    start "$cfg"
    fio --name=g --ioengine=nbd --uri="$uri" --rw=randread --bs=4k \
      --iodepth=1 --size="$bytes" --time_based --runtime="$SECONDS_" \
      --randrepeat=0 --output-format=json > "$OUT/$cfg.$round.json"
    stop
    rer=- sw=-
    if [ "$cfg" != upstream ]; then
      rer=$(awk '$1 == "hits_rerouted" { print $2 }' "$OUT/stats")
      sw=$(awk '$1 == "guard_switches" { print $2 }' "$OUT/stats")
    fi
    python3 - "$OUT/$cfg.$round.json" "$cfg" "$rer" "$sw" <<'PY' | tee -a "$OUT/results"
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["read"]
p = j["clat_ns"]["percentile"]
print("%-9s %8.0f %10.0f %10.0f %10.0f %9s %8s" % (sys.argv[2], j["iops"],
      p["50.000000"] / 1e3, p["99.000000"] / 1e3, p["99.900000"] / 1e3,
      sys.argv[3], sys.argv[4]))
PY
  done
done
echo "medians over $ROUNDS rounds:"
python3 - "$OUT/results" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]).read().splitlines()[1:]:
    f = line.split()
    rows[f[0]].append([float(x) for x in f[1:5]])
for cfg in ("upstream", "guard", "noguard"):
    if rows[cfg]:
        m = [statistics.median(c) for c in zip(*rows[cfg])]
        print("%-9s IOPS %.0f  p50 %.0f  p99 %.0f  p99.9 %.0f us" % (cfg, *m))
PY
