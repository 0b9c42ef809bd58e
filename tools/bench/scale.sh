#!/usr/bin/env bash
# Memory, start-up and commits at scale (issues 5, 10 and 18).
#
# An export of SIZE (default 1T) from nbdkit null behind the filter
# (fscache-validate=size, fscache-readahead=0), CACHED bytes of it
# cached (default 1G) in 64 KiB blocks:
#
#   --pattern=sparse  blocks at random places over the export (the same
#                     ones every run: a seeded sample), default
#   --pattern=dense   the first CACHED bytes, in order
#
# The fill uses NBD_CMD_CACHE requests (64 KiB each when sparse, 4 MiB
# (--request) when dense, 32 in flight), which fill inline when the fill queue is
# full instead of skipping like reads do, so that everything asked is
# cached however slow the disk.  Then:
#
#   1. kill -9 of the proxy that filled, a restart, and the time from
#      starting nbdkit to the first read served (an unclean open: the
#      index is checked and unnamed space reclaimed); a clean stop right
#      after it (its time: the walk after the crash is running), a
#      restart, and the cache made whole again (what the crash lost is
#      fetched again: counted);
#   2. a clean stop (its time: the queued fills and the last commit), a
#      restart and the time to the first read served;
#   3. every cached block read again (all hits: checked), and the
#      proxy's resident memory.
#
# Printed: the fill time and rate; peak RSS (VmHWM) while filling and
# after the clean restart and the re-read; the commit rounds of the
# fill (count, mean and longest, from the fscache-stats counters
# commits, commit_us and commit_max_us); the first read after kill -9
# and after the clean restart (from nbdkit's start to the read's reply,
# and to the end of that client's disconnect, which waits for the
# filter's close); the clean stop; the index and data on disk.
#
#   tools/bench/scale.sh [--size=SIZE] [--cached=SIZE]
#                        [--pattern=sparse|dense] [--request=SIZE]
#                        [--dir=DIR]
#
# --request sets the dense pattern's request size (default 4M): nbdkit
# holds each read request's data while it is in flight, 32 of them, so
# that the re-read's peak holds up to 32 times that on top of the
# filter's own memory.
#
# --dir puts the cache (and the work files) in DIR instead of a new
# directory under /tmp: the data written is CACHED bytes, so DIR needs
# that much free space.  The old form, a number of blocks (SCATTER),
# is still taken: tools/bench/scale.sh 16384 is --cached=1G.
set -euo pipefail
cd "$(dirname "$0")/../.."
FILTER="${FILTER:-$PWD/plugin/.libs/nbdkit-fscache-filter.so}"
TOOL="$PWD/tools/nbd-fscache/nbd-fscache"
SIZE=1T CACHED=1G PATTERN=sparse DIR="" REQUEST=4M
for a in "$@"; do
  case "$a" in
    --size=*) SIZE="${a#*=}" ;;
    --cached=*) CACHED="${a#*=}" ;;
    --pattern=*) PATTERN="${a#*=}" ;;
    --dir=*) DIR="${a#*=}" ;;
    --request=*) REQUEST="${a#*=}" ;;
    -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
    -*) echo "scale.sh: unknown option: $a" >&2; exit 2 ;;
    *) CACHED=$((a * 65536)) ;;
  esac
done
case "$PATTERN" in
  sparse|dense) ;;
  *) echo "scale.sh: --pattern=sparse or dense" >&2; exit 2 ;;
esac
BYTES=$(numfmt --from=iec "$SIZE")
CBYTES=$(numfmt --from=iec "$CACHED")
REQUEST=$(numfmt --from=iec "$REQUEST")
NBLOCKS=$((CBYTES / 65536))
[ "$CBYTES" -le "$BYTES" ] || { echo "scale.sh: --cached over --size" >&2; exit 2; }
PY=/usr/bin/python3
if [ -n "$DIR" ]; then
  mkdir -p "$DIR"
  work="$(mktemp -d "$DIR/fscache-scale.XXXXXX")"
else
  work="$(mktemp -d /tmp/fscache-scale.XXXXXX)"
