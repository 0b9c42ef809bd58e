#!/usr/bin/env bash
# nbd-fscache: a prefetch never fetches a piece the cache holds.  A
# random read fetches only the pieces it covers (docs/format.md,
# "Pieces"), mid-block; NBD_CMD_CACHE and readahead later complete such
# blocks, and must fetch the gaps around those pieces, not the pieces
# again.  Fetched through, they were read upstream twice: 64 KiB more
# than the image in test-fscache-parallel.sh's readahead part (CI, stop
# 57).
#
# Truth: the upstream's own request log (nbdkit --filter=log): no byte
# is read upstream twice, and every byte of the image is read once; the
# data read back through the proxy equals the image (Python compares).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires "$PYTHON" -c 'import nbd'

MiB=$((1024 * 1024))
size=$((16 * MiB + 12345))
make_random "$TMP/upstream.img" "$size"

# The upstream's reads, from its log: fails if two overlap, else
# prints their bytes in all.
cat > "$TMP/once.py" <<'PYEOF'
import re, sys
spans = []
for line in open(sys.argv[1]):
    m = re.search(r' Read id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)',
                  line)
    if m:
        lo = int(m.group(1), 16)
        spans.append((lo, lo + int(m.group(2), 16)))
spans.sort()
for (a, b), (c, d) in zip(spans, spans[1:]):
    if c < b:
        sys.exit("bytes read upstream twice: [%#x, %#x) and [%#x, %#x)"
                 % (a, b, c, d))
print(sum(b - a for a, b in spans))
PYEOF

# The client's reads.  PART "cache": random 64 KiB reads mid-block,
# then NBD_CMD_CACHE over every block (one request per 3 MiB, so that
# runs span blocks held in pieces); then all of it read back.  PART
# "stream": the same random reads, then a sequential stream of 64 KiB
# reads (readahead completes the blocks ahead of it).
cat > "$TMP/reads.py" <<'PYEOF'
import sys
import nbd
sock, img, part = sys.argv[1], sys.argv[2], sys.argv[3]
data = open(img, "rb").read()
size = len(data)
MiB = 1 << 20
h = nbd.NBD()
h.connect_unix(sock)
# Pieces held mid-block (1 MiB blocks: 64 KiB pieces): one, two apart,
# two together, one at a block's end, one in the export's last block.
for off in (0x40000, 0x180000, 0x1c0000, 0x290000, 0x2a0000,
            0x3f0000, 0x540000, 0x7f0000, 16 * MiB + 0x0):
    n = min(0x10000, size - off)
    assert h.pread(n, off) == data[off:off + n], off
if part == "cache":
    for off in range(0, size, 3 * MiB):
        h.cache(min(3 * MiB, size - off), off)
    got = h.pread(8 * MiB, 0) + h.pread(size - 8 * MiB, 8 * MiB)
else:
    got = b"".join(h.pread(min(0x10000, size - off), off)
                   for off in range(0, size, 0x10000))
if got != data:
    i = next(i for i in range(size) if got[i] != data[i])
    sys.exit("%s: differs from the image at byte %d" % (part, i))
h.shutdown()
PYEOF

for part in cache stream; do
  rm -f "$TMP/up.log"
  rm -rf "$TMP/cache"
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log file "$TMP/upstream.img" logfile="$TMP/up.log"
  ra=0
  [ "$part" = stream ] && ra=4M
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-validate=size \
    fscache-block-size=1M fscache-readahead=$ra \
    fscache-stats="$TMP/st"
  "$PYTHON" "$TMP/reads.py" "$TMP/px.sock" "$TMP/upstream.img" "$part" ||
    fail "$part: the data read back"
  stop_nbdkit "$TMP/px.pid"
  stop_nbdkit "$TMP/up.pid"
  got=$("$PYTHON" "$TMP/once.py" "$TMP/up.log") ||
    fail "$part: the upstream's log (above)"
  echo "$part: $got bytes read upstream, each once (image $size)," \
       "piece_fills=$(stat_value "$TMP/st" piece_fills)"
  [ "$got" -eq "$size" ] ||
    fail "$part: $got bytes read upstream, expected the image's $size"
done
echo "$0: OK"
