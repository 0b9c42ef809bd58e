#!/usr/bin/env bash
# tools/bench/compare.sh: the nbd-fscache benchmark suite (issue 5).
#
# Builds a slow "remote" NBD server out of nbdkit filters and measures,
# one after the other and with the same fio jobs, four configurations:
#
#   nocache   fio -> slow remote
#   proxy     fio -> nbdkit nbd -> remote (no filter: what the extra
#             hop of any proxy costs; not run unless asked for)
#   nbdcache  fio -> nbdkit --filter=cache cache-on-read=true nbd -> remote
#   fscache   fio -> nbdkit --filter=fscache nbd -> remote (fresh dir)
#   local     fio -> nbdkit file IMG (no delay, no rate: the local limit)
#
# over these phases (bw = bandwidth-bound link, lat = latency-bound link):
#
#   cold-seq-1m          bw   sequential 1M, IODEPTH, empty caches
#   warm-seq-1m          bw   the same again
#   warm-rand-4k         bw   random 4k over the image, IODEPTH
#   restart-seq-1m       bw   sequential 1M after restarting the proxy
#                             (same cache dir; nbdkit's cache filter
#                             loses its cache here)
#   cold-rand-4k-qd16    lat  random 4k, iodepth 16, empty caches
#   cold-rand-64k-qd16   lat  random 64k, iodepth 16, each block read
#                             once, empty caches
#   cold-seq-64k-qd1     lat  sequential 64k, iodepth 1, empty caches
#   cold-rand-4k-bw      bw   random 4k, IODEPTH, each block read once,
#                             empty caches (a VM or a database's first
#                             touch over a bandwidth-bound link)
#   cold-mixed           bw   mixed.fio: 70% random and 30% sequential
#                             requests, 70% 4k and 30% 1M, empty caches
#
# The whole sequence runs ROUNDS times (default 3), the configurations
# in a rotated order each round (round 2 starts with the second one),
# so that a machine's drift hits every configuration alike.  The
# report gives, per phase and configuration, the median over the
# rounds and the spread (min..max), and each ratio is computed within
# a round (fscache against nocache or local of the same round) before
# its median and spread are taken.
#
# The bw remote:  nbdkit --filter=log --filter=stats --filter=rate
#                        --filter=delay file IMG rate=RATE delay-read=DELAY_MS
# The lat remote: the same without the rate filter, delay-read=LAT_DELAY_MS.
# (The first --filter is the outermost: requests pass log, stats, rate,
# then delay, then reach the file plugin.)  The remote is restarted for
# every phase, so its log filter gives the exact bytes read upstream in
# that phase.
#
# Output (OUT, default a new /tmp/fscache-bench.XXXXXX, printed):
#   results.tsv   one row per phase x config, machine readable
#   table.txt     the table printed at the end, with the target checks
#   table.md      the same as Markdown
#   env.txt       the knobs and versions of this run
#   raw/          fio JSON, fio output, remote stats and fscache stats,
#                 every nbdkit command line (commands.txt) and the
#                 servers' messages (nbdkit-NAME.log)
#
# Exit status: 0 if every phase ran, 1 if any failed (its row says ERR).

set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
export top_srcdir top_builddir