fi
# (Under set -e a failing kill, of a proxy already stopped, would end
# the trap before the rm: CACHED bytes left behind on every run.)
cleanup () {
  if [ -s "$work/px.pid" ]; then
    kill -9 "$(cat "$work/px.pid")" 2>/dev/null || true
  fi
  if [ -n "${KEEP:-}" ]; then echo "scale.sh: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

now () { date +%s.%N; }
since () { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.3f\n", a - b }'; }
wait_pid () { while [ ! -s "$1" ]; do sleep 0.01; done; }
# A daemonized nbdkit is not our child, and may stay a zombie: it has
# exited once it is gone, or a zombie without threads left (after a
# kill -9 the leader is a zombie before the other threads, which hold
# the object's lock, are gone).
wait_gone ()
{
  local st
  while st=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null); do
    if [ "$st" = Z ] && [ "$(ls "/proc/$1/task" 2>/dev/null | wc -l)" -le 1 ]; then
      return 0
    fi
    sleep 0.01
  done
}
hwm () { awk '/VmHWM/ { print $2 }' "/proc/$(cat "$work/px.pid")/status"; }
stat_of () { awk -v k="$1" '$1 == k { print $2 }' "$work/px.stats"; }

proxy () {
  rm -f "$work/px.sock" "$work/px.pid"
  nbdkit -U "$work/px.sock" -P "$work/px.pid" --filter="$FILTER" \
    null "$BYTES" fscache-dir="$work/cache" fscache-validate=size \
    fscache-readahead=0 fscache-stats="$work/px.stats"
  wait_pid "$work/px.pid"
}
stop_proxy () { local p; p=$(cat "$work/px.pid"); kill "$p"; wait_gone "$p"; }

# blocks.py MODE: cache (NBD_CMD_CACHE) or read (pread, checked to be
# zeroes) every block of the pattern, 32 requests in flight; prints
# the seconds it took.  Sparse blocks are a seeded sample, so every
# run (and every mode) touches the same ones.
cat > "$work/blocks.py" <<'PY'
import nbd, random, sys, time
sock, mode, pattern = sys.argv[1], sys.argv[2], sys.argv[3]
size, nblocks = int(sys.argv[4]), int(sys.argv[5])
h = nbd.NBD()
h.connect_unix(sock)
if pattern == "sparse":
    random.seed(1)
    reqs = [(b * 65536, 65536)
            for b in random.sample(range(size // 65536), nblocks)]
else:
    total, step = nblocks * 65536, int(sys.argv[6])
    reqs = [(o, min(step, total - o)) for o in range(0, total, step)]
bad = []
# 32 buffers, reused: one per request would keep every buffer alive
# until the handle is closed (32 GiB for --cached=32G).
free = {n: [nbd.Buffer(n) for _ in range(32)] for n in set(r[1] for r in reqs)}
def done(buf, off, err):
    if err.value != 0:
        bad.append((off, err.value))
    elif buf is not None:
        if not buf.is_zero():
            bad.append((off, "not zeroes"))
        free[buf.size()].append(buf)
    return 1
t0 = time.monotonic()
i = 0
while i < len(reqs) or h.aio_in_flight() > 0:
    while i < len(reqs) and h.aio_in_flight() < 32:
        off, n = reqs[i]
        if mode == "cache":
            h.aio_cache(n, off,
                        completion=lambda err, o=off: done(None, o, err))
        else:
            b = free[n].pop()
            h.aio_pread(b, off,
                        completion=lambda err, o=off, b=b: done(b, o, err))
        i += 1
    h.poll(-1)
print("%.3f" % (time.monotonic() - t0))
h.shutdown()
if bad:
    sys.exit("%d failed requests, first %r" % (len(bad), bad[0]))
PY
blocks () { $PY "$work/blocks.py" "$work/px.sock" "$1" "$PATTERN" "$BYTES" "$NBLOCKS" "$REQUEST"; }
# first_read T0: a connection, one read, a disconnect; prints the
# seconds from T0 (the proxy's start) to the read's reply, then to the
# end of the disconnect (which waits for the filter's close).
first_read ()
{
  $PY -c 'import nbd, sys, time
t0 = float(sys.argv[2])
h = nbd.NBD(); h.connect_unix(sys.argv[1]); h.pread(65536, 0)
t1 = time.time(); h.shutdown(); t2 = time.time()
print("%.3f %.3f" % (t1 - t0, t2 - t0))' "$work/px.sock" "$1"
}

# The fill, and the proxy that did it killed.  Its counters are
# written when the filling connection has closed (after its fills).
proxy
fill_s=$(blocks cache)
while [ ! -s "$work/px.stats" ]; do sleep 0.01; done
hwm_fill=$(hwm)
cp "$work/px.stats" "$work/fill.stats"
commits=$(stat_of commits)
commit_us=$(stat_of commit_us)
commit_max_us=$(stat_of commit_max_us)
kill -9 "$(cat "$work/px.pid")"
wait_gone "$(cat "$work/px.pid")"
rm -f "$work/px.stats"

# 1. After kill -9: the first read, then the cache made whole again.
t0=$(now)
proxy
read ready_kill closed_kill < <(first_read "$t0")
# A clean stop soon after the crash, while the walk that reclaims
# unnamed space runs (it stops it; the next open walks again).
crash_stop_t0=$(now)
stop_proxy
crash_stop_s=$(since "$crash_stop_t0")
rm -f "$work/px.stats"
proxy
refill_s=$(blocks cache)
stop_t0=$(now)
stop_proxy
stop_s=$(since "$stop_t0")
refetched=$(stat_of upstream_read_bytes)
mv "$work/px.stats" "$work/refill.stats"

# 2. After a clean stop: the first read, then 3. everything again.
t0=$(now)
proxy
read ready_clean closed_clean < <(first_read "$t0")
reread_s=$(blocks read)
hwm_reread=$(hwm)
stop_proxy
hits_upstream=$(stat_of upstream_read_bytes)
cached=$("$TOOL" stat --dir "$work/cache" | awk '$1 == "cached_bytes" { print $2 }')

idx=$(du -kc "$work"/cache/objects/*/*.idx | awk 'END { print $1 }')
data=$(du -kc "$work"/cache/objects/*/*.data* | awk 'END { print $1 }')
nseg=$(ls "$work"/cache/objects/*/*.data* | wc -l)

printf 'export %s, block 64K, %s cached (%s, %d blocks)\n' \
  "$SIZE" "$CACHED" "$PATTERN" "$NBLOCKS"
printf 'fill time                 %9.2f s (%.0f MiB/s)\n' "$fill_s" \
  "$(awk -v b="$CBYTES" -v t="$fill_s" 'BEGIN { print b / 1048576 / t }')"
printf 'VmHWM while filling       %9d KiB\n' "$hwm_fill"
printf 'first read after kill -9  %9.3f s (its disconnect done at %.3f s)\n' \
  "$ready_kill" "$closed_kill"
printf 'clean stop after kill -9  %9.3f s (the walk after the crash running)\n' \
  "$crash_stop_s"
printf 'refetched after kill -9   %9d bytes (lost by the crash), in %.2f s\n' \
  "$refetched" "$refill_s"
printf 'commits during the fill    %9d, mean %.1f ms, longest %.1f ms\n' \
  "$commits" "$(awk -v u="$commit_us" -v n="$commits" \
                 'BEGIN { print n ? u / n / 1000 : 0 }')" \
  "$(awk -v u="$commit_max_us" 'BEGIN { print u / 1000 }')"
printf 'clean stop                %9.3f s\n' "$stop_s"
printf 'first read after restart  %9.3f s (its disconnect done at %.3f s)\n' \
  "$ready_clean" "$closed_clean"
printf 're-read of every block    %9.2f s, %d bytes upstream (0: all hits)\n' \
  "$reread_s" "$hits_upstream"
printf 'VmHWM after re-read       %9d KiB\n' "$hwm_reread"
printf 'cached after all          %9d bytes\n' "$cached"
printf 'index on disk             %9d KiB\n' "$idx"
printf 'data on disk              %9d KiB in %d segment files\n' "$data" "$nseg"
