#!/usr/bin/env bash
# tools/bench/latency.sh: hits' latency while the cache works (issue 44).
#
# One proxy, nbdkit --filter=fscache --filter=rate file dir=IMGS (the
# link, RATE, default 1600M bits/s), two exports: "warm" (WARM, default
# 256M, warmed whole first with nbd-fscache warm, so that every read of
# it is a hit: the script reports its misses) and "cold" (COLD,
# default 5G, never read before: its copy at the link's speed outlasts
# the measurement, or the script says so).  fio random 4 KiB reads of
# "warm" for SECONDS at iodepth 1 and 8, in these conditions:
#
#   idle     nothing else
#   fills    a second client copies "cold" through the same proxy
#            (nbdcopy): the cache fills at the link's speed; its limit
#            is measured twice: the local file beside a writer of what
#            the fills wrote (the disk's load), and beside that writer
#            and the same cold copy through a bare proxy over the same
#            link (nbdkit --filter=rate file dir=IMGS, no cache): the
#            same load without the cache ("fills (limit: fills+copy)")
#   nofill   the same copy with fills stopped (DIR/fscache.stop): what
#            the copy itself costs the hits, beside nothing on the disk
#            (its limit is the local file idle)
#   evict    the same copy through a proxy capped at WARM + CAP_EXTRA
#            (fscache-max-size, default 256M more): every fill past
#            the cap evicts (evicted_bytes says how much); its limits
#            as for fills
#   drain    a writeback proxy (fscache-mode=writeback) of an image
#            "wb" was just written WB (default 1G, the default
#            fscache-dirty-max) at local speed: its writer drains it to
#            the upstream through a link of DRAIN_RATE (default 300M
#            bits/s: the log's 0.8 to 1 GiB take longer to drain than
#            the measurement; at 400M two rounds of three had drained
#            before it ended, stop 55) while "warm" is read through a
#            second proxy on the same cache directory
#   catchup  a second proxy on the same cache directory, in front of
#            "cold" alone (file IMGS/cold, so that the filter has a
#            context of its own for the catch-up: plugin/ownctx.c) over
#            the same link, had all of "cold" read through it with the
#            fill budget forced on (NBD_FSCACHE_TEST_BUDGET=1, as a fast
#            upstream would engage it; the link held open for that read
#            through its rate file), so that all but the budget's burst
#            was skipped; its catch-up worker then makes it up at the
#            link's speed while "warm" is read through the first proxy.
#            The catch-up waits for its own process's clients only
#            (none here), not for another process's on the same cache:
#            this is the disk and CPU it takes from them.  Its limit,
#            the local file beside a writer of what the catch-up wrote
#            during the measurement (/proc/PID/io).
#
# Within one process the catch-up works only once no client request
# has been in flight for 100 ms (plugin/catchup.c), so it never runs
# beside that process's own reading clients: the condition above is
# where it can touch hits.
#
# As the limit, the local file plugin (nbdkit file WARM-IMAGE, no
# cache) idle and beside the same disk load: for fills and evict a
# writer that writes what the fills wrote (fio sequential 1 MiB writes
# at the fills' measured rate, fdatasync every 64 MiB, on the same file
# system); for drain the same writer in 4 MiB writes, the drain's
# request size, at the rate the writeback proxy wrote to the disk
# during the measurement (/proc/PID/io: the upstream's image and the
# cache's copy of what was drained; what the drain reads of the log is
# mostly in the page cache).
# Reports p50, p99 and p99.9 of fio's completion latency (µs), medians
# of ROUNDS, and the ratios fscache / local in the same condition.
#
# Options (or environment): --rate=BITS, --warm=SIZE, --cold=SIZE,
# --seconds=S (8), --rounds=N (3), --out=DIR, --conds="idle fills
# evict drain catchup", --cap-extra=SIZE, --wb=SIZE, --drain-rate=BITS.

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
RATE="${RATE:-1600M}" WARM="${WARM:-256M}" COLD="${COLD:-5G}"
SECONDS_="${SECONDS_:-8}" ROUNDS="${ROUNDS:-3}" OUT="${OUT:-}"
CONDS="${CONDS:-idle fills evict drain catchup}" CAP_EXTRA="${CAP_EXTRA:-256M}"
WB="${WB:-1G}" DRAIN_RATE="${DRAIN_RATE:-300M}"
TOOL="${TOOL:-$top_builddir/tools/nbd-fscache/nbd-fscache}"
for a in "$@"; do
  case "$a" in
    --rate=*) RATE="${a#*=}" ;;
    --warm=*) WARM="${a#*=}" ;;
    --cold=*) COLD="${a#*=}" ;;
    --seconds=*) SECONDS_="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    --conds=*) CONDS="${a#*=}" ;;
    --cap-extra=*) CAP_EXTRA="${a#*=}" ;;
    --wb=*) WB="${a#*=}" ;;
    --drain-rate=*) DRAIN_RATE="${a#*=}" ;;
    *) echo "$0: unknown option $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-latency.XXXXXX)"