usage ()
{
  cat <<EOF
Usage: $0 [OPTIONS]

Knobs (option or environment variable; options win):
  --size=SIZE          SIZE          image size and region read (default 1G,
                                     16M with --quick)
  --rate=BITS          RATE          bw link rate, bits/s (default 400M)
  --delay-ms=N         DELAY_MS      bw link read delay, ms (default 2)
  --lat-delay-ms=N     LAT_DELAY_MS  lat link read delay, ms (default 10)
  --burstiness=SECS    BURSTINESS    rate filter bucket, s (default 0.1)
  --iodepth=N          IODEPTH       iodepth of the bw phases (default 8)
  --lat-iodepth=N      LAT_IODEPTH   iodepth of the lat random phases (16)
  --runtime=SECS       RUNTIME       cap per phase, s (default 15, 1 with
                                     --quick)
  --rounds=N           ROUNDS        repetitions of the whole sequence, in
                                     alternating order (default 3, 1 with
                                     --quick)
  --warm-passes=N      WARM_PASSES   passes over the image of the warm and
                                     after-restart sequential phases
                                     (default 5, 1 with --quick)
  --seq-runtime=SECS   SEQ_RUNTIME   cap of the bw sequential phases, which
                                     must read the whole image so that the
                                     warm phases are warm (default: twice
                                     the time SIZE takes at RATE, + 10 s)
  --block-size=SIZE    BLOCK_SIZE    fscache-block-size (default: filter's)
  --readahead=SIZE     READAHEAD     fscache-readahead (default: not passed)
  --validate=MODE      VALIDATE      fscache-validate (default: filter's)
  --fscache-args="K=V"  FSCACHE_ARGS more fscache-* parameters, e.g.
                                     "fscache-verify=false"
  --out=DIR            OUT           output dir (default /tmp/fscache-bench.*)
  --configs="A B"      CONFIGS       subset of: nocache proxy nbdcache fscache
                                     local
  --phases="A B"       PHASES_ONLY   run only these phases (default: all);
                                     a warm or restart phase needs the
                                     phase that fills the cache before it
  --image=FILE         IMAGE         use FILE instead of SIZE random bytes
                                     (SIZE is then the file's size)
  --keep-logs          KEEP_LOGS=1   keep the remotes' request logs
  --quick                            test-sized run (SIZE=16M RUNTIME=1)
  -h, --help

Filter: \$FSCACHE_FILTER, else
  $top_builddir/plugin/.libs/nbdkit-fscache-filter.so
(copied to OUT/work before the run, so a rebuild cannot change it midway)
EOF
}

ORIG_ARGS="$*"
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --size=*)         SIZE="${1#*=}" ;;
    --rate=*)         RATE="${1#*=}" ;;
    --delay-ms=*)     DELAY_MS="${1#*=}" ;;
    --lat-delay-ms=*) LAT_DELAY_MS="${1#*=}" ;;
    --burstiness=*)   BURSTINESS="${1#*=}" ;;
    --iodepth=*)      IODEPTH="${1#*=}" ;;
    --lat-iodepth=*)  LAT_IODEPTH="${1#*=}" ;;
    --runtime=*)      RUNTIME="${1#*=}" ;;
    --rounds=*)       ROUNDS="${1#*=}" ;;
    --seq-runtime=*)  SEQ_RUNTIME="${1#*=}" ;;
    --warm-passes=*)  WARM_PASSES="${1#*=}" ;;
    --fscache-args=*) FSCACHE_ARGS="${1#*=}" ;;
    --block-size=*)   BLOCK_SIZE="${1#*=}" ;;
    --readahead=*)    READAHEAD="${1#*=}" ;;
    --validate=*)     VALIDATE="${1#*=}" ;;
    --out=*)          OUT="${1#*=}" ;;
    --configs=*)      CONFIGS="${1#*=}" ;;
    --phases=*)       PHASES_ONLY="${1#*=}" ;;
    --image=*)        IMAGE="${1#*=}" ;;
    --keep-logs)      KEEP_LOGS=1 ;;
    --quick)          QUICK=1 ;;
    -h|--help)        usage; exit 0 ;;
    *) echo "$0: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$QUICK" = 1 ]; then
  : "${SIZE:=16M}" "${RUNTIME:=1}" "${ROUNDS:=1}" "${WARM_PASSES:=1}"
