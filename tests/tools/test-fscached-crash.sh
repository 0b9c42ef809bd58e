#!/usr/bin/env bash
# nbd-fscached: a crash in the middle of a cull.
#
# Five idle 4 MiB objects, max-size 6M: the daemon must cull four,
# oldest first.  NBD_FSCACHED_TEST_PAUSE_MS=500 makes each rename into
# the graveyard (NAME.data, NAME.sums, NAME.stats, then NAME.idx) and
# the final
# unlinks wait 500 ms, so the test can see and act on each state.
#
#  1. While the first object is half moved (its lock held), a proxy
#     opening it finds it busy and serves it uncached: identical data.
#  2. kill -9 after 1, 2, 3 and 4 files are in the graveyard (data
#     moved; data and sums moved; all but the index moved; everything
#     moved but nothing unlinked).
#     Then every object, the half-deleted one included, read through a
#     new proxy is identical to its image (a half-deleted object is
#     discarded and starts cold, never served), and a restarted daemon
#     empties the graveyard before its pid file appears.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$DAEMON"
requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires nbdkit --filter="$FILTER" null --dump-plugin

SIZE=$((4 * 1024 * 1024))
N=5
for i in $(seq $N); do
  make_random "$TMP/img$i" $SIZE
done

cache=""
start_proxy ()           # N TAG
{
  start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" \
    --filter="$FILTER" file "$TMP/img$1" fscache-dir="$cache" \
    fscache-key="obj$1" fscache-stats="$TMP/px$1.$2.stats"
}
check_read ()            # N TAG: read the whole export, compare
{
  nbdcopy "nbd+unix:///?socket=$TMP/px$1.sock" "$TMP/out$1" ||
    fail "$2: obj$1: nbdcopy failed"
  cmp "$TMP/img$1" "$TMP/out$1" || fail "$2: obj$1: data differs from the image"
  rm -f "$TMP/out$1"
}
obj_file ()              # N SUFFIX: the file if it exists
{
  local f
  for f in "$cache"/objects/@*/kobj"$1"=00export=3d."$2"; do
    [ -e "$f" ] && echo "$f"
  done
  return 0
}
graves () { ls -A "$cache/graveyard" 2>/dev/null | wc -l; }
graves_ge () { [ "$(graves)" -ge "$1" ]; }

# A fresh cache with N warm idle objects, obj1 the oldest.
make_cache ()            # DIR
{
  cache="$1"
  for i in $(seq $N); do
    start_proxy $i warm
    check_read $i warm
    stop_nbdkit "$TMP/px$i.pid"
  done
  for i in $(seq $N); do
    touch -d "$((N + 1 - i)) days ago" "$(obj_file $i idx)"
  done
}

dpid=""
start_daemon ()          # TAG MAX-SIZE [PAUSE-MS]
{
  cat > "$TMP/$1.conf" <<EOF
dir $cache
max-size $2
brun 2%
bcull 1%
bstop 0%
frun 2%
fcull 1%
fstop 0%
EOF
  rm -f "$TMP/d.pid"
  NBD_FSCACHED_TEST_PAUSE_MS="${3:-0}" \
    "$DAEMON" -n -s -ddd -f "$TMP/$1.conf" -p "$TMP/d.pid" 2>"$TMP/$1.log" &
  dpid=$!
  cleanup_fn "kill -9 $dpid 2>/dev/null"
  wait_until test -s "$TMP/d.pid" ||
    { cat "$TMP/$1.log" >&2; fail "$1: daemon: no pid file"; }
}

# ---- 1. a proxy opening an object being culled -----------------------
make_cache "$TMP/cache0"
start_daemon busy 6M 500
wait_until graves_ge 1 || { cat "$TMP/busy.log" >&2; fail "busy: no cull started"; }
[ -z "$(obj_file 1 data)" ] || fail "busy: obj1.data not moved first"
[ -n "$(obj_file 1 idx)" ] || fail "busy: obj1.idx moved too early"
start_proxy 1 busy
check_read 1 busy
# Still held by the daemon, so the proxy served it uncached.
stop_nbdkit "$TMP/px1.pid"
[ "$(stat_value "$TMP/px1.busy.stats" objects_busy)" -ge 1 ] ||
  { cat "$TMP/px1.busy.stats" >&2; fail "busy: the proxy did not find obj1 locked"; }
