#!/usr/bin/env bash
# nbd-fscache: the coherency sample (fscache-validate=sample, the
# default) costs one round trip on an upstream that takes parallel
# requests: its 8 reads overlap.  On a serial upstream they do not
# (test-fscache-serial.sh, whose plugin fails any overlapping call).
# Either way the fingerprint is the same: the cache made with the
# sample read one way is reused when it is read the other way.
#
# Truth: the upstream's request log (nbdkit --filter=log), whose "Read"
# and "...Read" lines give how many reads were in flight at once, and
# the filter's own stats (objects_reused).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter=delay null --dump-plugin

size=$((64 * 1024 * 1024))
make_random "$TMP/up.img" "$size"

# The largest number of reads in flight at once in log file $1.
in_flight ()
{
  awk '/ Read id=/ { n++; if (n > max) max = n }
       /\.\.\.Read / { n-- }
       END { print max + 0 }' "$1"
}

run ()                          # NAME SERIAL(0|1)
{
  local name="$1" serial="$2" model=()
  # The noparallel filter under ours makes the proxy's upstream serial
  # (serialize_requests, as Debian 12's curl and ssh plugins): the
  # filter must then send the sample reads one at a time itself.
  [ "$serial" = 1 ] && model=(--filter=noparallel)
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log --filter=delay file "$TMP/up.img" \
    logfile="$TMP/$name.log" delay-read=200ms
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" "${model[@]}" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-key=sample fscache-readahead=0 \
    fscache-stats="$TMP/$name.stats"
  nbdinfo --size "nbd+unix:///?socket=$TMP/px.sock" >/dev/null ||
    fail "$name: nbdinfo failed"
  stop_nbdkit "$TMP/px.pid"
  stop_nbdkit "$TMP/up.pid"
}

# Parallel: all 8 sample reads at once; then fill the cache.
run parallel 0
n=$(in_flight "$TMP/parallel.log")
echo "parallel upstream: $n sample reads in flight at once"
[ "$n" -eq 8 ] || fail "expected the 8 sample reads to overlap, saw $n"

# Serial: one at a time, and the same fingerprint: reused.
requires nbdkit --filter=noparallel null --dump-plugin
run serial 1
n=$(in_flight "$TMP/serial.log")
echo "serial upstream: $n sample read(s) in flight at once"
[ "$n" -eq 1 ] || fail "a serial upstream saw $n overlapping reads"
[ "$(stat_value "$TMP/serial.stats" objects_reused)" -eq 1 ] ||
  fail "the sample read serially gave another fingerprint (not reused)"

echo "$0: PASS"
