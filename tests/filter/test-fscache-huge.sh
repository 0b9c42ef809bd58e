#!/usr/bin/env bash
# nbd-fscache: a 64 TiB export on this machine's file system.
#
# ext4 stops a file at 16 TiB (4 KiB blocks), so the data lives in
# segment files of 1 TiB (core/disk/data.c).  Upstream is nbdkit's pattern
# plugin (every 8-byte word is its own offset, big-endian: the truth
# is computed, nothing is stored), 64 TiB, below the log filter.
#
#   - scattered 64 KiB reads from the first to the last byte, reads
#     that straddle segment boundaries (1 TiB, 17 TiB: one run of
#     blocks in two files) and the export's last bytes are identical
#     to the pattern, cold and then warm (0 bytes upstream);
#   - the object has one data file per TiB (64), all sparse, and only
#     what was read is allocated;
#   - after a restart the same reads are served with 0 bytes upstream
#     (fscache-validate=size), and the object was reused, not
#     discarded.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit pattern --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdkit nbd --dump-plugin
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter="$FILTER" null --dump-plugin

T=$((1 << 40))
SIZE=$((64 * T))
log="$TMP/up.log"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log pattern "$SIZE" logfile="$log"
start_proxy ()
{
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-validate=size fscache-readahead=0 \
    fscache-stats="$TMP/px.stats"
}
uri="nbd+unix:///?socket=$TMP/px.sock"

# Read the offsets (and lengths) below, check each against the pattern.
cat > "$TMP/reads.py" <<'PYEOF'
import struct, sys
import nbd
T = 1 << 40
size = 64 * T
reads = [(0, 65536), (T - 32768, 65536), (17 * T - 4096, 1 << 20),
         (33 * T + 12345, 100000), (size - 65536, 65536), (size - 7, 7)]
reads += [(k * T + (k * 7919 % 4096) * 65536, 65536) for k in range(64)]
def pattern(off, n):
    first = off & ~7
    words = b"".join(struct.pack(">Q", w) for w in range(first, off + n, 8))
    return words[off - first:off - first + n]
h = nbd.NBD()
h.connect_uri(sys.argv[1])
assert h.get_size() == size, h.get_size()
for off, n in reads:
    if h.pread(n, off) != pattern(off, n):
        sys.exit("data differs at %d (+%d)" % (off, n))
h.shutdown()
# The distinct bytes read (two of the ranges are the same).
end, distinct = 0, 0
for off, n in sorted(reads):
    distinct += max(0, off + n - max(off, end))
    end = max(end, off + n)
print(distinct)
PYEOF

start_proxy
n=$("$PYTHON" "$TMP/reads.py" "$uri") || fail "cold reads: $n"
cold=$(log_read_bytes "$log")
echo "cold: $n distinct bytes read, $cold bytes upstream"
[ "$cold" -ge "$n" ] || fail "cold: only $cold bytes upstream for $n read"
"$PYTHON" "$TMP/reads.py" "$uri" >/dev/null || fail "warm reads"
[ "$(log_read_bytes "$log")" -eq "$cold" ] ||
  fail "warm: $(( $(log_read_bytes "$log") - cold )) bytes upstream"
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/px.stats" objects_created)" -eq 1 ] || fail "object not created"

obj=$(ls "$TMP"/cache/objects/@*/*.idx)
obj=${obj%.idx}
nseg=$(ls "$obj".data "$obj".data.* | wc -l)
echo "segments: $nseg data files; first $(stat -c %s "$obj.data") bytes," \
     "last $(stat -c %s "$obj.data.63") bytes"
[ "$nseg" -eq 64 ] || fail "$nseg data files, expected 64 (one per TiB)"
[ "$(stat -c %s "$obj.data")" -eq "$T" ] || fail "segment 0 is not 1 TiB"
alloc=$(du -B1 -c "$obj".data "$obj".data.* | awk 'END { print $1 }')
echo "data allocated: $alloc bytes"
[ "$alloc" -le $((cold + 64 * 65536)) ] ||
  fail "data allocated $alloc bytes for $cold fetched"

start_proxy
"$PYTHON" "$TMP/reads.py" "$uri" >/dev/null || fail "reads after restart"
[ "$(log_read_bytes "$log")" -eq "$cold" ] ||
  fail "after restart: $(( $(log_read_bytes "$log") - cold )) bytes upstream"
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/px.stats" objects_reused)" -eq 1 ] ||
  fail "after restart the object was not reused"
echo "after restart: 0 bytes upstream"
echo "$0: PASS"
