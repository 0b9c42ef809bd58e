#!/usr/bin/env bash
# tools/bench/fleet.sh: a fleet's first boot.  N proxies, each its own
# nbdkit process and cache directory as on N hosts, copy one image at
# the same moment from one origin behind a shared rate-limited link
# (nbdkit's rate filter, rate=, on the origin: the link every node's
# misses share; bursts of 0.1 s, where its default of 2 s let a 32 MiB
# image through at memory speed).  Reported per fleet size and configuration: the
# origin's bytes as a multiple of the image (nbdkit's log filter on
# the origin), the slowest node's copy time, and that time over one
# node's alone (nodes=1, no peers), the nodes' p50 and p99 copy times
# (as Kraken reports them), the origin's connections, and the most
# descriptors and threads of any node during the copy, and the nodes'
# CPU time summed (user and system); medians of
# ROUNDS.  Every node starts its copy at the same instant and reads
# the image in the same order: a lockstep boot.
#
# Configurations:
#   alone   no fscache-peers: every node reads the whole image upstream
#   peers   fscache-peers: each 1 MiB range read once by its owner, in
#           the range's tree (fscache-peer-fanout, FANOUT, default 8)
#   ranges  peers with fscache-peer-stripes=0: a tree per range, so
#           that over the image a node asks nearly every other (the
#           default shares 16 trees among the ranges: at most 16
#           parents per node, core/base/peertree.c T3)
#   flat    fscache-peer-fanout=0 and fscache-peer-stripes=0: every
#           node asks the range's owner (the design before issue 41)
#   manifest  peers, each node checking every peer's block against
#           the image's manifest (fscache-manifest, nbd-fscache
#           manifest, written once at the start)
#   tls     peers, over TLS with a pre-shared key
#   mux     peers, each asker keeping one connection per peer and
#           export with many reads in flight on it, forced
#           (NBD_FSCACHE_TEST_PEER_DEPTH=64): the filter does so by
#           itself only under an nbdkit that survives a client dying
#           with replies queued, which Debian 12's does not (see
#           plugin/peerlink.c; there it keeps up to 8, one read each)
#   kill    peers, and node 2 is killed (-9) halfway through its copy;
#           the others must finish, identical (cmp), the origin's
#           bytes bounded
# Peers talk over Unix sockets (as TCP on a LAN would, less the
# network).  The image is random; every copy is compared with it.
#
# --egress=BITS (EGRESS): each node's uplink.  Its peers then reach it
# through a relay of its own (nbdkit's rate filter, rate=BITS, over
# the nbd plugin with the askers' export names passed on), so that
# everything a node serves its peers shares BITS, as a host's NIC
# would: in a lockstep boot the flat design's owner of a hot range
# serves every other node through it, a tree's node at most K
# (issue 41's 64-node target).  --threads=T (THREADS): nbdkit's -t for
# the nodes (default nbdkit's, 16 per connection; 64 nodes with
# dozens of peer connections each reach this machine's pid_max).
# FANOUT=K and STRIPES=S (fscache-peer-fanout, fscache-peer-stripes)
# for the tree configurations: a node has at most S parents and S K
# askers, so its connections stop growing once N passes about S K.
#
# One machine has one disk and a few cores for all N nodes, where a
# fleet has N of each: with --rundir=/dev/shm the nodes' caches and
# copies live in memory, so that the disk the simulated hosts share
# does not stand in for the link being measured.
#
# Options (or environment): --nodes="1 4 8" (NODES), --size=SIZE
# (default 128M), --rate=BITS (RATE, default 200M), --rounds=N
# (ROUNDS, default 3), --configs="alone peers kill" (CONFIGS),
# --out=DIR (OUT), --rundir=DIR (RUNDIR, default OUT: where caches
# and copies go), ALONE_MAX=N (run "alone" only up to N nodes: it
# takes N times one node's time), KEEP=1 (keep each run's directory:
# the nodes' stats and logs).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
NODES="${NODES:-1 4 8}" SIZE="${SIZE:-128M}" RATE="${RATE:-200M}"
ROUNDS="${ROUNDS:-3}" CONFIGS="${CONFIGS:-alone peers kill}" OUT="${OUT:-}"
RUNDIR="${RUNDIR:-}" FANOUT="${FANOUT:-8}" EGRESS="${EGRESS:-}"
STRIPES="${STRIPES:-}"
THREADS="${THREADS:-}"
for a in "$@"; do
  case "$a" in
    --nodes=*) NODES="${a#*=}" ;;
    --size=*) SIZE="${a#*=}" ;;
    --rate=*) RATE="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --configs=*) CONFIGS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    --rundir=*) RUNDIR="${a#*=}" ;;
    --egress=*) EGRESS="${a#*=}" ;;
    --threads=*) THREADS="${a#*=}" ;;
    -h|--help) sed -n '2,60p' "$0"; exit 0 ;;
    *) echo "fleet.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-fleet.XXXXXX)"
