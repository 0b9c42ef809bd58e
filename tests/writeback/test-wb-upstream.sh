#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: trouble with the upstream never
# costs the client a write, and never loses one.
#
#  a. Outage.  The upstream (nbdkit file behind a unix socket, reached
#     by the proxy's nbd plugin) is killed (-9) while a client writes,
#     flushes and reads back continuously; it stays away until the
#     client has made 40 more writes and re-read every one of them
#     (served from the log: the upstream has none of them), then comes
#     back on the same socket, and a second client writes on.  The
#     writer must catch up: the upstream image becomes exactly the
#     clients' model (bounded wait), and the proxy says it could not
#     reach the upstream, then that it did.
#  b. Write errors.  The upstream's error filter fails 30% of its
#     pwrites and zeroes with EIO while $TMP/errors-on exists: a client's
#     writes (aligned and not), zeroes and flushes all succeed and read
#     back; the proxy says it cannot write back; the upstream does not
#     get the data while the errors last (a batch of many requests
#     hardly ever passes); once the errors stop, the upstream image
#     becomes exactly the model (nothing lost).
#  c. Backpressure.  The upstream is slower than the client (delay
#     filter, 20 ms per write; random 4 KiB writes do not merge) and the
#     proxy has fscache-dirty-max=1M: 8 MiB of writes all succeed, the
#     proxy logs "fscache-dirty-max reached; writes wait for writeback",
#     and while they run, a sampler reads the log file every 10 ms: the
#     bytes of log not yet written back (the file's end minus the tail
#     in its header) must stay within 1 MiB plus one record, and the
#     file's allocated blocks (the log punches what was written back)
#     within 1 MiB plus 40 KiB (headers, partly used pages, extent
#     tree); finally upstream == the model.
#
# Truth: the clients' own models (tests/wb-client.py, every write read
# back), the upstream image file (cmp), the proxy's stderr.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=error null --dump-plugin
requires nbdkit --filter=delay null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'
requires cmp --version

CLIENT="$top_srcdir/tests/wb-client.py"
uri="nbd+unix:///?socket=$TMP/px.sock"
size=$((16 * 1024 * 1024))

# start_proxy NAME [PARAMS]: stderr in $TMP/NAME.err, cache $TMP/NAME.
start_proxy ()
{
  NBDKIT_STDERR="$TMP/$1.err" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/$1" fscache-key=wb fscache-mode=writeback "${@:2}"
}
proxy_alive ()
{
  kill -0 "$(cat "$TMP/px.pid")" 2>/dev/null || fail "$1: the proxy died"
}
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
progress () { cat "$TMP/progress" 2>/dev/null || echo 0; }
progress_ge () { [ "$(progress)" -ge "$1" ]; }
same () { cmp -s "$1" "$2"; }

SECONDS=0

# ---- a. outage -------------------------------------------------------------
make_random "$TMP/up.img" "$size"
cp "$TMP/up.img" "$TMP/orig.img"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$TMP/up.img"
start_proxy a
rm -f "$TMP/progress"
$PYTHON "$CLIENT" "$uri" "$TMP/up.img" "$TMP/a.model" 1 \
  --stop "$TMP/a.stop" --progress "$TMP/progress" --sleep 0.01 \
  --mark "$TMP/a.down" --check "$TMP/a.check" --no-final-read \
  2>"$TMP/a.client.err" &
client=$!
cleanup_fn "kill $client 2>/dev/null"
wait_until progress_ge 20 || fail "a: the client made no progress"
kill9_nbdkit "$TMP/up.pid"
touch "$TMP/a.down"
n0=$(progress)
echo "a: upstream killed after $n0 writes"
outage_said () { grep -q 'writeback cannot reach the upstream' "$TMP/a.err"; }
wait_until progress_ge $((n0 + 40)) ||
  fail "a: writes through the proxy stalled while the upstream was away"
wait_until outage_said ||
  { cat "$TMP/a.err" >&2; fail "a: the proxy did not say it cannot reach the upstream"; }
touch "$TMP/a.check"
wait_until test -e "$TMP/a.check.done" ||
  fail "a: the client did not re-read its writes during the outage"
# The client stops while the upstream is still away (its last flush is
# local too).
touch "$TMP/a.stop"
wait $client ||
  { cat "$TMP/a.client.err" >&2; fail "a: the client failed during the outage"; }
echo "a: $(( $(progress) - n0 )) writes during the outage," \
     "$(cat "$TMP/a.check.done") re-read from the proxy"
