#!/usr/bin/env bash
# nbd-fscache: the fill budget pauses readahead only for a local
# upstream (core/ops/readahead.c, ra_budget_pause).
#
# With the budget engaged whatever the rates (NBD_FSCACHE_TEST_BUDGET=1)
# and past its first 64 MiB (spent by reads in no order, which start no
# readahead), a sequential reader (64 KiB reads) reads another 32 MiB:
#  - from a local upstream (the file plugin, reads in microseconds),
#    readahead pauses: no byte is prefetched during that read;
#  - from a remote one (the same behind the delay filter, 2 ms per
#    read), readahead goes on: bytes are prefetched, and what it
#    prefetched is stored (it used to pause there too, and a stream
#    over a link fell to one round trip per request).
# Every read is compared with the image.
#
# Truth: the proxy's stats file (prefetch_bytes), the image.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=delay file --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

size=$((128 * 1024 * 1024))
img="$TMP/img"
make_random "$img" "$size"
uri="nbd+unix:///?socket=$TMP/px.sock"

# prefetched_during DELAY: prefetch_bytes of the sequential read past
# the budget's first 64 MiB, through a proxy over the file plugin
# behind DELAY (none if empty).
prefetched_during ()
{
  local delay=() delay_arg=() stats="$TMP/px.stats"
  [ -z "$1" ] || { delay=(--filter=delay); delay_arg=(delay-read="$1"); }
  rm -rf "$TMP/cache" "$stats"
  NBD_FSCACHE_TEST_BUDGET=1 start_nbdkit -P "$TMP/px.pid" \
    -U "$TMP/px.sock" --filter="$FILTER" "${delay[@]}" file "$img" \
    "${delay_arg[@]}" fscache-dir="$TMP/cache" fscache-validate=size \
    fscache-stats="$stats"
  # Spend the first bucket (and let the meters see both rates) with
  # reads that never follow one another (37 blocks apart: readahead
  # never starts), then read the next 32 MiB in order.
  $PYTHON - "$uri" "$img" <<'EOF'
import sys, nbd
uri, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
def check(o):
    if h.pread(65536, o) != data[o:o + 65536]:
        sys.exit("wrong data at %d" % o)
for i in range(1024):
    check((i * 37) % 1024 * 65536)
for o in range(64 << 20, 96 << 20, 65536):
    check(o)
h.shutdown()
EOF
  stop_nbdkit "$TMP/px.pid"
  stat_value "$stats" prefetch_bytes
}

local_pf=$(prefetched_during "")
remote_pf=$(prefetched_during 2ms)
echo "prefetched with the budget engaged: local upstream $local_pf bytes," \
     "remote upstream (2 ms per read) $remote_pf bytes"
[ "$remote_pf" -gt 0 ] ||
  fail "readahead paused over a remote upstream under the budget"
[ "$remote_pf" -gt "$local_pf" ] ||
  fail "readahead ran as much from a local upstream ($local_pf) as from a" \
       "remote one ($remote_pf) under the budget"
echo "$0: OK"
