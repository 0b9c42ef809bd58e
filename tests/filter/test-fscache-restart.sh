#!/usr/bin/env bash
# nbd-fscache: the cache persists across a clean restart of nbdkit.
#
#  1. Fill the whole export, stop the proxy (SIGTERM, wait for exit),
#     start a new one on the same cache directory: a full read returns
#     the upstream's bytes and reads nothing upstream.
#  2. A half-filled cache: read only [0, HALF) cold (without readahead),
#     restart, read everything: the upstream sees exactly the blocks
#     that were not cached, i.e. [roundup(HALF, block), size).
#  3. With fscache-validate=sample (the default) a restarted proxy reads
#     only the coherency sample upstream (<= 8 x 4 KiB per connection).
#
# Truth: cmp against the upstream image file, and the upstream's own
# request log (nbdkit --filter=log).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires qemu-io --version
requires cmp --version
requires nbdkit --filter=log null --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

BS=65536                        # the default fscache-block-size
SAMPLE_MAX=32768                # 8 x 4 KiB per connection
size=$((64 * 1024 * 1024 + 12345))
half=$((32 * 1024 * 1024 + 1000))   # deliberately not block-aligned
make_random "$TMP/upstream.img" "$size"

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/upstream.img" logfile="$TMP/up.log"
log="$TMP/up.log"
up_bytes () { log_read_bytes "$log"; }
up_conns () { grep -c ' Connect export=' "$log" || true; }

# The proxy always listens on the same socket and names the upstream
# the same way, so its object key is the same across restarts.
start_proxy ()
{
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$1" "${@:2}"
}
uri="nbd+unix:///?socket=$TMP/px.sock"

check_copy ()
{
  rm -f "$TMP/out.img"
  nbdcopy "$uri" "$TMP/out.img"
  if ! cmp "$TMP/upstream.img" "$TMP/out.img"; then
    echo "$0: FAIL: $1: data differs from the upstream image" >&2
    exit 1
  fi
  rm -f "$TMP/out.img"
}

expect_bytes ()                 # WHAT GOT EXPECTED
{
  echo "$1: $2 bytes upstream (expected $3)"
  if [ "$2" -ne "$3" ]; then
    echo "$0: FAIL: $1: $2 bytes read upstream, expected $3" >&2
    exit 1
  fi
}

# ---- 1. full fill, restart, warm ----------------------------------------
start_proxy "$TMP/cache" fscache-validate=size
b0=$(up_bytes)
check_copy "fill"
b1=$(up_bytes)
expect_bytes "fill" $((b1 - b0)) "$size"
stop_nbdkit "$TMP/px.pid"

start_proxy "$TMP/cache" fscache-validate=size \
  fscache-stats="$TMP/restart.stats"
check_copy "after restart"
b2=$(up_bytes)
expect_bytes "read after restart" $((b2 - b1)) 0
stop_nbdkit "$TMP/px.pid"
reused=$(stat_value "$TMP/restart.stats" objects_reused)
created=$(stat_value "$TMP/restart.stats" objects_created)
if [ "$reused" -lt 1 ] || [ "$created" -ne 0 ]; then
  echo "$0: FAIL: after restart objects_reused=$reused" \
       "objects_created=$created, expected >= 1 and 0" >&2
  exit 1
fi

# A second restart: still complete (the first restart's close did not
# lose anything).
start_proxy "$TMP/cache" fscache-validate=size
check_copy "after a second restart"
b3=$(up_bytes)
expect_bytes "read after a second restart" $((b3 - b2)) 0
stop_nbdkit "$TMP/px.pid"

# ---- 2. half-filled cache -----------------------------------------------
# No readahead for the cold half read: the cached range must be exactly
# the blocks that read touched.  (The restarted proxy has the default
# readahead: it must not fetch a present block again either.)
start_proxy "$TMP/cache-half" fscache-validate=size fscache-readahead=0
b0=$(up_bytes)
qemu-io -r -f raw "$uri" -c "read 0 $half" >/dev/null
b1=$(up_bytes)
cached=$(( (half + BS - 1) / BS * BS ))     # whole blocks fetched
expect_bytes "cold read of [0, $half)" $((b1 - b0)) "$cached"
stop_nbdkit "$TMP/px.pid"

start_proxy "$TMP/cache-half" fscache-validate=size
check_copy "half-filled cache after restart"
b2=$(up_bytes)
expect_bytes "full read of a half-filled cache after restart" \
  $((b2 - b1)) $((size - cached))
# ... and now everything is cached.
check_copy "half-filled cache, completed"
b3=$(up_bytes)
expect_bytes "full read after completing" $((b3 - b2)) 0
stop_nbdkit "$TMP/px.pid"

# ---- 3. default fscache-validate=sample ---------------------------------
start_proxy "$TMP/cache-sample"
check_copy "fill (validate=sample)"
stop_nbdkit "$TMP/px.pid"
start_proxy "$TMP/cache-sample"
b0=$(up_bytes); c0=$(up_conns)
check_copy "after restart (validate=sample)"
b1=$(up_bytes); c1=$(up_conns)
conns=$((c1 - c0))
echo "read after restart (sample): $((b1 - b0)) bytes upstream over" \
     "$conns connection(s)"
if [ "$conns" -lt 1 ] || [ $((b1 - b0)) -gt $((SAMPLE_MAX * conns)) ]; then
  echo "$0: FAIL: read after restart (validate=sample) fetched" \
       "$((b1 - b0)) bytes upstream, expected <= $SAMPLE_MAX x $conns" >&2
  exit 1
fi
stop_nbdkit "$TMP/px.pid"

echo "$0: OK"