mkdir -p "$OUT/imgs"
head -c "$(numfmt --from=iec "$WARM")" /dev/urandom > "$OUT/imgs/warm"
head -c "$(numfmt --from=iec "$COLD")" /dev/urandom > "$OUT/imgs/cold"
has () { case " $CONDS " in *" $1 "*) return 0 ;; esac; return 1; }
has drain && head -c "$(numfmt --from=iec "$WB")" /dev/urandom > "$OUT/wbsrc"
# The images on the disk before any measurement: the kernel still had
# 2.2 GB of them dirty at the end of the first round's catch-up
# (/proc/meminfo, Dirty:), whose hits and limit then shared the disk
# with that writeback (stop 63).
sync
pids=()
cleanup () { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start ()                        # start NAME ARGS...: nbdkit on OUT/NAME.sock
{
  local name=$1; shift
  rm -f "$OUT/$name.sock" "$OUT/$name.pid"
  nbdkit -f -U "$OUT/$name.sock" -P "$OUT/$name.pid" "$@" \
    >/dev/null 2>>"$OUT/nbdkit.err" &
  pids+=($!)
  while [ ! -s "$OUT/$name.pid" ]; do sleep 0.05; done
}
stop () { kill "$(cat "$OUT/$1.pid")"; while kill -0 "$(cat "$OUT/$1.pid")" 2>/dev/null; do sleep 0.05; done; }
# wrote NAME: the bytes nbdkit NAME has written (or dirtied in the page
# cache) so far, all its threads (/proc/PID/io).
wrote () { awk '$1 == "write_bytes:" { print $2 }' "/proc/$(cat "$OUT/$1.pid")/io"; }

fio_lat ()                      # fio_lat URI QD TAG: prints p50 p99 p99.9 (µs)
{
  fio --name=l --ioengine=nbd --uri="$1" --rw=randread --bs=4k \
    --iodepth="$2" --time_based --runtime="$SECONDS_" --randrepeat=0 \
    --output-format=json > "$OUT/$3.json" 2>/dev/null
  python3 - "$OUT/$3.json" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
p = json.loads(t[t.index("{"):])["jobs"][0]["read"]["clat_ns"]["percentile"]
print("%.0f %.0f %.0f" % (p["50.000000"] / 1e3, p["99.000000"] / 1e3,
                          p["99.900000"] / 1e3))
PY
}

# hits CFG COND URI TAG R: fio on URI at iodepth 1 and 8, one line of
# results each (CFG COND QD p50 p99 p99.9), fio's JSON in TAG<QD>-R.json.
hits ()
{
  local qd
  for qd in 1 8; do
    echo "$1 $2 $qd $(fio_lat "$3" $qd "$4$qd-$5")" >> "$OUT/results"
  done
}

# local_beside COND RATE R [BS [COPY]]: the local file plugin's
# latencies beside a writer of RATE MiB/s in writes of BS (default 1M),
# the limit for COND in round R.  With COPY "copy", the cold copy runs
# beside them too, through a bare proxy over the same link (nbdkit
# --filter=rate file dir=IMGS, no cache), and the results go under
# COND+copy: the same load without the cache.
local_beside ()
{
  local cond=$1 rate=$2 r=$3 bs=${4:-1M} copy=${5:-} wp cp=""
  if [ "$copy" = copy ]; then
    start bare --filter=rate file dir="$OUT/imgs" rate="$RATE"
    nbdcopy "nbd+unix:///cold?socket=$OUT/bare.sock" null: & cp=$!
    cond="$cond+copy"
  fi
  fio --name=w --rw=write --bs="$bs" --rate="${rate}m" --fdatasync=64 \
    --size=4G --time_based --runtime=$((2 * SECONDS_ + 2)) \
    --filename="$OUT/writer.dat" >/dev/null 2>&1 & wp=$!
  sleep 1
  hits local "$cond" "$lw" "l$cond" "$r"
  kill $wp 2>/dev/null || true; wait $wp 2>/dev/null || true
  rm -f "$OUT/writer.dat"
  if [ -n "$cp" ]; then
    if ! kill -0 $cp 2>/dev/null; then
      echo "latency.sh: round $r, $cond: the bare proxy's copy ended before the measurement did: raise --cold" >&2
    fi
    # To its end: nbdkit 1.32 can abort (raw_send_socket: Assertion
    # `sock >= 0') when a client goes while the rate filter holds its
    # requests.
    wait $cp || true
    stop bare
  fi
}

# warm_up URI CACHEDIR: every block of the warm export stored before the
# hits are measured, and in the page cache.  nbd-fscache warm sends
# NBD_CMD_CACHE, which the filter fills inline whatever its budget.
# Two nbdcopy reads, as before stop 55, left a third to a half of it
# uncached: the upstream here is a local file, faster than the fills,
# so the budget skipped them (a fast upstream is never slowed), and
# with file dir= the filter has no catch-up to make them up
# (plugin/ownctx.c).  The "hits" measured then were a mix, the misses
# among them going through the link the cold copy kept busy.
# warm_misses says what was missed since.  Then the object's files are
# read into the page cache, as the local file's image is (written just
# before).  Stop 55 did that with an nbdcopy read through the proxy,
# but the first hits of each page went to the disk, slower than the
# rate filter in front of a page-cached file, so the latency guard
# rerouted a share of them upstream, the pages it rerouted never came
# into the page cache, and its probes kept finding them slow: 45,265
# hits of a round rerouted through the link (stop 56, hits_rerouted),
# measured as hits.  warm_rerouted says how many were.  And stop 56's
# `cat` came too early: `warm` returns once its fills are queued, and
# the fill thread writes them after, directly (O_DIRECT, core/disk/
# data.c), which drops the page cache's copy of each range written.
# fincore: 240 MiB of the 256 resident right after the `cat`, 121 a
# second later; the hits on the other half went to the disk, under
# the drain's writes up to 50 ms each (perf trace: the hit path's
# RWF_NOWAIT read refused, then a pread), the drain's p99.9 (stop 57).
# So the `cat` waits until the object is all cached in its index (a
# record is written only after its data, rule 1 of docs/design.md),
# and the files' residence is checked after it.
warm_up ()
{
  "$TOOL" warm "$1" > /dev/null
  local i=0
  until [ "$(warm_pct "$2")" = 100.0 ]; do
    i=$((i + 1))
    if [ $i -gt 600 ]; then
      echo "latency.sh: the warm export is $(warm_pct "$2")% cached after 60 s" >&2
      break
    fi
    sleep 0.1
  done
  find "$2/objects" -name '*export=3dwarm.*' -type f -exec cat {} + > /dev/null
  find "$2/objects" -name '*export=3dwarm.*' -type f -exec fincore -bno RES,SIZE {} + |
    awk '$1 < $2 { short += $2 - $1 } END { if (short)
      print "latency.sh: " short " bytes of the warm export not in the page cache" > "/dev/stderr" }'
}

