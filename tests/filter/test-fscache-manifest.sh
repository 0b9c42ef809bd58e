#!/usr/bin/env bash
# nbd-fscache: a fleet that trusts no node's data (issue 43): the
# image's manifest (nbd-fscache manifest, fscache-manifest=FILE), a
# SHA-256 per block that every block from a peer is checked against.
# Proxies in their own processes with their own caches, as on several
# hosts, over Unix sockets; origins the file plugin behind nbdkit's
# log filter.
#
#  1. The manifest itself: nbd-fscache manifest of the image, at 1 MiB
#     and at 64 KiB (the default, written to stdout the same): its
#     digests are Python's hashlib.sha256 of each block, its root the
#     SHA-256 of its header's fields and digests (printed by the tool).
#  2. A lying peer: node 2's origin serves another image of the same
#     size, equal to the real one in the regions the coherency sample
#     reads (found from its origin's log) and different in every 1 MiB
#     range elsewhere, so node 2 is taken for a node of the same image.
#     Without a manifest (fscache-generation only: peers trusted),
#     node 1's copy takes node 2's bytes and differs from the image:
#     the hole this closes.  With the manifest, node 1's copy is the
#     image, peer_bad_data counts node 2's answer, and node 1's log
#     names node 2.
#  3. An honest fleet with the manifest: three nodes' copies are the
#     image, ranges came from peers (peer_read_bytes), none failed the
#     manifest.
#  4. A manifest of another image (another size): the client's open
#     is refused, and the log says why.
#
# Truth: the image (cmp, hashlib), the nodes' counters and logs.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
requires test -x "$TOOL"
requires "$PYTHON" -c 'import nbd, hashlib'

MiB=$((1024 * 1024))
size=$((16 * MiB))
img="$TMP/img"
make_random "$img" "$size"
export NBD_FSCACHE_TEST_BUDGET=0

# origin NAME FILE: FILE at $TMP/NAME.sock, logged.
origin ()
{
  rm -f "$TMP/$1.log"
  NBDKIT_STDERR="$TMP/$1.err" start_nbdkit -P "$TMP/$1.pid" \
    -U "$TMP/$1.sock" --filter=log file "$2" logfile="$TMP/$1.log"
}
self () { echo "nbd+unix:///?socket=$TMP/n$1.sock"; }
# node I ORIGIN PEERFILE [ARGS...]
node ()
{
  local i=$1 o=$2 pf=$3; shift 3
  mkdir -p -m 700 "$TMP/c$i"
  NBDKIT_STDERR="$TMP/n$i.err" start_nbdkit -P "$TMP/n$i.pid" \
    -U "$TMP/n$i.sock" --filter="$FILTER" nbd socket="$TMP/$o.sock" \
    fscache-dir="$TMP/c$i" fscache-stats="$TMP/s$i" fscache-key=img \
    fscache-peers="$pf" fscache-peer-self="$(self "$i")" "$@"
}
stop_nodes () { for i in "$@"; do stop_nbdkit "$TMP/n$i.pid"; done; }
fresh () { rm -rf "$TMP"/c[0-9]* "$TMP"/s[0-9]* "$TMP"/out[0-9]*; }
touch_export () { "$PYTHON" -c 'import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.shutdown()' "$1"; }

# ---- 1. the manifest ----
origin o1 "$img"
check_manifest ()               # FILE BLOCKSIZE ROOT
{
  "$PYTHON" - "$1" "$img" "$2" "$3" <<'PY'
import hashlib, struct, sys
m = open(sys.argv[1], "rb").read()
img = open(sys.argv[2], "rb").read()
bs, root = int(sys.argv[3]), sys.argv[4]
assert m[:8] == b"FSCMNFST", "magic"
assert 1 << struct.unpack("<I", m[12:16])[0] == bs, "block size"
assert struct.unpack("<Q", m[16:24])[0] == len(img), "size"
n = (len(img) + bs - 1) // bs
assert struct.unpack("<Q", m[24:32])[0] == n and len(m) == 512 + 32 * n
for i in range(n):
    d = hashlib.sha256(img[i * bs:(i + 1) * bs]).digest()
    assert m[512 + 32 * i:544 + 32 * i] == d, "block %d" % i
r = hashlib.sha256(m[:296] + m[512:]).hexdigest()
assert r == m[296:328].hex() == root, "root"
PY
}
for bs in 1M 64K; do
  "$TOOL" manifest --block-size "$bs" -o "$TMP/m-$bs" "nbd+unix:///?socket=$TMP/o1.sock" \
    2> "$TMP/manifest-$bs.err" || fail "part 1: nbd-fscache manifest --block-size $bs"
  root=$(sed -n 's/.* root \([0-9a-f]*\)$/\1/p' "$TMP/manifest-$bs.err")
  bytes=$(numfmt --from=iec "$bs")
  check_manifest "$TMP/m-$bs" "$bytes" "$root" ||
    fail "part 1: the manifest at $bs differs from hashlib's digests"
