#!/usr/bin/env bash
# nbd-fscache: a fleet with a certificate per node (issue 43):
# fscache-peer-tls-certificates=DIR, nbdkit --tls-certificates=DIR
# --tls-verify-peer, the fleet's CA and its revocation list, so that
# one node can be revoked without re-keying the others (one pre-shared
# key for the fleet cannot).  Three nodes over TCP on 127.0.0.1 (libnbd
# 1.14 checks a peer's certificate against the host it dialled, which a
# Unix socket has none of), certificates made by openssl; node 3's is
# revoked.
#
#  1. Every copy is the image; nodes 1 and 2 read ranges from each
#     other; node 3 got nothing from peers and served nothing (its
#     certificate is refused both ways: as a client by nodes 1 and 2,
#     as a server by their checks), and nodes 1 and 2 set it aside.
#  2. A client asking node 1 for a peer export over TLS without a
#     certificate, or with node 3's, is stopped at the handshake;
#     without TLS the filter refuses it for want of TLS; a client with
#     node 2's certificate is served.
#
# Truth: the image (cmp), the nodes' counters.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires openssl version
requires nbdkit nbd --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

MiB=$((1024 * 1024))
size=$((16 * MiB))
img="$TMP/img"
make_random "$img" "$size"
export NBD_FSCACHE_TEST_BUDGET=0

# ---- the fleet's CA, three nodes' certificates, node 3's revoked ----
ca="$TMP/ca"
mkdir -p "$ca"
: > "$ca/index.txt"
echo 1000 > "$ca/crlnumber"
printf '%s\n' '[ ca ]' 'default_ca = fleet' '[ fleet ]' \
  "database = $ca/index.txt" "crlnumber = $ca/crlnumber" \
  "certificate = $ca/ca-cert.pem" "private_key = $ca/ca-key.pem" \
  'default_md = sha256' 'default_crl_days = 30' > "$ca/ca.cnf"
printf '%s\n' 'basicConstraints = CA:FALSE' \
  'keyUsage = digitalSignature, keyEncipherment' \
  'extendedKeyUsage = serverAuth, clientAuth' \
  'subjectAltName = IP:127.0.0.1, DNS:localhost' > "$ca/node.ext"
ossl ()
{
  openssl "$@" > "$TMP/openssl.out" 2>&1 ||
    { cat "$TMP/openssl.out"; fail "openssl $1"; }
}
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$ca/ca-key.pem" \
  -out "$ca/ca-cert.pem" -days 30 -subj "/CN=fleet CA"
for i in 1 2 3; do
  d="$TMP/certs$i"
  mkdir -p -m 700 "$d"
  ossl req -newkey rsa:2048 -nodes -keyout "$d/server-key.pem" \
    -out "$d/req.pem" -subj "/CN=node$i"
  ossl x509 -req -in "$d/req.pem" -CA "$ca/ca-cert.pem" \
    -CAkey "$ca/ca-key.pem" -set_serial "$((100 + i))" -days 30 \
    -extfile "$ca/node.ext" -out "$d/server-cert.pem"
  cp "$d/server-cert.pem" "$d/client-cert.pem"
  cp "$d/server-key.pem" "$d/client-key.pem"
  cp "$ca/ca-cert.pem" "$d/ca-cert.pem"
done
ossl ca -config "$ca/ca.cnf" -revoke "$TMP/certs3/server-cert.pem"
ossl ca -config "$ca/ca.cnf" -gencrl -out "$ca/ca-crl.pem"
for i in 1 2 3; do cp "$ca/ca-crl.pem" "$TMP/certs$i/ca-crl.pem"; done

# ---- 1. the origin and three nodes ----
NBDKIT_STDERR="$TMP/o.err" start_nbdkit -P "$TMP/o.pid" -U "$TMP/o.sock" \
  file "$img"
ports=()
for i in 1 2 3; do
  p=$(free_port)
  while [[ " ${ports[*]} " == *" $p "* ]]; do p=$(free_port); done
  ports+=("$p")
done
for i in 1 2 3; do echo "nbd://127.0.0.1:${ports[$((i - 1))]}"; done \
  > "$TMP/peers"
