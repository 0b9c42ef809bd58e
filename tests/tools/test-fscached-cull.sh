#!/usr/bin/env bash
# nbd-fscached: culling for free space, in LRU order, never in use.
#
# The cache lives on a 64 MiB tmpfs.  Six 8 MiB exports are cached by
# real proxies: four are then stopped (idle), with index mtimes 4, 3,
# 2 and 1 days ago; two keep running under a read load (a libnbd
# client on one long-lived connection reading the whole export over
# and over, every read compared with the image), and their indexes are
# made the OLDEST of all (5 days ago; serving hits rewrites nothing),
# so that only the lock keeps them from being culled first.  About 48 MiB are used, so
# free blocks are ~25%: below bcull 50% and bstop 40%.  The daemon
# (brun 60%) must then:
#
#   - cull exactly the three oldest idle objects, oldest first (two
#     are not enough to reach 60% free, three are), and keep the
#     fourth;
#   - never cull the two in use, whose clients never see a failed read
#     or wrong data (several full passes during and after the cull);
#   - create fscache.stop while below bstop and remove it once free
#     space is back above bcull; count the time below bcull and bstop;
#   - leave an empty graveyard, and stop cleanly on SIGTERM.
# A culled export read again through a new proxy is identical (cold).

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

SIZE=$((8 * 1024 * 1024))
for i in 1 2 3 4 5 6; do
  make_random "$TMP/img$i" $SIZE
done

start_proxy ()           # N
{
  start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" \
    --filter="$FILTER" file "$TMP/img$1" fscache-dir="$cache" \
    fscache-key="obj$1" fscache-stats="$TMP/px$1.stats"
}
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }
idx_of ()                # N: the object's index file
{
  local f
  for f in "$cache"/objects/@*/kobj"$1"=00export=3d.idx; do
    [ -e "$f" ] && echo "$f"
  done
  return 0
}
have_obj () { [ -n "$(idx_of "$1")" ]; }
free_pct ()              # available blocks, percent of all
{
  stat -f -c '%a %b' "$mnt" | awk '{ printf "%d\n", $1 * 100 / $2 }'
}

# ---- six objects: 1-4 idle, 5-6 in use -------------------------------
for i in 1 2 3 4 5 6; do
  start_proxy $i
  nbdcopy "$(uri $i)" "$TMP/warm$i"
  cmp "$TMP/img$i" "$TMP/warm$i" || fail "warming obj$i: data differs"
  rm -f "$TMP/warm$i"
done
for i in 1 2 3 4; do
  stop_nbdkit "$TMP/px$i.pid"
done
for i in 1 2 3 4 5 6; do
  have_obj $i || fail "obj$i has no index after warming"
done
touch -d '4 days ago' "$(idx_of 1)"
touch -d '3 days ago' "$(idx_of 2)"
touch -d '2 days ago' "$(idx_of 3)"
touch -d '1 day ago' "$(idx_of 4)"

# Readers of 5 and 6: whole passes, each checked, until told to stop.
start_readers seq 5 6
wait_until readers_passed 1 ||
  fail "the readers made no pass"
# Their connections are open and serve hits only, so nothing rewrites
# their indexes: make them the least recently used of all.
touch -d '5 days ago' "$(idx_of 5)" "$(idx_of 6)"

oldest=$(ls -tr "$cache"/objects/@*/*.idx | head -2 | sed 's/.*kobj\([0-9]\).*/\1/' |
         sort | tr -d '\n')
[ "$oldest" = 56 ] || fail "setup: the oldest indexes are of '$oldest', expected 5 and 6"
before=$(free_pct)
echo "before: ${before}% free, $(du -sk "$cache/objects" | cut -f1) KiB cached"
[ "$before" -lt 40 ] || fail "setup: ${before}% free, expected below bstop 40%"

# ---- the daemon ------------------------------------------------------
cat > "$TMP/d.conf" <<EOF
dir $cache
brun 60%
bcull 50%
bstop 40%
EOF
start_daemon "$TMP/d.conf"
t0=$(date +%s.%N)

