#!/usr/bin/env bash
# nbd-fscache: fscache-trace=FILE records, in order, the parts of
# client reads that no earlier read touched, rounded out to 4 KiB, and
# stops at fscache-trace-max.  Only the first export is traced.
#
# Truth: the workload itself.  A seeded list of reads (random offsets
# and sizes, some repeated, some overlapping) is replayed on one
# connection through a real proxy; the expected entries are computed
# from that list independently (a set of 4 KiB units in Python) and
# compared with the file the filter wrote, entry by entry.  The chunk
# checksums are checked by unit-trace; here the framing is.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter="$FILTER" null --dump-plugin

size=$((32 * 1024 * 1024))
make_random "$TMP/up.img" "$size"

# workload.py URI SEED N OUT: N reads, their (offset, length) in OUT.
cat > "$TMP/workload.py" <<'PY'
import random, sys
import nbd
uri, seed, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
img = open(sys.argv[5], "rb").read()
h = nbd.NBD(); h.connect_uri(uri)
size = h.get_size()
rnd = random.Random(seed)
reads = []
for i in range(n):
    if reads and rnd.random() < 0.2:
        off, ln = rnd.choice(reads)            # again: nothing new
        off += rnd.randrange(0, 3000)          # or a little past it
    else:
        off = rnd.randrange(0, size - 70000)
        ln = rnd.choice([512, 4096, 5000, 16384, 65536])
    if h.pread(ln, off) != img[off:off + ln]:
        sys.exit("wrong data at %d" % off)
    reads.append((off, ln))
h.shutdown()
with open(out, "w") as f:
    for off, ln in reads:
        f.write("%d %d\n" % (off, ln))
PY

# compare.py TRACE READS SIZE LIMIT: the trace's entries are exactly
# the first touches of READS (4 KiB units), up to LIMIT bytes.
cat > "$TMP/compare.py" <<'PY'
import struct, sys
trace, reads, size, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
d = open(trace, "rb").read()
assert d[:8] == b"NBDFSTRC", "bad magic"
ver, hsz, tsize, bs, unit = struct.unpack("<IIQII", d[8:32])
assert (ver, hsz, tsize, unit) == (1, 64, size, 4096), (ver, hsz, tsize, unit)
got, p = [], 64
while p < len(d):
    assert d[p:p + 4] == b"FTRC", "bad chunk magic at %d" % p
    (n,) = struct.unpack("<I", d[p + 4:p + 8])
    assert 1 <= n <= 4096
    for i in range(n):
        off, ln, ms = struct.unpack("<QII", d[p + 8 + 16 * i:p + 24 + 16 * i])
        got.append((off, ln))
    p += 16 + 16 * n
assert p == len(d), "trailing bytes"
seen, want, total = set(), [], 0
for line in open(reads):
    off, ln = map(int, line.split())
    ln = min(ln, size - off)
    u, run = off // 4096, None
    while u < (off + ln + 4095) // 4096 and total < limit:
        if u not in seen:
            seen.add(u)
            total += 4096
            if run is None:
                run = u
        elif run is not None:
            want.append((run * 4096, (u - run) * 4096)); run = None
        u += 1
    if run is not None:
        want.append((run * 4096, (u - run) * 4096))
if got != want:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            sys.exit("entry %d: trace has %s, expected %s" % (i, g, w))
    sys.exit("trace has %d entries, expected %d" % (len(got), len(want)))
print("%d entries, %d bytes" % (len(got), sum(l for _, l in got)))
PY

uri="nbd+unix:///?socket=$TMP/px.sock"
run ()                          # NAME LIMIT-PARAM...
{
  local name="$1"; shift
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" --filter="$FILTER" \
    file "$TMP/up.img" fscache-dir="$TMP/cache-$name" fscache-key=t \
    fscache-trace="$TMP/$name.trace" "$@"
  $PYTHON "$TMP/workload.py" "$uri" 7 600 "$TMP/$name.reads" "$TMP/up.img" ||
    fail "$name: the workload saw wrong data"
  stop_nbdkit "$TMP/px.pid"
}

# 1. The whole workload, traced.
run all
out=$($PYTHON "$TMP/compare.py" "$TMP/all.trace" "$TMP/all.reads" \
      "$size" $((1 << 40))) || fail "all: $out"
echo "1: $out"

# 2. A limit of 1M: the first 1 MiB of first touches, then nothing.
run cut fscache-trace-max=1M
out=$($PYTHON "$TMP/compare.py" "$TMP/cut.trace" "$TMP/cut.reads" \
      "$size" $((1 << 20))) || fail "cut: $out"
echo "2: $out"
case "$out" in *" 1048576 bytes") ;; *) fail "cut: not 1 MiB: $out" ;; esac

# 3. Two exports: only the first one opened is traced.
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" --filter="$FILTER" \
  memory 1M fscache-dir="$TMP/cache-two" fscache-key=two \
  fscache-trace="$TMP/two.trace"
$PYTHON -c '
import sys, nbd
first = nbd.NBD(); first.connect_uri(sys.argv[1] % "first")
second = nbd.NBD(); second.connect_uri(sys.argv[1] % "second")
second.pread(4096, 65536)
first.pread(4096, 0)
first.shutdown(); second.shutdown()
' "nbd+unix:///%s?socket=$TMP/px.sock"
stop_nbdkit "$TMP/px.pid"
entries=$($PYTHON -c '
import struct, sys
d = open(sys.argv[1], "rb").read()
print(" ".join("%d+%d" % struct.unpack("<QI", d[72 + 16 * i:84 + 16 * i])
               for i in range(struct.unpack("<I", d[68:72])[0])))
' "$TMP/two.trace")
echo "3: two exports, trace entries: $entries"
[ "$entries" = "0+4096" ] ||
  fail "two exports: expected only the first export's read, got '$entries'"

echo "$0: PASS"
