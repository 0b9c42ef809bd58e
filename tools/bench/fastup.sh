#!/usr/bin/env bash
# tools/bench/fastup.sh: cold reads from a fast upstream (issue 18).
#
# Where compare.sh puts a slow link between the proxy and the data, here
# the upstream costs (nearly) nothing, so that what the cache itself
# costs shows: an upstream as fast as a 25 GbE NBD server, or faster
# than the cache's own disk.  Each configuration is one nbdkit process,
# the plugin as the upstream, with or without a filter in front of it:
#
#   nocache   nbdkit PLUGIN
#   fscache   nbdkit --filter=fscache PLUGIN fscache-dir=DIR
#               fscache-validate=size fscache-stats=FILE (DIR fresh)
#   nbdcache  nbdkit --filter=cache PLUGIN cache-on-read=true
#             (its cache in a fresh TMPDIR)
#
# and the upstreams (PLUGIN):
#
#   null      nbdkit null SIZE: zeroes, no I/O, no copy
#   file      nbdkit file IMG: SIZE bytes of random data, written by
#             this script just before, so in the page cache
#   nbd       nbdkit nbd socket=UP: a separate NBD server (nbdkit file
#             IMG, started once) as a fast remote; here nocache is the
#             client connected to that server directly (its CPU not
#             counted), and the configuration proxy (nbdkit nbd, no
#             filter) shows what the extra hop alone costs
#
# Phases, each on a freshly started server (cold), with the same fio
# jobs as compare.sh:
#
#   seq-1m    seqread-1m.fio, iodepth 8, the whole export once
#   rand-64k  randread-64k.fio, iodepth 16, every 64 KiB block once
#
# Before each run the previous run's cache is removed and the file
# systems are synced, so that no run pays for another's writeback.
# After the run the server is stopped (SIGTERM; fscache finishes its
# queued fills and commits) and the script records:
#
#   MiB/s      fio's bandwidth
#   cached     the share of the bytes read that the cache holds after
#              the clean stop (nbd-fscache stat: cached_bytes / bytes
#              read); for nbdkit's cache filter "inline", which caches
#              everything in the client's time and loses it at exit
#   skipped    fscache's fill_skipped_bytes / bytes read: misses that
#              the cache disk was too slow to take
#   cpu s      the server's CPU seconds (user + system) during the run
#   stop s     the time the clean stop took (queued fills, commit)
#
# The whole sequence runs ROUNDS times (default 3), the configurations
# in a rotated order each round, and the report gives medians and
# (min..max) over the rounds, each ratio to no cache taken within its
# round.  The machine's noise is large when it is shared: read the
# spread, not only the median.
#
# Extra builds or settings of fscache can be measured side by side:
# --variant=NAME:FILTER.so[:ENV] adds a configuration NAME running that
# filter with ENV (space-separated K=V, e.g. NBD_FSCACHE_FAULTS=...) in
# its environment.
#
# Output (OUT, default a new /tmp/fscache-fastup.XXXXXX): results.tsv,
# table.md (printed), env.txt, raw/ (fio JSON, stats, commands).

