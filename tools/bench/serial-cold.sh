#!/usr/bin/env bash
# tools/bench/serial-cold.sh: cold reads from a serial upstream, with
# and without the pool of upstream contexts (fscache-upstream-connections).
#
# nginx on 127.0.0.1 serves a random image, reached through nbdkit's
# curl plugin (one request at a time per connection in nbdkit 1.32),
# with the delay filter adding DELAY_MS to every read, as a remote.
# With --upstream=ssh (UPSTREAM=ssh), OpenSSH's sshd on 127.0.0.1 (a
# private config and keys: start_sshd, tests/functions.sh) serves it
# over SFTP through nbdkit's ssh plugin (also one request at a time)
# instead, everywhere "curl" stands below:
#
#   nocache     nbdkit --filter=delay curl
#   cachefilter nbdkit --filter=cache --filter=delay curl
#   poolN       nbdkit --filter=fscache --filter=delay curl
#                 fscache-upstream-connections=N (N in POOLS)
#   splitN      the serial plugin in a process of its own, the filter
#                 in front of it over NBD (N in SPLITS):
#                   back:  nbdkit -U B --filter=delay curl
#                   front: nbdkit --filter=fscache nbd socket=B
#                            fscache-upstream-connections=N
#                 the front is parallel, so the client's queue depth
#                 reaches the filter, and each context of the pool is
#                 one connection of the back server (pool.c)
#   proxy       nbd-fscache-proxy with its defaults (issue 42): a
#                 NAME.conf with only plugin=, the URL (or the ssh
#                 parameters), fscache-key, fscache-dir and
#                 filter=delay; the proxy splits the serial plugin by
#                 itself (split=auto)
#   ceiling     nbdkit --filter=delay file: the same delay on a plugin
#                 that takes requests in parallel (what the link allows)
#
# Each configuration runs, on a fresh cache and a fresh server, two
# cold workloads from one fio job (nbd engine, one connection):
#
#   seq1m     sequential 1 MiB reads, iodepth 8, MiB/s
#   rand4k    random 4 KiB reads, iodepth 16, IOPS
#
# for RUNTIME seconds each (time_based within the image, so nothing is
# read twice: the image is larger than what RUNTIME covers at the
# ceiling's seq1m rate, else the number is capped by the image).
# ROUNDS rounds, configurations interleaved; prints the median and the
# spread (min..max) of each.
#
# Options (or environment): --size=SIZE (SIZE, default 1G),
# --delay-ms=N (DELAY_MS, default 10), --runtime=S (RUNTIME, default
# 8), --rounds=N (ROUNDS, default 3), --pools="0 1 4 8 16" (POOLS),
# --splits="16" (SPLITS, default none), --proxy (PROXY=1: the proxy
# configuration too), --upstream=curl|ssh (UPSTREAM, default curl; ssh
# needs root), --out=DIR (OUT, default a new
# /tmp/fscache-serial-cold.XXXXXX).

set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
# cleanup_fn, start_nginx, start_sshd and a private $TMP, removed at exit.
# shellcheck source=/dev/null
source "$top_srcdir/tests/functions.sh"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
SIZE="${SIZE:-1G}" DELAY_MS="${DELAY_MS:-10}" RUNTIME="${RUNTIME:-8}"
ROUNDS="${ROUNDS:-3}" POOLS="${POOLS:-0 1 4 8 16}" OUT="${OUT:-}"
SPLITS="${SPLITS:-}" UPSTREAM="${UPSTREAM:-curl}" PROXY="${PROXY:-}"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --delay-ms=*) DELAY_MS="${a#*=}" ;;
    --runtime=*) RUNTIME="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --pools=*) POOLS="${a#*=}" ;;
    --splits=*) SPLITS="${a#*=}" ;;
    --proxy) PROXY=1 ;;
    --upstream=*) UPSTREAM="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "serial-cold.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done
case $UPSTREAM in
  curl) needs="nginx nbdkit fio" ;;
  ssh) needs="/usr/sbin/sshd ssh-keygen nbdkit fio" ;;
  *) echo "serial-cold.sh: --upstream=$UPSTREAM: curl or ssh" >&2; exit 2 ;;
esac
for c in $needs; do
  command -v "$c" >/dev/null ||
    { echo "serial-cold.sh: $c: not installed" >&2; exit 1; }
done
[ -f "$FILTER" ] ||
  { echo "serial-cold.sh: $FILTER: not built (./build.sh build)" >&2; exit 1; }

[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-serial-cold.XXXXXX)"
mkdir -p "$OUT/raw" "$OUT/www"
# On exit: the nbdkit servers, then the image and the cache (3 GiB
# each at the documented sizes; left behind, a few runs fill the disk,
# and below fscache-min-free the filter stores nothing).  raw/ stays.
# nginx and sshd stop by their own cleanup_fn, registered later, so
# run before this one.
cleanup () {
  local f
  for f in s.pid b.pid; do
    [ -s "$OUT/$f" ] && kill "$(cat "$OUT/$f")" 2>/dev/null || true
  done
  rm -rf "$OUT/www" "$OUT/cache"
}
cleanup_fn cleanup

bytes=$(numfmt --from=iec "$SIZE")
head -c "$bytes" /dev/urandom > "$OUT/www/img"
if [ "$UPSTREAM" = curl ]; then
  # nginx without an access log (tests/functions.sh), stopped at exit.
  start_nginx "$OUT/www" off
  up=(curl url="http://127.0.0.1:$PORT/img")
