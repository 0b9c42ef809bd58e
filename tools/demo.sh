#!/usr/bin/env bash
# nbd-fscache demo: what the cache buys in front of a slow upstream.
#
#   tools/demo.sh            (or ./build.sh demo, which builds first)
#
# It starts a simulated slow remote, an nbdkit server on a Unix socket
# serving an image of random data through the rate filter (bandwidth)
# and the delay filter (latency), and the fscache filter in front of
# it as a proxy.  Then it copies the whole export with nbdcopy three
# times: cold (empty cache), warm (same proxy), and after restarting
# the proxy (the cache persists on disk).  For each copy it prints the
# wall time, the throughput and the bytes the upstream really served,
# summed from the upstream's log filter, and checks the copy with cmp.
#
# Environment (all optional):
#   FILTER          the fscache filter (default: the one built here)
#   TOOL            nbd-fscache(1), to show the cache at the end
#                   (default: the one built here; skipped if absent)
#   DEMO_SIZE_MIB   size of the image in MiB (default 256)
#   DEMO_RATE       upstream bandwidth in bits/s, nbdkit syntax
#                   (default 100M, about 12.5 MiB/s: ~20 s cold)
#   DEMO_DELAY      upstream latency per read (default 2ms)
#   TMPDIR          where the image, cache and copies go (~3x the size)
#
# Exit status: 0 if all three copies match the image, 1 on any error.
# Every server and file it creates is removed on exit.

set -euo pipefail

prog=demo.sh
here="$(cd "$(dirname "$0")" && pwd)"
FILTER="${FILTER:-$here/../plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="${TOOL:-$here/nbd-fscache/nbd-fscache}"
size_mib="${DEMO_SIZE_MIB:-256}"
rate="${DEMO_RATE:-100M}"
delay="${DEMO_DELAY:-2ms}"

die ()
{
  echo "$prog: $*" >&2
  exit 1
}

for cmd in nbdkit nbdcopy cmp du awk; do
  command -v "$cmd" >/dev/null 2>&1 ||
    die "$cmd: not found (on Debian: ./build.sh demo installs it)"
done
[ -f "$FILTER" ] ||
  die "$FILTER: filter not built (run ./build.sh build first)"
case "$size_mib" in
  ''|*[!0-9]*|0) die "DEMO_SIZE_MIB=$size_mib: must be a positive integer" ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/nbd-fscache-demo.XXXXXX")"
img="$work/upstream.img"
up_sock="$work/upstream.sock"
up_pid="$work/upstream.pid"
up_log="$work/upstream.log"
px_sock="$work/proxy.sock"
px_pid="$work/proxy.pid"
cache="$work/cache"
out="$work/copy.img"

