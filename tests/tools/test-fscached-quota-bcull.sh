#!/usr/bin/env bash
# nbd-fscached: free space above bcull with every object in use.
#
# The cache lives on a 64 MiB tmpfs.  Three 16 MiB exports are cached
# whole by three running proxies (~48 MiB, so ~25% free) and stay
# under a read load (tests/pass-reader.py in a shuffled order, every
# read compared with the image).  The daemon runs with brun 50% and
# bcull 40%: there is no idle object to cull, so it must give the
# objects in use quota records on the blocks trigger alone (no
# max-size), and the filters must evict down to them:
#
#   - within 20 s free space is at or above bcull, and stays there for
#     three more full passes of every reader (sampled all along);
#   - nothing was culled, the time below bcull was counted;
#   - no reader ever sees a failed read or wrong data.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$DAEMON"
requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires "$PYTHON" -c "import nbd"
requires mount --version
requires nbdkit --filter="$FILTER" null --dump-plugin

mnt="$TMP/mnt"
cache="$mnt/cache"
mount_tmpfs "$mnt" 64m

SIZE=$((16 * 1024 * 1024))
for i in 1 2 3; do
  make_random "$TMP/img$i" $SIZE
done
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }
# fscache-min-free=0: the floor is the daemon's business here.
for i in 1 2 3; do
  start_nbdkit -P "$TMP/px$i.pid" -U "$TMP/px$i.sock" \
    --filter="$FILTER" file "$TMP/img$i" fscache-dir="$cache" \
    fscache-key="obj$i" fscache-min-free=0 fscache-stats="$TMP/px$i.stats"
  nbdcopy "$(uri $i)" "$TMP/warm$i"
  cmp "$TMP/img$i" "$TMP/warm$i" || fail "warming obj$i: data differs"
  rm -f "$TMP/warm$i"
done
free_pct () { stat -f -c '%a %b' "$mnt" | awk '{ printf "%d\n", $1 * 100 / $2 }'; }
before=$(free_pct)
echo "before: ${before}% free, $(du -sk "$cache/objects" | cut -f1) KiB cached"
[ "$before" -lt 40 ] || fail "setup: ${before}% free, expected below bcull 40%"

start_readers random 1 2 3
# Every object is in use (its reader connected and reading) before the
# daemon starts: otherwise an object between its warming and its
# reader's connection is idle, and culling it is right.
wait_until readers_passed 1 || fail "the readers made no pass"

cat > "$TMP/d.conf" <<EOF2
dir $cache
brun 50%
bcull 40%
bstop 5%
EOF2
start_daemon "$TMP/d.conf"
t0=$(date +%s.%N)

above_bcull () { [ "$(free_pct)" -ge 40 ]; }
wait_until above_bcull ||
  { cat "$dlog" >&2; fail "still $(free_pct)% free after 20 s, bcull 40%"; }
took=$(seconds_since "$t0")
echo "converged: $(free_pct)% free after $took s"

mark_passes
low=100
held ()
{
  local f
  f=$(free_pct)
  [ "$f" -lt "$low" ] && low=$f
  [ "$f" -ge 40 ] || fail "${f}% free after convergence, bcull 40%"
  readers_passed 3
}
wait_until held || fail "the readers stalled under quotas"
echo "held: lowest ${low}% free over three more passes of each reader"

nq=$(ls "$cache"/objects/@*/*.quota 2>/dev/null | wc -l)
[ "$nq" -eq 3 ] || fail "$nq quota records, expected one per object in use (3)"

stop_readers
# The filters, not the daemon, freed the space.  Not necessarily all
# three: the fair share is recomputed as objects shrink, and once the
# first ones have evicted (down to their quota and a slack below it)
# the last may already fit in the share it is given then.
evicted=0
for i in 1 2 3; do
  stop_nbdkit "$TMP/px$i.pid"
  [ "$(stat_value "$TMP/px$i.stats" verify_failures)" -eq 0 ] ||
    fail "obj$i: verify failures"
  e=$(stat_value "$TMP/px$i.stats" evicted_bytes)
  echo "obj$i: the filter evicted $e bytes"
  evicted=$((evicted + e))
done
[ "$evicted" -ge $((8 * 1024 * 1024)) ] ||
  fail "the filters evicted $evicted bytes in all, less than the 8 MiB" \
       "that free space had to grow by"

stop_daemon
# The counters as the daemon wrote them at exit (during the run the
# file is rewritten every 2 s).
stats="$cache/nbd-fscached.stats"
[ "$(stat_value "$stats" culled_objects)" -eq 0 ] || fail "objects in use were culled"
[ "$(stat_value "$stats" below_bcull_ms)" -gt 0 ] || fail "below_bcull_ms is 0"
echo "$0: PASS"
