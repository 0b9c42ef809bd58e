#!/usr/bin/env bash
# Readahead: a sequential reader through a latency-bound upstream gets
# the upstream's bytes, readahead really fetches ahead (prefetch_bytes
# > 0, most of the reader's bytes are hits), every block is read
# upstream exactly once (readahead and demand misses never duplicate a
# fetch), and nothing is read past the export's end (which is not a
# multiple of the block or chunk size).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
requires nbdkit --version
requires python3 -c 'import nbd'

size=$((24 * 1024 * 1024 + 4321))
make_random "$TMP/up.img" $size
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log --filter=delay file "$TMP/up.img" \
  logfile="$TMP/up.log" delay-read=5ms
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache" fscache-validate=size fscache-readahead=4M \
  fscache-stats="$TMP/px.stats"

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
