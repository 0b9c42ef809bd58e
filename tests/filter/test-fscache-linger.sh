#!/usr/bin/env bash
# nbd-fscache: after a crash, no client waits for the walk that
# reclaims space no index names, not even at its disconnect.
#
# The walk is slowed on purpose (NBD_FSCACHE_TEST_WALK_DELAY_MS=10
# after each of 768 extents of junk: at least 7.7 s).  An object holds
# the export's first 8 MiB; a proxy fills one more block and is killed
# (the index is left unclean), and junk is written into the data file
# where no block is cached.  Then:
#
#  1. a client connects, reads and disconnects: the disconnect does not
#     wait for the walk (the object lingers, unreferenced); the walk
#     goes on without any client, frees the junk, and the object then
#     closes itself: the index says clean while the proxy still runs;
#  2. after another crash, a client that connects while the object
#     lingers is not kept waiting either: it takes the object back as
#     it is (the upstream's sample unchanged), the walk goes on (one
#     unclean open in that process); a clean stop does not wait for it
#     (slowed to 40 ms an extent here, at least 30 s): it leaves the
#     index unclean, and the next proxy walks again, frees the junk
#     and closes the index clean;
#  3. after a third crash, the upstream's image changes while the
#     object lingers: the next client must not get the lingering
#     object's data: the walk stops, the object closes, and the lookup
#     finds the sample changed and starts cold.
#
# Every byte read is compared with the image.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires "$PYTHON" -c 'import nbd'
requires test -r "$FILTER"
requires test -x "$TOOL"

SIZE=$((64 * 1024 * 1024))
CACHED=$((8 * 1024 * 1024))
make_random "$TMP/img" "$SIZE"

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$TMP/img"

# proxy [DELAY]: the walk slowed by DELAY ms per extent (default 10).
proxy ()
{
  rm -f "$TMP/px.stats"
  NBD_FSCACHE_TEST_WALK_DELAY_MS=${1:-10} \
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" --filter="$FILTER" \
    nbd socket="$TMP/up.sock" fscache-dir="$TMP/cache" fscache-key=k \
    fscache-readahead=0 fscache-validate=sample \
    fscache-stats="$TMP/px.stats" 2>>"$TMP/px.err"
}
uri="nbd+unix:///?socket=$TMP/px.sock"

# client START LEN: reads [START, START+LEN) in 1 MiB chunks, compares
# them with the image, disconnects; prints the seconds from its start
# to the end of its first read, and to the end of its disconnect.
cat > "$TMP/client.py" <<'EOF'
import nbd, sys, time
uri, img, start, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = open(img, 'rb').read()
t0 = time.monotonic()
h = nbd.NBD()
h.connect_uri(uri)
first = None
for off in range(start, start + length, 1 << 20):
    n = min(1 << 20, start + length - off)
    if h.pread(n, off) != data[off:off + n]:
        sys.exit("MISMATCH at %d" % off)
    if first is None:
        first = time.monotonic() - t0
h.shutdown()
print("%.2f %.2f" % (first, time.monotonic() - t0))
EOF
client () { "$PYTHON" "$TMP/client.py" "$uri" "$TMP/img" "$@"; }

data_file () { find "$TMP/cache/objects" -name '*.data' -type f; }
data_du () { echo $(( $(stat -c %b "$(data_file)") * 512 )); }
# Closed, and clean (a check of an object in use says nothing of it).
clean ()
{
  ! tool --dir "$TMP/cache" check 2>&1 |
    grep -Eq "not closed cleanly|in use by a running process"
}

# The cached 8 MiB, closed cleanly.
proxy
client 0 "$CACHED" > /dev/null
stop_nbdkit "$TMP/px.pid"
held=$(data_du)

