#!/usr/bin/env bash
# nbd-fscache: the open race between a writeback proxy and one in
# another mode, on the same cache directory and key (plugin/fscache.c,
# the open path).
#
# A writeback process opens the write log (its flock), then the object
# to itself.  A process in another mode must never serve the object
# while a writeback process holds dirty data for it: its writes would
# go around the log.  Two upstream servers on one image: the writeback
# proxy's fails every write (nbdkit's error filter), so its data stays
# dirty; the writethrough proxy's does not.
#
#  1. A writethrough proxy, with NBD_FSCACHE_TEST_OPEN_GATE (a test
#     knob: the open stops between its two steps, the object and the
#     log, until the test lets it go), gets a client (A); the test waits
#     until A's open has stopped there.
#  2. A writeback proxy gets a client (B) that writes 4 KiB and flushes.
#  3. A's open goes on; A writes other bytes at the same place.
#  Only one of A and B may have been served.  Checking the log before
#  opening the object (as the open did) let B's proxy take both in the
#  gap, and A's proxy then served the object uncached: A's write went
#  to the upstream around B's dirty data.  Now the first proxy holds
#  the object when it checks the log: B's proxy finds the object held
#  and refuses.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=error null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'
requires timeout --version

size=$((4 * 1024 * 1024))
make_random "$TMP/up.img" $size
touch "$TMP/blocked"
start_nbdkit -P "$TMP/upwb.pid" -U "$TMP/upwb.sock" --filter=error \
  file "$TMP/up.img" error-pwrite=EIO error-pwrite-rate=100% \
  error-pwrite-file="$TMP/blocked"
start_nbdkit -P "$TMP/upwt.pid" -U "$TMP/upwt.sock" file "$TMP/up.img"
common=(fscache-dir="$TMP/cache" fscache-key=race fscache-validate=size)

mkdir "$TMP/gate"
NBD_FSCACHE_TEST_OPEN_GATE="$TMP/gate" \
  start_nbdkit -P "$TMP/wt.pid" -U "$TMP/wt.sock" \
  --filter="$FILTER" nbd socket="$TMP/upwt.sock" "${common[@]}"
start_nbdkit -P "$TMP/wb.pid" -U "$TMP/wb.sock" \
  --filter="$FILTER" nbd socket="$TMP/upwb.sock" "${common[@]}" \
  fscache-mode=writeback fscache-writeback-drain=0

# client SOCK BYTE OUT: connect, write 4 KiB of BYTE at 0, flush; OUT
# says "served" or "refused: why".
client ()
{
  $PYTHON - "nbd+unix:///?socket=$1" "$2" "$3" <<'PY'
import nbd, sys
try:
    h = nbd.NBD(); h.connect_uri(sys.argv[1])
except nbd.Error as e:
    open(sys.argv[3], "w").write("refused: %s\n" % e)
    sys.exit(0)
h.pwrite(bytes([int(sys.argv[2])]) * 4096, 0)
h.flush()
h.shutdown()
open(sys.argv[3], "w").write("served\n")
PY
}

# 1. A stops in its open.
client "$TMP/wt.sock" 65 "$TMP/a.out" &
a=$!
cleanup_fn "touch '$TMP/gate/go'; kill $a 2>/dev/null"
wait_until test -e "$TMP/gate/reached" || fail "A's open never reached the gate"

# 2. B, in the gap.
timeout 60 bash -c "$(declare -f client); PYTHON=$PYTHON; client '$TMP/wb.sock' 66 '$TMP/b.out'" ||
  fail "B's client failed"

# 3. A goes on.
touch "$TMP/gate/go"
wait $a || fail "A's client failed"
echo "A: $(cat "$TMP/a.out")"
echo "B: $(cat "$TMP/b.out")"
if grep -q served "$TMP/a.out" && grep -q served "$TMP/b.out"; then
  fail "both served: A's write went around B's dirty log"
fi
grep -q served "$TMP/a.out" || grep -q served "$TMP/b.out" ||
  fail "neither served"
echo "$0: PASS"
