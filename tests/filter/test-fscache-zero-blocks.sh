#!/usr/bin/env bash
# WRITE_ZEROES in writethrough mode stores zero blocks (docs/format.md,
# "Zero blocks"): present in the index, no data in the cache.
#
# Upstream: nbdkit --filter=log file up.img (random, 16 MiB + 1000, so
# the last 64K block is short).  Proxy: fscache in writethrough mode,
# fscache-readahead=0 and fscache-validate=size so that the upstream
# reads counted are only the requests' own.  Clients: qemu-io.
#
#  1. The first 8 MiB are read (cached), then written over with a
#     pattern (stored by writethrough): the data file holds them.
#  2. write -z over 4 MiB at 1 MiB + 1000 (WRITE_ZEROES, unaligned: its
#     end blocks are merged like a write's) and over 2 MiB that were
#     never read, at 10 MiB, and over the short end of the export.
#  3. Reading the zeroed ranges (qemu-io read -P 0) and their
#     neighbours reads 0 bytes upstream (log filter), and the stats
#     count hits and zero blocks.
#  4. The data file is at least the zeroed whole blocks smaller than
#     before (du), and the never-read 2 MiB allocate nothing.
#  5. After a restart of the proxy the same reads still read 0 bytes
#     upstream, and the data file is no bigger.
#  6. Trim still only invalidates: the trimmed range is read upstream.
#  7. nbd-fscache check accepts the zero blocks.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires qemu-io --version
requires nbdcopy --version
requires cmp --version
requires test -f "$FILTER"

SIZE=$(( 16*1024*1024 + 1000 ))
BS=65536
M=$(( 1024*1024 ))
Z0=$(( 1*M + 1000 )); ZN=$(( 4*M ))                  # cached, unaligned
U0=$(( 10*M )); UN=$(( 2*M ))                         # never read
E0=$(( SIZE - 1000 - 2*BS )); EN=$(( 2*BS + 1000 ))   # the short end

make_random "$TMP/up.img" $SIZE
cache="$TMP/cache"
pxargs=(-P "$TMP/px.pid" -U "$TMP/px.sock" --filter="$FILTER"
        nbd socket="$TMP/up.sock" fscache-dir="$cache"
        fscache-mode=writethrough fscache-readahead=0 fscache-validate=size
        fscache-stats="$TMP/stats")
uri="nbd+unix:///?socket=$TMP/px.sock"

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/up.img" logfile="$TMP/up.log"
start_nbdkit "${pxargs[@]}"

data_file () { find "$cache/objects" -name '*.data' | head -1; }
allocated () { echo $(( $(stat -c %b "$(data_file)") * $(stat -c %B "$(data_file)") )); }
qio () { qemu-io -f raw "$uri" "$@" >"$TMP/qio.out" 2>&1 ||
           { cat "$TMP/qio.out"; fail "qemu-io $*"; }
         ! grep -q -i 'verification failed\|error' "$TMP/qio.out" ||
           { cat "$TMP/qio.out"; fail "qemu-io $*"; }; }

# 1. Cache and overwrite the first 8 MiB.  The read's fill is queued
# (core/ops/fill.c) and may still hold its blocks when the write comes;
# the write then stores nothing there (they are being filled, and the
# fill, seeing the write, publishes nothing), and the zero blocks of
# step 2 would have old claims to skip.  So the write waits until the
# object holds what the read fetched (its live counters).
qio -c "read 0 $(( 8*M ))"
present () { [ "$(tool stat --dir "$cache" |
                  awk '$1 == "present_blocks" { print $2 }')" -ge "$1" ]; }
wait_until present $(( 8*M / BS )) ||
  fail "the 8 MiB read was not stored: $(tool stat --dir "$cache" | grep present_blocks)"
qio -c "write -P 0x5a 0 $(( 8*M ))"
before=$(allocated)
[ "$before" -ge $(( 8*M )) ] ||
  fail "the data file holds $before bytes after writing 8 MiB"

# 2. Zeroes.
qio -c "write -z $Z0 $ZN" -c "write -z $U0 $UN" -c "write -z $E0 $EN"
after=$(allocated)
echo "data file: $before bytes allocated before the zeroes, $after after"

# The truth, read directly: zeroes there, the pattern around them.
cmp -n $ZN -i $Z0:0 "$TMP/up.img" /dev/zero ||
  fail "the upstream was not zeroed"

check_reads () {
  local what="$1" mark lines
  mark=$(log_read_bytes "$TMP/up.log")
  lines=$(wc -l < "$TMP/up.log")
  qio -c "read -P 0 $Z0 $ZN" -c "read -P 0 $U0 $UN" -c "read -P 0 $E0 $EN" \
      -c "read -P 0x5a 0 $Z0" -c "read -P 0x5a $(( Z0 + ZN )) 1000"
  local got=$(( $(log_read_bytes "$TMP/up.log") - mark ))
  [ "$got" -eq 0 ] ||
    { tail -n +$(( lines + 1 )) "$TMP/up.log" | grep ' Read id=' >&2
      fail "$what: $got bytes read upstream"; }
  echo "$what: zeroed ranges read as zeroes, 0 bytes upstream"
}

# 3. Reads of the zeroed ranges: hits, nothing upstream.
check_reads "after write -z"

# 4. The zeroed whole blocks freed their space (at least 4 MiB less
#    one block at each end), the never-read ones took none.
freed=$(( before - after ))
[ "$freed" -ge $(( ZN - 2*BS )) ] ||
  fail "the data file shrank by $freed bytes, not by the zeroed range"
[ "$after" -le $(( 8*M - ZN + 2*BS )) ] ||
  fail "the data file holds $after bytes: the zeroed blocks took space"

# 5. After a restart.
stop_nbdkit "$TMP/px.pid"
zb=$(stat_value "$TMP/stats" zero_blocks)
echo "stats: zero_blocks=$zb"
# 4 MiB less the two merged end blocks, 2 MiB, and the short end.
[ "$zb" -ge $(( (ZN + UN) / BS - 2 + 1 )) ] ||
  fail "zero_blocks is $zb"
start_nbdkit "${pxargs[@]}"
check_reads "after a restart"
[ "$(allocated)" -le "$after" ] || fail "the data file grew after a restart"
stop_nbdkit "$TMP/px.pid"
[ "$(stat_value "$TMP/stats" hit_bytes)" -ge $(( ZN + UN + EN )) ] ||
  fail "the zero blocks were not counted as hits"

# 6. Trim only invalidates: its range comes from upstream again.
start_nbdkit "${pxargs[@]}"
qio -c "discard $U0 $BS"
mark=$(log_read_bytes "$TMP/up.log")
qemu-io -f raw "$uri" -c "read $U0 $BS" >/dev/null
[ $(( $(log_read_bytes "$TMP/up.log") - mark )) -eq $BS ] ||
  fail "a trimmed block was not read upstream"
stop_nbdkit "$TMP/px.pid"

# 7. The tool's check accepts them (no data read for them).
if [ -x "$TOOL" ]; then
  tool --dir "$cache" check >"$TMP/check.out" 2>&1 ||
    { cat "$TMP/check.out"; fail "nbd-fscache check"; }
  grep -q ': ok (' "$TMP/check.out" || { cat "$TMP/check.out"; fail "check"; }
  cat "$TMP/check.out"
fi

# Truth at the end: the proxy's view is the upstream's.
start_nbdkit "${pxargs[@]}"
nbdcopy --no-extents "$uri" "$TMP/view.img"
cmp "$TMP/view.img" "$TMP/up.img" || fail "proxy view != upstream"
echo "$0: OK"
