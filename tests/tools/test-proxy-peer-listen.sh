#!/usr/bin/env bash
# nbd-fscache-proxy's peer listener (issue 43): peer-listen=ADDRESS:PORT
# runs, beside the proxy's own socket, a read-only, TLS-only process on
# the fleet's network that serves peers' connections alone
# (fscache-peer-only) and joins the proxy's objects through the host's
# sharing, so that a node serves its fleet without putting its clients'
# exports on the network.
#
#  1. --dry-run: the listener is nbdkit -r --tls=require with the
#     conf's key, on ADDRESS:PORT, fscache-peer-only, its stats in
#     FILE.peer, one thread per connection (-t 1) on Debian 12's
#     nbdkit; a conf with peer-listen= and no TLS is refused.
#  2. Node 1 is the proxy (peer-listen on 127.0.0.1:P, a PSK); a client
#     copies the image through its Unix socket.  Node 2, an nbdkit with
#     the filter in the same fleet, then copies it: its copy is the
#     image, and it read ranges from node 1's listener (peer_read_bytes;
#     the listener's own counters say it served them), which had them
#     from the proxy's cache (the origin's log: no second read of them).
#  3. At the listener: a client with the key asking for the export
#     itself is refused (fscache-peer-only), a write through a peer
#     export fails (read-only), and a client without TLS gets nothing.
#
# Truth: the image (cmp), the origin's request log, counters, exit codes.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter=log null --dump-plugin
requires setpriv --version
requires "$PYTHON" -c 'import nbd'
requires test -r "$FILTER"
proxy="$top_builddir/tools/nbd-fscache-proxy/nbd-fscache-proxy"
requires test -x "$proxy"

MiB=$((1024 * 1024))
size=$((16 * MiB))
make_random "$TMP/img" "$size"
printf 'fleet:%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
  > "$TMP/psk"
chmod 600 "$TMP/psk"
NBDKIT_STDERR="$TMP/o.err" start_nbdkit -P "$TMP/o.pid" -U "$TMP/o.sock" \
  --filter=log file "$TMP/img" logfile="$TMP/o.log"
P=$(free_port)
Q=$(free_port)
while [ "$Q" = "$P" ]; do Q=$(free_port); done
printf 'nbd://127.0.0.1:%s\nnbd://127.0.0.1:%s\n' "$P" "$Q" > "$TMP/peers"

mkdir -p "$TMP/conf"
conf ()                         # NAME LINES...
{
  local n=$1; shift
  printf '%s\n' "$@" > "$TMP/conf/$n.conf"
  chmod 0644 "$TMP/conf/$n.conf"
}
conf n1 plugin=nbd "upstream=socket=$TMP/o.sock" fscache-key=img \
  "fscache-dir=$TMP/c1" "socket=$TMP/n1.sock" "fscache-stats=$TMP/s1" \
  "fscache-peers=$TMP/peers" "fscache-peer-self=nbd://127.0.0.1:$P" \
  "fscache-peer-tls-psk=$TMP/psk" fscache-generation=1 \
  "peer-listen=127.0.0.1:$P" split=no

# ---- 1. what would run ----
dry="$("$proxy" --filter="$FILTER" --confdir "$TMP/conf" --dry-run n1)" ||
  fail "part 1: --dry-run"
echo "$dry"
peer=$(sed -n 's/^peer: //p' <<<"$dry")
# One thread per peer connection on an nbdkit that breaks when a client
# dies mid-reply (see the proxy: 1.32.4 to 1.33.9), else nbdkit's own.
threads=""
case "$(nbdkit --version | awk '{ print $2 }')" in
  1.32.[4-9]|1.32.[1-9][0-9]|1.33.[3-9]) threads="-t 1 " ;;
esac
case "$peer" in
  *" -r ${threads}-i 127.0.0.1 -p $P --tls=require --tls-psk=$TMP/psk "*"fscache-peer-only=true"*"fscache-stats=$TMP/s1.peer"*) ;;
  *) fail "part 1: the peer listener: $peer" ;;
esac
conf bad plugin=nbd "upstream=socket=$TMP/o.sock" fscache-key=img \
  "fscache-peers=$TMP/peers" "fscache-peer-self=nbd://127.0.0.1:$P" \
  fscache-generation=1 "peer-listen=127.0.0.1:$P"