done
"$TOOL" manifest "nbd+unix:///?socket=$TMP/o1.sock" > "$TMP/manifest" 2>/dev/null ||
  fail "part 1: nbd-fscache manifest to stdout"
cmp "$TMP/manifest" "$TMP/m-64K" ||
  fail "part 1: the default manifest is not the 64K one"
echo "part 1: manifests at 1M and 64K match hashlib's SHA-256 of the image"
stop_nbdkit "$TMP/o1.pid"

# ---- 2. a lying peer ----
liar ()                         # the lie, for node 2's origin
{
  cp "$img" "$TMP/lie"
  origin o2 "$TMP/lie"
  origin o1 "$img"
  { self 1; self 2; } > "$TMP/p2"
  node 2 o2 "$TMP/p2" "$@"
  touch_export "$(self 2)"      # its samples, in o2's log
  "$PYTHON" - "$TMP/o2.log" "$TMP/lie" <<'PY'
import re, sys
samples = [int(m.group(1), 16) for m in
           (re.search(r" Read id=\d+ offset=(0x[0-9a-f]+) count=0x1000 ", l)
            for l in open(sys.argv[1])) if m]
assert samples, "no sample read logged"
f = open(sys.argv[2], "r+b")
size = f.seek(0, 2)
for r in range(0, size, 1 << 20):
    for at in (r + (1 << 19) + 123, r + (1 << 18) + 77, r + 3 * (1 << 18) + 5):
        if all(abs(at - s) > 8192 for s in samples):
            f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0xff]))
            break
    else:
        sys.exit("no place to lie in range %d" % r)
PY
  node 1 o1 "$TMP/p2" "$@"
}
# Without a manifest the lie gets through: the control.
fresh
liar fscache-generation=1
timeout 120 nbdcopy "$(self 1)" "$TMP/out1" || fail "part 2: node 1's copy (control)"
pr=$(stat_value "$TMP/s1" peer_read_bytes)
stop_nodes 1 2
if cmp -s "$img" "$TMP/out1"; then
  fail "part 2: without a manifest node 1's copy is the image (the lie did not reach it: test bug?)"
fi
echo "part 2: without a manifest node 1 read $pr bytes from node 2, and its copy differs from the image"
[ "$pr" -gt 0 ] || fail "part 2: node 1 read nothing from node 2 (test bug?)"
stop_nbdkit "$TMP/o1.pid"; stop_nbdkit "$TMP/o2.pid"
# With it, node 1 takes none of it.
fresh
liar fscache-manifest="$TMP/manifest"
timeout 120 nbdcopy "$(self 1)" "$TMP/out1" || fail "part 2: node 1's copy"
stop_nodes 1 2
cmp "$img" "$TMP/out1" || fail "part 2: node 1's copy differs from the image"
bad=$(stat_value "$TMP/s1" peer_bad_data)
echo "part 2: with the manifest node 1's copy is the image; node 1 counted" \
     "$bad answers failing it"
[ "$bad" -ge 1 ] || fail "part 2: peer_bad_data $bad"
grep "n2.sock sent export .* does not match fscache-manifest" "$TMP/n1.err" ||
  fail "part 2: node 1's log does not name node 2"
stop_nbdkit "$TMP/o1.pid"; stop_nbdkit "$TMP/o2.pid"

# ---- 3. an honest fleet with the manifest ----
fresh
origin o3 "$img"
for i in 1 2 3; do self "$i"; done > "$TMP/p3"
for i in 1 2 3; do node "$i" o3 "$TMP/p3" fscache-manifest="$TMP/manifest"; done
pids=()
for i in 1 2 3; do
  timeout 120 nbdcopy "$(self "$i")" "$TMP/out$i" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "part 3: a copy failed"; done
stop_nodes 1 2 3
pr=0 bad=0
for i in 1 2 3; do
  cmp "$img" "$TMP/out$i" || fail "part 3: node $i's copy differs"
  pr=$((pr + $(stat_value "$TMP/s$i" peer_read_bytes)))
  bad=$((bad + $(stat_value "$TMP/s$i" peer_bad_data)))
done
echo "part 3: three honest nodes with the manifest: $pr bytes from peers" \
     "(two thirds of the image each: $((2 * size))), $bad failing it"
[ "$pr" -gt 0 ] || fail "part 3: nothing came from peers"
[ "$bad" = 0 ] || fail "part 3: honest answers failed the manifest"
stop_nbdkit "$TMP/o3.pid"

# ---- 4. a manifest of another image ----
fresh
make_random "$TMP/other" $((8 * MiB))
origin o4 "$TMP/other"
self 1 > "$TMP/p4"
node 1 o4 "$TMP/p4" fscache-manifest="$TMP/manifest"
if timeout 60 nbdcopy "$(self 1)" "$TMP/out1" 2>/dev/null; then
  fail "part 4: a client read an image the manifest is not of"
fi
grep "is the manifest of an image of $size bytes.*another image" "$TMP/n1.err" ||
  fail "part 4: node 1 did not say why it refused"
echo "part 4: an export of another size is refused, with the reason"
stop_nodes 1
stop_nbdkit "$TMP/o4.pid"

echo "$0: OK"
