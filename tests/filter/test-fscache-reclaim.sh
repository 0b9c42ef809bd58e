#!/usr/bin/env bash
# nbd-fscache: the walk that reclaims space no index names runs in the
# background after a crash, beside the requests; kill -9 during it, 10
# rounds.
#
# An object holds the export's first 8 MiB (closed cleanly).  Each
# round writes junk into its data file where no block is cached (4 KiB
# every 64 KiB from 16 MiB on: 768 extents, the space a crash leaves
# when fills were written but not committed), starts the proxy (the
# previous round's kill -9 makes the index unclean, so the walk runs),
# reads the whole export at once with a reader that compares every
# chunk with the upstream image as it goes, and kills the proxy at a
# random moment.  Fills are paused (NBD_FSCACHE_FAULTS=...ENOSPC) so
# that the object keeps exactly its 8 MiB.
#
# Checked: every byte any reader got is the image's (junk is never
# served: the index does not name those blocks); the cached 8 MiB are
# still served from the cache in the end (the log filter sees no
# upstream read of them); and the junk does not stay for good: a last
# proxy frees it in the background (its data file falls back to the
# 8 MiB, waited for while a client holds the object open), and after
# a clean stop the index is clean.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --dump-plugin
requires "$PYTHON" -c 'import nbd'
requires test -r "$FILTER"
requires test -x "$TOOL"

SIZE=$((64 * 1024 * 1024))
CACHED=$((8 * 1024 * 1024))
make_random "$TMP/img" "$SIZE"

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/img" logfile="$TMP/up.log"

proxy ()                # start the proxy on px.sock
{
  NBD_FSCACHE_FAULTS="${NBD_FSCACHE_FAULTS:-}" \
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" --filter="$FILTER" \
    nbd socket="$TMP/up.sock" fscache-dir="$TMP/cache" fscache-key=k \
    fscache-readahead=0 fscache-validate=size 2>>"$TMP/px.err"
}
PAUSE=write:data:1+:ENOSPC
uri="nbd+unix:///?socket=$TMP/px.sock"

# Reads the export in 1 MiB chunks from OFFSET on, comparing each with
# the image; prints the bytes compared.  A dropped connection (the
# kill) ends it quietly; a difference fails it.
cat > "$TMP/reader.py" <<'EOF'
import nbd, sys
uri, img, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(img, 'rb').read()
h = nbd.NBD()
done = 0
try:
    h.connect_uri(uri)
    for off in range(start, len(data), 1 << 20):
        got = h.pread(1 << 20, off)
        if got != data[off:off + (1 << 20)]:
            print("MISMATCH at %d" % off)
            sys.exit(1)
        done += 1 << 20
except nbd.Error:
    pass
print(done)
EOF

data_file () { find "$TMP/cache/objects" -name '*.data' -type f; }
data_du () { echo $(( $(stat -c %b "$(data_file)") * 512 )); }

# The cached 8 MiB, closed cleanly.
proxy
"$PYTHON" - "$uri" "$CACHED" <<'EOF'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for off in range(0, int(sys.argv[2]), 1 << 20):
    h.pread(1 << 20, off)
h.shutdown()
EOF
stop_nbdkit "$TMP/px.pid"
held=$(data_du)
[ "$held" -ge "$CACHED" ] || fail "only $held bytes cached after the fill"

junk () { write_junk "$(data_file)"; }

total=0
interrupted=0
for round in $(seq 1 10); do
  junk
  NBD_FSCACHE_FAULTS=$PAUSE proxy
  "$PYTHON" "$TMP/reader.py" "$uri" "$TMP/img" 0 > "$TMP/read.out" &
  reader=$!
  # A random moment in the first 0.3 s: the walk over 768 extents and
  # the reader run side by side.
  sleep "0.$(printf %02d $((RANDOM % 30)))"
  kill9_nbdkit "$TMP/px.pid"
  wait "$reader" || fail "round $round: $(cat "$TMP/read.out")"
  got=$(cat "$TMP/read.out")
  total=$((total + got))
  left=$(( $(data_du) - held ))
  [ "$left" -gt 65536 ] && interrupted=$((interrupted + 1))
  echo "round $round: reader compared $got bytes; junk left at the kill:" \
       "$left bytes"
done
echo "$total bytes compared in 10 rounds; the kill cut the walk short in" \
     "$interrupted of them"

# The last proxy frees the junk while it serves, then stops cleanly.
# A client holds the object open meanwhile, so that the junk is seen
# going while the object is in use (a close would wait for the walk).
junk
NBD_FSCACHE_FAULTS=$PAUSE proxy
: > "$TMP/up.log"
hold_export "$uri" "$TMP/release"
"$PYTHON" "$TMP/reader.py" "$uri" "$TMP/img" 0 > "$TMP/read.out" ||
  fail "last read: $(cat "$TMP/read.out")"
# (With a few KiB of slack: ext4 counts the blocks of a fragmented
# file's extent tree in st_blocks, and keeps them after the punches.)
below_junk () { [ "$(data_du)" -le $((held + 65536)) ]; }
wait_until below_junk ||
  fail "the junk was not reclaimed: $(data_du) bytes, $held cached"
touch "$TMP/release"
stop_nbdkit "$TMP/px.pid"
up_head=$(log_read_bytes "$TMP/up.log" "$CACHED")
[ "$up_head" -eq 0 ] ||
  fail "$up_head bytes of the cached 8 MiB were read upstream"
tool --dir "$TMP/cache" check > "$TMP/check.out" 2>&1 || true
if grep -q "not closed cleanly" "$TMP/check.out"; then
  cat "$TMP/check.out" >&2
  fail "the index is not clean after a clean stop"
fi
echo "after the last proxy: data file $(data_du) bytes, $held cached"