if "$proxy" --filter="$FILTER" --confdir "$TMP/conf" --dry-run bad \
     2> "$TMP/bad.err"; then
  fail "part 1: peer-listen= without TLS was accepted"
fi
grep -q "needs fscache-peer-tls" "$TMP/bad.err" || fail "part 1: $(cat "$TMP/bad.err")"
echo "part 1: the listener is read-only, TLS-only, peers only; no TLS refused"

# ---- 2. node 1 the proxy, node 2 a plain node ----
mkdir -p -m 700 "$TMP/c1" "$TMP/c2"
"$proxy" --filter="$FILTER" --confdir "$TMP/conf" n1 2> "$TMP/n1.err" &
proxy_pid=$!
cleanup_fn "kill $proxy_pid 2>/dev/null"
listening () { [ -S "$TMP/n1.sock" ] &&
  awk -v p="$(printf '%04X' "$P")" '$2 ~ ":"p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp; }
wait_until listening || fail "part 2: the proxy or its listener did not start"
nbdcopy "nbd+unix:///?socket=$TMP/n1.sock" "$TMP/out1" || fail "part 2: node 1's copy"
cmp "$TMP/img" "$TMP/out1" || fail "part 2: node 1's copy differs"
before=$(log_read_bytes "$TMP/o.log")
NBDKIT_STDERR="$TMP/n2.err" start_nbdkit -P "$TMP/n2.pid" -i 127.0.0.1 -p "$Q" \
  --tls=on --tls-psk="$TMP/psk" --filter="$FILTER" nbd socket="$TMP/o.sock" \
  fscache-key=img fscache-dir="$TMP/c2" fscache-stats="$TMP/s2" \
  fscache-peers="$TMP/peers" fscache-peer-self="nbd://127.0.0.1:$Q" \
  fscache-peer-tls-psk="$TMP/psk" fscache-generation=1
nbdcopy "nbd://127.0.0.1:$Q" "$TMP/out2" || fail "part 2: node 2's copy"
cmp "$TMP/img" "$TMP/out2" || fail "part 2: node 2's copy differs"
stop_nbdkit "$TMP/n2.pid"
pr=$(stat_value "$TMP/s2" peer_read_bytes)
after=$(log_read_bytes "$TMP/o.log")
echo "part 2: node 2 read $pr bytes from node 1's listener; the origin" \
     "sent $((after - before)) bytes for node 2's copy (of $size)"
[ "$pr" -gt 0 ] || fail "part 2: node 2 read nothing from node 1's listener"
[ $((after - before + pr)) -le $((size + size / 8)) ] ||
  fail "part 2: the listener read its ranges from the origin again"

# ---- 3. what the listener refuses ----
cat > "$TMP/try.py" <<'PY'
import sys, nbd
port, psk, exp, what = sys.argv[1:5]
h = nbd.NBD()
h.set_export_name(exp)
if psk == "-":
    h.set_tls(nbd.TLS_DISABLE)
else:
    h.set_tls(nbd.TLS_REQUIRE)
    h.set_tls_psk_file(psk)
    h.set_tls_username("fleet")
try:
    h.connect_tcp("127.0.0.1", port)
    if what == "write":
        h.pwrite(b"x" * 4096, 0)
    else:
        h.pread(4096, 0)
except nbd.Error as e:
    sys.exit(str(e))
PY
try () { timeout 30 "$PYTHON" "$TMP/try.py" "$P" "$@"; }
if try "$TMP/psk" "" read 2> "$TMP/t1.err"; then
  fail "part 3: the listener served the export itself"
fi
id=$(printf '%016x' 1)
if try - "fscache-peer:2:$id:$id$(printf %08x 1):" read 2> "$TMP/t2.err"; then
  fail "part 3: a client without TLS read through the listener"
fi
grep -qi "tls" "$TMP/t2.err" || fail "part 3: without TLS: $(cat "$TMP/t2.err")"
if try "$TMP/psk" "" write 2> "$TMP/t3.err"; then
  fail "part 3: a write went through the listener"
fi
kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true
grep -q "this listener (fscache-peer-only) serves fleet peers alone" "$TMP/n1.err" ||
  fail "part 3: the listener did not say why it refused the export"
echo "part 3: the listener refused the export itself, a client without TLS, a write"
stop_nbdkit "$TMP/o.pid"

echo "$0: OK"