same "$TMP/up.img" "$TMP/a.model" &&
  fail "a: the upstream has writes made while it was dead"
rm "$TMP/a.down"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$TMP/up.img"
# That client's connection lost its own upstream context with the
# outage: on it, reads of what neither the log nor the cache holds fail
# (test-fscache-outage.sh).  A second client, on a new connection,
# writes on (aligned and not) and reads everything back.
$PYTHON "$CLIENT" "$uri" "$TMP/a.model" "$TMP/a.model2" 7 --count 40 \
  --unaligned > /dev/null || fail "a: a client after the outage failed"
proxy_alive a
t0=$(date +%s.%N)
wait_long 30 same "$TMP/up.img" "$TMP/a.model2" ||
  fail "a: the upstream did not catch up with the clients' writes in 30 s"
echo "a: upstream caught up $(seconds_since "$t0") s after the last write"
grep -q 'writeback reached the upstream again' "$TMP/a.err" ||
  { cat "$TMP/a.err" >&2; fail "a: the proxy did not say the upstream is back"; }
l_out=$(grep -n 'writeback cannot reach the upstream' "$TMP/a.err" | head -1 | cut -d: -f1)
l_back=$(grep -n 'writeback reached the upstream again' "$TMP/a.err" | tail -1 | cut -d: -f1)
[ "$l_out" -lt "$l_back" ] || fail "a: 'reached again' came before 'cannot reach'"
stop_nbdkit "$TMP/px.pid"
stop_nbdkit "$TMP/up.pid"
same "$TMP/up.img" "$TMP/a.model2" || fail "a: the upstream changed after catching up"
echo "a: ok (${SECONDS}s)"

# ---- b. upstream write errors ----------------------------------------------
make_random "$TMP/up.img" "$size"
cp "$TMP/up.img" "$TMP/orig.img"
touch "$TMP/errors-on"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=error file "$TMP/up.img" error=EIO \
  error-pwrite-rate=30% error-pwrite-file="$TMP/errors-on" \
  error-zero-rate=30% error-zero-file="$TMP/errors-on"
start_proxy b
$PYTHON "$CLIENT" "$uri" "$TMP/up.img" "$TMP/b.model" 2 \
  --count 300 --units 1-16 --unaligned --zero --flush-every 10 ||
  fail "b: a write through the proxy failed while the upstream failed writes"
proxy_alive b
errors_said () { grep -q 'writeback cannot reach the upstream (Input/output error)' "$TMP/b.err"; }
wait_until errors_said ||
  { cat "$TMP/b.err" >&2; fail "b: the proxy did not say the upstream fails writes"; }
# A batch of ~300 scattered requests, each failing with 30%: the whole
# model has not reached the upstream.
same "$TMP/up.img" "$TMP/b.model" &&
  fail "b: the upstream holds all the data although it fails 30% of writes"
rm "$TMP/errors-on"
t0=$(date +%s.%N)
wait_long 30 same "$TMP/up.img" "$TMP/b.model" ||
  fail "b: the upstream did not get everything within 30 s of the errors stopping"
echo "b: upstream complete $(seconds_since "$t0") s after the errors stopped"
grep -q 'writeback reached the upstream again' "$TMP/b.err" ||
  fail "b: the proxy did not say writeback works again"
stop_nbdkit "$TMP/px.pid"
stop_nbdkit "$TMP/up.pid"
echo "b: ok (${SECONDS}s)"

# ---- c. a slow upstream: backpressure --------------------------------------
make_random "$TMP/up.img" "$size"
# The upstream's messages kept (in the foreground of a disowned job): two
# fresh clones saw it gone in this part, with nothing to say why, and
# the client's writes then waited on fscache-dirty-max for ever.
NBDKIT_STDERR="$TMP/up-c.err" start_nbdkit -P "$TMP/up.pid" \
  -U "$TMP/up.sock" --filter=delay file "$TMP/up.img" delay-write=20ms
dirty_max=$((1024 * 1024))
start_proxy c fscache-dirty-max=1M
# The sampler: every 10 ms, the log's pending bytes (file size minus the
# tail of the newest header slot; a sample is kept only if the header
# did not change while the size was read) and its allocated bytes.  A
# value over the bound counts only if the next sample is over it too:
# the writer moves the tail (waking writers) just before it punches,
# and rewinds the file (header first, then cut) when the log is empty.
cat > "$TMP/sampler.py" <<'EOF'
import glob, os, struct, sys, time
cache, stop = sys.argv[1], sys.argv[2]
bound_p, bound_a = int(sys.argv[3]), int(sys.argv[4])
trace = open(sys.argv[5], "w")          # every sample, for a post-mortem
def header(fd):
    best = None
    for slot in (0, 4096):
        b = os.pread(fd, 96, slot)
        if len(b) < 96 or b[:8] != b"FSCWLOG\0":
            continue
        gen, tail = struct.unpack_from("<Q", b, 16)[0], struct.unpack_from("<Q", b, 64)[0]
        if best is None or gen > best[0]:
            best = (gen, tail)
    return best