# warm_pct CACHEDIR: the share of the warm export cached (nbd-fscache
# ls's %, from the index).
warm_pct ()
{
  "$TOOL" --dir "$1" ls | awk '/export=warm / { print $(NF - 5) }'
}

# warm_rerouted STATS: hits the latency guard sent upstream (the proxy's
# stats at its clean stop).
warm_rerouted ()
{
  awk '$1 == "hits_rerouted" { print $2 }' "$1"
}

# warm_misses CACHEDIR: bytes of the warm export read from the upstream
# (its object's counters, written at the proxy's clean stop): 0 if
# every read measured was a hit.
warm_misses ()
{
  local f
  f=$(find "$1/objects" -name '*export=3dwarm.stats' | head -1)
  awk '$1 == "miss_bytes" { print $2 }' "$f"
}

# copy_cold NAME COND R [FILTER-ARGS...]: proxy NAME over the link, warm
# warmed, then fio on warm at iodepth 1 and 8 while a client copies
# cold; echoes the fills' rate (MiB/s) during the copy.
copy_cold ()
{
  local name=$1 cond=$2 r=$3 cp t0 t1 tm fill warmb; shift 3
  rm -rf "$OUT/cache-$name"; mkdir -m 700 "$OUT/cache-$name"
  start "$name" --filter="$FILTER" --filter=rate file dir="$OUT/imgs" \
    rate="$RATE" fscache-dir="$OUT/cache-$name" \
    fscache-stats="$OUT/$name.stats" "$@"
  local warm="nbd+unix:///warm?socket=$OUT/$name.sock"
  local cold="nbd+unix:///cold?socket=$OUT/$name.sock"
  warm_up "$warm" "$OUT/cache-$name"
  [ "$cond" != nofill ] || touch "$OUT/cache-$name/fscache.stop"
  if [ "$cond" = fills ] && has idle; then
    hits fscache idle "$warm" fi "$r"
  fi
  t0=$(date +%s.%N)
  rm -f "$OUT/copy.end"
  ( nbdcopy "$cold" null: && date +%s.%N > "$OUT/copy.end" ) & cp=$!
  sleep 1
  hits fscache "$cond" "$warm" "f$cond" "$r"
  tm=$(date +%s.%N)
  wait $cp
  t1=$(cat "$OUT/copy.end")
  # The hits must be measured beside the copy all along: a copy that
  # ended first (COLD 2G before stop 55, at the link's 200 MB/s: 11 s
  # of the measurement's 18) left the iodepth 8 run mostly idle, and
  # the fills' rate, taken over the whole run, at half the real one.
  if python3 -c "import sys; sys.exit(not $t1 < $tm)"; then
    echo "latency.sh: round $r, $cond: the cold copy ended $(python3 -c "print(round($tm - $t1, 1))") s before the measurement did: raise --cold" >&2
  fi
  stop "$name"
  fill=$(awk '$1 == "fill_bytes" { print $2 }' "$OUT/$name.stats")
  warmb=$(numfmt --from=iec "$WARM")
  echo "round $r, $cond: evicted_bytes $(awk '$1 == "evicted_bytes" { print $2 }' "$OUT/$name.stats"), the warm export's misses $(warm_misses "$OUT/cache-$name") bytes, hits rerouted $(warm_rerouted "$OUT/$name.stats")" >&2
  python3 -c "print(max(1, int(($fill - $warmb) / ($t1 - $t0) / 1048576)))"
}