# A proxy that fills one block past them (at OFFSET: a new one each
# time, a hit would change nothing) and is killed (unclean), and 4 KiB
# of junk every 64 KiB from 16 MiB on: 768 extents to walk.
crash ()
{
  proxy
  # The block read twice (the second waits for its fill: the index is
  # marked unclean before its data is written), committed, and the
  # connection kept open while the proxy is killed.
  rm -f "$TMP/filled"
  "$PYTHON" -c 'import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
off = int(sys.argv[3])
h.pread(65536, off); h.pread(65536, off); h.flush()
open(sys.argv[2], "w").close(); time.sleep(60)' "$uri" "$TMP/filled" "$1" &
  local c=$!
  wait_until test -e "$TMP/filled" || fail "the filling client did not fill"
  kill9_nbdkit "$TMP/px.pid"
  kill "$c" 2>/dev/null || true
  wait "$c" 2>/dev/null || true
  write_junk "$(data_file)"
  clean && fail "the index is clean after a crash that filled a block"
  return 0
}
# (The blocks the crashes filled, and a block of slack: ext4 keeps the
# blocks of a fragmented file's extent tree after the punches.)
below_junk () { [ "$(data_du)" -le $((held + 3 * 65536)) ]; }

# ---- 1. the disconnect does not wait; the walk goes on alone --------
crash $((12 * 1024 * 1024))
proxy
read -r first closed < <(client 0 65536)
echo "1: first read after ${first}s, disconnected after ${closed}s"
awk -v c="$closed" 'BEGIN { exit !(c < 3) }' ||
  fail "1: the disconnect took ${closed}s: it waited for the walk"
below_junk && fail "1: the walk was over before the client left"
wait_until below_junk ||
  fail "1: the junk was not reclaimed once the client left: $(data_du)"
# The object closes itself when the walk ends: clean, proxy running.
wait_until clean || fail "1: the index is not clean after the walk"
kill -0 "$(cat "$TMP/px.pid")" || fail "1: the proxy is gone"
client 0 "$CACHED" > /dev/null
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/px.stats" unclean_opens)" -eq 1 ] ||
  fail "1: unclean_opens $(stat_value "$TMP/px.stats" unclean_opens)"
[ "$(stat_value "$TMP/px.stats" reclaimed_bytes)" -gt 0 ] ||
  fail "1: nothing reclaimed"

# ---- 2. a client while the object lingers: not kept waiting ---------
crash $((13 * 1024 * 1024))
proxy 40
read -r first closed < <(client 0 65536)
read -r first2 closed2 < <(client 0 "$CACHED")
echo "2: first client disconnected after ${closed}s; the second's" \
     "first read after ${first2}s, its $CACHED bytes after ${closed2}s"
awk -v c="$closed" -v f="$first2" 'BEGIN { exit !(c < 3 && f < 3) }' ||
  fail "2: a client waited for the walk"
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/px.stats" unclean_opens)" -eq 1 ] ||
  fail "2: unclean_opens $(stat_value "$TMP/px.stats" unclean_opens)," \
       "expected 1 (the lingering object taken back)"
clean && fail "2: the index is clean: the clean stop waited for the walk"
echo "2: after the clean stop: data file $(data_du) bytes, $held cached"
proxy 0
client 0 "$CACHED" > /dev/null
wait_until clean ||
  fail "2: the index is not clean after the next proxy's walk"
below_junk || fail "2: the junk is still there after the walk: $(data_du)"
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/px.stats" unclean_opens)" -eq 1 ] ||
  fail "2: the next proxy's unclean_opens" \
       "$(stat_value "$TMP/px.stats" unclean_opens), expected 1"
[ "$(stat_value "$TMP/px.stats" upstream_read_bytes)" -eq 0 ] ||
  fail "2: $(stat_value "$TMP/px.stats" upstream_read_bytes) bytes" \
       "upstream after the walk: the cached blocks were lost"
clean || fail "2: the index is not clean after the last stop"

# ---- 3. the upstream changes while the object lingers ---------------
crash $((14 * 1024 * 1024))
proxy
read -r first closed < <(client 0 65536)
below_junk && fail "3: the walk was over before the client left"
make_random "$TMP/img.new" "$SIZE"
cp "$TMP/img.new" "$TMP/img"            # the upstream's file, rewritten
read -r first3 closed3 < <(client 0 "$CACHED") ||
  fail "3: the client read the lingering object's old data"
echo "3: after the image changed: first read after ${first3}s," \
     "$CACHED bytes after ${closed3}s, all of them the new image's"
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/px.stats" upstream_read_bytes)" -ge "$CACHED" ] ||
  fail "3: $(stat_value "$TMP/px.stats" upstream_read_bytes) bytes" \
       "upstream: the changed image was not read again"