set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${top_srcdir:=$(cd "$BENCH_DIR/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="$top_builddir/tools/nbd-fscache/nbd-fscache"

usage ()
{
  cat <<EOF
Usage: $0 [OPTIONS]
  --size=SIZE          export size and bytes read per run (default 4G)
  --rounds=N           repetitions, configurations rotated (default 3)
  --runtime=SECS       cap per run (default 120)
  --upstreams="A B"    subset of: null file nbd (default: null file)
  --phases="A B"       subset of: seq-1m rand-64k (default both)
  --configs="A B"      subset of: nocache fscache nbdcache proxy nofill
                       (fscache storing nothing: DIR/fscache.stop), plus
                       variants
                       (default: all three and every variant)
  --fscache-args="K=V" more fscache-* parameters for every fscache run
  --variant=NAME:SO[:ENV]
                       another fscache configuration (repeatable)
  --out=DIR            output directory
  --report=DIR         print the table of an earlier run again
Filter: \$FSCACHE_FILTER, else $FILTER
EOF
}

# report DIR: the table of DIR/results.tsv, into DIR/table.md.
report ()
{
python3 - "$1/results.tsv" <<'PY' | tee "$1/table.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def med(v):
    v = sorted(v)
    return statistics.median(v), v[0], v[-1]
def fmt(t, f):
    return "%s (%s..%s)" % (f % t[0], f % t[1], f % t[2])
base = {(r["upstream"], r["phase"], r["round"]): float(r["mib_s"])
        for r in rows if r["config"] == "nocache"}
keys = []
for r in rows:
    k = (r["upstream"], r["phase"], r["config"])
    if k not in keys:
        keys.append(k)
# Issue 44's bound is against the bare proxy, which pays the same hop:
# its ratios (each within its round) get a column when it ran.
proxy = {(r["upstream"], r["phase"], r["round"]): float(r["mib_s"])
         for r in rows if r["config"] == "proxy"}
def ratios(k, rs, b):
    v = [float(r["mib_s"]) / b[(k[0], k[1], r["round"])]
         for r in rs if (k[0], k[1], r["round"]) in b]
    return fmt(med(v), "%.2f") if v else "-"
xp = " x bare proxy |" if proxy else ""
print("| upstream | phase | config | MiB/s | x no cache |" + xp +
      " cached | skipped | server CPU s | clean stop s |")
print("|---|---|---|---:|---:|" + ("---:|" if proxy else "") +
      "---:|---:|---:|---:|")
for k in keys:
    rs = [r for r in rows if (r["upstream"], r["phase"], r["config"]) == k]
    mib = med([float(r["mib_s"]) for r in rs])
    ratio = ratios(k, rs, base)
    if proxy:
        ratio += " | " + ratios(k, rs, proxy)
    if rs[0]["cached_bytes"] in ("-", "inline"):
        cached = rs[0]["cached_bytes"]
        skipped = "-"
    else:
        cached = fmt(med([100.0 * float(r["cached_bytes"]) / float(r["io_bytes"])
                          for r in rs]), "%.0f%%")
        skipped = fmt(med([100.0 * float(r["skipped_bytes"]) / float(r["io_bytes"])
                           for r in rs]), "%.0f%%")
    cpu = fmt(med([float(r["cpu_s"]) for r in rs]), "%.2f")
    stop = fmt(med([float(r["stop_s"]) for r in rs]), "%.2f")
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |"
          % (k[0], k[1], k[2], fmt(mib, "%.0f"), ratio, cached, skipped, cpu,
             stop))
PY
}

SIZE=4G ROUNDS=3 RUNTIME=120 UPSTREAMS="null file" PHASES="seq-1m rand-64k"
CONFIGS="" FSCACHE_ARGS="" OUT=""
declare -A VSO=() VENV=()
VNAMES=""
ORIG_ARGS="$*"
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --rounds=*) ROUNDS="${a#*=}" ;;
    --runtime=*) RUNTIME="${a#*=}" ;;
    --upstreams=*) UPSTREAMS="${a#*=}" ;;
    --phases=*) PHASES="${a#*=}" ;;
    --configs=*) CONFIGS="${a#*=}" ;;
    --fscache-args=*) FSCACHE_ARGS="${a#*=}" ;;
    --variant=*)
      v="${a#*=}"
      name="${v%%:*}"; rest="${v#*:}"
      VSO[$name]="${rest%%:*}"
      if [[ "$rest" == *:* ]]; then VENV[$name]="${rest#*:}"; else VENV[$name]=""; fi
      VNAMES="$VNAMES $name" ;;
    --out=*) OUT="${a#*=}" ;;
    --report=*) report "${a#*=}"; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fastup.sh: unknown argument: $a (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$CONFIGS" ] || CONFIGS="nocache fscache nbdcache$VNAMES"
for c in nbdkit fio python3 numfmt; do
  command -v "$c" >/dev/null || { echo "fastup.sh: $c is required" >&2; exit 2; }
done
[ -f "$FILTER" ] || { echo "fastup.sh: $FILTER: not built" >&2; exit 2; }
[ -x "$TOOL" ] || { echo "fastup.sh: $TOOL: not built" >&2; exit 2; }

[ -n "$OUT" ] || OUT="$(mktemp -d /tmp/fscache-fastup.XXXXXX)"
mkdir -p "$OUT/raw"
OUT="$(cd "$OUT" && pwd)"
RAW="$OUT/raw"
WORK="$OUT/work"
rm -rf "$WORK"
mkdir -p "$WORK"
SOCK="$WORK/s.sock" PIDF="$WORK/s.pid"

# A private copy of each filter: the tree may be rebuilt meanwhile.
cp "$FILTER" "$WORK/fscache.so"
VSO[fscache]="$WORK/fscache.so"
VENV[fscache]=""
# nofill: fscache with DIR/fscache.stop present, so that it stores
# nothing: what the filter costs a stream without its fills.
VSO[nofill]="$WORK/fscache.so"
VENV[nofill]=""
for v in $VNAMES; do
  cp "${VSO[$v]}" "$WORK/$v.so"
  VSO[$v]="$WORK/$v.so"
done

srv_pid="" up_pid=""
cleanup ()
{
  if [ -n "$srv_pid" ]; then kill -9 "$srv_pid" 2>/dev/null || true; fi
  if [ -n "$up_pid" ]; then kill -9 "$up_pid" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

BYTES=$(numfmt --from=iec "$SIZE")
if [[ " $UPSTREAMS " == *" file "* || " $UPSTREAMS " == *" nbd "* ]]; then
  echo "fastup.sh: writing a $SIZE image of random data"
  head -c "$BYTES" /dev/urandom > "$WORK/image"
fi
UPSOCK="$WORK/up.sock"
if [[ " $UPSTREAMS " == *" nbd "* ]]; then
  nbdkit -U "$UPSOCK" -P "$WORK/up.pid" file "$WORK/image"
  for (( i=0; i<500; i++ )); do
    [ -s "$WORK/up.pid" ] && break
    sleep 0.02
  done
  up_pid=$(cat "$WORK/up.pid")
fi

{
  echo "date	$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command	$0 $ORIG_ARGS"
  echo "SIZE	$SIZE"
  echo "ROUNDS	$ROUNDS"
  echo "cpus	$(nproc)"
  echo "kernel	$(uname -sr)"
  echo "nbdkit	$(nbdkit --version)"
  echo "fio	$(fio --version)"
  echo "git	$(git -C "$top_srcdir" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "loadavg_start	$(cut -d' ' -f1-3 /proc/loadavg)"
  for v in fscache $VNAMES; do
    echo "filter_$v	$(sha256sum "${VSO[$v]}" | cut -c1-16) ${VENV[$v]}"
  done
} > "$OUT/env.txt"

# srv_start CONFIG UPSTREAM TAG: a fresh server, ready to serve.
srv_start ()
{
  local config="$1" up="$2" tag="$3" i
  local plugin=()
  case "$up" in
    null) plugin=(null "$BYTES") ;;
    file) plugin=(file "$WORK/image") ;;
    nbd) plugin=(nbd socket="$UPSOCK") ;;
  esac
  rm -rf "$WORK/cache" "$WORK/tmp" "$WORK/stats"
  mkdir -p "$WORK/tmp"
  if [ "$config" = nofill ]; then
    mkdir -m 700 "$WORK/cache"
    touch "$WORK/cache/fscache.stop"
  fi
  sync
  rm -f "$SOCK" "$PIDF"
  local cmd=()
  local envs=()
  case "$config" in
    nocache|proxy) cmd=(nbdkit -U "$SOCK" -P "$PIDF" "${plugin[@]}") ;;
    nbdcache)
      cmd=(nbdkit -U "$SOCK" -P "$PIDF" --filter=cache "${plugin[@]}"
           cache-on-read=true)
      envs=(TMPDIR="$WORK/tmp") ;;
    *)
      # shellcheck disable=SC2206
      envs=(${VENV[$config]})
      # shellcheck disable=SC2206
      cmd=(nbdkit -U "$SOCK" -P "$PIDF" --filter="${VSO[$config]}"
           "${plugin[@]}" fscache-dir="$WORK/cache" fscache-validate=size
           fscache-stats="$WORK/stats" $FSCACHE_ARGS) ;;
  esac
  echo "$tag: ${envs[*]} ${cmd[*]}" >> "$RAW/commands.txt"
  env "${envs[@]}" "${cmd[@]}" 2>>"$RAW/nbdkit.log"
  for (( i=0; i<500; i++ )); do
    [ -s "$PIDF" ] && break
    sleep 0.02
  done
  srv_pid=$(cat "$PIDF")
}

