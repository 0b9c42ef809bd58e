#!/usr/bin/env bash
# TRIM, WRITE_ZEROES and NBD_CMD_CACHE through the fscache filter.
#
# Upstream: nbdkit --filter=log file up.img (random, 16 MiB + 1000), which
# supports trim (punches holes) and zero.  Proxy: fscache in front, with
# fscache-readahead=0 so that the upstream reads counted below are only
# the ones the requests themselves cause.  python libnbd, one connection.
#
# trim/zero, both modes: after the whole export was read (cached), a mix
# of zero (with and without NO_HOLE) and trim requests, aligned and
# unaligned, inside one block, over many, at the short end of the
# export, interleaved with writes and re-reads.  After each request the
# affected range and its neighbours read through the proxy equal up.img
# (read directly); at the end the whole view does (read with pread, not
# nbdcopy, which would skip holes using extents), and again after a
# restart.
#
# cache: h.cache(len, off) on uncached ranges (unaligned, several
# blocks; a range half cached already; the short end of the export):
#   - the cache request read each 4 KiB piece of the range upstream
#     exactly once (upstream reads during it: no overlap, union == the
#     range rounded out to 4 KiB, minus what was cached before);
#   - a later read of the range fetches nothing upstream (log_read_bytes
#     before/after == 0 new bytes) and returns up.img's bytes;
#   - a second cache request of the same range reads nothing upstream.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
PY=python3                    # functions.sh: the one with libnbd
requires "$PY" -c 'import nbd'
requires test -f "$FILTER"

SIZE=$(( 16*1024*1024 + 1000 ))

cat > "$TMP/common.py" <<'EOF'
import nbd, re
BS = 65536
READ = re.compile(r" Read id=\d+ offset=0x([0-9a-f]+) count=0x([0-9a-f]+)")

def upstream_reads(logf, mark):
    """(offset, count) of the upstream reads logged after line MARK."""
    out = []
    with open(logf) as f:
        for i, line in enumerate(f):
            if i >= mark:
                m = READ.search(line)
                if m and "...Read" not in line:
                    out.append((int(m.group(1), 16), int(m.group(2), 16)))
    return out

def nlines(logf):
    with open(logf) as f:
        return sum(1 for _ in f)

def file_bytes(img, off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)

def read_all(h):
    size = h.get_size()
    out = bytearray()
    for off in range(0, size, 1 << 20):
        out += h.pread(min(1 << 20, size - off), off)
    return bytes(out)
EOF

cat > "$TMP/trimzero.py" <<'EOF'
import sys
sys.path.insert(0, sys.argv[4])
from common import *
sock, img, mode = sys.argv[1:4]
h = nbd.NBD(); h.connect_unix(sock)
size = h.get_size()
assert h.can_trim() and h.can_zero(), "upstream must support trim and zero"
read_all(h)                                       # everything cached
M = 1 << 20
E = size
ops = [
    ("zero", 1000, 3000, 0),                      # inside block 0
    ("zero", 1 * BS, BS, 0),                      # one whole block
    ("trim", 2 * BS, 2 * BS, 0),                  # two whole blocks
    ("trim", 5 * BS - 100, 300, 0),               # straddling, tiny
    ("zero", 7 * BS + 5, 3 * BS, nbd.CMD_FLAG_NO_HOLE),
    ("trim", 1 * M + 12345, M, 0),                # unaligned, many blocks
    ("write", 1 * M, 2 * M, 0),                   # then write over them
    ("zero", 1 * M + 4096, 4 * BS, 0),
    ("trim", 3 * M, 3 * M, 0),                    # big, aligned
    ("zero", 6 * M - 777, 2 * M + 1554, nbd.CMD_FLAG_NO_HOLE),
    ("zero", E - 700, 700, 0),                    # the short end
    ("trim", E - 1000 - BS - 3, BS + 600, 0),     # near the end
    ("trim", E - 1000, 1000, 0),                  # the whole short block
    ("write", E - 1500, 1500, 0),
    ("zero", 10 * M, 64, 0),
]
bad = 0
for i, (op, off, n, fl) in enumerate(ops):
    # Re-read (re-cache) the area before each request.
    lo, hi = max(0, off - BS), min(size, off + n + BS)
    h.pread(hi - lo, lo)
    if op == "zero":
        h.zero(n, off, fl)
    elif op == "trim":
        h.trim(n, off, fl)
    else:
        h.pwrite(bytes([0x40 + i]) * n, off)
    for _ in range(2):                            # miss, then hit
        got = h.pread(hi - lo, lo)
        if got != file_bytes(img, lo, hi - lo):
            bad += 1
            print("%s: %s %d@%d: proxy != upstream around it" % (mode, op, n, off))
            break
h.flush()
if read_all(h) != file_bytes(img, 0, size):
    bad += 1
    print("%s: whole view != upstream after trim/zero" % mode)
h.shutdown()
print("%s: %d trim/zero/write requests checked, %d bad" % (mode, len(ops), bad))
sys.exit(1 if bad else 0)
EOF

