#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: the drain stores what it wrote
# back with direct writes, not through the page cache.
#
# After each upstream write the writer stores the same bytes into the
# object (core/wlog/writeback.c, update_obj).  From a buffer malloc gave
# it, never 4 KiB aligned, that store was a buffered write: each 4 MiB
# request copied into the page cache in one 5.5 to 7 ms stretch of
# kernel time, which this kernel preempts for nobody, and hits of
# other proxies on the machine waited behind it (issue 44, stop 57:
# the drain's hit p99.9).  From the cache's aligned buffers it is a
# direct write (core/disk/data.c, O_DIRECT from 256 KiB).
#
# The truth is the kernel's: 16 MiB written through the proxy and
# drained, then fincore counts the pages of the object's data file in
# the page cache (a direct write leaves none; the buffered store left
# all 16 MiB).  Then the data: the upstream image and a read through
# the proxy (its hits now from the disk) against what was written.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter="$FILTER" null --dump-plugin
requires nbdcopy --version
requires fincore --version

# Where the file system refuses O_DIRECT (tmpfs) the object stays
# buffered by design (data.c): nothing to test there.
if ! dd if=/dev/zero of="$TMP/odirect" bs=4096 count=1 oflag=direct \
     2>/dev/null; then
  echo "$0: SKIP: $TMP refuses O_DIRECT"
  exit 77
fi

MiB=$((1024 * 1024))
size=$((16 * MiB))
make_random "$TMP/src" $size
truncate -s $size "$TMP/up.img"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" file "$TMP/up.img" \
  fscache-dir="$TMP/cache" fscache-key=direct fscache-mode=writeback \
  fscache-readahead=0
nbdcopy --flush "$TMP/src" "nbd+unix:///?socket=$TMP/px.sock" ||
  fail "the write through the proxy"

# Drained: nothing dirty in the index (a record is retired only after
# its bytes are upstream and stored).
drained () { [ "$(tool --dir "$TMP/cache" ls | awk '$1 == "direct" { print $6 }')" = 0B ]; }
wait_until drained ||
  fail "the log did not drain: $(tool --dir "$TMP/cache" ls)"

data=$(find "$TMP/cache/objects" -name '*.data' -type f)
[ -n "$data" ] || fail "no data file in the cache"
res=$(fincore -bno RES "$data" | tr -d " ")
echo "after the drain: $res bytes of the object's $size in the page cache"
[ "$res" -le $MiB ] ||
  fail "the drain stored through the page cache: $res bytes of $data resident"

cmp "$TMP/src" "$TMP/up.img" || fail "the upstream image differs"
nbdcopy "nbd+unix:///?socket=$TMP/px.sock" "$TMP/out" ||
  fail "the read through the proxy"
cmp "$TMP/src" "$TMP/out" || fail "the read through the proxy differs"
stop_nbdkit "$TMP/px.pid"
echo "$0: PASS"
