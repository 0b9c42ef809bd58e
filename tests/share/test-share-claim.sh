#!/usr/bin/env bash
# nbd-fscache: a block several processes miss at the same moment is
# fetched once for the whole host, and no process reads a block that
# another one is still filling.
#
# Four proxy processes on one cache directory and key, in front of one
# slow upstream (nbdkit file + delay filter, 100 ms per read, + log
# filter).  Process 1 opens the object first (a held connection): it
# owns it, the others join it.  Eight clients, two per process, read
# the same ranges at the same moment (a barrier before each range):
# aligned, unaligned, straddling 64 KiB blocks, a few bytes across a
# block boundary.
#
#  1. Claims on: every client gets the image's bytes, and the
#     upstream's log shows each block (or, for the reads that cover
#     only part of a block, each 4 KiB piece) read exactly once: the
#     bytes read are exactly what the ranges need, once (the sum that
#     tests/filter/test-fscache-dedup.sh checks for one process).
#  2. The same, on a new cache, with NBD_FSCACHE_TEST_NO_CLAIM=1 in the
#     owner: a read that finds a block being fetched by another fetches
#     it again instead of waiting.  The data must still be right, and
#     the check of part 1 must see it: more bytes read upstream than
#     the ranges need.  This shows that part 1 can fail.
#
# Truth: the image, the upstream's log filter (bytes of every read).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log --filter=delay null --dump-plugin
requires python3 -c 'import nbd'
requires test -r "$FILTER"

SIZE=$((8 * 1024 * 1024))
NPROC=4
img="$TMP/up.img"
log="$TMP/up.log"
make_random "$img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log --filter=delay file "$img" \
  logfile="$log" delay-read=100ms

cat > "$TMP/clients.py" <<'PY'
import nbd, sys, threading
img, socks = sys.argv[1], sys.argv[2:]
data = open(img, "rb").read()
# Each range is read by every client at once.
ranges = [(0, 1 << 20), (3 << 20, 65536), ((5 << 20) + 1000, 200000),
          ((7 << 20) + 65535, 2)]
errors = []
def client(sock, barrier):
    try:
        h = nbd.NBD()
        h.connect_unix(sock)
        for off, n in ranges:
            barrier.wait()
            if h.pread(n, off) != data[off:off + n]:
                errors.append("%s: wrong data at %d+%d" % (sock, off, n))
        h.shutdown()
    except Exception as e:
        errors.append("%s: %s" % (sock, e))
        barrier.abort()
clients = [s for s in socks for _ in range(2)]
barrier = threading.Barrier(len(clients))
ts = [threading.Thread(target=client, args=(s, barrier)) for s in clients]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    sys.exit("\n".join(errors))
PY

# What the ranges need, once: 16 + 1 whole 64K blocks, then the 4K
# pieces of 200000 bytes at 1000 into a block (50 pieces, over four
# blocks) and of 2 bytes across a block boundary (2 pieces).  Random
# reads, far apart (as in test-fscache-dedup.sh).
expected=$(( (16 + 1) * 65536 + (50 + 2) * 4096 ))

# run PASS [ENV=VALUE for the owner]: upstream bytes of the clients'
# reads, in $got.
run ()
{
  local pass="$1" n socks=()
  shift
  for (( n=1; n<=NPROC; n++ )); do
    # The owner (1) with the environment given, the others without
    # (a subshell: start_nbdkit's cleanup is registered below).
    ( [ $n -eq 1 ] && [ $# -gt 0 ] && export "$@"
      start_nbdkit -P "$TMP/$pass.px$n.pid" -U "$TMP/$pass.px$n.sock" \
        -v --log=stderr --filter="$FILTER" nbd socket="$TMP/up.sock" \
        fscache-dir="$TMP/cache.$pass" fscache-key=claim \
        fscache-validate=size fscache-readahead=0 \
        fscache-stats="$TMP/$pass.px$n.stats" 2>"$TMP/$pass.px$n.err" )
    cleanup_fn "kill -9 $(cat "$TMP/$pass.px$n.pid") 2>/dev/null"
    socks+=("$TMP/$pass.px$n.sock")
  done
  # The owner: process 1 opens the object first, and keeps it open.
  # Its read is of the last 4 KiB, which no range touches.
  python3 -c '
import nbd, os, sys, time
h = nbd.NBD(); h.connect_unix(sys.argv[1])
h.pread(4096, (8 << 20) - 4096)
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
h.shutdown()
' "${socks[0]}" "$TMP/$pass.held" "$TMP/$pass.release" &
  local holder=$!
  cleanup_fn "touch '$TMP/$pass.release'; kill $holder 2>/dev/null"
  wait_until test -e "$TMP/$pass.held" || fail "$pass: the holder did not read"
  local b0
  b0=$(log_read_bytes "$log")
  python3 "$TMP/clients.py" "$img" "${socks[@]}" ||
    fail "$pass: a client read wrong data or failed (above)"
  got=$(( $(log_read_bytes "$log") - b0 ))
  touch "$TMP/$pass.release"
  wait $holder || fail "$pass: the holder failed"
  for (( n=1; n<=NPROC; n++ )); do
    stop_nbdkit "$TMP/$pass.px$n.pid"
    echo "  px$n: $(grep -E '^(dedup_waits|objects_busy|share_[a-z]+) ' \
                     "$TMP/$pass.px$n.stats" | tr '\n' ' ')"
  done
}

run claims
echo "1. claims: $got bytes read upstream, expected exactly $expected"
[ "$got" -eq "$expected" ] ||
  fail "1. claims: $got bytes read upstream instead of $expected: a block" \
       "missed by several processes at once was fetched more than once"

run noclaim NBD_FSCACHE_TEST_NO_CLAIM=1
echo "2. the owner without claims: $got bytes read upstream (once: $expected)"
[ "$got" -gt "$expected" ] ||
  fail "2. without claims in the owner the upstream still read each block" \
       "once ($got bytes): the check of part 1 cannot tell (or the knob" \
       "NBD_FSCACHE_TEST_NO_CLAIM does nothing)"
echo "$0: PASS"