fi
: "${SIZE:=1G}"
: "${RATE:=400M}"
: "${DELAY_MS:=2}"
: "${LAT_DELAY_MS:=10}"
: "${BURSTINESS:=0.1}"
: "${IODEPTH:=8}"
: "${LAT_IODEPTH:=16}"
: "${RUNTIME:=15}"
: "${ROUNDS:=3}"
: "${BLOCK_SIZE:=}"
: "${READAHEAD:=}"
: "${VALIDATE:=}"
: "${FSCACHE_ARGS:=}"
: "${SEQ_RUNTIME:=}"
: "${WARM_PASSES:=5}"
: "${CONFIGS:=nocache nbdcache fscache local}"
: "${PHASES_ONLY:=}"
: "${KEEP_LOGS:=0}"
: "${IMAGE:=}"

# The shared helpers of the tests: log_read_bytes, log_count,
# stat_value, cleanup_fn and a private $TMP (short paths for the Unix
# sockets), removed at exit.  Servers are started and stopped by the
# srv_* functions below, not start_nbdkit/stop_nbdkit: see there.
# shellcheck source=/dev/null
source "$top_srcdir/tests/functions.sh"

for cmd in nbdkit fio python3; do
  if ! command -v "$cmd" >/dev/null; then
    echo "$0: $cmd is required" >&2
    exit 2
  fi
done
for c in $CONFIGS; do
  case "$c" in
    nocache|proxy|nbdcache|fscache|local) ;;
    *) echo "$0: unknown configuration $c" >&2; exit 2 ;;
  esac
done
if [[ " $CONFIGS " == *" fscache "* ]] && [ ! -f "$FILTER" ]; then
  echo "$0: fscache filter not found: $FILTER (build it, or set FSCACHE_FILTER)" >&2
  exit 2
fi
if [ -n "$READAHEAD" ] &&
   ! nbdkit --filter="$FILTER" null --help 2>/dev/null |
       grep -q '^fscache-readahead='; then
  echo "$0: warning: READAHEAD=$READAHEAD but this filter does not list" \
       "fscache-readahead=; the fscache proxy will probably refuse to start" >&2
fi

if [ -z "${OUT:-}" ]; then
  OUT="$(mktemp -d /tmp/fscache-bench.XXXXXX)"
fi
mkdir -p "$OUT/raw"
OUT="$(cd "$OUT" && pwd)"
RAW="$OUT/raw"
WORK="$OUT/work"            # image and caches; removed at exit
rm -rf "$WORK"
mkdir -p "$WORK"
cleanup_fn "rm -rf '$WORK'"

RESULTS="$OUT/results.tsv"
FAILED=0
T_START=$(date +%s.%N)

echo "compare.sh: output in $OUT"

# ---- The image. -----------------------------------------------------------

to_bytes ()
{
  python3 - "$1" <<'PY'
import sys, re
m = re.fullmatch(r'(\d+)([kKmMgGtT]?)', sys.argv[1])
if not m:
    sys.exit("bad size: " + sys.argv[1])
n = int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")
print(n)
PY
}

if [ -n "$IMAGE" ]; then
  IMG="$(cd "$(dirname "$IMAGE")" && pwd)/$(basename "$IMAGE")"
  SIZE_BYTES=$(stat -c %s "$IMG")
  SIZE="$SIZE_BYTES"
else
  SIZE_BYTES=$(to_bytes "$SIZE")
  IMG="$WORK/image.img"
  echo "compare.sh: creating a $SIZE image of random data"
  head -c "$SIZE_BYTES" /dev/urandom > "$IMG"
fi

if [ -z "$SEQ_RUNTIME" ]; then
  rate_bits=$(to_bytes "$RATE")
  SEQ_RUNTIME=$(( SIZE_BYTES * 8 * 2 / rate_bits + 10 ))
  [ "$SEQ_RUNTIME" -ge "$RUNTIME" ] || SEQ_RUNTIME=$RUNTIME
fi

# ---- Knobs, recorded. -----------------------------------------------------