mkdir -p "$OUT"
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
bytes=$(numfmt --from=iec "$SIZE")
head -c "$bytes" /dev/urandom > "$OUT/img"
printf 'fleet:%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
  > "$OUT/psk"
chmod 600 "$OUT/psk"
case " $CONFIGS " in
  *" manifest "*)
    nbdkit -U - file "$OUT/img" --run \
      "$top_builddir/tools/nbd-fscache/nbd-fscache manifest --generation 1 -o $OUT/manifest \"\$uri\"" \
      2>/dev/null || { echo "fleet.sh: nbd-fscache manifest failed" >&2; exit 1; }
    ;;
esac

pids=() cleanup_dirs=()
wait_pid () { for _ in $(seq 300); do [ -s "$1" ] && return; sleep 0.05; done
              echo "fleet.sh: $1 did not appear" >&2; exit 1; }
stop_all () {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
  pids=()
}
trap 'stop_all; [ -n "${KEEP:-}" ] || for c in "${cleanup_dirs[@]}"; do rm -rf "$c"; done' EXIT

origin_bytes () {
  awk 'function hex(s,  i, c, v) { v = 0; s = tolower (substr (s, 3))
         for (i = 1; i <= length (s); i++) {
           c = index ("0123456789abcdef", substr (s, i, 1)) - 1; v = v * 16 + c }
         return v }
       / Read id=/ && !/\.\.\.Read/ { for (i = 1; i <= NF; i++)
         if ($i ~ /^count=/) { sub ("count=", "", $i); s += hex($i) } }
       END { printf "%d\n", s }' "$1"
}

