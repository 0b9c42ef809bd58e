#!/usr/bin/env bash
# nbd-fscache: a node that wrote an export asks no peer for it, after a
# restart too (issue 43).  "Written" lived in one process's memory: a
# restarted node (or another process of its host) asked its peers for
# ranges they held as they were before the write, and served them.
# Now the object's superblock keeps it (FSC_SB_WRITTEN) until the
# object is made again (another generation, a coherency change).
#
# Two nodes, fscache-validate=size and one generation (so that the
# write does not change the identity peers compare), the origin a
# writable file.  Node 2 caches the whole image.  Node 1, in
# writearound mode (written blocks are dropped from its cache, so its
# later reads of them miss), writes 4 KiB at the start of every 1 MiB
# range, is stopped and started again on its cache, and reads the
# image: its copy is the origin's new content (half the ranges are node
# 2's, which still holds the old bytes), and it read nothing from
# peers.
#
# Truth: the origin's file (cmp), node 1's counters.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit nbd --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

MiB=$((1024 * 1024))
size=$((16 * MiB))
make_random "$TMP/img" "$size"
export NBD_FSCACHE_TEST_BUDGET=0
NBDKIT_STDERR="$TMP/o.err" start_nbdkit -P "$TMP/o.pid" -U "$TMP/o.sock" \
  file "$TMP/img"
self () { echo "nbd+unix:///?socket=$TMP/n$1.sock"; }
{ self 1; self 2; } > "$TMP/peers"
node ()                         # I ARGS...
{
  local i=$1; shift
  mkdir -p -m 700 "$TMP/c$i"
  NBDKIT_STDERR="$TMP/n$i.err" start_nbdkit -P "$TMP/n$i.pid" \
    -U "$TMP/n$i.sock" --filter="$FILTER" nbd socket="$TMP/o.sock" \
    fscache-dir="$TMP/c$i" fscache-stats="$TMP/s$i" fscache-key=img \
    fscache-validate=size fscache-generation=1 \
    fscache-peers="$TMP/peers" fscache-peer-self="$(self "$i")" "$@"
}
node 2
nbdcopy "$(self 2)" "$TMP/out2" || fail "node 2's copy"
node 1 fscache-mode=writearound
"$PYTHON" - "$(self 1)" "$size" <<'PY' || fail "node 1's writes"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for r in range(0, int(sys.argv[2]), 1 << 20):
    h.pwrite(b"written!" * 512, r)
h.flush()
h.shutdown()
PY
stop_nbdkit "$TMP/n1.pid"
node 1 fscache-mode=writearound
nbdcopy "$(self 1)" "$TMP/out1" || fail "node 1's copy"
stop_nbdkit "$TMP/n1.pid"
stop_nbdkit "$TMP/n2.pid"
pr=$(stat_value "$TMP/s1" peer_read_bytes)
echo "node 1, restarted after writing: read $pr bytes from peers"
cmp "$TMP/img" "$TMP/out1" || fail "node 1 read ranges older than its own writes"
[ "$pr" = 0 ] || fail "node 1 asked peers for an export it wrote"
stop_nbdkit "$TMP/o.pid"

echo "$0: OK"