# measure_beside PROC COND R URI: the hits on URI at iodepth 1 and 8 as
# condition COND of round R; WROTE_MIBS gets what nbdkit PROC wrote to
# the disk meanwhile (MiB/s, /proc/PID/io).
measure_beside ()
{
  local proc=$1 cond=$2 r=$3 uri=$4 w0 w1 t0 t1
  w0=$(wrote "$proc"); t0=$(date +%s.%N)
  hits fscache "$cond" "$uri" "f$cond" "$r"
  w1=$(wrote "$proc"); t1=$(date +%s.%N)
  WROTE_MIBS=$(python3 -c "print(max(1, int(($w1 - $w0) / ($t1 - $t0) / 1048576)))")
}

# catchup_cond R: the catchup condition (see the top); echoes the
# catch-up's disk writes during the measurement (MiB/s).
catchup_cond ()
{
  local r=$1 pct
  rm -rf "$OUT/cache-cu"; mkdir -m 700 "$OUT/cache-cu"
  echo 1000G > "$OUT/cu.rate"
  NBD_FSCACHE_TEST_BUDGET=1 start pxc --filter="$FILTER" --filter=rate \
    file "$OUT/imgs/cold" rate=1000G rate-file="$OUT/cu.rate" \
    fscache-dir="$OUT/cache-cu" fscache-key=cold \
    fscache-stats="$OUT/pxc.stats"
  start pxcr --filter="$FILTER" --filter=rate file dir="$OUT/imgs" \
    rate="$RATE" fscache-dir="$OUT/cache-cu" fscache-stats="$OUT/pxcr.stats"
  local warm="nbd+unix:///warm?socket=$OUT/pxcr.sock"
  warm_up "$warm" "$OUT/cache-cu"
  nbdcopy "nbd+unix:///?socket=$OUT/pxc.sock" null:
  # The link back to its speed for the catch-up (the rate filter reads
  # its file about once a second).
  echo "$RATE" > "$OUT/cu.rate"
  sleep 2
  measure_beside pxc catchup "$r" "$warm"
  pct=$("$TOOL" --dir "$OUT/cache-cu" ls | awk '$1 == "cold" { print $4 }')
  [ "$pct" != 100.0 ] ||
    echo "latency.sh: round $r, catchup: the catch-up ended before the measurement did: raise --cold" >&2
  stop pxcr
  stop pxc
  echo "round $r, catchup: cold $pct% cached at the end, $(awk '$1 == "catchup_noted_bytes" || $1 == "catchup_done_bytes" { printf "%s %s ", $1, $2 }' "$OUT/pxc.stats"), the warm export's misses $(warm_misses "$OUT/cache-cu") bytes, hits rerouted $(warm_rerouted "$OUT/pxcr.stats")" >&2
  echo "round $r, catchup: the catch-up wrote $WROTE_MIBS MiB/s to the disk during the measurement" >&2
  echo "$WROTE_MIBS"
}

