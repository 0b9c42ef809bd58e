#!/usr/bin/env bash
# Readahead: a sequential reader through a latency-bound upstream gets
# the upstream's bytes, readahead really fetches ahead (prefetch_bytes
# > 0, most of the reader's bytes are hits), every block is read
# upstream exactly once (readahead and demand misses never duplicate a
# fetch), and nothing is read past the export's end (which is not a
# multiple of the block or chunk size).
source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
requires nbdkit --version
requires python3 -c 'import nbd'

size=$((24 * 1024 * 1024 + 4321))
make_random "$TMP/up.img" $size
# servers WINDOW: the upstream (logged, 5 ms a read) and the filter in
# front of it with fscache-readahead=WINDOW, on a fresh cache.
servers ()
{
  rm -rf "$TMP/cache" "$TMP/up.log" "$TMP/px.stats"
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log --filter=delay file "$TMP/up.img" \
    logfile="$TMP/up.log" delay-read=5ms
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-validate=size \
    fscache-readahead="$1" fscache-stats="$TMP/px.stats"
}
servers 4M

python3 - "$TMP/px.sock" "$TMP/up.img" <<'PY'
import nbd, sys
sock, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_unix(sock)
off, n = 0, 65536
while off < len(data):
    m = min(n, len(data) - off)
    if h.pread(m, off) != data[off:off + m]:
        sys.exit("wrong data at %d" % off)
    off += m
h.shutdown()
PY
stop_nbdkit "$TMP/px.pid"

got=$(log_read_bytes "$TMP/up.log")
echo "upstream bytes read: $got (export $size)"
test "$got" -eq "$size"
# No upstream request failed (one past the end would).
! grep -q 'return=-1' "$TMP/up.log"
prefetch=$(stat_value "$TMP/px.stats" prefetch_bytes)
hits=$(stat_value "$TMP/px.stats" hit_bytes)
echo "prefetch_bytes $prefetch hit_bytes $hits"
test "$prefetch" -gt $((size / 2))
test "$hits" -gt $((size / 2))

# Part 2: a queued client.  One connection keeps 8 reads of 256 KiB
# in flight, in order, as fio, qemu and the kernel do; the filter's
# threads take them in whatever order they win the race.  Readahead
# must still run ahead of the client's queue: its fetches are whole
# 1 MiB chunks (readahead.h, FSC_RA_CHUNK), the client's own misses
# are its 256 KiB reads, so the upstream's log says who fetched what.
# (Counted from the read last served and taking a read that overtook
# another for a jump, readahead restarted every few requests: the
# upstream saw about no 1 MiB reads.)
stop_nbdkit "$TMP/up.pid"
servers 2M

python3 - "$TMP/px.sock" "$TMP/up.img" <<'PY'
import nbd, sys
sock, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_unix(sock)
n, depth = 256 * 1024, 8
inflight = []               # (offset, buffer, cookie), oldest first
off = 0
while off < len(data) or inflight:
    while off < len(data) and len(inflight) < depth:
        m = min(n, len(data) - off)
        b = nbd.Buffer(m)
        inflight.append((off, b, h.aio_pread(b, off)))
        off += m
    o, b, c = inflight[0]
    while not h.aio_command_completed(c):
        h.poll(-1)
    inflight.pop(0)
    if b.to_bytearray() != data[o:o + len(b.to_bytearray())]:
        sys.exit("wrong data at %d" % o)
h.shutdown()
PY
stop_nbdkit "$TMP/px.pid"

got=$(log_read_bytes "$TMP/up.log")
# Bytes the upstream sent in reads of a whole readahead chunk.
chunked=$(awk '/ Read .*count=0x100000 / { n += 1048576 } END { print n + 0 }' \
            "$TMP/up.log")
echo "queued client: upstream bytes $got (export $size), in 1 MiB chunks $chunked"
test "$got" -eq "$size" || fail "queued client: blocks fetched twice or not at all"
! grep -q 'return=-1' "$TMP/up.log"
test "$chunked" -gt $((size / 2)) ||
  fail "queued client: readahead did not run ahead of the client's queue"
