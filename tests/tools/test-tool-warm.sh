#!/usr/bin/env bash
# nbd-fscache warm: warming the whole export, a range, at a limited
# rate and by reads where the server has no cache support leaves the
# proxy serving those bytes without upstream reads (and the right
# data); replaying an access trace fetches upstream exactly the traced
# 4 KiB pieces, after which the traced workload reads nothing upstream;
# a truncated trace replays its complete chunks with a warning; a
# garbage trace, a trace of another export and upstream errors fail
# (1); usage errors are 2.
#
# The trace is recorded by the filter (fscache-trace=) during the
# workload; tests/write-trace writes the damaged and foreign ones.
source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
requires nbdkit --version
requires nbdcopy --version
requires python3 -c 'import nbd'
requires test -x "$TOOL"

WRITE_TRACE="$top_builddir/tests/write-trace"
size=$((16 * 1024 * 1024))
make_random "$TMP/up.img" $size

# ---- Usage. ----------------------------------------------------------------
st=0; "$TOOL" warm --no-such-option nbd://x 2>"$TMP/err" || st=$?
[ "$st" -eq 2 ] || fail "unknown option: exit $st, expected 2"
st=0; "$TOOL" warm 2>"$TMP/err" || st=$?
[ "$st" -eq 2 ] || fail "missing URI: exit $st, expected 2"
grep -q 'nbd-fscache: warm: missing URI' "$TMP/err" || fail "missing URI: $(cat "$TMP/err")"
st=0; "$TOOL" warm --max-rate 10X nbd://x 2>"$TMP/err" || st=$?
[ "$st" -eq 2 ] || fail "bad number: exit $st, expected 2"
st=0; "$TOOL" warm --help >"$TMP/help" || st=$?
[ "$st" -eq 0 ] || fail "--help: exit $st"
grep -q '^Usage: nbd-fscache warm URI' "$TMP/help" || fail "--help: no usage on stdout"

# ---- Servers. --------------------------------------------------------------
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/up.img" logfile="$TMP/up.log"

# proxy NAME CACHEDIR ARGS...: a proxy at $TMP/NAME.sock, the --filter=
# ARGS before the plugin, the others after.  No
# readahead and no sampling at open: every upstream read is one the
# test asked for.
proxy ()
{
  local name="$1" dir="$2" a filters=() params=()
  shift 2
  for a; do
    case "$a" in
      --filter=*) filters+=("$a") ;;
      *) params+=("$a") ;;
    esac
  done
  start_nbdkit -P "$TMP/$name.pid" -U "$TMP/$name.sock" "${filters[@]}" \
    nbd socket="$TMP/up.sock" fscache-dir="$dir" fscache-key=warm-test \
    fscache-validate=size fscache-readahead=0 "${params[@]}"
}
uri () { echo "nbd+unix:///?socket=$TMP/$1.sock"; }

# The upstream log's length now; upstream_since MARK: the read lines
# logged after it.
mark () { wc -l < "$TMP/up.log"; }
upstream_since () { tail -n +"$(( $1 + 1 ))" "$TMP/up.log"; }
bytes_since () { upstream_since "$1" > "$TMP/since.log"; log_read_bytes "$TMP/since.log"; }