else
  # sshd with keys of its own (tests/functions.sh); more connections
  # being authenticated at once than its default 10, which a pool of
  # 16 and a split's back server can have.
  start_sshd internal-sftp "MaxStartups 100" || {
    cat "$TMP/sshd.err" >&2; echo "serial-cold.sh: sshd did not start" >&2
    exit 1
  }
  up=(ssh "${ssh_args[@]}" "$OUT/www/img")
fi

# serve CONFIG: start the server of CONFIG on $OUT/s.sock, fresh cache.
serve () {
  local c=$1 args
  rm -rf "$OUT/cache" "$OUT/s.sock" "$OUT/s.pid"
  case $c in
    nocache) args=(--filter=delay "${up[@]}") ;;
    cachefilter) args=(--filter=cache --filter=delay "${up[@]}"
                       cache-min-block-size=64K) ;;
    pool*) args=(--filter="$FILTER" --filter=delay "${up[@]}"
                 fscache-dir="$OUT/cache" fscache-validate=size
                 fscache-upstream-connections="${c#pool}") ;;
    ceiling) args=(--filter=delay file "$OUT/www/img") ;;
  esac
  rm -f "$OUT/b.sock" "$OUT/b.pid"
  if [ "$c" = proxy ]; then
    mkdir -p "$OUT/conf"
    { echo "plugin=${up[0]}"
      for a in "${up[@]:1}"; do echo "upstream=$a"; done
      echo "filter=delay"; echo "upstream=delay-read=${DELAY_MS}ms"
      echo "fscache-key=serial-cold"; echo "fscache-dir=$OUT/cache"
      echo "socket=$OUT/s.sock"; } > "$OUT/conf/img.conf"
    chmod 0600 "$OUT/conf/img.conf"
    "$top_builddir/tools/nbd-fscache-proxy/nbd-fscache-proxy" \
      --filter="$FILTER" --confdir "$OUT/conf" img 2>>"$OUT/raw/$c.log" &
    echo $! > "$OUT/s.pid"
    for i in $(seq 100); do [ -S "$OUT/s.sock" ] && break; sleep 0.1; done
    return
  fi
  if [ "${c#split}" != "$c" ]; then
    nbdkit -U "$OUT/b.sock" -P "$OUT/b.pid" --filter=delay "${up[@]}" \
      delay-read="${DELAY_MS}ms" 2>>"$OUT/raw/$c-back.log"
    for i in $(seq 100); do [ -s "$OUT/b.pid" ] && break; sleep 0.1; done
    nbdkit -U "$OUT/s.sock" -P "$OUT/s.pid" --filter="$FILTER" \
      nbd socket="$OUT/b.sock" fscache-dir="$OUT/cache" \
      fscache-validate=size fscache-upstream-connections="${c#split}" \
      2>>"$OUT/raw/$c.log"
  else
    nbdkit -U "$OUT/s.sock" -P "$OUT/s.pid" "${args[@]}" \
      delay-read="${DELAY_MS}ms" 2>>"$OUT/raw/$c.log"
  fi
  for i in $(seq 100); do [ -s "$OUT/s.pid" ] && break; sleep 0.1; done
}
stop () {
  local p f
  for f in s.pid b.pid; do
    [ -s "$OUT/$f" ] || continue
    p=$(cat "$OUT/$f")
    kill "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  done
}

# run CONFIG ROUND: both workloads, each on a fresh server and cache.
run () {
  local c=$1 r=$2 w
  for w in seq1m rand4k; do
    serve "$c"
    if [ $w = seq1m ]; then
      fio --name=$w --ioengine=nbd --uri="nbd+unix:///?socket=$OUT/s.sock" \
          --rw=read --bs=1M --iodepth=8 --runtime="$RUNTIME" --time_based \
          --size="$bytes" --output-format=json \
          --output="$OUT/raw/$c-$w-$r.json" >/dev/null
    else
      fio --name=$w --ioengine=nbd --uri="nbd+unix:///?socket=$OUT/s.sock" \
          --rw=randread --bs=4k --iodepth=16 --runtime="$RUNTIME" \
          --time_based --norandommap --size="$bytes" --output-format=json \
          --output="$OUT/raw/$c-$w-$r.json" >/dev/null
    fi
    stop
  done
}

configs="nocache cachefilter"
for n in $POOLS; do configs="$configs pool$n"; done
for n in $SPLITS; do configs="$configs split$n"; done
[ -n "$PROXY" ] && configs="$configs proxy"
configs="$configs ceiling"
for r in $(seq "$ROUNDS"); do
  for c in $configs; do
    run "$c" "$r"
    echo "round $r: $c done" >&2
  done
done

$PYTHON - "$OUT/raw" "$ROUNDS" $configs <<'EOF' | tee "$OUT/results.txt"
import json, statistics, sys
raw, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def val(c, w, r):
    j = json.load(open("%s/%s-%s-%d.json" % (raw, c, w, r)))["jobs"][0]["read"]
    return j["bw"] / 1024 if w == "seq1m" else j["iops"]
print("%-12s %22s %22s" % ("config", "seq1m MiB/s", "rand4k IOPS"))
ceil = {}
for c in configs[::-1]:
    row = []
    for w in ("seq1m", "rand4k"):
        v = [val(c, w, r) for r in range(1, rounds + 1)]
        m = statistics.median(v)
        if c == "ceiling":
            ceil[w] = m
        row.append("%7.0f (%.0f..%.0f) %4.2fx" % (m, min(v), max(v),
                                                 m / ceil[w]))
    print("%-12s %s %s" % (c, row[0], row[1]))
EOF
echo "raw results in $OUT"
