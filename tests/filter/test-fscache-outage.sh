#!/usr/bin/env bash
# nbd-fscache: the upstream server goes away and comes back.
#
#  1. A client is connected to a warm proxy when the upstream nbdkit is
#     killed (-9).  Cached blocks keep being served, identical to the
#     image; a block that is not cached fails with EIO (never wrong
#     data); the proxy stays up and logs why.
#  2. A connection opening during the outage, with the default
#     settings, is refused with a clear message; the proxy stays up.
#  3. With fscache-offline=true, a connection opening during the outage
#     is served the cached copy read-only: cached blocks identical,
#     the rest EIO, writes refused.
#  4. The upstream dies in the middle of cold reads (delay filter, so
#     requests are in flight): the client gets an error, not data.
#  5. The upstream is back: a new connection is served, the data is
#     identical to the image, and the cache is still warm: only the
#     part never cached (plus the coherency sample) is read upstream.
#  6. With nbdkit's retry filter after this one, a connection that was
#     open during an outage recovers: a miss waits while the upstream
#     is down and returns the image's bytes once it is back.
#
# Truth: the image file (cmp and per-read comparison in python), the
# upstream's request log (nbdkit --filter=log), errno of failed reads.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdinfo --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter=delay null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'

SAMPLE_MAX=32768
size=$((16 * 1024 * 1024))
warm=$((size / 2))               # [0, warm) cached, the rest never read
make_random "$TMP/upstream.img" "$size"
log="$TMP/up.log"

# start_upstream [PARAMS]: with $UP_FILTERS (e.g. --filter=delay) too.
start_upstream ()
{
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log ${UP_FILTERS:-} file "$TMP/upstream.img" logfile="$log" "$@"
}

start_proxy ()
{
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-key=outage "$@" \
    2>>"$TMP/px.err"
}
uri="nbd+unix:///?socket=$TMP/px.sock"

proxy_alive ()
{
  kill -0 "$(cat "$TMP/px.pid")" 2>/dev/null ||
    fail "$1: the proxy died (see $TMP/px.err)"
}

# The client: commands on a FIFO, one per line, each answered on
# stdout with "ok" or "FAIL reason".
#   read OFF LEN        must succeed and equal the image
#   eio OFF LEN         must fail with EIO
#   write OFF LEN       must be refused (any error)
cat > "$TMP/client.py" <<'EOF'
import errno, sys
import nbd
uri, img, fifo = sys.argv[1], sys.argv[2], sys.argv[3]
h = nbd.NBD()
h.connect_uri(uri)
def want(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)
for line in open(fifo):
    cmd, off, n = line.split()
    off, n = int(off), int(n)
    try:
        if cmd == "read":
            for o in range(off, off + n, 65536):
                k = min(65536, off + n - o)
                if h.pread(k, o) != want(o, k):
                    raise SystemExit("FAIL wrong data at %d" % o)
            print("ok", flush=True)
        elif cmd == "eio":
            try:
                h.pread(n, off)
                print("FAIL read at %d+%d succeeded" % (off, n), flush=True)
            except nbd.Error as e:
                # libnbd names the errno ("EIO"); older bindings gave the number.
                print("ok" if e.errno in ("EIO", errno.EIO) else
                      "FAIL errno %s, not EIO: %s" % (e.errno, e), flush=True)
        elif cmd == "write":
            try:
                h.pwrite(b"x" * n, off)
                print("FAIL write at %d succeeded" % off, flush=True)
            except nbd.Error as e:
                print("ok", flush=True)
    except SystemExit as e:
        print(e, flush=True)
EOF

# session NAME: start a client on a fresh FIFO; ask NAME CMD... sends
# one command and checks the answer.
session ()
{
  rm -f "$TMP/$1.fifo" "$TMP/$1.out"
  mkfifo "$TMP/$1.fifo"
  python3 "$TMP/client.py" "$uri" "$TMP/upstream.img" "$TMP/$1.fifo" \
    > "$TMP/$1.out" 2>&1 &
  eval "${1}_pid=$!"
  exec {fd}>"$TMP/$1.fifo"
  eval "${1}_fd=$fd"
}
lines_at_least () { [ "$(wc -l < "$1")" -ge "$2" ]; }
ask ()
{
  local name="$1" fd n
  shift
  eval "fd=\$${name}_fd"
  n=$(( $(wc -l < "$TMP/$name.out") + 1 ))
  echo "$*" >&"$fd"
  wait_until lines_at_least "$TMP/$name.out" "$n" ||
    fail "$name: no answer to '$*'"
  local ans
  ans=$(sed -n "${n}p" "$TMP/$name.out")
  [ "$ans" = ok ] || fail "$name: '$*': $ans ($(cat "$TMP/$name.out"))"
}
end_session ()
{
  local fd pid
  eval "fd=\$${1}_fd pid=\$${1}_pid"
  exec {fd}>&-
  wait "$pid" || fail "$1: client exited with an error: $(cat "$TMP/$1.out")"
}