{
  echo "date	$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command	$0 $ORIG_ARGS"
  echo "SIZE	$SIZE"
  echo "SIZE_BYTES	$SIZE_BYTES"
  echo "RATE	$RATE"
  echo "BURSTINESS	$BURSTINESS"
  echo "DELAY_MS	$DELAY_MS"
  echo "LAT_DELAY_MS	$LAT_DELAY_MS"
  echo "IODEPTH	$IODEPTH"
  echo "LAT_IODEPTH	$LAT_IODEPTH"
  echo "RUNTIME	$RUNTIME"
  echo "ROUNDS	$ROUNDS"
  echo "SEQ_RUNTIME	$SEQ_RUNTIME"
  echo "WARM_PASSES	$WARM_PASSES"
  echo "BLOCK_SIZE	${BLOCK_SIZE:-unset (filter default)}"
  echo "READAHEAD	${READAHEAD:-unset (filter default)}"
  echo "VALIDATE	${VALIDATE:-unset (filter default)}"
  echo "FSCACHE_ARGS	${FSCACHE_ARGS:-none}"
  echo "loadavg_start	$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "CONFIGS	$CONFIGS"
  echo "PHASES_ONLY	${PHASES_ONLY:-all}"
  echo "FILTER	$FILTER"
  echo "nbdkit	$(nbdkit --version)"
  echo "fio	$(fio --version)"
  echo "cpus	$(nproc)"
  echo "kernel	$(uname -sr)"
} > "$OUT/env.txt"

# ---- Servers. -------------------------------------------------------------

RSOCK="$TMP/remote.sock"  RPID="$TMP/remote.pid"
PSOCK="$TMP/proxy.sock"   PPID_FILE="$TMP/proxy.pid"
LSOCK="$TMP/local.sock"   LPID="$TMP/local.pid"
FSC_DIR="$WORK/fscache"
FSC_STATS="$WORK/fscache.stats"
NBDCACHE_TMP="$WORK/nbdcache-tmp"
mkdir -p "$NBDCACHE_TMP"

# A private copy of the filter: the tree may be rebuilt during the run.
FSC_SO="$WORK/nbdkit-fscache-filter.so"
if [[ " $CONFIGS " == *" fscache "* ]]; then
  cp "$FILTER" "$FSC_SO"
  {
    echo "FILTER_SHA256	$(sha256sum "$FSC_SO" | cut -d' ' -f1)"
    echo "FILTER_MTIME	$(date -u -r "$FILTER" +%Y-%m-%dT%H:%M:%SZ)"
    echo "git	$(git -C "$top_srcdir" describe --always --dirty 2>/dev/null ||
                 echo unknown)"
  } >> "$OUT/env.txt"
fi

uri_of () { echo "nbd+unix:///?socket=$1"; }

