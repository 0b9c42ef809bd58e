#!/usr/bin/env bash
# nbd-fscache: an upstream that misbehaves gets the client a clear
# error and the proxy a log line, and the cache keeps only data the
# upstream really returned.
#
#  1. Read errors (nbdkit's error filter, 25% of preads, as EINVAL):
#     four parallel readers get either the image's bytes or EIO, never
#     anything else; afterwards, with the errors off, a full read is
#     identical to the image.
#  2. Short reads (an eval plugin that prints half of what is asked in
#     one zone): the read fails, and a good upstream afterwards shows
#     the cache holds nothing of it.
#  3. The upstream's size changes under a live connection (the image
#     file shrinks): reads past the new end fail with EIO, cached ones
#     still succeed; the next connection discards the cache (size
#     changed) and reads the new image; so does one after it grows.
#
# Truth: the image file, errno of failed reads, the proxy's log.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit nbd --dump-plugin
requires nbdkit eval --dump-plugin
requires nbdkit --filter=error null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'
requires test -x "$TOOL"

size=$((8 * 1024 * 1024))
img="$TMP/upstream.img"
make_random "$img" "$size"
uri="nbd+unix:///?socket=$TMP/px.sock"

# The reader: N random reads; each must equal the image or fail with
# EIO.  Prints "good BAD eio" counts; exits 1 on wrong data or errno.
cat > "$TMP/reader.py" <<'EOF'
import errno, random, sys
import nbd
uri, img, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
rnd = random.Random(seed)
data = open(img, "rb").read()
good = eio = 0
for _ in range(n):
    k = rnd.randrange(1, 300000)
    off = rnd.randrange(0, size - k)
    try:
        got = h.pread(k, off)
    except nbd.Error as e:
        if e.errno not in ("EIO", errno.EIO):
            sys.exit("read %d+%d failed with %s, not EIO: %s" % (off, k, e.errno, e))
        eio += 1
        continue
    if got != data[off:off + k]:
        sys.exit("read %d+%d returned wrong data" % (off, k))
    good += 1
print(good, eio)
EOF

# expect_read URI OFF LEN ok|eio: one read through the proxy.
expect_read ()
{
  $PYTHON - "$@" "$img" <<'EOF'
import errno, sys
import nbd
uri, off, n, want, img = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
h = nbd.NBD()
h.connect_uri(uri)
try:
    got = h.pread(n, off)
except nbd.Error as e:
    if want == "eio" and e.errno in ("EIO", errno.EIO):
        sys.exit(0)
    sys.exit("read %d+%d: %s" % (off, n, e))
if want == "eio":
    sys.exit("read %d+%d succeeded, expected EIO" % (off, n))
with open(img, "rb") as f:
    f.seek(off)
    if f.read(n) != got:
        sys.exit("read %d+%d: wrong data" % (off, n))
EOF
}

start_proxy ()
{
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" -v --log=stderr \
    --filter="$FILTER" "$@" fscache-dir="$TMP/cache" fscache-key=errors \
    2>>"$TMP/px.err"
}

# ---- 1. read errors ---------------------------------------------------
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=error file "$img" \
  error-pread=EINVAL error-pread-rate=25% error-pread-file="$TMP/errors-on"
# validate=size: with sampling, a sample read that fails refuses the
# connection (nothing can be validated), which is not what this tests.
start_proxy nbd socket="$TMP/up.sock" fscache-validate=size
touch "$TMP/errors-on"
pids=()
for i in 1 2 3 4; do
  $PYTHON "$TMP/reader.py" "$uri" "$img" "$i" 150 > "$TMP/reader.$i" &
  pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || fail "read errors: a reader saw wrong data or a wrong errno"
done
eio=$(cat "$TMP"/reader.* | awk '{ s += $2 } END { print s + 0 }')
good=$(cat "$TMP"/reader.* | awk '{ s += $1 } END { print s + 0 }')
echo "1: read errors: $good reads identical, $eio failed with EIO"
[ "$eio" -gt 0 ] || fail "read errors: no read failed, the error filter did nothing"
[ "$good" -gt 0 ] || fail "read errors: no read succeeded"
grep -q 'upstream read .* failed' "$TMP/px.err" ||
  fail "read errors: the proxy logged no upstream read failure"
