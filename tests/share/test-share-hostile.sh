#!/usr/bin/env bash
# nbd-fscache: a hostile client of an object's share socket, and a
# process of another user (issue 26, items 3 and 4).
#
# Process A owns an object (a held connection), in front of an nbdkit
# file upstream.  tests/share-hostile.py speaks the share protocol to
# A's socket; the valid hello it needs is taken from a real joiner J
# (the socket moved aside for a moment, the script listening in its
# place).  Then:
#
#  1. 1,500 connections that never say hello: while they are held,
#     A's descriptors (/proc/PID/fd) stay under 200 and its VmRSS under
#     256 MiB, and A's own client copies the export identical to the
#     image (cmp); A closes every connection it took (no hello in
#     time, or refused at once: the script waits for each to end);
#  2. after a hello, one connection each: hit reports of 64 MiB and of
#     257 blocks, reads at and across the end and overflowing, a read
#     of 128 MiB, a prefetch and a write-begin past the end, a
#     write-end without a begin, a map past the end, an unknown type,
#     a bad magic: A closes each link (a map past the end: an error);
#     an implausible hit report (10^15 requests) is answered and its
#     counts ignored (the object's hit_requests, NAME.stats, at the end);
#  3. a claim never answered: the script reads a block, takes A's FETCH
#     and never answers; A's own client then reads that block and gets
#     the image's bytes (cmp), and A gives up on the script (it closes
#     the link: the script sees it);
#  4. another user (made with useradd, removed at exit), with the path
#     and the socket opened to it (as a careless umask would): A hangs
#     up on its hello without a welcome, and says so in its log
#     ("refused a process of uid N"); share_peers_refused counts it.
#  Throughout A serves its client right: a final copy is identical to
#  the image.
#
# Truth: the image (cmp), /proc/PID/{fd,status}, A's log and stats.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
# Part 4 needs another user: as root, made and removed by the test.
requires test "$(id -u)" = 0
requires useradd --help
requires runuser --help
requires python3 -c 'import nbd'
requires test -r "$FILTER"

SIZE=$((16 * 1024 * 1024))
img="$TMP/up.img"
cache="$TMP/cache"
make_random "$img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$img"
cp "$top_srcdir/tests/share-hostile.py" "$TMP/hostile.py"
hostile () { "$PYTHON" "$TMP/hostile.py" "$@"; }

proxy ()                        # NAME
{
  start_nbdkit -P "$TMP/$1.pid" -U "$TMP/$1.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$cache" fscache-key=shared \
    fscache-stats="$TMP/$1.stats" 2>>"$TMP/$1.err"
}
proxy A
hold_export "nbd+unix:///?socket=$TMP/A.sock" "$TMP/A.stop" "$TMP/A.ready"
apid=$(cat "$TMP/A.pid")
sock=$(find "$cache/objects" -name '*.sock')
[ -S "$sock" ] || fail "A has no share socket"

# A joiner's hello, taken in the socket's place.
mv "$sock" "$sock.real"
hostile capture "$sock" "$TMP/hello" &
cap=$!
wait_until test -S "$sock" || fail "the capturing script did not listen"
proxy J
nbdcopy "nbd+unix:///?socket=$TMP/J.sock" "$TMP/j.img"
wait $cap || fail "no hello captured"
mv "$sock.real" "$sock"
cmp "$img" "$TMP/j.img" || fail "J served wrong data"
stop_nbdkit "$TMP/J.pid"

fds () { ls "/proc/$apid/fd" | wc -l; }
rss_kb () { awk '$1 == "VmRSS:" { print $2 }' "/proc/$apid/status"; }
copy_from_a ()                  # NAME
{
  nbdcopy "nbd+unix:///?socket=$TMP/A.sock" "$TMP/$1.img" ||
    fail "$1: A's client could not copy the export"
  cmp "$img" "$TMP/$1.img" || fail "$1: A's client read wrong data"
  rm -f "$TMP/$1.img"
}
echo "A before: $(fds) fds, $(rss_kb) kB"

# 3. (first: nothing is cached yet) A claim never answered, on block
# 1 MiB.
hostile claim "$sock" "$TMP/hello" 1048576 65536 "$TMP/claimed" \
  > "$TMP/claim.out" 2>&1 &
