#!/usr/bin/env bash
# nbd-fscache: no "error:" line for the filter's own opens over the nbd
# plugin, and nothing else lost from the log while they open (issue 40,
# plugin/quiet.c, invariants Q1 and Q2).
#
# The nbd plugin asks nbdkit for the client's export name in every
# open; on a context the filter opens for itself nbdkit 1.32 logs
# "nbd[1]: error: no connection in this thread".
#
#  1. A writeback proxy over the nbd plugin (its writer opens a context
#     of its own): a copy, 1 MiB written and flushed, the proxy stopped
#     cleanly.  The upstream holds the write (cmp), and the proxy's
#     stderr has no line with "error" in it.
#  2. The same with nbdkit -v: every open of the nbd plugin has its two
#     debug lines in the log, as many as connections the upstream saw
#     (from a log filter there), the writer's among them (Q1: the
#     window keeps what else is written), and no "no connection" line.
#  3. A pool of 4 over the nbd plugin (fscache-upstream-connections=4),
#     readahead off, four readers of the first 16 MiB at once, so that opens of our own overlap: every
#     read right, no "error" line.
#  4. Q2, an error in the window is kept: the upstream stopped under a
#     connected client of the pool's proxy; its next read of blocks not
#     cached makes the pool open fresh contexts, which the nbd plugin
#     cannot connect: "connect: Connection refused" is in the log (only
#     an open connects, and only contexts of our own open after the
#     client's).
#
# Truth: the image and cmp, the upstream's log filter, the proxy's stderr.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

M=$((1024 * 1024))
img="$TMP/img"
make_random "$img" $((32 * M))

start_up ()
{
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" --filter=log \
    file "$TMP/up.img" logfile="$TMP/up.log"
}

# A proxy in the foreground of a disowned job, its stderr in $1.
start_proxy ()
{
  local err="$1"; shift
  : > "$err"
  NBDKIT_STDERR="$err" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" "$@"
}

px_uri="nbd+unix:///?socket=$TMP/px.sock"

errors_in ()
{
  grep -i "error" "$1"
}

# ---- 1. writeback over nbd: no error line ------------------------------------
cp "$img" "$TMP/up.img"
start_up
start_proxy "$TMP/p1.err" fscache-dir="$TMP/c1" fscache-mode=writeback
nbdcopy "$px_uri" "$TMP/copy1" || fail "part 1: the copy failed"
cmp "$TMP/copy1" "$img" || fail "part 1: the copy is not the image"
head -c $M /dev/urandom > "$TMP/patch"
"$PYTHON" - "$px_uri" "$TMP/patch" <<'EOF' || fail "part 1: the write failed"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(open(sys.argv[2], 'rb').read(), 4 * 1024 * 1024)
h.flush()
h.shutdown()
EOF
stop_nbdkit "$TMP/px.pid"
cp "$img" "$TMP/model"
dd if="$TMP/patch" of="$TMP/model" bs=$M seek=4 conv=notrunc status=none
cmp "$TMP/up.img" "$TMP/model" || fail "part 1: the upstream lacks the write"
cat "$TMP/p1.err"
if errors_in "$TMP/p1.err"; then
  fail "part 1: the proxy logged an error line for its writer's open"
fi
echo "part 1: writeback over nbd: no error line"

# ---- 2. the same with -v: what else the open writes is kept ------------------
before=$(grep -c " Connect " "$TMP/up.log")
start_proxy "$TMP/p2.err" -v fscache-dir="$TMP/c2" fscache-mode=writeback
nbdcopy "$px_uri" "$TMP/copy2" || fail "part 2: the copy failed"
cmp "$TMP/copy2" "$TMP/model" || fail "part 2: the copy is not the image"
stop_nbdkit "$TMP/px.pid"
conns=$(( $(grep -c " Connect " "$TMP/up.log") - before ))
opens=$(grep -c "nbd: open returned handle" "$TMP/p2.err")
asked=$(grep -c "nbd: open readonly=" "$TMP/p2.err")
echo "part 2: -v: the upstream saw $conns connections; the log shows" \
  "$asked opens of the nbd plugin, $opens returned"
[ "$conns" -ge 2 ] ||
  fail "part 2: only $conns connections: the writer opened none"
[ "$opens" -eq "$conns" ] && [ "$asked" -eq "$conns" ] ||
  fail "part 2: $conns connections but $asked opens and $opens returns logged"
if grep "no connection in this thread" "$TMP/p2.err"; then
  fail "part 2: nbdkit's line about the writer's open is in the log"
fi

# ---- 3. a pool of 4, four readers: opens of our own at once ------------------
start_proxy "$TMP/p3.err" fscache-dir="$TMP/c3" fscache-upstream-connections=4 \
  fscache-readahead=0
pids=()
for i in 1 2 3 4; do
  "$PYTHON" - "$px_uri" "$TMP/model" "$i" <<'EOF' &
import sys, nbd
M = 1024 * 1024
h = nbd.NBD()
h.connect_uri(sys.argv[1])
img = open(sys.argv[2], 'rb').read()
k = int(sys.argv[3])
for off in range((k - 1) * 4 * M, k * 4 * M, M):
    if h.pread(M, off) != img[off:off + M]:
        sys.exit("reader %d: wrong data at %d" % (k, off))
h.shutdown()
EOF
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "part 3: a reader failed"; done
if errors_in "$TMP/p3.err"; then
  fail "part 3: the proxy logged an error line for its pool's opens"
fi
echo "part 3: a pool of 4 over nbd, four readers: right, no error line"

# ---- 4. an error in the window is kept --------------------------------------
"$PYTHON" - "$px_uri" "$TMP/up.pid" <<'EOF'
import os, signal, sys, time, nbd
M = 1024 * 1024
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(M, 0)                   # cached already: the connection is up
pid = int(open(sys.argv[2]).read())
os.kill(pid, signal.SIGKILL)
while True:                     # until the upstream process is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.05)
try:
    h.pread(M, 24 * M)          # never read: a miss, through the pool
except nbd.Error:
    pass
EOF
stop_nbdkit "$TMP/px.pid"
grep "connect: Connection refused" "$TMP/p3.err" ||
  { cat "$TMP/p3.err"; fail "part 4: the pool's failed open left no error line"; }
echo "part 4: the pool's failed open is in the log"

echo "$0: OK"