rm "$TMP/errors-on"
nbdcopy "$uri" "$TMP/copy1.img"
cmp "$img" "$TMP/copy1.img" ||
  fail "read errors: with the errors off the data differs from the image"
kill -0 "$(cat "$TMP/px.pid")" || fail "read errors: the proxy died"
stop_nbdkit "$TMP/px.pid"
stop_nbdkit "$TMP/up.pid"

# ---- 2. short reads ---------------------------------------------------
# The eval plugin prints half the bytes for reads that start in
# [2M, 3M): nbdkit's sh plugin reports that as an error.
rm -rf "$TMP/cache"
start_proxy eval \
  get_size="stat -Lc %s '$img'" \
  pread="if [ \$4 -ge 2097152 ] && [ \$4 -lt 3145728 ]; then n=\$((\$3 / 2)); else n=\$3; fi
         dd if='$img' skip=\$4 count=\$n iflag=skip_bytes,count_bytes status=none"
expect_read "$uri" 0 1048576 ok || fail "short reads: a good read failed"
expect_read "$uri" 2097152 65536 eio || fail "short reads: a short read was not EIO"
expect_read "$uri" $((2097152 + 300000)) 4096 eio ||
  fail "short reads: a short read was not EIO"
stop_nbdkit "$TMP/px.pid"
# The same object behind a good upstream: everything identical.
start_proxy file "$img"
nbdcopy "$uri" "$TMP/copy2.img"
cmp "$img" "$TMP/copy2.img" ||
  fail "short reads: the cache kept data of a short read"
stop_nbdkit "$TMP/px.pid"
echo "2: short reads: EIO to the client, nothing of them cached"

# ---- 3. the size changes under a live connection ---------------------
rm -rf "$TMP/cache"
start_proxy file "$img"
cat > "$TMP/live.py" <<'EOF'
import errno, os, sys
import nbd
uri, img = sys.argv[1], sys.argv[2]
h = nbd.NBD()
h.connect_uri(uri)
data = open(img, "rb").read()
size = len(data)
h.pread(1 << 20, 0)                     # [0, 1M) cached
os.truncate(img, size // 2)             # the upstream shrinks
if h.pread(65536, 0) != data[:65536]:
    sys.exit("a cached block changed")
try:
    h.pread(65536, size - 65536)        # past the new end, not cached
    sys.exit("a read past the upstream's new end succeeded")
except nbd.Error as e:
    if e.errno not in ("EIO", errno.EIO):
        sys.exit("read past the new end: %s, not EIO" % e.errno)
h.shutdown()
EOF
$PYTHON "$TMP/live.py" "$uri" "$img" || fail "size change: live connection"
# Next connection: the upstream is half the size; the cache is dropped.
# Once the old object is let go: work the live connection left (a
# queued fill, the catch-up) may hold it a moment after the connection
# ends, and an open of the new size meanwhile finds its index locked
# and serves the export uncached (a fresh clone saw that: "cached by
# another process ... for a different upstream").
released () { ! tool --dir "$TMP/cache" ls | grep -q 'in use'; }
wait_until released || fail "size change: the old object is still in use"
nbdcopy "$uri" "$TMP/copy3.img"
cmp "$img" "$TMP/copy3.img" || fail "size change: shrunk image differs"
[ "$(stat -c %s "$TMP/copy3.img")" -eq $((size / 2)) ] ||
  fail "size change: the proxy did not see the new size"
# Said by the next connection's open, or before it by the catch-up
# worker if it ran in between (it makes up fills skipped under load; its
# own context finds the new size and withdraws the object).
grep -q 'discarding cached data (upstream-size-changed)\|it was replaced under the cache; withdrawing its cache object' "$TMP/px.err" ||
  { grep -v 'debug:' "$TMP/px.err"
    fail "size change: no log line about discarding the cache"; }
head -c $((size / 2)) /dev/urandom >> "$img"       # and grows again
nbdcopy "$uri" "$TMP/copy4.img"
cmp "$img" "$TMP/copy4.img" || fail "size change: regrown image differs"
stop_nbdkit "$TMP/px.pid"
echo "3: size change: EIO past the new end, cache discarded next time"

echo "$0: OK"