# A server has exited once it is gone or a zombie: nbdkit daemonizes,
# so its parent is pid 1, which may take a second or two to reap it
# (kill -0 succeeds on a zombie).
srv_alive ()
{
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# Ours: its command line names our private $TMP (its -U socket).
srv_ours ()
{
  grep -qaF "$TMP/" "/proc/$1/cmdline" 2>/dev/null
}

# srv_start NAME PIDFILE SOCK NBDKIT-ARGS...: start nbdkit in the
# background, its messages appended to raw/nbdkit-NAME.log.
srv_start ()
{
  local name="$1" pidfile="$2" sock="$3" i
  shift 3
  rm -f "$pidfile" "$sock"
  echo "$name: nbdkit --log=stderr -P $pidfile -U $sock $*" >> "$RAW/commands.txt"
  if ! nbdkit --log=stderr -P "$pidfile" -U "$sock" "$@" \
         2>>"$RAW/nbdkit-$name.log"; then
    echo "compare.sh: nbdkit ($name) did not start; see" \
         "$RAW/nbdkit-$name.log" >&2
    tail -5 "$RAW/nbdkit-$name.log" >&2
    return 1
  fi
  for (( i=0; i<500; i++ )); do
    [ -s "$pidfile" ] && return 0
    sleep 0.02
  done
  echo "compare.sh: nbdkit ($name) wrote no pid file" >&2
  return 1
}

# srv_stop PIDFILE: SIGTERM, and wait until it has exited (and so has
# finished its unload work: fscache commits its index and writes its
# stats at exit).
srv_stop ()
{
  local pidfile="$1" pid i
  [ -s "$pidfile" ] || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  rm -f "$pidfile"
  if srv_alive "$pid" && srv_ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for (( i=0; i<3000; i++ )); do
      srv_alive "$pid" || return 0
      sleep 0.02
    done
    echo "compare.sh: nbdkit $pid did not exit in 60 s; killing it" >&2
    srv_ours "$pid" && kill -KILL "$pid" 2>/dev/null
  fi
  return 0
}

# shellcheck disable=SC2317  # called from the cleanup at exit
stop_all ()
{
  srv_stop "$RPID"
  srv_stop "$PPID_FILE"
  srv_stop "$LPID"
}
cleanup_fn stop_all

# start_remote bw|lat LOG STATS
start_remote ()
{
  local link="$1" log="$2" stats="$3"
  rm -f "$log" "$stats"
  if [ "$link" = bw ]; then
    srv_start remote "$RPID" "$RSOCK" \
      --filter=log --filter=stats --filter=rate --filter=delay \
      file "$IMG" logfile="$log" statsfile="$stats" \
      rate="$RATE" burstiness="$BURSTINESS" delay-read="${DELAY_MS}ms"
  else
    srv_start remote "$RPID" "$RSOCK" \
      --filter=log --filter=stats --filter=delay \
      file "$IMG" logfile="$log" statsfile="$stats" \
      delay-read="${LAT_DELAY_MS}ms"
  fi
}

# Wait until every connection the remote accepted has closed: then the
# proxy has finished with its client too (nbdkit finalizes a connection,
# which writes the fscache stats, before closing its upstream).
wait_remote_idle ()
{
  local log="$1" i c d
  for (( i=0; i<1500; i++ )); do
    c=$(grep -c ' Connect ' "$log" || true)
    d=$(grep -c ' Disconnect ' "$log" || true)
    [ "$c" = "$d" ] && return 0
    sleep 0.02
  done
  echo "compare.sh: warning: remote still has $((c - d)) connection(s)" >&2
}

# start_proxy proxy|nbdcache|fscache fresh|keep
start_proxy ()
{
  local config="$1" how="$2"
  local args=()
  if [ "$config" = proxy ]; then
    srv_start proxy "$PPID_FILE" "$PSOCK" nbd socket="$RSOCK"
  elif [ "$config" = nbdcache ]; then
    # The cache filter keeps its cache in an unlinked file in $TMPDIR:
    # every start is cold.
    TMPDIR="$NBDCACHE_TMP" srv_start nbdcache "$PPID_FILE" "$PSOCK" \
      --filter=cache nbd socket="$RSOCK" cache-on-read=true
  else
    [ "$how" = fresh ] && rm -rf "$FSC_DIR"
    rm -f "$FSC_STATS"          # the counters restart with the process
    # The image's own version: its size and mtime (it is made once per
    # run), so that a key given by hand is not taken for any upstream
    # of that size.
    args=(fscache-dir="$FSC_DIR" fscache-key="bench:$IMG"
          fscache-generation="$(stat -c %s-%Y "$IMG")"
          fscache-stats="$FSC_STATS")
    [ -n "$BLOCK_SIZE" ] && args+=(fscache-block-size="$BLOCK_SIZE")
    [ -n "$READAHEAD" ] && args+=(fscache-readahead="$READAHEAD")
    [ -n "$VALIDATE" ] && args+=(fscache-validate="$VALIDATE")
    # shellcheck disable=SC2206
    [ -n "$FSCACHE_ARGS" ] && args+=($FSCACHE_ARGS)
    srv_start fscache "$PPID_FILE" "$PSOCK" \
      --filter="$FSC_SO" nbd socket="$RSOCK" "${args[@]}"
  fi
}

start_local ()
{
  srv_start local "$LPID" "$LSOCK" file "$IMG"
}

fsc_upstream_bytes ()
{
  if [ -f "$FSC_STATS" ]; then stat_value "$FSC_STATS" upstream_read_bytes
  else echo 0; fi
}

# ---- Phases. --------------------------------------------------------------

# name link job-file bs iodepth runtime-cap [passes]
# The warm and after-restart sequential phases read the image
# WARM_PASSES times: one pass of a gigabyte from the page cache lasts
# under half a second, too short to tell a configuration from the
# machine's noise (single passes of the same build ranged from 0.4 to
# 1.5 of local).  After a restart the first pass is the restarted
# process's; the others show it lost nothing either.
PHASES=(
  "cold-seq-1m        bw  seqread-1m.fio   1m  $IODEPTH     $SEQ_RUNTIME"
  "warm-seq-1m        bw  seqread-1m.fio   1m  $IODEPTH     $SEQ_RUNTIME $WARM_PASSES"
  "warm-rand-4k       bw  randread-4k.fio  4k  $IODEPTH     $RUNTIME"
  "restart-seq-1m     bw  seqread-1m.fio   1m  $IODEPTH     $SEQ_RUNTIME $WARM_PASSES"
  "cold-rand-4k-qd16  lat randread-4k.fio  4k  $LAT_IODEPTH $RUNTIME"
  "cold-rand-64k-qd16 lat randread-64k.fio 64k $LAT_IODEPTH $RUNTIME"
  "cold-seq-64k-qd1   lat seqread-64k.fio  64k 1            $RUNTIME"
  "cold-rand-4k-bw    bw  randread-4k.fio  4k  $IODEPTH     $RUNTIME"
  "cold-mixed         bw  mixed.fio        mix $IODEPTH     $RUNTIME"
)

printf 'phase\tconfig\tlink\tjob\tbs\tiodepth\tstatus\tmib_s\tiops\tio_bytes\truntime_ms\tlat_mean_us\tupstream_bytes\tupstream_reads\tupstream_conns\tfscache_upstream_bytes\tround\n' > "$RESULTS"

# Before a phase: get the configuration's server into the state the
# phase wants (cold: empty cache; restart: same cache, new process).
prepare_phase ()
{
  local config="$1" phase="$2"
  case "$config" in
    proxy|nbdcache|fscache)
      case "$phase" in
        cold-*)     srv_stop "$PPID_FILE"; start_proxy "$config" fresh ;;
        restart-*)  srv_stop "$PPID_FILE"; start_proxy "$config" keep ;;
        *)          [ -s "$PPID_FILE" ] || start_proxy "$config" keep ;;
      esac ;;
    local)
      case "$phase" in
        cold-*|restart-*) srv_stop "$LPID"; start_local ;;
        *)                [ -s "$LPID" ] || start_local ;;
      esac ;;
  esac
}

