#!/usr/bin/env bash
# Concurrent misses of the same blocks cause one upstream read: eight
# connections read the same ranges at the same time through a slow
# upstream; the upstream's log must show each block (or, for the reads
# that cover only part of a block, each 4 KiB piece) read exactly once,
# and every client must get the upstream's bytes.
source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
requires nbdkit --version
requires python3 -c 'import nbd'

size=$((8 * 1024 * 1024))
make_random "$TMP/up.img" $size
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log --filter=delay file "$TMP/up.img" \
  logfile="$TMP/up.log" delay-read=100ms
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache" fscache-validate=size fscache-readahead=0 \
  fscache-stats="$TMP/px.stats"

python3 - "$TMP/px.sock" "$TMP/up.img" <<'PY'
import nbd, sys, threading
sock, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
# Ranges: aligned, unaligned, straddling 64K blocks; each read by all
# eight clients at once.
ranges = [(0, 1 << 20), (3 << 20, 65536), ((5 << 20) + 1000, 200000),
          ((7 << 20) + 65535, 2)]
errors = []
def client(barrier):
    h = nbd.NBD()
    h.connect_unix(sock)
    for off, n in ranges:
        barrier.wait()
        got = h.pread(n, off)
        if got != data[off:off + n]:
            errors.append((off, n))
    h.shutdown()
barrier = threading.Barrier(8)
ts = [threading.Thread(target=client, args=(barrier,)) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    sys.exit("wrong data at %r" % errors)
PY

# What the ranges above need, once: 16 + 1 whole 64K blocks, then the
# 4K pieces of 200000 bytes at 1000 into a block (50 pieces, over four
# blocks) and of 2 bytes across a block boundary (2 pieces).  Random
# reads, far apart: none of them is near the last (fscache.c).
expected=$(( (16 + 1) * 65536 + (50 + 2) * 4096 ))
got=$(log_read_bytes "$TMP/up.log")
echo "upstream bytes read: $got, expected $expected"
test "$got" -eq "$expected"
