#!/usr/bin/env bash
# nbd-fscache: a fleet's members from a name (fscache-peers=dns:NAME:PORT,
# issue 41).  The test runs in a mount namespace of its own, where a
# hosts file it writes is bind-mounted over /etc/hosts: the resolver
# the nodes use (glibc's NSS, files first) is the test's, and nothing
# outside sees the name.  Nodes serve TCP on 127.0.0.2, .3 and .4 (all
# loopback), on one port.
#
#  1. fleet.test has two addresses: both nodes copy the image at once,
#     identical, the origin sent it about once, and each node read
#     from the other.
#  2. A third address is added to the name (the hosts file edited in
#     place) and its node started: its copy is identical, it read from
#     the other two, and it counts 2 peers (peers_known); the origin
#     sent it only the ranges it now ranks first for (rendezvous moves
#     a third of them to the new member: under 0.7 of the image, and
#     its peers at least 0.3, for 64 ranges whatever the scores).
#
# Truth: the image (cmp), the origin's request log, the counters.

if [ -z "${FSCACHE_DNS_NS:-}" ]; then
  if ! command -v unshare >/dev/null ||
     ! unshare -m --propagation private true 2>/dev/null; then
    echo "$0: SKIP: requires a mount namespace (unshare -m, as root)"
    exit 77
  fi
  FSCACHE_DNS_NS=1 exec unshare -m --propagation private "$0" "$@"
fi

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
requires getent --version

MiB=$((1024 * 1024))
size=$((64 * MiB))      # 64 ranges: the new member's share varies little
img="$TMP/img"
make_random "$img" "$size"
export NBD_FSCACHE_TEST_BUDGET=0 NBD_FSCACHE_TEST_PEER_DNS_MS=200

printf '127.0.0.1 localhost\n127.0.0.2 fleet.test\n127.0.0.3 fleet.test\n' \
  > "$TMP/hosts"
mount --bind "$TMP/hosts" /etc/hosts ||
  { echo "$0: SKIP: cannot bind-mount over /etc/hosts"; exit 77; }
[ "$(getent ahostsv4 fleet.test | awk '$2 == "STREAM"' | wc -l)" = 2 ] ||
  fail "the test's resolver does not see its hosts file"

NBDKIT_STDERR="$TMP/o.err" start_nbdkit -P "$TMP/o.pid" -U "$TMP/o.sock" \
  --filter=log file "$img" logfile="$TMP/o.log"
PORT=$(free_port)

node ()                         # I: on 127.0.0.I
{
  mkdir -p -m 700 "$TMP/c$1"
  NBDKIT_STDERR="$TMP/n$1.err" start_nbdkit -P "$TMP/n$1.pid" \
    -i "127.0.0.$1" -p "$PORT" --filter="$FILTER" \
    nbd socket="$TMP/o.sock" fscache-key=img fscache-dir="$TMP/c$1" \
    fscache-stats="$TMP/s$1" fscache-peers="dns:fleet.test:$PORT" \
    fscache-peer-self="nbd://127.0.0.$1:$PORT" fscache-generation=1
}
copy ()
{
  local i pids=()
  for i in "$@"; do
    timeout 120 nbdcopy "nbd://127.0.0.$i:$PORT" "$TMP/out$i" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a copy failed"; done
  for i in "$@"; do
    cmp "$img" "$TMP/out$i" || fail "node $i's copy differs"
  done
}

# ---- 1. two addresses ----
node 2; node 3
copy 2 3
stop_nbdkit "$TMP/n2.pid"; stop_nbdkit "$TMP/n3.pid"
got=$(log_read_bytes "$TMP/o.log")
echo "part 1: origin sent $got bytes for two copies of $size;" \
     "node 2 read $(stat_value "$TMP/s2" peer_read_bytes) from its peer," \
     "node 3 $(stat_value "$TMP/s3" peer_read_bytes)"
[ "$got" -le $((size * 11 / 10)) ] ||
  fail "part 1: the origin sent $got bytes, over 1.1 times the image"
for i in 2 3; do
  [ "$(stat_value "$TMP/s$i" peer_read_bytes)" -gt 0 ] ||
    fail "part 1: node $i read nothing from its peer"
done

# ---- 2. a third address ----
before=$got
echo '127.0.0.4 fleet.test' >> "$TMP/hosts"
node 2; node 3; node 4
copy 4
stop_nbdkit "$TMP/n2.pid"; stop_nbdkit "$TMP/n3.pid"; stop_nbdkit "$TMP/n4.pid"
got=$(( $(log_read_bytes "$TMP/o.log") - before ))
pr=$(stat_value "$TMP/s4" peer_read_bytes)
known=$(stat_value "$TMP/s4" peers_known)
echo "part 2: node 4 read $pr bytes from peers and knows $known; the" \
     "origin sent it $got bytes"
[ "$known" = 2 ] || fail "part 2: node 4 knows $known peers, not 2"
[ "$pr" -ge $((size * 3 / 10)) ] ||
  fail "part 2: node 4 read only $pr bytes from its peers"
[ "$got" -le $((size * 7 / 10)) ] ||
  fail "part 2: the origin sent node 4 $got bytes, over 0.7 of the image"
echo "$0: OK"