run_phase ()
{
  local config="$1" phase="$2" link="$3" job="$4" bs="$5" depth="$6"
  local cap="$7" passes="${8:-1}"
  local tag="$phase.$config.r$ROUND" uri status=ok
  local rlog="$RAW/$tag.remote.log" rstats="$RAW/$tag.remote-stats.txt"
  local up_bytes=- up_reads=- up_conns=- fsc_bytes=- fsc_before=0

  prepare_phase "$config" "$phase"
  case "$config" in
    nocache)  uri=$(uri_of "$RSOCK") ;;
    local)    uri=$(uri_of "$LSOCK") ;;
    *)        uri=$(uri_of "$PSOCK") ;;
  esac
  [ "$config" = local ] || start_remote "$link" "$rlog" "$rstats"
  [ "$config" = fscache ] && fsc_before=$(fsc_upstream_bytes)

  printf '  %-20s %-9s ' "$phase" "$config"
  if ! URI="$uri" SIZE="$SIZE_BYTES" IODEPTH="$depth" RUNTIME="$cap" \
       LOOPS="$passes" fio --output-format=json --output="$RAW/$tag.json" \
           "$BENCH_DIR/$job" > "$RAW/$tag.fio.log" 2>&1; then
    status=ERR
    FAILED=1
  fi
  # A server that died under the load is a failure even if fio coped.
  local pf
  case "$config" in
    proxy|nbdcache|fscache) pf="$PPID_FILE" ;;
    local)            pf="$LPID" ;;
    *)                pf="$RPID" ;;
  esac
  if ! srv_alive "$(cat "$pf")"; then
    echo "compare.sh: the $config server exited during $phase" >&2
    status=ERR
    FAILED=1
    rm -f "$pf"
  fi

  if [ "$config" != local ]; then
    wait_remote_idle "$rlog"
    srv_stop "$RPID"
    up_bytes=$(log_read_bytes "$rlog")
    up_reads=$(log_count "$rlog" Read)
    up_conns=$(grep -c ' Connect ' "$rlog" || true)
    [ "$KEEP_LOGS" = 1 ] || rm -f "$rlog"
  fi
  if [ "$config" = fscache ]; then
    fsc_bytes=$(( $(fsc_upstream_bytes) - fsc_before ))
    [ -f "$FSC_STATS" ] && cp "$FSC_STATS" "$RAW/$tag.fscache-stats.txt"
  fi

  local fio_fields
  if [ "$status" = ok ] &&
     fio_fields=$(python3 "$BENCH_DIR/report.py" fio "$RAW/$tag.json"); then
    :
  else
    status=ERR
    FAILED=1
    fio_fields=$(printf -- '-\t-\t-\t-\t-')
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$phase" "$config" "$link" "$job" "$bs" "$depth" "$status" \
    "$fio_fields" "$up_bytes" "$up_reads" "$up_conns" "$fsc_bytes" \
    "$ROUND" >> "$RESULTS"
  if [ "$status" = ok ]; then
    echo "$fio_fields" | awk -F'\t' -v u="$up_bytes" \
      '{ printf "%10.1f MiB/s %10.0f IOPS   upstream %s B\n", $1, $2, u }'
  else
    echo "ERR (see $RAW/$tag.fio.log)"
  fi
}

