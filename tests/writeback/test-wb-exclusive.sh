#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: who may use a cache whose write
# log holds data the upstream does not have yet, and what a damaged
# dirty block reads as.
#
# The upstream: nbdkit's error filter over a file, failing every pwrite
# with EIO while $TMP/blocked exists, so that a writeback proxy's writes
# stay dirty (clients still connect and read: only writeback fails).
#
#  a. While a writeback proxy runs, a second proxy process on the same
#     cache directory and key, in writeback and in writethrough mode,
#     is refused: the client's connection fails and the second proxy
#     says "another process uses its cache in writeback mode".  The
#     first one keeps working and writes everything back (cmp).
#  b. A writeback proxy is killed (-9) with dirty data (writeback
#     blocked); a writethrough proxy, then a writearound one, on the
#     same directory and key are refused with a message that names
#     'nbd-fscache ... writeback' and 'invalidate --force'; the
#     upstream is untouched.
#  c. A writeback proxy then takes over: it says how many bytes of
#     dirty data it found and that it writes them back; the export reads
#     as the client's model, and the upstream becomes exactly that.
#  d. The upstream changes behind the cache's back while dirty data
#     waits (proxy killed -9 each time): fscache-generation changed,
#     the upstream's size changed, the upstream's content changed (the
#     coherency sample): each restart is refused, the message names the
#     reason and both ways out, and nothing is written; once the
#     upstream (or the generation) is as it was, a writeback proxy
#     writes everything back (cmp).
#  e. A dirty block damaged in the log: write block A, flush, write
#     block B, flush (A's record is followed by a flush marker, so it
#     was promised durable), kill -9 with writeback blocked; flip one
#     byte of A's data in the .wlog (its record is the first one: at
#     8192, 64 bytes of header and 8 of hash before the data; the test
#     checks the record headers first); unblock and restart: reading A
#     fails with EIO (never the upstream's old bytes), the proxy logs an
#     ERROR naming A's offset (and does not blame the upstream), B reads
#     back as written; the writer halts at A, so B (a later epoch) must
#     not reach the upstream: after a SIGTERM (drain 2 s) the proxy says
#     dirty data is left, and the upstream image is unchanged.
#
# Truth: client models (tests/wb-client.py), the upstream image (cmp),
# the refused connections' errors and the proxies' stderr.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=error null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires nbdinfo --version
requires nbdcopy --version
requires python3 -c 'import nbd'
requires cmp --version

CLIENT="$top_srcdir/tests/wb-client.py"
size=$((8 * 1024 * 1024))
make_random "$TMP/up.img" "$size"
cp "$TMP/up.img" "$TMP/orig.img"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=error file "$TMP/up.img" \
  error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$TMP/blocked"

# proxy N NAME DIR [PARAMS]: proxy N on $TMP/pxN.sock, stderr in
# $TMP/NAME.err (fresh), in writeback mode unless PARAMS say otherwise.
proxy ()
{
  rm -f "$TMP/$2.err"
  NBDKIT_STDERR="$TMP/$2.err" start_nbdkit -P "$TMP/px$1.pid" \
    -U "$TMP/px$1.sock" --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/$3" fscache-key=ex fscache-mode=writeback \
    fscache-writeback-drain=20 "${@:4}"
}
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }
# refused N NAME WHAT: a client of proxy N cannot connect.
refused ()
{
  if nbdinfo --size "$(uri "$1")" > "$TMP/$2.client" 2>&1; then
    fail "$3: a client could connect to a proxy that must refuse"
  fi
  kill -0 "$(cat "$TMP/px$1.pid")" 2>/dev/null || fail "$3: the proxy died"
}
said () { grep -q -- "$2" "$TMP/$1.err"; }
# must_say NAME WHAT PATTERN...: the proxy's stderr has each pattern.
must_say ()
{
  local name="$1" what="$2" pat
  shift 2
  for pat; do
    if ! said "$name" "$pat"; then
      cat "$TMP/$name.err" >&2
      fail "$what: the proxy did not say: $pat"
    fi
  done
}
blocked_said () { said "$1" 'writeback cannot reach the upstream'; }
# dirty NAME SEED: a client writes with writeback blocked, the model in
# $TMP/NAME.model; returns once the proxy has tried to write back.
dirty ()
{
  touch "$TMP/blocked"
  $PYTHON "$CLIENT" "$(uri 1)" "$TMP/up.img" "$TMP/$1.model" "$2" \
    --count 30 --flush-every 5 > /dev/null ||
    fail "$1: the client failed"
  wait_until blocked_said "$1" ||
    { cat "$TMP/$1.err" >&2; fail "$1: the writer never tried the upstream"; }
}
same () { cmp -s "$1" "$2"; }
# wait_long SECONDS CMD...: wait_until with another bound.
wait_long ()
{
  local t=$1 i
  shift
  for (( i=0; i<t*20; i++ )); do
    "$@" && return 0
    sleep 0.05
  done
  return 1
}
# written_back NAME: the proxy on socket 1 (a client connects, which
# starts the writer) writes NAME.model back.
written_back ()
{
  nbdcopy "$(uri 1)" "$TMP/$1.copy" || fail "$1: nbdcopy from the proxy failed"
  same "$TMP/$1.copy" "$TMP/$1.model" ||
    fail "$1: the proxy's view differs from what was written"
  wait_long 30 same "$TMP/up.img" "$TMP/$1.model" ||
    fail "$1: the dirty data did not reach the upstream within 30 s"
  stop_nbdkit "$TMP/px1.pid"
  said "$1" 'left in the cache' && fail "$1: dirty data left after SIGTERM"
  return 0
}
untouched ()
{
  same "$TMP/up.img" "$1" || fail "$2: the upstream changed"
}