: > "$OUT/results"
for r in $(seq "$ROUNDS"); do
  frate="" erate="" drate="" crate=""
  if has fills || has idle; then
    frate=$(copy_cold px fills "$r")
    echo "round $r: fills at $frate MiB/s during the cold copy" >&2
  fi
  if has nofill; then
    copy_cold pxn nofill "$r" > /dev/null
  fi
  if has evict; then
    cap=$(( $(numfmt --from=iec "$WARM") + $(numfmt --from=iec "$CAP_EXTRA") ))
    erate=$(copy_cold pxe evict "$r" fscache-max-size="$cap")
    echo "round $r: fills at $erate MiB/s under the cap of $cap bytes" >&2
  fi
  if has drain; then
    # The writeback proxy has the image alone (file FILE): with dir=
    # the filter opens no context of its own, so writeback is written
    # through (plugin/ownctx.c).  "warm" is read through a second
    # proxy on the same cache directory (the host's sharing), so the
    # hits and the drain share the cache disk.
    rm -rf "$OUT/cache-wb"; mkdir -m 700 "$OUT/cache-wb"
    truncate -s "$(numfmt --from=iec "$WB")" "$OUT/wb.img"
    start pxw --filter="$FILTER" --filter=rate file "$OUT/wb.img" \
      rate="$DRAIN_RATE" fscache-dir="$OUT/cache-wb" fscache-mode=writeback \
      fscache-key=wb
    start pxr --filter="$FILTER" file dir="$OUT/imgs" \
      fscache-dir="$OUT/cache-wb" fscache-stats="$OUT/pxr.stats"
    warm="nbd+unix:///warm?socket=$OUT/pxr.sock"
    warm_up "$warm" "$OUT/cache-wb"
    # WB written at local speed: the log takes it, the writer drains it.
    nbdcopy --flush "$OUT/wbsrc" "nbd+unix:///?socket=$OUT/pxw.sock"
    dirty0=$("$TOOL" --dir "$OUT/cache-wb" ls | awk '$1 == "wb" { print $6 }')
    measure_beside pxw drain "$r" "$warm"
    dirty1=$("$TOOL" --dir "$OUT/cache-wb" ls | awk '$1 == "wb" { print $6 }')
    echo "round $r, drain: dirty $dirty0 after the writes, $dirty1 after the reads" >&2
    [ "$dirty1" != 0B ] ||
      echo "latency.sh: round $r, drain: the log drained before the measurement ended: lower --drain-rate" >&2
    # The drain's load on the disk: what the writeback proxy wrote while
    # the hits were measured.  Not the link's rate: each byte drained
    # is written twice here, to the upstream's file and into the cache's
    # data files (a written-back block is stored after its upstream
    # write, writeback.c), plus the log's header and the index: 78 MB/s
    # for a link of 37.5 (stop 57).  Before stop 57 the limit's writer
    # wrote at the link's rate, half the disk load.
    drate=$WROTE_MIBS
    echo "round $r, drain: the writeback proxy wrote $drate MiB/s to the disk, its link carries $(python3 -c "print(int($(numfmt --from=iec "$DRAIN_RATE") / 8 / 1048576))")" >&2
    stop pxr
    stop pxw
    echo "round $r, drain: the warm export's misses $(warm_misses "$OUT/cache-wb") bytes, hits rerouted $(warm_rerouted "$OUT/pxr.stats")" >&2
    rm -f "$OUT/wb.img"
  fi
  if has catchup; then
    crate=$(catchup_cond "$r")
  fi
  start local file "$OUT/imgs/warm"
  lw="nbd+unix:///?socket=$OUT/local.sock"
  if has idle; then
    hits local idle "$lw" li "$r"
  fi
  [ -z "$frate" ] || ! has fills || local_beside fills "$frate" "$r"
  [ -z "$frate" ] || ! has fills || local_beside fills "$frate" "$r" 1M copy
  [ -z "$erate" ] || local_beside evict "$erate" "$r"
  [ -z "$erate" ] || local_beside evict "$erate" "$r" 1M copy
  # The drain writes the upstream's file (the file plugin, in the
  # writeback proxy's process) up to 4 MiB a request (writeback.c,
  # MAX_REQ): a buffered write's copy that long holds a CPU for
  # milliseconds, and a hit woken on that CPU waits for it (perf sched
  # timehist, stop 55).  The limit's writer writes as large.
  [ -z "$drate" ] || local_beside drain "$drate" "$r" 4M
  [ -z "$crate" ] || local_beside catchup "$crate" "$r"
  stop local
done
python3 - "$OUT/results" <<'PY' | tee "$OUT/table.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    cfg, cond, qd, *v = line.split()
    rows[(cfg, cond, int(qd))].append([float(x) for x in v])
print("| condition | iodepth | fscache p50/p99/p99.9 (µs) | local p50/p99/p99.9 (µs) | p99 ratio | p99.9 ratio |")
print("|---|---:|---:|---:|---:|---:|")
for cond, lc in (("idle", "idle"), ("fills", "fills"),
                 ("fills", "fills+copy"), ("nofill", "idle"),
                 ("evict", "evict"), ("evict", "evict+copy"),
                 ("drain", "drain"), ("catchup", "catchup")):
    for qd in (1, 8):
        if not rows[("fscache", cond, qd)] or not rows[("local", lc, qd)]:
            continue
        f = [statistics.median(c) for c in zip(*rows[("fscache", cond, qd)])]
        l = [statistics.median(c) for c in zip(*rows[("local", lc, qd)])]
        name = cond if lc in (cond, "idle") else cond + " (limit: " + lc + ")"
        print("| %s | %d | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f | %.2f | %.2f |"
              % (name, qd, *f, *l, f[1] / l[1], f[2] / l[2]))
PY
echo "latency.sh: $OUT" >&2