# ---- warm up, then the outage with a client connected -------------------
start_upstream
start_proxy
session c1
ask c1 read 0 "$warm"                           # fills [0, warm)
kill9_nbdkit "$TMP/up.pid"
echo "upstream killed with a client connected"
ask c1 read 0 "$warm"
ask c1 read $((warm / 3)) 100000
# Readahead (4M by default) may have cached up to warm + 4M: ask past it.
cold=$((size - 2 * 1024 * 1024))
ask c1 eio "$cold" 65536
ask c1 eio $((size - 4096)) 4096
ask c1 read 4096 65536
end_session c1
proxy_alive "outage, connected client"
echo "1: cached blocks served, misses EIO"

# ---- a connection opening during the outage (default) -------------------
if nbdinfo --size "$uri" > "$TMP/nbdinfo.out" 2>&1; then
  fail "a connection opened during the outage succeeded without" \
       "fscache-offline: $(cat "$TMP/nbdinfo.out")"
fi
grep -q 'cannot open the upstream' "$TMP/px.err" ||
  fail "no log line saying the upstream could not be opened"
proxy_alive "outage, new connection"
echo "2: new connection refused: $(grep -m1 'cannot open the upstream' "$TMP/px.err")"

# ---- fscache-offline=true: served read-only from the cache ------------
stop_nbdkit "$TMP/px.pid"
start_proxy fscache-offline=true
ro=$(nbdinfo --json "$uri" | python3 -c '
import json, sys
e = json.load(sys.stdin)["exports"][0]
print(e["is_read_only"], e["export-size"])')
[ "$ro" = "True $size" ] ||
  fail "offline: nbdinfo says read-only/size '$ro', expected 'True $size'"
session c2
ask c2 read 0 "$warm"
ask c2 eio "$cold" 4096
ask c2 write 0 4096
ask c2 read 0 65536
end_session c2
grep -q 'serving the cached copy read-only' "$TMP/px.err" ||
  fail "offline: no log line saying the cached copy is served"
proxy_alive "offline"
echo "3: offline: cached copy served read-only, misses EIO, writes refused"
stop_nbdkit "$TMP/px.pid"

# ---- the upstream dies with cold reads in flight --------------------------
UP_FILTERS=--filter=delay start_upstream delay-read=300ms
start_proxy fscache-readahead=0
n0=$(grep -c ' Read id=' "$log" || true)
nbdcopy --requests=4 "$uri" "$TMP/midway.img" 2>"$TMP/midway.err" &
copy=$!
# Wait until cold reads are in flight upstream, then kill it.
reads_beyond () { [ "$(grep -c ' Read id=' "$log")" -gt "$1" ]; }
wait_until reads_beyond $((n0 + 12)) ||
  fail "no cold reads reached the upstream"
kill9_nbdkit "$TMP/up.pid"
if wait "$copy"; then
  fail "nbdcopy succeeded although the upstream died mid-copy"
fi
proxy_alive "upstream died mid-request"
echo "4: upstream died mid-copy: $(head -c 200 "$TMP/midway.err")"
stop_nbdkit "$TMP/px.pid"

# ---- the upstream is back -------------------------------------------------
start_upstream
start_proxy
b0=$(log_read_bytes "$log")
nbdcopy "$uri" "$TMP/after.img"
cmp "$TMP/upstream.img" "$TMP/after.img" ||
  fail "after the outage the data differs from the image"
b1=$(log_read_bytes "$log")
got=$((b1 - b0))
echo "5: upstream back: $got bytes read upstream for a full read" \
     "($warm were cached before the outage)"
# Blocks filled before the last kill may be cached too: at most the
# uncached half, plus the sample, and at least the sample... never the
# half that was warm before the outage.
[ "$got" -le $((size - warm + SAMPLE_MAX)) ] ||
  fail "after the outage $got bytes were read upstream: the warm half" \
       "($warm bytes) was not kept"
stop_nbdkit "$TMP/px.pid"

# ---- 6. the retry filter reconnects an open connection ---------------
requires nbdkit --filter=retry null --dump-plugin
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" -v --log=stderr \
  --filter="$FILTER" --filter=retry nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache6" fscache-key=outage retries=20 retry-delay=1 \
  retry-exponential=no 2>"$TMP/px-retry.err"
session c3
ask c3 read 0 65536          # a fresh cache: only this block is cached
kill9_nbdkit "$TMP/up.pid"
# A miss now waits in the retry filter (its log says so), and returns
# the right bytes once the upstream is back.
echo "read $((size - 65536)) 65536" >&"$c3_fd"
retrying () { grep -q 'retry 1' "$TMP/px-retry.err"; }
wait_until retrying || fail "retry: the retry filter never retried"
# (Without the client's FIFO: an upstream holding it open would keep
# the client from ever seeing the end of its commands.)
start_upstream {c3_fd}>&-
wait_until lines_at_least "$TMP/c3.out" 2 || fail "retry: no answer"
[ "$(sed -n 2p "$TMP/c3.out")" = ok ] ||
  fail "retry: the read after the outage: $(cat "$TMP/c3.out")"
end_session c3
stop_nbdkit "$TMP/px.pid"
echo "6: retry filter: the open connection recovered, read identical"
echo "$0: OK"