SECONDS=0

# ---- a. a second process -----------------------------------------------------
proxy 1 a1 cache
$PYTHON "$CLIENT" "$(uri 1)" "$TMP/up.img" "$TMP/a1.model" 1 --count 20 \
  > /dev/null || fail "a: the client of the first proxy failed"
for mode in writeback writethrough; do
  proxy 2 "a2-$mode" cache fscache-mode="$mode"
  refused 2 "a2-$mode" "a: a second proxy ($mode)"
  must_say "a2-$mode" "a: a second proxy ($mode)" \
    'another process uses its cache in writeback mode'
  stop_nbdkit "$TMP/px2.pid"
done
written_back a1
echo "a: ok, a second process refused in writeback and writethrough mode (${SECONDS}s)"

# ---- b. dirty data, then another mode ------------------------------------
cp "$TMP/up.img" "$TMP/orig.img"
proxy 1 b1 cache
dirty b1 2
kill9_nbdkit "$TMP/px1.pid"
for mode in writethrough writearound; do
  proxy 2 "b-$mode" cache fscache-mode="$mode"
  refused 2 "b-$mode" "b: $mode after a kill -9 with dirty data"
  must_say "b-$mode" "b: $mode after a kill -9 with dirty data" \
    'not yet written back' "nbd-fscache --dir $TMP/cache writeback" \
    'invalidate --force'
  stop_nbdkit "$TMP/px2.pid"
done
untouched "$TMP/orig.img" "b: with writeback blocked"
echo "b: ok, writethrough and writearound refused (${SECONDS}s)"

# ---- c. a writeback proxy takes over ---------------------------------------
rm "$TMP/blocked"
proxy 1 b1-resume cache
cp "$TMP/b1.model" "$TMP/b1-resume.model"
written_back b1-resume
must_say b1-resume "c: resuming" \
  'bytes of dirty data in [0-9]* epochs found in the cache; writing them back'
echo "c: ok, $(grep -o '[0-9]* bytes of dirty data in [0-9]* epochs' \
  "$TMP/b1-resume.err") written back (${SECONDS}s)"

# ---- d. the upstream changed behind the cache's back -----------------------
# changed NAME WHAT REASON [PARAMS]: proxy 1 is refused, says REASON and
# both ways out, and leaves the upstream as it is.
changed ()
{
  local before="$TMP/$1.before"
  cp "$TMP/up.img" "$before"
  proxy 1 "$1" cache "${@:4}"
  refused 1 "$1" "d: $2"
  must_say "$1" "d: $2" "$3" "nbd-fscache --dir $TMP/cache writeback" \
    'invalidate --force'
  stop_nbdkit "$TMP/px1.pid"
  untouched "$before" "d: $2: refused, but"
}
# generation
cp "$TMP/up.img" "$TMP/orig.img"
proxy 1 d-gen cache fscache-generation=1
dirty d-gen 3
kill9_nbdkit "$TMP/px1.pid"
rm "$TMP/blocked"
changed d-gen2 "generation 1 -> 2" generation-changed fscache-generation=2
untouched "$TMP/orig.img" "d: generation"
proxy 1 d-gen-back cache fscache-generation=1
cp "$TMP/d-gen.model" "$TMP/d-gen-back.model"
written_back d-gen-back
# size
proxy 1 d-size cache fscache-generation=1
dirty d-size 4
kill9_nbdkit "$TMP/px1.pid"
rm "$TMP/blocked"
cp "$TMP/up.img" "$TMP/d-size.orig"
truncate -s $((size + 1024 * 1024)) "$TMP/up.img"
changed d-size2 "size grown by 1 MiB" upstream-size-changed fscache-generation=1
truncate -s "$size" "$TMP/up.img"
untouched "$TMP/d-size.orig" "d: size"
proxy 1 d-size-back cache fscache-generation=1
cp "$TMP/d-size.model" "$TMP/d-size-back.model"
written_back d-size-back
# content: the whole image rewritten (every sampled region differs; the
# 30 writes cover few of them)
proxy 1 d-data cache fscache-generation=1
dirty d-data 5
kill9_nbdkit "$TMP/px1.pid"
rm "$TMP/blocked"
cp "$TMP/up.img" "$TMP/d-data.orig"
make_random "$TMP/other.img" "$size"
cp "$TMP/other.img" "$TMP/up.img"
changed d-data2 "content rewritten" 'upstream-changed' fscache-generation=1
cp "$TMP/d-data.orig" "$TMP/up.img"
proxy 1 d-data-back cache fscache-generation=1
cp "$TMP/d-data.model" "$TMP/d-data-back.model"
written_back d-data-back
echo "d: ok, generation, size and content changes refused (${SECONDS}s)"

