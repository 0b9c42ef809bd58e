#!/usr/bin/env bash
# nbd-fscache: the pool of upstream contexts for serial plugins
# (fscache-upstream-connections, plugin/pool.c).
#
#  1. The overlap-detecting serial plugin (tests/serial-plugin.sh,
#     serialize_requests, 2 ms per read), the pool at 0 (none), 1, 4
#     and 16, a fresh cache each time:
#     a. one client connection copies the export (nbdcopy, one
#        connection, requests of 4 MiB, which the pool reads in 1 MiB
#        pieces side by side whatever readahead does;
#        NBD_FSCACHE_TEST_BUDGET=0, so that a loaded machine's disk
#        pauses no readahead nor skips a fill): cmp-identical, and the
#        plugin's reads overlap in time across its connections only
#        with a pool of several (the most at once: 1 with 0 and 1, at
#        least 2 with 4 and 16);
#     b. 4 client connections at once (nbdcopy --connections=4, and two
#        sequential 64 KiB readers that start readahead), then
#        qemu-img compare: identical.
#     The plugin's overlap log stays empty throughout: each context
#     carries one call at a time.
#  2. An upstream that accepts only 2 connections (nbdkit's limit
#     filter in front of it, reached through the nbd plugin under
#     noparallel serialize=requests): the copy is identical, no client
#     error, and the proxy logs exactly one line that the pool goes on
#     with fewer.
#  3. The serial plugin in a process of its own, the filter in front
#     of it over NBD (the nbd plugin: parallel, so one client
#     connection's queue depth reaches the filter), one client
#     connection with 16 random 4 KiB reads in flight, each checked
#     against the image: without fscache-upstream-connections the pool
#     stays off over a parallel plugin (at most 1 read at once at the
#     serial server, through the front's one connection); given, the
#     reads overlap across the server's connections (at least 2 at
#     once), and its overlap log stays empty.
#  4. nginx through the curl plugin (serialize_requests in nbdkit
#     1.32), with the pool: the copy is identical, nginx served it in
#     range requests, and the upstream reads overlapped in time (a log
#     filter between the cache and curl: nginx's own $request_time
#     reads 0.000 for a 1 MiB response on loopback, rate-limited or
#     not, so its log cannot show overlap).  (Skipped, after parts 1 to 3 passed,
#     without nginx or the curl plugin.)
#  5. The default pool over curl is 16 (issue 42: what the measurements
#     say): with 200 ms per read, more than 8 reads and at most 16 are
#     in flight at once.  (Not 10 ms: the pool opens its contexts one
#     at a time (invariant U1), each a HEAD at nginx, and the readers
#     start up to 10 ms apart; on a loaded 2-core CI machine the last
#     reads began after the first had ended, and 6 were seen at once.)
#  6. Contexts of our own opened at once (invariant U1 of
#     plugin/upstream.c): RACE_ROUNDS fresh proxies (16) whose pool
#     opens 16 contexts at once through the exportname and log filters,
#     under AddressSanitizer's allocator: every read right, no report.
#
# Truth: the image (cmp, qemu-img compare), the serial plugin's own
# overlap log and call times, nginx's access log ($msec, $request_time).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires qemu-img --version
requires flock --version
requires nbdkit sh --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=limit null --dump-plugin
requires nbdkit --filter=noparallel null --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

plugin="$top_srcdir/tests/serial-plugin.sh"
size=$((16 * 1024 * 1024))
img="$TMP/img"
make_random "$img" "$size"

# most_at_once CALLS: the most reads in flight at once, from the serial
# plugin's call log (start and end in ns per read).
most_at_once ()
{
  $PYTHON - "$1" <<'EOF'
import sys
ev = []
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "pread" and len(f) >= 6:
        ev += [(int(f[4]), 1), (int(f[5]), -1)]
ev.sort(key=lambda e: (e[0], e[1]))
cur = most = 0
for _, d in ev:
    cur += d
    most = max(most, cur)
print(most)
EOF
}

seq_reader ()                   # URI: 64 KiB reads, start to end, checked
{
  $PYTHON - "$1" "$img" <<'EOF'
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
data = open(sys.argv[2], "rb").read()
for o in range(0, len(data), 65536):
    if h.pread(65536, o) != data[o:o + 65536]:
        sys.exit("seq reader: wrong data at %d" % o)
EOF
}

