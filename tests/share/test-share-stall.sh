#!/usr/bin/env bash
# nbd-fscache: a joiner stopped mid-fetch blocks nobody, and the owner
# still stops (issue 26, item 2).
#
# The owner A reads a fast upstream; the joiner J reads the same image
# through its own upstream, behind nbdkit's rate and log filters.  J's
# client reads block X: A claims it and asks J to fetch it; once J's
# upstream read is in flight (the log filter: issued, not answered;
# the rate made 1 kbit/s first), J is stopped with SIGSTOP.  Then:
#
#   - A's client reads block X: it must get the image's bytes (compared
#     with the image), because A gives J's claim back after the fetch
#     deadline (a floor of 2 s at these latencies: share_timeouts in A's
#     stats says it did) and the client fetches the block itself.
#     (timeout 60 is a guard against a hang only; without the deadline
#     the read waits for J for ever);
#   - A stops on SIGTERM while J is still stopped (stop_nbdkit waits
#     up to 30 s for it to exit; a guard, not a timed assertion).
#
# Truth: the image (cmp of the bytes read), the log filter, A's stats.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires cmp --version
requires timeout --version
requires nbdkit --filter=log --filter=rate null --dump-plugin
requires python3 -c 'import nbd'
requires test -r "$FILTER"

SIZE=$((16 * 1024 * 1024))
X=$((8 * 1024 * 1024))
N=65536
img="$TMP/up.img"
log="$TMP/j-up.log"
make_random "$img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" -r file "$img"
echo 1000M > "$TMP/rate"
start_nbdkit -P "$TMP/jup.pid" -U "$TMP/jup.sock" -r \
  --filter=log --filter=rate file "$img" \
  logfile="$log" rate=1000M rate-file="$TMP/rate"

proxy ()                        # NAME UPSTREAM-SOCKET
{
  start_nbdkit -P "$TMP/$1.pid" -U "$TMP/$1.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$2" \
    fscache-dir="$TMP/cache" fscache-key=shared \
    fscache-stats="$TMP/$1.stats" 2>>"$TMP/$1.err"
}
proxy A "$TMP/up.sock"
proxy J "$TMP/jup.sock"
# A's client first (connected until the end): A owns the object.
hold_export "nbd+unix:///?socket=$TMP/A.sock" "$TMP/A.stop" "$TMP/A.ready"

# read.py URI OFFSET LENGTH OUT [READY GO]: one connection; with READY
# and GO, it first reads 4 KiB at 0, creates READY and waits for GO.
cat > "$TMP/read.py" <<'PY'
import nbd, os, sys, time
uri, off, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
h = nbd.NBD()
h.connect_uri(uri)
if len(sys.argv) > 6:
    h.pread(4096, 0)
    open(sys.argv[5], "w").close()
    while not os.path.exists(sys.argv[6]):
        time.sleep(0.05)
b = h.pread(n, off)
open(out, "wb").write(b)
h.shutdown()
PY
dd if="$img" of="$TMP/expect" bs=$N skip=$((X / N)) count=1 status=none

# J's client joins (its opening reads at full speed), then the link is
# slowed and the client reads block X.
python3 "$TMP/read.py" "nbd+unix:///?socket=$TMP/J.sock" $X $N "$TMP/jx" \
  "$TMP/j.ready" "$TMP/j.go" 2>"$TMP/jx.err" &
jc=$!
cleanup_fn "kill $jc 2>/dev/null"
wait_until test -e "$TMP/j.ready" || fail "J's client did not connect"
grep -q 'joined the copy of process' "$TMP/J.err" || fail "J did not join A"
echo 1k > "$TMP/rate.tmp" && mv "$TMP/rate.tmp" "$TMP/rate"
touch "$TMP/j.go"
# J's upstream read of block X: issued, not answered.
xhex=$(printf '0x%x' $X)
inflight ()
{
  local id
  id=$(sed -n "s/.* Read id=\([0-9]*\) offset=$xhex .*/\1/p" "$log" | head -1)
  [ -n "$id" ] && ! grep -q "\.\.\.Read id=$id " "$log"
}
wait_until inflight || fail "J's upstream read of block X never started"
jpid=$(cat "$TMP/J.pid")
kill -STOP "$jpid"
cleanup_fn "kill -CONT $jpid 2>/dev/null"
echo "J stopped with its fetch of block X in flight"

# A's client reads block X: the right bytes, J still stopped.
timeout 60 "$PYTHON" "$TMP/read.py" "nbd+unix:///?socket=$TMP/A.sock" $X $N \
  "$TMP/ax" || fail "A's client did not get block X (J holds its claim)"
cmp "$TMP/expect" "$TMP/ax" || fail "A's client read wrong bytes of block X"
[ "$(awk '{print $3}' /proc/$jpid/stat)" = T ] ||
  fail "J was not stopped all along"
echo "A's client read block X right while J was stopped"

# A stops on SIGTERM, J still stopped.
touch "$TMP/A.stop"
stop_nbdkit "$TMP/A.pid" || fail "A did not stop on SIGTERM while J was stopped"
[ "$(stat_value "$TMP/A.stats" share_timeouts)" -ge 1 ] ||
  fail "A's stats count no joiner's fetch given up (share_timeouts)"
echo "A stopped; share_timeouts $(stat_value "$TMP/A.stats" share_timeouts)"

# (J's fetch at 1 kbit/s would take minutes: it is killed at cleanup.)
echo "$0: PASS"