stats="$cache/nbd-fscached.stats"
culled () { stat_value "$stats" culled_objects 2>/dev/null || echo 0; }
settled ()
{
  [ -s "$stats" ] && [ "$(culled)" -ge 3 ] &&
    [ "$(stat_value "$stats" culling)" -eq 0 ] &&
    [ "$(stat_value "$stats" stopped)" -eq 0 ] &&
    [ ! -e "$cache/fscache.stop" ]
}
wait_until settled || { cat "$dlog" "$stats" >&2; fail "the daemon did not settle"; }
took=$(seconds_since "$t0")
after=$(free_pct)
echo "after: ${after}% free, $(du -sk "$cache/objects" | cut -f1) KiB cached," \
     "settled in $took s"
grep 'culled' "$dlog"

[ "$after" -ge 60 ] || fail "free space ${after}% after culling, expected >= brun 60%"
[ "$(culled)" -eq 3 ] || fail "culled $(culled) objects, expected 3"
for i in 1 2 3; do
  have_obj $i && fail "obj$i (idle, among the oldest) was not culled"
done
have_obj 4 || fail "obj4 (idle, most recent) was culled: more than needed"
for i in 5 6; do
  have_obj $i || fail "obj$i (in use) was culled"
  for s in data sums; do
    ls "$cache"/objects/@*/kobj$i=00export=3d.$s >/dev/null 2>&1 ||
      fail "obj$i (in use) lost its .$s file"
  done
done
# LRU order, from the daemon's log.
order=$(sed -n 's/.*culled objects\/@..\/kobj\([0-9]\)=00export=3d:.*/\1/p' "$dlog" |
        tr -d '\n')
[ "$order" = 123 ] || fail "cull order was '$order', expected 123 (oldest first)"

# The stop mark came and went; time below the thresholds was counted.
[ "$(stat_value "$stats" stop_marks)" -ge 1 ] || fail "fscache.stop was never created"
[ "$(stat_value "$stats" below_bcull_ms)" -gt 0 ] || fail "below_bcull_ms is 0"
[ "$(stat_value "$stats" below_bstop_ms)" -gt 0 ] || fail "below_bstop_ms is 0"
[ "$(stat_value "$stats" culled_bytes)" -ge $((3 * SIZE)) ] ||
  fail "culled_bytes $(stat_value "$stats" culled_bytes), expected >= $((3 * SIZE))"
[ "$(stat_value "$stats" objects_in_use)" -eq 2 ] ||
  fail "objects_in_use $(stat_value "$stats" objects_in_use), expected 2"
[ -z "$(ls -A "$cache/graveyard")" ] || fail "graveyard not empty: $(ls -A "$cache/graveyard")"

# Two more full passes of each reader after the cull, then stop them.
# The in-use indexes were never touched (the daemon took no lock).
[ "$(ls -tr "$cache"/objects/@*/*.idx | head -2 | sed 's/.*kobj\([0-9]\).*/\1/' |
    sort | tr -d '\n')" = 56 ] || fail "the in-use indexes changed"
mark_passes
wait_until readers_passed 2 ||
  fail "the readers stalled after the cull"
stop_readers
for i in 5 6; do
  stop_nbdkit "$TMP/px$i.pid"
  [ "$(stat_value "$TMP/px$i.stats" verify_failures)" -eq 0 ] ||
    fail "obj$i: verify failures"
  [ "$(stat_value "$TMP/px$i.stats" withdrawals)" -eq 0 ] ||
    fail "obj$i: withdrawn"
done

stop_daemon

# A culled export through a new proxy: cold, identical.
start_proxy 1
nbdcopy "$(uri 1)" "$TMP/again1"
cmp "$TMP/img1" "$TMP/again1" || fail "obj1 after culling: data differs"
stop_nbdkit "$TMP/px1.pid"
[ "$(stat_value "$TMP/px1.stats" objects_created)" -eq 1 ] ||
  fail "obj1 after culling was not created anew"

echo "$0: PASS"
