#!/usr/bin/env bash
# nbd-fscache: a joiner refuses a FETCH outside the export from its
# owner (issue 26, item 5: nbdkit aborted on backend_valid_range).
#
# Process A holds the object; its share socket is moved aside and
# tests/share-hostile.py listens in its place as a fake owner that
# welcomes joiners and answers every READ with a FETCH at the export's
# size.  Process J joins it, and J's client reads 64 KiB: J must close
# that link (the fake owner sees it: EVENTS), stay up, and serve the
# read right (from its upstream, uncached: cmp against the image).
#
# Truth: the image (cmp), the fake owner's record, J's process.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires cmp --version
requires python3 -c 'import nbd'
requires test -r "$FILTER"

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
mv "$sock" "$sock.real"
"$PYTHON" "$top_srcdir/tests/share-hostile.py" fake-owner "$sock" $SIZE \
  "$TMP/events" 2>"$TMP/fake.err" &
fake=$!
cleanup_fn "kill $fake 2>/dev/null"
wait_until test -S "$sock" || fail "the fake owner did not listen"

proxy J
jpid=$(cat "$TMP/J.pid")
"$PYTHON" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
open(sys.argv[2], "wb").write(h.pread(65536, 1048576))
h.shutdown()' "nbd+unix:///?socket=$TMP/J.sock" "$TMP/got" ||
  fail "J's client could not read (J: $(tail -3 "$TMP/J.err" | tr '\n' ' '))"
dd if="$img" of="$TMP/expect" bs=65536 skip=16 count=1 status=none
cmp "$TMP/expect" "$TMP/got" || fail "J's client read wrong bytes"
grep -q "joined the copy of process $fake" "$TMP/J.err" ||
  fail "J did not join the fake owner"
kill -0 "$jpid" || fail "J died"
grep -q "closed the link" "$TMP/events" ||
  fail "J did not close the link on the bad fetch"
cat "$TMP/events"
stop_nbdkit "$TMP/J.pid"
kill $fake
mv "$sock.real" "$sock"
touch "$TMP/A.stop"
stop_nbdkit "$TMP/A.pid"
echo "$0: PASS"