# ---- 1. the serial plugin -------------------------------------------------
export SERIAL_IMG="$img" SERIAL_MODEL=serialize_requests
export NBD_FSCACHE_TEST_BUDGET=0
for n in 0 1 4 16; do
  export SERIAL_DIR="$TMP/sp$n"
  mkdir -p "$SERIAL_DIR"
  uri="nbd+unix:///?socket=$TMP/px$n.sock"
  start_nbdkit -P "$TMP/px$n.pid" -U "$TMP/px$n.sock" --filter="$FILTER" \
    sh "$plugin" fscache-dir="$TMP/cache$n" fscache-upstream-connections=$n
  # a. one connection
  nbdcopy --connections=1 --requests=8 --request-size=4194304 "$uri" \
    "$TMP/copy$n"
  cmp "$img" "$TMP/copy$n" || fail "pool $n: the copy differs"
  most=$(most_at_once "$SERIAL_DIR/calls")
  echo "pool $n: one client connection, at most $most upstream reads at once"
  case $n in
    0|1) [ "$most" -le 1 ] ||
           fail "pool $n: $most reads at once from one connection" ;;
    *) [ "$most" -ge 2 ] ||
         fail "pool $n: the reads never overlapped: no pool at work" ;;
  esac
  stop_nbdkit "$TMP/px$n.pid"
  # b. four connections, fresh cache
  rm -rf "$TMP/cache$n"
  start_nbdkit -P "$TMP/px$n.pid" -U "$TMP/px$n.sock" --filter="$FILTER" \
    sh "$plugin" fscache-dir="$TMP/cache$n" fscache-upstream-connections=$n
  nbdcopy --connections=4 "$uri" "$TMP/copy4-$n" & c1=$!
  seq_reader "$uri" & r1=$!
  seq_reader "$uri" & r2=$!
  wait "$c1" || fail "pool $n: nbdcopy --connections=4 failed"
  wait "$r1" || fail "pool $n: a sequential reader failed"
  wait "$r2" || fail "pool $n: a sequential reader failed"
  cmp "$img" "$TMP/copy4-$n" || fail "pool $n: the 4-connection copy differs"
  qemu-img compare -f raw -F raw "$img" "$uri" ||
    fail "pool $n: qemu-img compare"
  stop_nbdkit "$TMP/px$n.pid"
  if [ -s "$SERIAL_DIR/overlaps" ]; then
    cat "$SERIAL_DIR/overlaps" >&2
    fail "pool $n: calls overlapped on one upstream connection"
  fi
done

# ---- 2. an upstream that accepts only 2 connections ----------------------
start_nbdkit -P "$TMP/lim.pid" -U "$TMP/lim.sock" --filter=limit \
  file "$img" limit=2
NBDKIT_STDERR="$TMP/lim-px.err" start_nbdkit -P "$TMP/lp.pid" \
  -U "$TMP/lp.sock" --filter="$FILTER" --filter=noparallel \
  nbd socket="$TMP/lim.sock" serialize=requests \
  fscache-dir="$TMP/cache-lim" fscache-upstream-connections=4
nbdcopy --connections=1 --requests=8 "nbd+unix:///?socket=$TMP/lp.sock" \
  "$TMP/copy-lim" || fail "limit 2: the client got an error"
cmp "$img" "$TMP/copy-lim" || fail "limit 2: the copy differs"
stop_nbdkit "$TMP/lp.pid"
said=$(grep -c "the upstream refused another connection; the pool goes on" \
         "$TMP/lim-px.err" || true)
echo "limit 2: $said log line(s) about the refused connection"
[ "$said" -eq 1 ] || fail "limit 2: $said lines about the refusal, not 1"

