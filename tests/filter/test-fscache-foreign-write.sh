#!/usr/bin/env bash
# A second process writes upstream through an object the first process
# holds, without joining it: the first must stop serving its now stale
# copy (it sees the mark the writer leaves within a commit interval),
# and nothing stale survives a restart.
#
# Processes with the same settings share an object (the second joins
# the first, and its writes drop the blocks in the holder before they
# go upstream: tests/share/test-share-writes.sh).  One that finds the object
# held for another upstream cannot join it and serves it uncached: here
# the second process has another fscache-generation (a configuration
# updated while the old proxy still runs).  Its writes are what the
# stale mark is for.
source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
requires nbdkit --version
requires nbdcopy --version
requires python3 -c 'import nbd'

M=$((1024 * 1024))
SIZE=$((8 * M))
make_random "$TMP/up.img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$TMP/up.img"
proxy ()                        # NAME [fscache-PARAM=VALUE...]
{
  start_nbdkit -P "$TMP/$1.pid" -U "$TMP/$1.sock" --filter="$FILTER" \
    nbd socket="$TMP/up.sock" fscache-dir="$TMP/cache" fscache-key=k \
    fscache-validate=size fscache-readahead=0 fscache-stats="$TMP/$1.stats" \
    "${@:2}" -v --log=stderr 2>"$TMP/$1.err"
}

# P1 caches everything and keeps the object open (a held connection).
proxy p1
cat > "$TMP/hold.py" <<'PY'
import nbd, os, sys
h = nbd.NBD()
h.connect_unix(sys.argv[1])
h.pread(1 << 20, 0)
open(sys.argv[2], "w").close()          # connected: object held
while not os.path.exists(sys.argv[3]):
    h.pread(512, 0)                     # keep the connection busy-waiting
    os.sched_yield()
h.shutdown()
PY
nbdcopy "nbd+unix:///?socket=$TMP/p1.sock" "$TMP/cold.img"
cmp "$TMP/up.img" "$TMP/cold.img"
python3 "$TMP/hold.py" "$TMP/p1.sock" "$TMP/held" "$TMP/release" &
holder=$!
cleanup_fn "touch '$TMP/release'; kill $holder 2>/dev/null"
wait_until test -f "$TMP/held" || fail "holder did not connect"

# P2, for another generation, finds the object held for another
# upstream: uncached, and its write marks P1 stale.
proxy p2 fscache-generation=2
python3 - "$TMP/p2.sock" <<'PY'
import nbd, sys
h = nbd.NBD()
h.connect_unix(sys.argv[1])
h.pwrite(b"\xee" * 65536, 5 * 65536)
h.flush()
h.shutdown()
PY
grep -q "another process" "$TMP/p2.err" || fail "p2 did not say it was uncached"
python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); sys.exit(0 if d[5*65536:6*65536] == b"\xee" * 65536 else 1)' "$TMP/up.img" ||
  fail "the write did not reach upstream"

# P1 must serve the new bytes once it has seen the mark (its committer
# looks every 2 s): poll, bounded.
p1_fresh ()
{
  python3 - "$TMP/p1.sock" <<'PY'
import nbd, sys
h = nbd.NBD()
h.connect_unix(sys.argv[1])
ok = h.pread(65536, 5 * 65536) == b"\xee" * 65536
h.shutdown()
sys.exit(0 if ok else 1)
PY
}
wait_until p1_fresh || fail "p1 kept serving its stale copy"
touch "$TMP/release"
wait "$holder"
stop_nbdkit "$TMP/p2.pid"
stop_nbdkit "$TMP/p1.pid"
test "$(stat_value "$TMP/p1.stats" withdrawals)" -ge 1 || fail "p1 did not withdraw"
test ! -e "$(find "$TMP/cache" -name '*.stale' | head -1)" ||
  fail "the stale mark was left behind"

# After a restart: identical to upstream.
proxy p3
nbdcopy "nbd+unix:///?socket=$TMP/p3.sock" "$TMP/after.img"
cmp "$TMP/up.img" "$TMP/after.img"
echo "$0: PASS"