# ranges log|trace FILE [MAX_ENTRIES]: the 4 KiB units a log's reads or
# a trace's entries cover, merged, one "offset length" a line.
cat > "$TMP/ranges.py" <<'PY'
import struct, sys
what, path = sys.argv[1], sys.argv[2]
limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
units = set()
if what == "log":
    for line in open(path):
        if " Read id=" not in line or "...Read" in line:
            continue
        f = dict(w.split("=", 1) for w in line.split() if "=" in w)
        off, cnt = int(f["offset"], 16), int(f["count"], 16)
        units.update(range(off // 4096, (off + cnt + 4095) // 4096))
else:
    data = open(path, "rb").read()
    pos, n = 64, 0
    while pos + 8 <= len(data) and data[pos:pos + 4] == b"FTRC":
        count = struct.unpack_from("<I", data, pos + 4)[0]
        if pos + 16 + 16 * count > len(data):
            break
        for i in range(count):
            if limit is not None and n >= limit:
                break
            off, ln, _ = struct.unpack_from("<QII", data, pos + 8 + 16 * i)
            units.update(range(off // 4096, (off + ln) // 4096))
            n += 1
        pos += 16 + 16 * count
start = prev = None
for u in sorted(units):
    if prev is not None and u == prev + 1:
        prev = u
        continue
    if start is not None:
        print(start * 4096, (prev - start + 1) * 4096)
    start = prev = u
if start is not None:
    print(start * 4096, (prev - start + 1) * 4096)
PY
ranges () { python3 "$TMP/ranges.py" "$@"; }

# Read all of the export through proxy NAME; check the data.
copy_check ()
{
  rm -f "$TMP/copy.img"
  nbdcopy "$(uri "$1")" "$TMP/copy.img"
  cmp "$TMP/up.img" "$TMP/copy.img" || fail "$1: data differs from the image"
}

# warmed_whole WHAT NAME: after a warm of all of it, a full read through
# proxy NAME is right and reads nothing upstream.
warmed_whole ()
{
  local m got
  m=$(mark)
  copy_check "$2"
  got=$(bytes_since "$m")
  [ "$got" -eq 0 ] || fail "$1: $got bytes read upstream after warming"
}

# ---- The whole export. -----------------------------------------------------
proxy px1 "$TMP/c1" --filter="$FILTER"
m=$(mark)
"$TOOL" warm "$(uri px1)" > "$TMP/out"
cat "$TMP/out"
grep -q "^warmed $size bytes in .* s (.* MB/s), [0-9]* requests, 0 errors$" "$TMP/out" ||
  fail "whole export: summary line: $(cat "$TMP/out")"
warm_bytes=$(bytes_since "$m")
[ "$warm_bytes" -eq "$size" ] || fail "whole export: warm read $warm_bytes bytes upstream"
warmed_whole "whole export" px1
stop_nbdkit "$TMP/px1.pid"

# ---- A range: exactly it is warmed. ----------------------------------------
proxy px2 "$TMP/c2" --filter="$FILTER"
m=$(mark)
"$TOOL" warm "$(uri px2)" --offset 4M --length 2M --connections 2 > "$TMP/out"
grep -q "^warmed 2097152 bytes" "$TMP/out" || fail "range: $(cat "$TMP/out")"
upstream_since "$m" > "$TMP/range.log"
[ "$(ranges log "$TMP/range.log")" = "4194304 2097152" ] ||
  fail "range: upstream reads $(ranges log "$TMP/range.log" | tr '\n' ' ')"
m=$(mark)
copy_check px2
got=$(bytes_since "$m")
[ "$got" -eq $((size - 2 * 1024 * 1024)) ] ||
  fail "range: the copy read $got bytes upstream, expected all but the range"
upstream_since "$m" > "$TMP/copy.log"
ranges log "$TMP/copy.log" | awk '$1 < 6291456 && $1 + $2 > 4194304 { exit 1 }' ||
  fail "range: the warmed range was read upstream again"
stop_nbdkit "$TMP/px2.pid"

# ---- --max-rate: finishes, and warms (no timing asserted). -----------------
proxy px3 "$TMP/c3" --filter="$FILTER"
"$TOOL" warm "$(uri px3)" --max-rate 32M --connections 1 > "$TMP/out"
grep -q "^warmed $size bytes" "$TMP/out" || fail "max-rate: $(cat "$TMP/out")"
warmed_whole max-rate px3
stop_nbdkit "$TMP/px3.pid"

# ---- No cache support (nocache outermost): warm by reading. ----------------
proxy px4 "$TMP/c4" --filter=nocache --filter="$FILTER" cachemode=none
nbdinfo --can cache "$(uri px4)" 2>/dev/null &&
  fail "nocache: the proxy still advertises cache support"
"$TOOL" warm "$(uri px4)" > "$TMP/out"
grep -q "^warmed $size bytes" "$TMP/out" || fail "reads: $(cat "$TMP/out")"
warmed_whole reads px4
stop_nbdkit "$TMP/px4.pid"

# ---- Trace replay. ---------------------------------------------------------
# A boot-like workload: 200 reads of 4-16 KiB at 512-byte aligned
# offsets, a fixed seed; checks the data.
cat > "$TMP/workload.py" <<'PY'
import nbd, random, sys
sock, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
rnd = random.Random(1)
h = nbd.NBD()
h.connect_unix(sock)
for i in range(200):
    n = rnd.randrange(4096, 16385)
    off = rnd.randrange(0, (len(data) - n) // 512) * 512
    if h.pread(n, off) != data[off:off + n]:
        sys.exit("wrong data at %d" % off)
h.shutdown()
PY

proxy px5 "$TMP/c5" --filter="$FILTER" fscache-trace="$TMP/t.trace"
python3 "$TMP/workload.py" "$TMP/px5.sock" "$TMP/up.img"
stop_nbdkit "$TMP/px5.pid"
traced=$(ranges trace "$TMP/t.trace")
[ -n "$traced" ] || fail "trace: empty"

# The cache invalidated, a fresh proxy, the replay.
"$TOOL" --dir "$TMP/c5" invalidate --all > /dev/null ||
  fail "trace: invalidate failed"
proxy px6 "$TMP/c5" --filter="$FILTER"
m=$(mark)
"$TOOL" warm "$(uri px6)" --trace "$TMP/t.trace" > "$TMP/out" 2>"$TMP/err"
cat "$TMP/out" "$TMP/err"
[ ! -s "$TMP/err" ] || fail "trace: messages from a good trace"
upstream_since "$m" > "$TMP/trace.log"
[ "$(ranges log "$TMP/trace.log")" = "$traced" ] ||
  fail "trace: upstream reads during the warm differ from the trace:
$(diff <(echo "$traced") <(ranges log "$TMP/trace.log") | head -20)"
m=$(mark)
python3 "$TMP/workload.py" "$TMP/px6.sock" "$TMP/up.img"
got=$(bytes_since "$m")
[ "$got" -eq 0 ] || fail "trace: the workload read $got bytes upstream after the replay"
stop_nbdkit "$TMP/px6.pid"

# A truncated trace: the same entries, 25 a chunk, cut in the middle of
# the third chunk.  The first two chunks are replayed, with a warning.
python3 - "$TMP/t.trace" > "$TMP/all-entries" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
pos = 64
while pos + 8 <= len(data):
    count = struct.unpack_from("<I", data, pos + 4)[0]
    if pos + 16 + 16 * count > len(data):
        break
    for i in range(count):
        off, ln, _ = struct.unpack_from("<QII", data, pos + 8 + 16 * i)
        print(off, ln)
    pos += 16 + 16 * count
PY
[ "$(wc -l < "$TMP/all-entries")" -gt 60 ] || fail "trace: too few entries for the truncation test"
"$WRITE_TRACE" $size 25 < "$TMP/all-entries" > "$TMP/t25.trace"
chunk=$((8 + 25 * 16 + 8))
head -c $((64 + 2 * chunk + chunk / 2)) "$TMP/t25.trace" > "$TMP/cut.trace"
proxy px7 "$TMP/c7" --filter="$FILTER"
m=$(mark)
"$TOOL" warm "$(uri px7)" --trace "$TMP/cut.trace" --window 4 > "$TMP/out" 2>"$TMP/err"
cat "$TMP/out" "$TMP/err"
grep -q "warning: .*cut.trace: truncated chunk at byte $((64 + 2 * chunk)); replaying the 50 entries" "$TMP/err" ||
  fail "truncated trace: no warning"
upstream_since "$m" > "$TMP/cut.log"
[ "$(ranges log "$TMP/cut.log")" = "$(ranges trace "$TMP/t25.trace" 50)" ] ||
  fail "truncated trace: upstream reads are not the first 50 entries"

# The recorded trace itself cut inside its first chunk: the header is
# good, so nothing is replayed, with a warning, and that is success.
head -c 76 "$TMP/t.trace" > "$TMP/cut1.trace"
st=0; "$TOOL" warm "$(uri px7)" --trace "$TMP/cut1.trace" > "$TMP/out" 2>"$TMP/err" || st=$?
cat "$TMP/out" "$TMP/err"
[ "$st" -eq 0 ] || fail "trace cut in its first chunk: exit $st, expected 0"
grep -q "truncated chunk at byte 64; replaying the 0 entries" "$TMP/err" ||
  fail "trace cut in its first chunk: no warning"

# A garbage file, and a trace of another export: refused (1).
head -c 5000 /dev/urandom > "$TMP/garbage.trace"
st=0; "$TOOL" warm "$(uri px7)" --trace "$TMP/garbage.trace" 2>"$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "garbage trace: exit $st, expected 1"
grep -q 'not an access trace' "$TMP/err" || fail "garbage trace: message"
echo "0 4096" | "$WRITE_TRACE" $((size * 2)) > "$TMP/other.trace"
st=0; "$TOOL" warm "$(uri px7)" --trace "$TMP/other.trace" 2>"$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "trace of another export: exit $st, expected 1"
grep -q "recorded on an export of $((size * 2)) bytes" "$TMP/err" ||
  fail "trace of another export: message"
stop_nbdkit "$TMP/px7.pid"

# ---- Upstream errors: exit 1. ----------------------------------------------
start_nbdkit -P "$TMP/bad.pid" -U "$TMP/bad.sock" \
  --filter=error file "$TMP/up.img" error=EIO error-pread-rate=1
start_nbdkit -P "$TMP/px8.pid" -U "$TMP/px8.sock" --filter="$FILTER" \
  nbd socket="$TMP/bad.sock" fscache-dir="$TMP/c8" fscache-key=warm-bad \
  fscache-validate=size fscache-readahead=0
st=0; "$TOOL" warm "$(uri px8)" --length 1M > "$TMP/out" 2>"$TMP/err" || st=$?
cat "$TMP/out" "$TMP/err"
[ "$st" -eq 1 ] || fail "upstream errors: exit $st, expected 1"
grep -q "errors$" "$TMP/out" && ! grep -q " 0 errors$" "$TMP/out" ||
  fail "upstream errors: summary does not count them"
echo "test-tool-warm: ok"