cat > "$TMP/cache.py" <<'EOF'
import sys
sys.path.insert(0, sys.argv[3])
from common import *
sock, img, _, logf = sys.argv[1:5]
h = nbd.NBD(); h.connect_unix(sock)
size = h.get_size()
assert h.can_cache(), "the proxy must advertise NBD_CMD_CACHE"
bad = 0
def fail(msg):
    global bad
    bad += 1
    print("FAIL: " + msg)

M = 1 << 20
h.pread(2 * BS, 4 * M + 2 * BS)                   # two blocks cached already
cases = [
    ("unaligned, 3 MiB", 8 * M + 1000, 3 * M),
    ("half cached", 4 * M, 6 * BS),
    ("short end", size - 1000 - BS - 10, BS + 1010),
    ("one byte", 13 * M + 7, 1),
]
# NBD_CMD_CACHE fetches exactly the 4 KiB pieces its range covers
# (whole blocks inside it): accounted in pieces.
PS = 4096
cached = set(range((4 * M + 2 * BS) // PS, (4 * M + 4 * BS) // PS))
for name, off, n in cases:
    first, last = off // PS, (off + n - 1) // PS
    want = set(range(first, last + 1)) - cached
    mark = nlines(logf)
    h.cache(n, off)
    reads = upstream_reads(logf, mark)
    seen = {}
    for o, c in reads:
        for b in range(o // PS, (o + c - 1) // PS + 1):
            seen[b] = seen.get(b, 0) + 1
        if o % PS or (c % PS and o + c != size):
            fail("%s: upstream read %d@%d not in whole pieces" % (name, c, o))
    twice = sorted(b for b, k in seen.items() if k > 1)
    if twice:
        fail("%s: pieces read upstream more than once: %s" % (name, twice[:5]))
    if set(seen) != want:
        fail("%s: cache read pieces %s upstream, expected %s"
             % (name, sorted(seen)[:8], sorted(want)[:8]))
    cached |= want
    # A later read of the range: nothing upstream, right data.
    mark = nlines(logf)
    got = h.pread(n, off)
    later = upstream_reads(logf, mark)
    if later:
        fail("%s: read after cache went upstream: %s" % (name, later[:4]))
    if got != file_bytes(img, off, n):
        fail("%s: read after cache returned wrong data" % name)
    # Caching it again reads nothing.
    mark = nlines(logf)
    h.cache(n, off)
    again = upstream_reads(logf, mark)
    if again:
        fail("%s: second cache request went upstream: %s" % (name, again[:4]))
    print("cache %s (%d@%d): %d upstream reads, %d bytes, then 0" %
          (name, n, off, len(reads), sum(c for _, c in reads)))
h.shutdown()
sys.exit(1 if bad else 0)
EOF

for mode in writethrough writearound; do
  d="$TMP/$mode"
  mkdir -p "$d"
  make_random "$d/up.img" $SIZE
  start_nbdkit -P "$d/up.pid" -U "$d/up.sock" \
    --filter=log file "$d/up.img" logfile="$d/up.log"
  pxargs=(-P "$d/px.pid" -U "$d/px.sock" --filter="$FILTER"
          nbd socket="$d/up.sock" fscache-dir="$d/cache" fscache-mode="$mode"
          fscache-readahead=0 fscache-stats="$d/stats")
  start_nbdkit "${pxargs[@]}"
  "$PY" "$TMP/trimzero.py" "$d/px.sock" "$d/up.img" $mode "$TMP"
  stop_nbdkit "$d/px.pid"
  start_nbdkit "${pxargs[@]}"
  "$PY" -c "
import sys; sys.path.insert(0, '$TMP')
from common import *
h = nbd.NBD(); h.connect_unix('$d/px.sock')
sys.exit(0 if read_all(h) == file_bytes('$d/up.img', 0, h.get_size()) else 1)
" || { echo "$0: $mode: proxy view != upstream after restart"; exit 1; }
  stop_nbdkit "$d/px.pid"
  stop_nbdkit "$d/up.pid"
done

# NBD_CMD_CACHE, on a fresh cache.
d="$TMP/cache"
mkdir -p "$d"
make_random "$d/up.img" $SIZE
start_nbdkit -P "$d/up.pid" -U "$d/up.sock" \
  --filter=log file "$d/up.img" logfile="$d/up.log"
start_nbdkit -P "$d/px.pid" -U "$d/px.sock" --filter="$FILTER" \
  nbd socket="$d/up.sock" fscache-dir="$d/cache" fscache-readahead=0 \
  fscache-stats="$d/stats"
before=$(log_read_bytes "$d/up.log")
"$PY" "$TMP/cache.py" "$d/px.sock" "$d/up.img" "$TMP" "$d/up.log"
stop_nbdkit "$d/px.pid"
prefetched=$(stat_value "$d/stats" prefetch_bytes)
echo "cache: prefetch_bytes=$prefetched," \
     "upstream read $(( $(log_read_bytes "$d/up.log") - before )) bytes in all"
if [ "$prefetched" -eq 0 ]; then
  echo "$0: NBD_CMD_CACHE prefetched nothing according to the stats"
  exit 1
fi
echo "$0: OK"