# srv_stop: SIGTERM and wait until it is gone (a daemonized nbdkit is
# not our child: a zombie counts as gone).  Prints the seconds it took.
srv_stop ()
{
  local t0 st
  t0=$(date +%s.%N)
  kill -TERM "$srv_pid" 2>/dev/null || true
  while :; do
    st=$(awk '{ print $3 }' "/proc/$srv_pid/stat" 2>/dev/null) || break
    [ "$st" = Z ] && break
    sleep 0.01
  done
  srv_pid=""
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f\n", b - a }'
}

cpu_seconds ()
{
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f\n", ($14 + $15) / hz }' \
    "/proc/$1/stat"
}

rotated ()
{
  local -a c
  read -r -a c <<< "$CONFIGS"
  local n=$(( $1 % ${#c[@]} ))
  echo "${c[@]:n}" "${c[@]:0:n}"
}

printf 'upstream\tphase\tconfig\tround\tmib_s\tio_bytes\tcached_bytes\tskipped_bytes\tcpu_s\tstop_s\n' \
  > "$OUT/results.tsv"

for (( round=1; round<=ROUNDS; round++ )); do
  for up in $UPSTREAMS; do
    for phase in $PHASES; do
      case "$phase" in
        seq-1m) job=seqread-1m.fio depth=8 ;;
        rand-64k) job=randread-64k.fio depth=16 ;;
        *) echo "fastup.sh: unknown phase $phase" >&2; exit 2 ;;
      esac
      for config in $(rotated $((round - 1))); do
        tag="$up.$phase.$config.r$round"
        [ "$config" = proxy ] && [ "$up" != nbd ] && continue
        sock="$SOCK"
        if [ "$up" = nbd ] && [ "$config" = nocache ]; then
          sock="$UPSOCK"        # the client on the server itself
        else
          srv_start "$config" "$up" "$tag"
        fi
        printf '  round %d %-5s %-9s %-10s ' "$round" "$up" "$phase" "$config"
        URI="nbd+unix:///?socket=$sock" SIZE="$BYTES" IODEPTH="$depth" \
          RUNTIME="$RUNTIME" LOOPS=1 \
          fio --output-format=json --output="$RAW/$tag.json" \
              "$BENCH_DIR/$job" > "$RAW/$tag.fio.log" 2>&1
        cpu=0 stop=0
        if [ "$sock" = "$SOCK" ]; then
          cpu=$(cpu_seconds "$srv_pid")
          stop=$(srv_stop)
        fi
        cached=- skipped=-
        case "$config" in
          nocache|proxy) ;;
          nbdcache) cached=inline ;;
          *)
            cp "$WORK/stats" "$RAW/$tag.stats"
            skipped=$(awk '$1 == "fill_skipped_bytes" { s = $2 }
                           END { print (s == "" ? 0 : s) }' "$WORK/stats")
            cached=$("$TOOL" stat --dir "$WORK/cache" --json |
                     python3 -c 'import json, sys
print(json.load(sys.stdin)["total"]["cached_bytes"])') ;;
        esac
        read -r mib io < <(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["jobs"][0]["read"]
print("%.1f %d" % (r["bw_bytes"] / 1048576, r["io_bytes"]))' "$RAW/$tag.json")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$up" "$phase" \
          "$config" "$round" "$mib" "$io" "$cached" "$skipped" "$cpu" \
          "$stop" >> "$OUT/results.tsv"
        printf '%8.1f MiB/s  cpu %5.2f s  stop %6.3f s  cached %s\n' \
          "$mib" "$cpu" "$stop" "$cached"
      done
    done
  done
done
echo "loadavg_end	$(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"

report "$OUT"
echo "fastup.sh: results in $OUT"