# ---- e. a damaged dirty block --------------------------------------------
A=$((1024 * 1024))
B=$((3 * 1024 * 1024))
cp "$TMP/up.img" "$TMP/orig.img"
touch "$TMP/blocked"
proxy 1 e1 cache-e
$PYTHON - "$(uri 1)" "$A" "$B" "$TMP/e.a" "$TMP/e.b" <<'EOF' ||
import os, sys
import nbd
uri, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
da, db = os.urandom(4096), os.urandom(4096)
h.pwrite(da, a)
h.flush()
h.pwrite(db, b)
h.flush()
if h.pread(4096, a) != da or h.pread(4096, b) != db:
    sys.exit("A or B does not read back")
open(sys.argv[4], "wb").write(da)
open(sys.argv[5], "wb").write(db)
EOF
  fail "e: writing A and B failed"
wait_until blocked_said e1 || fail "e: the writer never tried the upstream"
kill9_nbdkit "$TMP/px1.pid"
untouched "$TMP/orig.img" "e: with writeback blocked"
wlog=$(find "$TMP/cache-e/objects" -name '*.wlog')
[ -n "$wlog" ] || fail "e: no .wlog in the cache"
# The records: A's data (type 1) at 8192, its flush marker (type 4),
# B's data, B's flush marker.  Flip one byte of A's data.
$PYTHON - "$wlog" "$A" "$B" <<'EOF' || fail "e: the log is not as expected"
import struct, sys
path, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
f = open(path, "r+b")
def rec(pos):
    f.seek(pos)
    h = f.read(64)
    magic, typ = struct.unpack_from("<IB", h, 0)
    off, length = struct.unpack_from("<QQ", h, 24)
    nunits = struct.unpack_from("<I", h, 40)[0]
    if magic != 0x524c5746:
        sys.exit("no record at %d" % pos)
    size = 64 + 8 * nunits + (length if typ == 1 else 0)
    return typ, off, length, (size + 7) // 8 * 8
want = [(1, a, 4096), (4, None, None), (1, b, 4096), (4, None, None)]
pos = 8192
for w in want:
    typ, off, length, size = rec(pos)
    if typ != w[0] or (w[1] is not None and (off, length) != (w[1], w[2])):
        sys.exit("record at %d: type %d offset %d length %d, expected %s"
                 % (pos, typ, off, length, w))
    pos += size
p = 8192 + 64 + 8 + 100
f.seek(p)
c = f.read(1)
f.seek(p)
f.write(bytes([c[0] ^ 0x5a]))
f.close()
EOF
rm "$TMP/blocked"
proxy 1 e2 cache-e fscache-writeback-drain=2
$PYTHON - "$(uri 1)" "$A" "$B" "$TMP/e.b" "$TMP/orig.img" <<'EOF' ||
import errno, sys
import nbd
uri, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
db = open(sys.argv[4], "rb").read()
with open(sys.argv[5], "rb") as f:
    f.seek(a)
    old = f.read(4096)
h = nbd.NBD()
h.connect_uri(uri)
for what, n, off in (("A", 4096, a), ("A's last byte", 1, a + 4095),
                     ("A and its neighbours", 3 * 4096, a - 4096)):
    try:
        got = h.pread(n, off)
    except nbd.Error as e:
        if e.errno not in ("EIO", errno.EIO):
            sys.exit("reading %s: %s, not EIO" % (what, e))
        continue
    if got == old[off - a:off - a + n]:
        sys.exit("reading %s returned the upstream's old bytes" % what)
    sys.exit("reading %s succeeded" % what)
if h.pread(4096, b) != db:
    sys.exit("B does not read back as written")
h.shutdown()
EOF
  fail "e: reads of the damaged block"
must_say e2 "e: a damaged dirty block" \
  "fscache: ERROR: export \"\": dirty data at offset $A failed its checksum"
# The upstream works: the writer halted on the log, not on it.
said e2 'writeback cannot reach the upstream' &&
  fail "e: the proxy blames the upstream for the damaged log"
stop_nbdkit "$TMP/px1.pid"
must_say e2 "e: SIGTERM with a halted writer" \
  'bytes of dirty data in [0-9]* epochs left in the cache'
untouched "$TMP/orig.img" "e: with A damaged in the log (B is a later epoch)"
echo "e: ok, A reads as EIO, B as written, nothing written back (${SECONDS}s)"

echo "$0: OK (${SECONDS}s)"