for i in 1 2 3; do
  mkdir -p -m 700 "$TMP/c$i"
  NBDKIT_STDERR="$TMP/n$i.err" start_nbdkit -P "$TMP/n$i.pid" \
    -i 127.0.0.1 -p "${ports[$((i - 1))]}" \
    --tls=on --tls-certificates="$TMP/certs$i" --tls-verify-peer \
    --filter="$FILTER" nbd socket="$TMP/o.sock" fscache-dir="$TMP/c$i" \
    fscache-stats="$TMP/s$i" fscache-generation=1 \
    fscache-peers="$TMP/peers" \
    fscache-peer-self="nbd://127.0.0.1:${ports[$((i - 1))]}" \
    fscache-peer-tls-certificates="$TMP/certs$i"
done
pids=()
for i in 1 2 3; do
  timeout 120 nbdcopy "nbd://127.0.0.1:${ports[$((i - 1))]}" "$TMP/out$i" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "part 1: a copy failed"; done
for i in 1 2 3; do
  cmp "$img" "$TMP/out$i" || fail "part 1: node $i's copy differs"
done

# ---- 2. clients at node 1's peer path ----
cat > "$TMP/try.py" <<'PY'
import sys, nbd
port, exp, how = sys.argv[1], sys.argv[2], sys.argv[3]
h = nbd.NBD()
h.set_export_name(exp)
if how == "plain":
    h.set_tls(nbd.TLS_DISABLE)
else:
    h.set_tls(nbd.TLS_REQUIRE)
    if how != "none":
        h.set_tls_certificates(how)
try:
    h.connect_tcp("127.0.0.1", port)
    h.pread(4096, 0)
    h.shutdown()
except nbd.Error as e:
    sys.exit(str(e))
PY
id=$(printf '%016x' 1)
peer_export="fscache-peer:2:$id:$id$(printf %08x 1):"
try () { timeout 30 "$PYTHON" "$TMP/try.py" "${ports[0]}" "$1" "$2"; }
# A TLS client without a certificate, or with the revoked one, does not
# get past the handshake, whatever it asks for.
for how in none "$TMP/certs3"; do
  if try "$peer_export" "$how" 2> "$TMP/try.err"; then
    fail "part 2: TLS with '$how' read a peer export"
  fi
  grep -qi "handshake\|certificate\|tls" "$TMP/try.err" ||
    fail "part 2: '$how' was not stopped at TLS: $(cat "$TMP/try.err")"
done
# Without TLS the filter refuses the peer export name, and says why.
if try "$peer_export" plain 2>/dev/null; then
  fail "part 2: a plain client read a peer export"
fi
grep -q "refusing a peer's connection.*the connection has no TLS" "$TMP/n1.err" ||
  fail "part 2: node 1 did not refuse the plain peer request for want of TLS"
# Node 2's certificate is good: a client with it reads node 1's export.
try "" "$TMP/certs2" || fail "part 2: node 2's certificate was refused"
echo "part 2: node 1 over TLS without a certificate or with the revoked one:" \
     "stopped at the handshake; a plain peer request: refused; node 2's" \
     "certificate: served"

for i in 1 2 3; do stop_nbdkit "$TMP/n$i.pid"; done
pr1=$(stat_value "$TMP/s1" peer_read_bytes)
pr2=$(stat_value "$TMP/s2" peer_read_bytes)
pr3=$(stat_value "$TMP/s3" peer_read_bytes)
sv3=$(stat_value "$TMP/s3" peer_served_bytes)
bo=$(( $(stat_value "$TMP/s1" peer_backoffs) + $(stat_value "$TMP/s2" peer_backoffs) ))
echo "part 1: peer bytes read: node 1 $pr1, node 2 $pr2, node 3 $pr3;" \
     "node 3 served $sv3; nodes 1 and 2 set a peer aside $bo times"
[ "$pr1" -gt 0 ] && [ "$pr2" -gt 0 ] ||
  fail "part 1: nodes 1 and 2 did not share"
[ "$pr3" = 0 ] || fail "part 1: node 3, revoked, got $pr3 bytes from peers"
[ "$sv3" = 0 ] || fail "part 1: node 3, revoked, served $sv3 bytes"
[ "$bo" -ge 1 ] || fail "part 1: nobody set node 3 aside"
stop_nbdkit "$TMP/o.pid"

echo "$0: OK"
