#!/usr/bin/env bash
# nbd-fscache: a process never joins an owner of another user (issue
# 26, item 4: a socket planted in the owner's place).
#
# Process A (root) holds the object; its share socket is moved aside,
# and tests/share-hostile.py, run as another user (made with useradd,
# removed at exit; setpriv), listens in its place as a fake owner that
# welcomes joiners (each hello it gets is recorded).  Process J (root)
# opens the object: it must not say hello to it (SO_PEERCRED: neither
# our uid nor root), it serves its client right anyway (uncached: cmp
# against the image), and counts the refusal (share_peers_refused).
#
# Truth: the image (cmp), the fake owner's record, J's stats.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires cmp --version
requires python3 -c 'import nbd'
requires test -r "$FILTER"
requires test "$(id -u)" = 0
requires useradd --help
requires setpriv --version

SIZE=$((16 * 1024 * 1024))
img="$TMP/up.img"
cache="$TMP/cache"
make_random "$img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$img"

proxy ()                        # NAME
{
  start_nbdkit -P "$TMP/$1.pid" -U "$TMP/$1.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$cache" fscache-key=shared \
    fscache-stats="$TMP/$1.stats" 2>>"$TMP/$1.err"
}
proxy A
hold_export "nbd+unix:///?socket=$TMP/A.sock" "$TMP/A.stop" "$TMP/A.ready"
sock=$(find "$cache/objects" -name '*.sock')
[ -S "$sock" ] || fail "A has no share socket"

user="fscfo$$"
useradd -M -r -s /usr/sbin/nologin "$user" || fail "useradd $user failed"
cleanup_fn "userdel $user 2>/dev/null"
uid=$(id -u "$user"); gid=$(id -g "$user")
# Its socket, in A's place: bound by root in root's own 0700 fan-out
# directory (safeopen.c's rule 1 refuses a directory another user may
# write, so a planted socket can only come this way), listening as the
# other user: the peer's credentials (SO_PEERCRED) are its.  The event
# record is written by the other user.
mkdir -m 0777 "$TMP/ev"
mv "$sock" "$sock.real"
FSC_FAKE_OWNER_UID="$uid:$gid" \
  "$PYTHON" "$top_srcdir/tests/share-hostile.py" fake-owner "$sock" $SIZE \
  "$TMP/ev/events" 2>"$TMP/ev/fake.err" &
fake=$!
cleanup_fn "kill $fake 2>/dev/null"
wait_until test -S "$sock" || fail "the fake owner did not listen"
"$PYTHON" - "$sock" "$uid" <<'PY' || fail "the fake owner's credentials are not $user's"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
pid, uid, gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET,
                                                 socket.SO_PEERCRED, 12))
s.close()
sys.exit(0 if uid == int(sys.argv[2]) else 1)
PY

proxy J
"$PYTHON" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
open(sys.argv[2], "wb").write(h.pread(65536, 1048576))
h.shutdown()' "nbd+unix:///?socket=$TMP/J.sock" "$TMP/got" ||
  fail "J's client could not read"
dd if="$img" of="$TMP/expect" bs=65536 skip=16 count=1 status=none
cmp "$TMP/expect" "$TMP/got" || fail "J's client read wrong bytes"
if grep -q hello "$TMP/ev/events" 2>/dev/null; then
  fail "J said hello to an owner of uid $uid"
fi
stop_nbdkit "$TMP/J.pid"
[ "$(stat_value "$TMP/J.stats" share_joins)" = 0 ] || fail "J joined"
n=$(stat_value "$TMP/J.stats" share_peers_refused)
echo "J refused the owner of uid $uid ($n times) and served its client right"
[ "$n" -ge 1 ] || fail "J's share_peers_refused counted nothing"
kill $fake
mv "$sock.real" "$sock"
touch "$TMP/A.stop"
stop_nbdkit "$TMP/A.pid"
echo "$0: PASS"