[ "$(stat_value "$TMP/px1.busy.stats" hit_bytes)" -eq 0 ] ||
  fail "busy: the proxy served hits from an object being culled"
echo "busy: a proxy opening obj1 during its cull served it uncached, identical"
culled_ge ()             # N: the daemon's stats file says N culled
{
  [ -s "$cache/nbd-fscached.stats" ] &&
    [ "$(stat_value "$cache/nbd-fscached.stats" culled_objects)" -ge "$1" ]
}
wait_until culled_ge 4 ||
  { cat "$TMP/busy.log" >&2; fail "busy: the cull did not finish"; }
kill -TERM $dpid
wait $dpid || fail "busy: daemon exit status $?"

# ---- 2. kill -9 at each point of a cull ------------------------------
for k in 1 2 3 4; do
  make_cache "$TMP/cache$k"
  start_daemon "kill$k" 6M 500
  wait_until graves_ge $k || { cat "$TMP/kill$k.log" >&2; fail "kill$k: no cull"; }
  kill -9 $dpid
  wait $dpid 2>/dev/null || true
  g=$(graves)
  [ "$g" -eq $k ] || fail "kill$k: $g files in the graveyard after kill -9, expected $k"
  case $k in
    1) [ -n "$(obj_file 1 idx)" ] && [ -z "$(obj_file 1 data)" ] &&
         [ -n "$(obj_file 1 sums)" ] || fail "kill1: obj1 is not half moved" ;;
    2) [ -n "$(obj_file 1 idx)" ] && [ -z "$(obj_file 1 data)" ] &&
         [ -z "$(obj_file 1 sums)" ] || fail "kill2: obj1 is not index-only" ;;
    3) [ -n "$(obj_file 1 idx)" ] && [ -z "$(obj_file 1 data)" ] &&
         [ -z "$(obj_file 1 sums)" ] && [ -z "$(obj_file 1 stats)" ] ||
         fail "kill3: obj1 is not index-only, its statistics moved" ;;
    4) [ -z "$(obj_file 1 idx)" ] && [ -z "$(obj_file 1 data)" ] &&
         [ -z "$(obj_file 1 sums)" ] && [ -z "$(obj_file 1 stats)" ] ||
         fail "kill4: obj1 is not entirely moved" ;;
  esac
  echo "kill$k: killed with $g files in the graveyard:" \
       "obj1 has $(ls "$cache"/objects/@*/kobj1=* 2>/dev/null | sed 's/.*\.//' | tr '\n' ' ')"

  # Every object through a new proxy: identical, the half-deleted one
  # discarded or new.
  for i in $(seq $N); do
    start_proxy $i "after$k"
    check_read $i "kill$k"
    stop_nbdkit "$TMP/px$i.pid"
    st="$TMP/px$i.after$k.stats"
    [ "$(stat_value "$st" verify_failures)" -eq 0 ] || fail "kill$k: obj$i: verify failures"
    [ "$(stat_value "$st" read_errors)" -eq 0 ] || fail "kill$k: obj$i: read errors"
  done
  st="$TMP/px1.after$k.stats"
  [ "$(stat_value "$st" objects_reused)" -eq 0 ] ||
    fail "kill$k: the half-deleted obj1 was reused"
  # (Hits there may be: readahead fills the new copy as it is read.)
  [ "$(stat_value "$st" objects_created)" -eq 1 ] ||
    fail "kill$k: obj1 was not started cold"
  [ $k -eq 4 ] || [ "$(stat_value "$st" objects_discarded)" -eq 1 ] ||
    fail "kill$k: the half-deleted obj1 was not discarded"
  for i in $(seq 2 $N); do
    [ "$(stat_value "$TMP/px$i.after$k.stats" objects_reused)" -eq 1 ] ||
      fail "kill$k: obj$i (never touched by the cull) was not reused"
  done

  # A restart empties the graveyard before it says it runs.
  start_daemon "restart$k" 1G
  g=$(graves)
  [ "$g" -eq 0 ] || fail "restart$k: $g files left in the graveyard"
  kill -TERM $dpid
  wait $dpid || fail "restart$k: daemon exit status $?"
  echo "kill$k: the restarted daemon emptied the graveyard"
done

echo "$0: PASS"