# CONFIGS rotated left by N.
rotated ()
{
  local -a c
  read -r -a c <<< "$CONFIGS"
  local n=$(( $1 % ${#c[@]} ))
  echo "${c[@]:n}" "${c[@]:0:n}"
}

for (( ROUND=1; ROUND<=ROUNDS; ROUND++ )); do
  for config in $(rotated $((ROUND - 1))); do
    echo "compare.sh: round $ROUND of $ROUNDS, configuration $config"
    for p in "${PHASES[@]}"; do
      if [ -n "$PHASES_ONLY" ] && [[ " $PHASES_ONLY " != *" ${p%% *} "* ]]; then
        continue
      fi
      # shellcheck disable=SC2086
      run_phase "$config" $p
    done
    srv_stop "$PPID_FILE"
    srv_stop "$LPID"
    rm -rf "$FSC_DIR"
  done
done

for f in "$RAW"/nbdkit-*.log; do
  if [ -s "$f" ]; then
    echo "compare.sh: note: $(wc -l < "$f") line(s) of nbdkit messages in $f:"
    sed 's/^/    /' "$f" | sort | uniq -c | sort -rn | head -5
  fi
done

T_END=$(date +%s.%N)
ELAPSED=$(python3 -c "print(f'{$T_END - $T_START:.0f}')")
{
  echo "elapsed	${ELAPSED}s"
  echo "loadavg_end	$(cut -d' ' -f1-3 /proc/loadavg)"
} >> "$OUT/env.txt"

python3 "$BENCH_DIR/report.py" table "$OUT" | tee "$OUT/table.txt"
python3 "$BENCH_DIR/report.py" markdown "$OUT" > "$OUT/table.md"
echo
echo "compare.sh: finished in ${ELAPSED}s; results in $OUT"
exit "$FAILED"