# Stop the server whose pid file is $1 (SIGTERM) and wait until it has
# exited, so that its cleanup (commit, stats file) is done.
stop_server ()
{
  local pid i
  [ -s "$1" ] || return 0
  pid="$(cat "$1")"
  kill -TERM "$pid" 2>/dev/null || true
  for (( i=0; i<200; i++ )); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

cleanup ()
{
  local status=$?
  stop_server "$px_pid"
  stop_server "$up_pid"
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# start_server PIDFILE SOCKET ARGS...: start nbdkit in the background
# on the Unix socket; it writes the pid file once it is ready to serve.
start_server ()
{
  local pidfile="$1" sock="$2" i
  shift 2
  rm -f "$pidfile" "$sock"
  nbdkit -P "$pidfile" -U "$sock" "$@" ||
    die "nbdkit failed to start: nbdkit $*"
  for (( i=0; i<200; i++ )); do
    [ -s "$pidfile" ] && return 0
    sleep 0.05
  done
  die "nbdkit did not start: nbdkit $*"
}

start_proxy ()
{
  start_server "$px_pid" "$px_sock" --filter="$FILTER" \
    nbd socket="$up_sock" \
    fscache-dir="$cache" fscache-stats="$1"
}

# Bytes read from the upstream so far: the count= of every Read in its
# log (hex; mawk has no strtonum, so convert by hand).
upstream_bytes ()
{
  awk 'function hex(s,   i, v) {
         v = 0; s = tolower (substr (s, 3))
         for (i = 1; i <= length (s); i++)
           v = v * 16 + index ("0123456789abcdef", substr (s, i, 1)) - 1
         return v
       }
       / Read id=/ && !/\.\.\.Read/ {
         for (i = 1; i <= NF; i++)
           if ($i ~ /^count=/) { sub ("count=", "", $i); s += hex($i) }
       }
       END { printf "%.0f\n", s }' "$up_log"
}

now () { date +%s.%N; }

# A counter from an fscache-stats file.
stat_value ()
{
  awk -v k="$2" '$1 == k { v = $2 } END { print v + 0 }' "$1"
}

mib () { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

names=() times=() speeds=() upbytes=()

# Copy the whole export through the proxy, time it, check it.
run_copy ()
{
  local name="$1" before after t0 t1 secs
  printf '  %-24s ' "$name"
  before="$(upstream_bytes)"
  rm -f "$out"
  t0="$(now)"
  nbdcopy "nbd+unix:///?socket=$px_sock" "$out" ||
    die "$name: nbdcopy failed"
  t1="$(now)"
  cmp -s "$out" "$img" || die "$name: the copy differs from the image"
  rm -f "$out"
  after="$(upstream_bytes)"
  secs="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
  names+=("$name")
  times+=("$secs")
  speeds+=("$(awk -v s="$secs" -v m="$size_mib" \
                'BEGIN { printf "%.1f", (s > 0) ? m / s : 0 }')")
  upbytes+=("$((after - before))")
  printf '%7s s  %8s MiB/s  upstream read %s bytes  (cmp ok)\n' \
    "$secs" "${speeds[-1]}" "${upbytes[-1]}"
}

echo "nbd-fscache demo ($work)"
echo "  filter:   $FILTER"
echo "  upstream: $size_mib MiB of random data, rate=$rate bits/s," \
     "delay-read=$delay"
echo

head -c "$((size_mib * 1048576))" /dev/urandom > "$img"

# The slow remote.  The first filter is nearest the client: the log
# records every request the proxy sends, then the rate and delay
# filters slow it down.  Read-only, so the image stays what cmp expects.
start_server "$up_pid" "$up_sock" -r \
  --filter=log --filter=rate --filter=delay \
  file "$img" logfile="$up_log" rate="$rate" delay-read="$delay"

start_proxy "$work/proxy1.stats"
run_copy "1. cold (empty cache)"
run_copy "2. warm (same proxy)"
stop_server "$px_pid"

start_proxy "$work/proxy2.stats"
run_copy "3. after proxy restart"
stop_server "$px_pid"

cache_disk="$(du -s --block-size=1 "$cache" | awk '{ print $1 }')"
cache_app="$(du -s --apparent-size --block-size=1 "$cache" |
             awk '{ print $1 }')"
hit1="$(stat_value "$work/proxy1.stats" hit_bytes)"
miss1="$(stat_value "$work/proxy1.stats" miss_bytes)"
pre1="$(stat_value "$work/proxy1.stats" prefetch_bytes)"
hit2="$(stat_value "$work/proxy2.stats" hit_bytes)"
miss2="$(stat_value "$work/proxy2.stats" miss_bytes)"
reused2="$(stat_value "$work/proxy2.stats" objects_reused)"
verr="$(( $(stat_value "$work/proxy1.stats" verify_failures) +
          $(stat_value "$work/proxy2.stats" verify_failures) ))"

echo
echo "Summary ($size_mib MiB export, every copy verified with cmp):"
echo
printf '  %-24s %9s %10s %16s %10s\n' \
  "read" "time (s)" "MiB/s" "upstream bytes" "of export"
printf '  %-24s %9s %10s %16s %10s\n' \
  "------------------------" "---------" "----------" \
  "----------------" "----------"
for i in "${!names[@]}"; do
  printf '  %-24s %9s %10s %16s %8s%%\n' "${names[$i]}" "${times[$i]}" \
    "${speeds[$i]}" "${upbytes[$i]}" \
    "$(awk -v b="${upbytes[$i]}" -v m="$size_mib" \
         'BEGIN { printf "%.2f", 100 * b / (m * 1048576) }')"
done
echo
echo "  cache on disk:    $(mib "$cache_disk") MiB used," \
     "$(mib "$cache_app") MiB apparent (sparse data file + index)"
echo "  proxy 1 counters: hit $(mib "$hit1") MiB, miss $(mib "$miss1") MiB," \
     "prefetched by readahead $(mib "$pre1") MiB"
echo "  proxy 2 counters: hit $(mib "$hit2") MiB, miss $(mib "$miss2") MiB," \
     "objects reused $reused2"
echo "  checksum failures on hits: $verr"
if [ "${upbytes[1]}" -gt 0 ] || [ "${upbytes[2]}" -gt 0 ]; then
  echo
  echo "  (warm reads still read a few KiB upstream: opening the export"
  echo "   samples up to 32 KiB to check the upstream has not changed,"
  echo "   see fscache-validate in nbdkit-fscache-filter(1))"
fi

if [ -x "$TOOL" ]; then
  echo
  echo "The cache as nbd-fscache(1) sees it:"
  echo
  echo "  \$ nbd-fscache --dir \$cache ls"
  "$TOOL" --dir "$cache" ls | sed 's/^/  /'
  echo
  echo "  \$ nbd-fscache --dir \$cache stat"
  "$TOOL" --dir "$cache" stat | sed 's/^/  /'
  echo
  echo "  \$ nbd-fscache --dir \$cache check"
  "$TOOL" --dir "$cache" check 2>&1 | sed 's/^/  /'
fi