fd = None
n = over_p = over_a = 0
max_p = max_a = 0
prev_p = prev_a = False
while not os.path.exists(stop):
    if fd is None:
        g = glob.glob(os.path.join(cache, "objects", "*", "*.wlog"))
        if g:
            fd = os.open(g[0], os.O_RDONLY)
    if fd is not None:
        h1 = header(fd)
        st = os.fstat(fd)
        h2 = header(fd)
        if h1 and h1 == h2:
            n += 1
            p = st.st_size - h1[1]
            al = st.st_blocks * 512
            trace.write("%.3f %d %d %d %d\n" % (time.time(), st.st_size, h1[1], p, al))
            if p > bound_p and prev_p:
                over_p += 1
            if al > bound_a and prev_a:
                over_a += 1
            prev_p, prev_a = p > bound_p, al > bound_a
            if p <= bound_p:
                max_p = max(max_p, p)
            if al <= bound_a:
                max_a = max(max_a, al)
    time.sleep(0.01)
print(n, max_p, max_a, over_p, over_a)
EOF
# Pending: 1 MiB (a write waits unless it fits; one 4 KiB record, 72
# bytes of header and hash, goes into an empty log whatever its size).
# Allocated: that, the two 4 KiB header slots, the partly retired page at
# the tail and the partly written one at the head, and a few blocks of
# the file system's extent tree: 40 KiB over the bound in all.
bound_p=$((dirty_max + 4096 + 72))
bound_a=$((dirty_max + 40960))
$PYTHON "$TMP/sampler.py" "$TMP/c" "$TMP/c.stop" "$bound_p" "$bound_a" "$TMP/c.trace" \
  > "$TMP/c.samples" &
sampler=$!
cleanup_fn "touch '$TMP/c.stop'; kill $sampler 2>/dev/null"
# 2048 writes of one unit at random places in 8 MiB of the export.
t0=$(date +%s.%N)
# Bounded (2048 writes at 20 ms each, unmerged, take 41 s): a client
# that waits on a writer whose upstream is gone fails, saying so.
timeout 240 $PYTHON "$CLIENT" "$uri" "$TMP/up.img" "$TMP/c.model" 3 \
  --region 0/2 --count 2048 --units 1-1 --flush-every 256 --no-final-read ||
  { kill -0 "$(cat "$TMP/up.pid")" 2>/dev/null ||
      { echo "c: the upstream is gone; its messages:"; cat "$TMP/up-c.err"; } >&2
    fail "c: a write through the proxy failed against a slow upstream"; }
echo "c: 8 MiB written in $(seconds_since "$t0") s"
touch "$TMP/c.stop"
wait $sampler || fail "c: the sampler failed"
read -r ns max_p max_a over_p over_a < "$TMP/c.samples"
echo "c: $ns samples of the log: at most $max_p bytes pending (bound" \
     "$bound_p), $max_a bytes allocated (bound $bound_a)"
[ "$ns" -ge 20 ] || fail "c: only $ns samples of the log"
[ "$over_p" -eq 0 ] ||
  fail "c: the log held more than $bound_p bytes not written back ($over_p samples)"
[ "$over_a" -eq 0 ] ||
  fail "c: the log file took more than $bound_a bytes of disk ($over_a samples)"
[ "$max_p" -gt $((dirty_max / 2)) ] ||
  fail "c: the log never filled up ($max_p bytes): nothing was held back"
grep -q 'fscache-dirty-max reached; writes wait for writeback' "$TMP/c.err" ||
  { cat "$TMP/c.err" >&2; fail "c: the proxy did not say writes wait"; }
proxy_alive c
wait_long 30 same "$TMP/up.img" "$TMP/c.model" ||
  fail "c: the upstream did not get all the writes"
stop_nbdkit "$TMP/px.pid"
stop_nbdkit "$TMP/up.pid"
echo "c: ok (${SECONDS}s)"

echo "$0: OK (${SECONDS}s)"
