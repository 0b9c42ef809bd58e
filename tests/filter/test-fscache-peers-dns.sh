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
#  3. SRV records (fscache-peers=dns:_nbd._tcp.fleet.test, no port):
#     three nodes, each on a port of its own, listed by a DNS server
#     the test starts (dnsmasq on 127.0.0.153, the namespace's
#     resolv.conf naming it), the targets' addresses from that server
#     too: the copies are identical, each node knows the other two and
#     read from them, the origin sent the image about once, and
#     dnsmasq's log shows the nodes' SRV queries and no lookup of a
#     target's address (dnsmasq sends them with the SRV records, in the
#     additional section, and the filter takes them from there).
#  4. Hostile answers: node 2 takes its members from dnsmasq, then
#     dnsmasq is replaced by a server (tests/dns-hostile.py) that
#     answers each query with the next of eight malformed or useless
#     answers (an answer count with no answer, a record past the
#     message's end, SRV data too short, a pointer loop, a target
#     pointing past the end, garbage, only ".", a target that does not
#     resolve), nodes 3 and 4 stopped, node 2 resolving every 200 ms
#     (its cap 1 MiB, so that its reads keep missing): copies from node
#     2 until the server answered every variant once are the image,
#     node 2 lives and keeps its two members (a failed lookup keeps the
#     last list).
#
# Truth: the image (cmp), the origin's request log, the counters,
# dnsmasq's query log.

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
requires dnsmasq --version

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

node ()                         # I PORT PEERS [ARGS]: on 127.0.0.I:PORT
{
  mkdir -p -m 700 "$TMP/c$1"
  NBDKIT_STDERR="$TMP/n$1.err" start_nbdkit -P "$TMP/n$1.pid" \
    -i "127.0.0.$1" -p "$2" --filter="$FILTER" \
    nbd socket="$TMP/o.sock" fscache-key=img fscache-dir="$TMP/c$1" \
    fscache-stats="$TMP/s$1" fscache-peers="$3" \
    fscache-peer-self="nbd://127.0.0.$1:$2" fscache-generation=1 "${@:4}"
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
node 2 "$PORT" "dns:fleet.test:$PORT"; node 3 "$PORT" "dns:fleet.test:$PORT"
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
for i in 2 3 4; do node "$i" "$PORT" "dns:fleet.test:$PORT"; done
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

# ---- 3. SRV records ----
rm -rf "$TMP"/c[0-9] "$TMP"/s[0-9] "$TMP"/out[0-9]
before=$(log_read_bytes "$TMP/o.log")
declare -A P
srv=()
for i in 2 3 4; do
  P[$i]=$(free_port)
  srv+=(--srv-host="_nbd._tcp.fleet.test,n$i.fleet.test,${P[$i]},0,10"
        --host-record="n$i.fleet.test,127.0.0.$i")
done
printf 'nameserver 127.0.0.153\noptions attempts:2 timeout:2\n' \
  > "$TMP/resolv.conf"
mount --bind "$TMP/resolv.conf" /etc/resolv.conf ||
  fail "part 3: cannot bind-mount over /etc/resolv.conf"
dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
  --listen-address=127.0.0.153 --bind-interfaces --port=53 --user=root \
  --pid-file="$TMP/dns.pid" --log-queries --log-facility="$TMP/dns.log" \
  "${srv[@]}" 2>"$TMP/dns.err" &
cleanup_fn "kill $! 2>/dev/null"
wait_until test -s "$TMP/dns.pid" || fail "part 3: dnsmasq did not start"
wait_until getent hosts n4.fleet.test >/dev/null ||
  fail "part 3: the test's DNS server does not answer"
for i in 2 3 4; do node "$i" "${P[$i]}" dns:_nbd._tcp.fleet.test; done
pids=()
for i in 2 3 4; do
  timeout 120 nbdcopy "nbd://127.0.0.$i:${P[$i]}" "$TMP/out$i" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "part 3: a copy failed"; done
for i in 2 3 4; do stop_nbdkit "$TMP/n$i.pid"; done
for i in 2 3 4; do
  cmp "$img" "$TMP/out$i" || fail "part 3: node $i's copy differs"
done
got=$(( $(log_read_bytes "$TMP/o.log") - before ))
echo "part 3: SRV: origin sent $got bytes for three copies of $size;" \
     "peers read: $(for i in 2 3 4; do stat_value "$TMP/s$i" peer_read_bytes; done | tr '\n' ' ')"
for i in 2 3 4; do
  [ "$(stat_value "$TMP/s$i" peers_known)" = 2 ] ||
    fail "part 3: node $i knows $(stat_value "$TMP/s$i" peers_known) peers, not 2"
  [ "$(stat_value "$TMP/s$i" peer_read_bytes)" -gt 0 ] ||
    fail "part 3: node $i read nothing from its peers"
done
[ "$got" -le $((size * 11 / 10)) ] ||
  fail "part 3: the origin sent $got bytes, over 1.1 times the image"
grep -q "query\[SRV\] _nbd._tcp.fleet.test" "$TMP/dns.log" ||
  fail "part 3: dnsmasq saw no SRV query for the fleet's name"
# The targets' addresses came with the SRV answers (the additional
# section): no node looked one up (getent's, above, is n4's A only).
looked=$(grep -c "query\[A*\] n[23].fleet.test" "$TMP/dns.log" || true)
[ "$looked" = 0 ] ||
  fail "part 3: $looked address lookups of targets the SRV answers held"

# ---- 4. hostile answers ----
rm -rf "$TMP"/c[0-9] "$TMP"/s[0-9] "$TMP"/out[0-9]
# A cap of 1 MiB: reads keep missing, and misses look the members up.
node 2 "${P[2]}" dns:_nbd._tcp.fleet.test fscache-max-size=1M
kill "$(cat "$TMP/dns.pid")"
wait_until sh -c "! kill -0 $(cat "$TMP/dns.pid") 2>/dev/null" ||
  fail "part 4: dnsmasq did not stop"
"$PYTHON" "$top_srcdir/tests/dns-hostile.py" 127.0.0.153 "$TMP/hostile.n" \
  2>"$TMP/hostile.err" &
cleanup_fn "kill $! 2>/dev/null"
answered () { [ "$(cat "$TMP/hostile.n" 2>/dev/null || echo 0)" -ge "$1" ]; }
copies=0
until answered 8; do
  [ "$copies" -lt 20 ] ||
    fail "part 4: $copies copies and the server answered under 8 queries"
  timeout 120 nbdcopy "nbd://127.0.0.2:${P[2]}" "$TMP/out2" ||
    fail "part 4: a copy from node 2 failed"
  cmp "$img" "$TMP/out2" || fail "part 4: node 2's copy differs"
  copies=$((copies + 1))
done
kill -0 "$(cat "$TMP/n2.pid")" || fail "part 4: node 2 died"
stop_nbdkit "$TMP/n2.pid"
echo "part 4: $copies copies, $(cat "$TMP/hostile.n") hostile answers; node 2 knew" \
     "$(stat_value "$TMP/s2" peers_known) peers"
[ "$(stat_value "$TMP/s2" peers_known)" = 2 ] ||
  fail "part 4: node 2 knows $(stat_value "$TMP/s2" peers_known) peers, not its last 2"
echo "$0: OK"