claim=$!
cleanup_fn "kill $claim 2>/dev/null"
wait_until test -e "$TMP/claimed" || { cat "$TMP/claim.out"; fail "no claim"; }
timeout 60 "$PYTHON" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
open(sys.argv[2], "wb").write(h.pread(65536, 1048576))
h.shutdown()' "nbd+unix:///?socket=$TMP/A.sock" "$TMP/claimed.blk" ||
  fail "A's client did not get the block the script claimed"
dd if="$img" of="$TMP/expect.blk" bs=65536 skip=16 count=1 status=none
cmp "$TMP/expect.blk" "$TMP/claimed.blk" ||
  fail "A's client read wrong bytes of the claimed block"
wait $claim || { cat "$TMP/claim.out"; fail "A never gave up the claim"; }
cat "$TMP/claim.out"

# 1. Idle connections.
hostile idle "$sock" 1500 > "$TMP/idle.out" 2>&1 &
idle=$!
cleanup_fn "kill $idle 2>/dev/null"
wait_until grep -q '^connected' "$TMP/idle.out" ||
  fail "the idle connections were not made"
f=$(fds); r=$(rss_kb)
copy_from_a idle
echo "A holding idle connections: $f fds, $r kB ($(head -1 "$TMP/idle.out"))"
[ "$f" -lt 200 ] || fail "A holds $f descriptors for idle connections"
[ "$r" -lt $((256 * 1024)) ] || fail "A's VmRSS is $r kB"
wait $idle || { cat "$TMP/idle.out"; fail "A kept connections that never said hello"; }
echo "A closed them: $(tail -1 "$TMP/idle.out")"

# 2. Bad messages after a hello.
hostile attack "$sock" "$TMP/hello" $SIZE > "$TMP/attack.out" 2>&1 ||
  { cat "$TMP/attack.out"; fail "A did not close a link on a bad message"; }
cat "$TMP/attack.out"
r=$(rss_kb)
[ "$r" -lt $((256 * 1024)) ] || fail "after the bad messages A's VmRSS is $r kB"
# An implausible hit report: its counts are ignored (checked at the end
# in the object's counters).
hostile report "$sock" "$TMP/hello" || fail "the hit report was not answered"

# 4. Another user.
{
  user="fscsh$$"
  useradd -M -r -s /usr/sbin/nologin "$user" ||
    fail "useradd $user failed"
  cleanup_fn "userdel $user 2>/dev/null"
  uid=$(id -u "$user")
  # The way open to it: the directories searchable, the socket and the
  # script readable (what a careless umask could leave).
  d="$sock"
  while d=$(dirname "$d"); [ "$d" != / ]; do chmod o+x "$d"; done
  chmod o+rw "$sock"
  chmod o+r "$TMP/hostile.py" "$TMP/hello"
  runuser -u "$user" -- "$PYTHON" "$TMP/hostile.py" join "$sock" \
    "$TMP/hello" > "$TMP/join.out" 2>&1 ||
    { cat "$TMP/join.out"; fail "A welcomed a process of uid $uid"; }
  cat "$TMP/join.out"
  copy_from_a after-user        # a request: A logs its notices
  grep -q "refused a process of uid $uid on the object's share socket" \
    "$TMP/A.err" || fail "A did not log the refusal of uid $uid"
  grep "refused a process of uid" "$TMP/A.err" | head -1
}

copy_from_a final
echo "A after: $(fds) fds, $(rss_kb) kB"
touch "$TMP/A.stop"
stop_nbdkit "$TMP/A.pid"
echo "A: share_peers_refused $(stat_value "$TMP/A.stats" share_peers_refused)," \
     "share_timeouts $(stat_value "$TMP/A.stats" share_timeouts)"
[ "$(stat_value "$TMP/A.stats" share_peers_refused)" -ge 1 ] ||
  fail "share_peers_refused counted nothing"
ostats=$(find "$cache/objects" -name '*.stats')
hits=$(stat_value "$ostats" hit_requests)
echo "the object's hit_requests: $hits"
[ "$hits" -lt 1000000 ] || fail "the object counts $hits hits: a joiner's" \
                                "implausible report was taken"
echo "$0: PASS"
