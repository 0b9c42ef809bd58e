#!/usr/bin/env bash
# nbd-fscached: max-size with every object in use: quotas.
#
# Three 24 MiB exports are cached whole by three running proxies
# (about 72 MiB) and stay under a read load (nbdcopy of the whole
# export, cmp'ed against the image, in a loop).  The daemon runs with
# max-size 40M: there is no idle object to cull, so it must write
# NAME.quota records, and the filters must evict down to them.
#
#   - within 20 s, the allocated bytes of objects/ (du) are at most
#     max-size, and stay there for three more full passes of every
#     reader (sampled all along);
#   - every object in use has a quota record, all with the same
#     budget (the fair share), and nothing was culled;
#   - no reader ever sees a failed read or wrong data;
#   - once the proxies are gone the daemon lifts the quotas (removes
#     the records).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$DAEMON"
requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires "$PYTHON" -c "import nbd"
requires du --version
requires nbdkit --filter="$FILTER" null --dump-plugin

SIZE=$((24 * 1024 * 1024))
MAX=$((40 * 1024 * 1024))
cache="$TMP/cache"
avail_pct=$(stat -f -c '%a %b' "$TMP" | awk '{ printf "%d\n", $1 * 100 / $2 }')
if [ "$avail_pct" -lt 5 ]; then
  echo "$0: SKIP: $TMP has only ${avail_pct}% free"
  exit 77
fi

for i in 1 2 3; do
  make_random "$TMP/img$i" $SIZE
done
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }
for i in 1 2 3; do
  start_nbdkit -P "$TMP/px$i.pid" -U "$TMP/px$i.sock" \
    --filter="$FILTER" file "$TMP/img$i" fscache-dir="$cache" \
    fscache-key="obj$i" fscache-stats="$TMP/px$i.stats"
  nbdcopy "$(uri $i)" "$TMP/warm$i"
  cmp "$TMP/img$i" "$TMP/warm$i" || fail "warming obj$i: data differs"
  rm -f "$TMP/warm$i"
done
cached () { du -s -B1 "$cache/objects" | cut -f1; }
echo "before: $(cached) bytes cached, max-size $MAX"
[ "$(cached)" -gt "$MAX" ] || fail "setup: only $(cached) bytes cached"

# Checking readers, in a shuffled order, one connection each: every
# object stays in use all along.
start_readers random 1 2 3
# Every object is in use (its reader connected and reading) before the
# daemon starts: otherwise an object between its warming and its
# reader's connection is idle, and culling it is right.
wait_until readers_passed 1 || fail "the readers made no pass"

cat > "$TMP/d.conf" <<EOF
dir $cache
max-size 40M
brun 2%
bcull 1%
bstop 0%
frun 2%
fcull 1%
fstop 0%
EOF
start_daemon "$TMP/d.conf"
t0=$(date +%s.%N)

under_max () { [ "$(cached)" -le "$MAX" ]; }
wait_until under_max ||
  { cat "$dlog" >&2; fail "still $(cached) bytes cached after 20 s, max-size $MAX"; }
took=$(seconds_since "$t0")
echo "converged: $(cached) bytes cached after $took s"

# Stay under it for three more passes of every reader.
mark_passes
peak=0
held ()
{
  local c
  c=$(cached)
  [ "$c" -gt "$peak" ] && peak=$c
  [ "$c" -le "$MAX" ] ||
    { cat "$dlog" >&2; fail "$c bytes cached after convergence, max-size $MAX"; }
  readers_passed 3
}
wait_until held || fail "the readers stalled under quotas"
echo "held: peak $peak bytes over three more passes of each reader"

budgets=$(for f in "$cache"/objects/@*/*.quota; do
            od -A n -t u8 -j 16 -N 8 "$f"
          done | tr -s ' \n' ' ')
nq=$(ls "$cache"/objects/@*/*.quota 2>/dev/null | wc -l)
echo "quota records: $nq, budgets:$budgets"
[ "$nq" -eq 3 ] || fail "$nq quota records, expected one per object in use (3)"
[ "$(echo $budgets | tr ' ' '\n' | sort -u | wc -l)" -eq 1 ] ||
  fail "the budgets differ: $budgets (expected one fair share)"

# While every object is in use nothing may be culled (the quotas do
# the work): the daemon's counters, rewritten every 2 s, at this point.
# (Once the proxies stop, the objects are idle, and culling one of them
# to get back under the thresholds is the daemon's job: not counted.)
stats="$cache/nbd-fscached.stats"
culled_in_use=$(stat_value "$stats" culled_objects)
stop_readers
for i in 1 2 3; do
  stop_nbdkit "$TMP/px$i.pid"
  [ "$(stat_value "$TMP/px$i.stats" verify_failures)" -eq 0 ] ||
    fail "obj$i: verify failures"
  [ "$(stat_value "$TMP/px$i.stats" withdrawals)" -eq 0 ] || fail "obj$i: withdrawn"
  [ "$(stat_value "$TMP/px$i.stats" evicted_bytes)" -gt 0 ] ||
    fail "obj$i: the filter evicted nothing"
done

# No object in use any more: the quotas are lifted.
no_quota () { ! ls "$cache"/objects/@*/*.quota >/dev/null 2>&1; }
wait_until no_quota || fail "quota records left once no object is in use"
# (The daemon logs it once the records are gone: wait for the line.)
wait_until grep -q 'quotas lifted' "$dlog" ||
  fail "no 'quotas lifted' message"

stop_daemon
# The counters as the daemon wrote them at exit (during the run the
# file is rewritten every 2 s).
[ "$culled_in_use" -eq 0 ] ||
  { grep -i cull "$dlog" | tail -5 >&2; fail "objects in use were culled"; }
echo "culled while in use: $culled_in_use; in all:" \
     "$(stat_value "$stats" culled_objects)"
[ "$(stat_value "$stats" quota_writes)" -ge 3 ] || fail "quota_writes < 3"
echo "$0: PASS"