# run N CONFIG ROUND: prints "slowest p50 p99 origin_bytes origin_conns
# max_fds max_threads"
run () {
  local n=$1 cfg=$2 d
  d="$(mktemp -d "${RUNDIR:-$OUT}/run.XXXXXX")"
  cleanup_dirs+=("$d")
  nbdkit -f -U "$d/origin.sock" -P "$d/origin.pid" --filter=log --filter=rate \
    file "$OUT/img" logfile="$d/origin.log" rate="$RATE" burstiness=0.1 \
    2>>"$d/origin.err" &
  pids+=($!)
  wait_pid "$d/origin.pid"
  : > "$d/peers"
  # A node's peer address: its own socket, or its relay's (--egress).
  local pl=n
  [ -n "$EGRESS" ] && [ "$cfg" != alone ] && pl=p
  for i in $(seq "$n"); do
    echo "nbd+unix:///?socket=$d/$pl$i.sock" >> "$d/peers"
  done
  local topt=()
  [ -n "$THREADS" ] && topt=(-t "$THREADS")
  for i in $(seq "$n"); do
    local extra=()
    [ "$cfg" != alone ] && extra=(fscache-peers="$d/peers"
                                  fscache-peer-self="nbd+unix:///?socket=$d/$pl$i.sock"
                                  fscache-peer-fanout="$FANOUT"
                                  fscache-generation=1)
    [ -n "$STRIPES" ] && [ "$cfg" != alone ] &&
      extra+=(fscache-peer-stripes="$STRIPES")
    [ "$cfg" = flat ] && extra+=(fscache-peer-fanout=0 fscache-peer-stripes=0)
    [ "$cfg" = ranges ] && extra+=(fscache-peer-stripes=0)
    [ "$cfg" = manifest ] && extra+=(fscache-manifest="$OUT/manifest")
    [ "$cfg" = tls ] && extra+=(--tls=on --tls-psk="$OUT/psk"
                                fscache-peer-tls-psk="$OUT/psk")
    mkdir -m 700 "$d/c$i"
    local env=()
    [ "$cfg" = mux ] && env=(NBD_FSCACHE_TEST_PEER_DEPTH=64)
    env "${env[@]}" nbdkit -f "${topt[@]}" -U "$d/n$i.sock" -P "$d/n$i.pid" \
      --filter="$FILTER" \
      nbd socket="$d/origin.sock" fscache-dir="$d/c$i" \
      fscache-stats="$d/s$i" "${extra[@]}" 2>>"$d/n$i.err" &
    pids+=($!)
    if [ "$pl" = p ]; then
      # The node's uplink: one rate for all it serves (rate= is the
      # whole server's), each asker's export name passed on.
      nbdkit -f "${topt[@]}" -U "$d/p$i.sock" -P "$d/p$i.pid" --filter=rate \
        nbd socket="$d/n$i.sock" dynamic-export=true rate="$EGRESS" \
        burstiness=0.1 2>>"$d/p$i.err" &
      pids+=($!)
    fi
  done
  for i in $(seq "$n"); do
    wait_pid "$d/n$i.pid"
    [ "$pl" = n ] || wait_pid "$d/p$i.pid"
  done
  local t0 cp=()
  t0=$(date +%s.%N)
  for i in $(seq "$n"); do
    ( nbdcopy "nbd+unix:///?socket=$d/n$i.sock" "$d/out$i" 2>"$d/copy$i.err"
      date +%s.%N > "$d/t$i" ) &
    cp+=($!)
  done
  if [ "$cfg" = kill ] && [ "$n" -ge 2 ]; then
    # Halfway through node 2's copy: half one node's time alone (or,
    # not measured, half the image's time at the nominal rate).
    if [ -n "$one" ]; then
      sleep "$($PY -c "print($one / 2)")"
    else
      sleep "$($PY -c "print($bytes * 8 / $(numfmt --from=si "$RATE") / 2)")"
    fi
    kill -9 "$(cat "$d/n2.pid")"
  fi
  # The most descriptors and threads of any node, sampled while the
  # copies run (every 0.2 s).
  : > "$d/res"
  ( while [ ! -e "$d/done" ]; do
      for i in $(seq "$n"); do
        p=$(cat "$d/n$i.pid" 2>/dev/null) || continue
        f=$(ls "/proc/$p/fd" 2>/dev/null | wc -l)
        t=$(awk '/^Threads:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
        echo "$f ${t:-0}" >> "$d/res"
      done
      sleep 0.2
    done ) &
  local sampler=$!
  local bad=0
  for p in "${cp[@]}"; do wait "$p" || true; done
  touch "$d/done"; wait $sampler || true
  for i in $(seq "$n"); do
    [ "$cfg" = kill ] && [ "$i" = 2 ] && continue
    cmp -s "$OUT/img" "$d/out$i" || { echo "fleet.sh: node $i's copy differs" >&2; bad=1; }
  done
  [ $bad = 0 ] || exit 1
  local times=()
  for i in $(seq "$n"); do
    [ "$cfg" = kill ] && [ "$i" = 2 ] && continue
    times+=("$(cat "$d/t$i")")
  done
  local slow p50 p99
  read -r slow p50 p99 < <($PY -c '
import sys
t0 = float(sys.argv[1])
t = sorted(float(x) - t0 for x in sys.argv[2:])
pct = lambda p: t[min(len(t) - 1, int(p * len(t)))]
print(t[-1], pct(0.50), pct(0.99))' "$t0" "${times[@]}")
  # The nodes' CPU time (user and system), summed: what the fleet's
  # work costs, whatever this machine's cores made of the wall time.
  local cpu=0 st
  for i in $(seq "$n"); do
    st=$(cat "/proc/$(cat "$d/n$i.pid" 2>/dev/null)/stat" 2>/dev/null) || continue
    cpu=$((cpu + $(echo "${st##*) }" | awk '{ print $12 + $13 }')))
  done
  cpu=$($PY -c "print($cpu / $(getconf CLK_TCK))")
  stop_all
  echo "$slow $p50 $p99 $cpu $(origin_bytes "$d/origin.log") $(grep -c ' Connect ' "$d/origin.log") $(awk '$1 > f { f = $1 } $2 > t { t = $2 } END { print f + 0, t + 0 }' "$d/res")"
  [ -n "${KEEP:-}" ] || rm -rf "$d"
}

median () { $PY -c 'import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

one=""
printf "%-6s %-8s %10s %10s %8s %8s %8s %8s %10s %8s %8s\n" nodes config \
  "origin(x)" "slowest(s)" "x one" "p50(s)" "p99(s)" "cpu(s)" \
  "origin-con" "max-fds" "max-thr"
for n in $NODES; do
  for cfg in $CONFIGS; do
    [ "$n" = 1 ] && [ "$cfg" != alone ] && continue
    [ "$cfg" = alone ] && [ "$n" -gt "${ALONE_MAX:-1000000}" ] && continue
    [ "$cfg" = kill ] && [ "$n" -lt 3 ] && continue
    ts=() os=() cs=() fs=() hs=() p5=() p9=() us=()
    for r in $(seq "$ROUNDS"); do
      read -r t a b u o c f h < <(run "$n" "$cfg" "$r")
      ts+=("$t"); os+=("$o"); cs+=("$c"); fs+=("$f"); hs+=("$h")
      p5+=("$a"); p9+=("$b"); us+=("$u")
    done
    t=$(median "${ts[@]}"); o=$(median "${os[@]}")
    [ "$n" = 1 ] && one=$t
    printf "%-6s %-8s %10.2f %10.2f %8s %8.2f %8.2f %8.2f %10s %8s %8s\n" \
      "$n" "$cfg" "$($PY -c "print($o / $bytes)")" "$t" \
      "$([ -n "$one" ] && $PY -c "print('%.2f' % ($t / $one))" || echo -)" \
      "$(median "${p5[@]}")" "$(median "${p9[@]}")" "$(median "${us[@]}")" \
      "$(median "${cs[@]}")" "$(median "${fs[@]}")" "$(median "${hs[@]}")"
  done
done