# ---- 3. the serial plugin behind the nbd plugin ---------------------------
rand_reader ()                  # URI: 16 random 4 KiB reads in flight, checked
{
  $PYTHON - "$1" "$img" <<'EOF'
import random, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
data = open(sys.argv[2], "rb").read()
rnd = random.Random(27)
offs = [rnd.randrange(len(data) // 4096) * 4096 for _ in range(300)]
flight = []
while offs or flight:
    while offs and len(flight) < 16:
        o = offs.pop()
        b = nbd.Buffer(4096)
        flight.append((h.aio_pread(b, o), b, o))
    h.poll(-1)
    for t in flight[:]:
        if h.aio_command_completed(t[0]):
            if t[1].to_bytearray() != data[t[2]:t[2] + 4096]:
                sys.exit("random reader: wrong data at %d" % t[2])
            flight.remove(t)
EOF
}
for given in no yes; do
  export SERIAL_DIR="$TMP/split-$given"
  mkdir -p "$SERIAL_DIR"
  start_nbdkit -P "$TMP/back.pid" -U "$TMP/back.sock" sh "$plugin"
  pool=(); [ $given = yes ] && pool=(fscache-upstream-connections=8)
  start_nbdkit -P "$TMP/front.pid" -U "$TMP/front.sock" --filter="$FILTER" \
    nbd socket="$TMP/back.sock" fscache-dir="$TMP/cache-split-$given" \
    "${pool[@]}"
  rand_reader "nbd+unix:///?socket=$TMP/front.sock" ||
    fail "split, pool given: $given: the random reader failed"
  stop_nbdkit "$TMP/front.pid"
  stop_nbdkit "$TMP/back.pid"
  most=$(most_at_once "$SERIAL_DIR/calls")
  echo "split, fscache-upstream-connections given: $given:" \
       "at most $most reads at once at the serial server"
  if [ $given = no ]; then
    [ "$most" -le 1 ] ||
      fail "split: a pool over the nbd plugin without being asked ($most)"
  else
    [ "$most" -ge 2 ] ||
      fail "split: the pool was asked for, the reads never overlapped"
  fi
  if [ -s "$SERIAL_DIR/overlaps" ]; then
    cat "$SERIAL_DIR/overlaps" >&2
    fail "split: calls overlapped on one connection of the serial server"
  fi
done

# ---- 4. nginx and the curl plugin ----------------------------------------
if nginx -v 2>/dev/null && nbdkit curl --dump-plugin >/dev/null 2>&1; then :
else
  echo "$0: SKIP: part 3 needs nginx and nbdkit's curl plugin" >&2
  exit 77
fi
mkdir -p "$TMP/www"
cp "$img" "$TMP/www/img.raw"
start_nginx "$TMP/www" '$status $request_method $uri $body_bytes_sent'
# The log filter between the cache and curl sees each upstream read
# start and end, with its connection.
start_nbdkit -P "$TMP/hp.pid" -U "$TMP/hp.sock" --filter="$FILTER" \
  --filter=log curl "http://127.0.0.1:$PORT/img.raw" logfile="$TMP/curl.log" \
  fscache-dir="$TMP/cache-http" fscache-upstream-connections=4
nbdcopy --connections=1 --requests=8 --request-size=4194304 \
  "nbd+unix:///?socket=$TMP/hp.sock" "$TMP/copy-http"
cmp "$img" "$TMP/copy-http" || fail "curl: the copy differs"
stop_nbdkit "$TMP/hp.pid"
most=$(log_reads_at_once "$TMP/curl.log")
gets=$(grep -c '^206 GET /img.raw' "$TMP/access.log" || true)
echo "curl: $gets range GETs at nginx; at most $most upstream reads in" \
     "flight at once (log filter)"
[ "$gets" -gt 0 ] || fail "curl: nginx served no range request"
[ "$most" -ge 2 ] || fail "curl: the upstream reads never overlapped"

# four_at_once SOCK WHAT: four client connections to SOCK, each
# reading 4 MiB of the image in one request at the same moment (a read
# is cut in 1 MiB chunks over the pool, at most 4 MiB at a time per
# request: 16 chunks at once), each checked; 0 if all four read right.
four_at_once ()
{
  local sock=$1 what=$2 q p bad=0 pids=()
  rm -f "$TMP"/go[0-9] "$TMP/go"
  for q in 0 1 2 3; do
    $PYTHON - "nbd+unix:///?socket=$sock" "$img" $q "$TMP" <<'EOF' &
import os, sys, time, nbd
uri, img, q, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
h = nbd.NBD()
h.connect_uri(uri)
open(os.path.join(tmp, "go%d" % q), "w").close()
while not os.path.exists(os.path.join(tmp, "go")):
    time.sleep(0.01)
o = q << 22
if h.pread(1 << 22, o) != open(img, "rb").read()[o:o + (1 << 22)]:
    sys.exit("wrong data at %d" % o)
EOF
    pids+=($!)
  done
  wait_until test -e "$TMP/go3" -a -e "$TMP/go2" -a -e "$TMP/go1" \
    -a -e "$TMP/go0" || fail "$what: the readers did not connect"
  touch "$TMP/go"
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  return $bad
}

# ---- 5. the default pool over curl is 16 ---------------------------------
start_nbdkit -P "$TMP/hd.pid" -U "$TMP/hd.sock" --filter="$FILTER" \
  --filter=log --filter=delay curl "http://127.0.0.1:$PORT/img.raw" \
  logfile="$TMP/curl16.log" rdelay=200ms fscache-dir="$TMP/cache-http16"
four_at_once "$TMP/hd.sock" "curl, default pool" ||
  fail "curl, default pool: a reader failed"
stop_nbdkit "$TMP/hd.pid"
most=$(log_reads_at_once "$TMP/curl16.log")
echo "curl, default pool: at most $most upstream reads in flight at once"
[ "$most" -gt 8 ] && [ "$most" -le 16 ] ||
  fail "curl, default pool: $most reads at once, not a pool of 16"

# ---- 6. contexts of our own opened at once (invariant U1) ----------------
# A fresh proxy's pool opens 16 contexts at once (four_at_once), through
# the exportname and log filters, whose .open interns a string with no
# connection to hold it: nbdkit 1.32 appends it to one global vector
# without a lock.  Opened in parallel, two reallocs of it raced and
# nbdkit died (a double free: part 5 failed so in CI, over curl).
# nbdkit runs with AddressSanitizer's allocator preloaded (gcc's
# libasan, which the build has), which stops at the first double free
# where glibc's often goes on: without the lock 6 of 20 rounds failed
# so, with it none; 16 rounds miss the race with a chance of 0.7^16.
# Every round: the reads right, and no report.
asan=$(gcc -print-file-name=libasan.so 2>/dev/null || true)
[ -e "$asan" ] || fail "part 6: gcc's libasan.so not found"
RACE_ROUNDS=${RACE_ROUNDS:-16}
for round in $(seq 1 "$RACE_ROUNDS"); do
  rm -rf "$TMP/cache-race" "$TMP/asan".*
  LD_PRELOAD="$asan" \
  ASAN_OPTIONS="detect_leaks=0:symbolize=0:log_path=$TMP/asan" \
  NBDKIT_STDERR="$TMP/race.err" start_nbdkit -P "$TMP/race.pid" \
    -U "$TMP/race.sock" --filter="$FILTER" --filter=exportname \
    --filter=log file "$img" logfile=/dev/null \
    fscache-dir="$TMP/cache-race" fscache-upstream-connections=16 \
    fscache-readahead=0
  bad=0
  four_at_once "$TMP/race.sock" "opens at once, round $round" || bad=1
  # Gone before the next round removes its cache: a disowned job
  # (NBDKIT_STDERR, tests/functions.sh), which "wait" does not wait
  # for; a fresh clone's round removed the cache while this proxy was
  # still closing into it ("rm: cannot remove ... Directory not empty").
  stop_nbdkit "$TMP/race.pid" || fail "opens at once, round $round: nbdkit did not exit"
  if [ "$bad" = 1 ] || ls "$TMP/asan".* >/dev/null 2>&1; then
    # Unsymbolized (module+offset, for addr2line): a fresh clone's
    # report was cut after its first line while it symbolized.
    cat "$TMP/asan".* 2>/dev/null | head -60 >&2
    fail "opens at once, round $round: a read failed or nbdkit's allocator reported an error"
  fi
done
echo "opens at once: $RACE_ROUNDS proxies, 16 contexts opened at once each, no error"

echo "$0: OK"
