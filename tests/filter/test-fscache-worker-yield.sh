#!/usr/bin/env bash
# nbd-fscache: a worker that served reads back to back without sleeping
# offers its CPU (fscache-worker-yield, plugin/yield.c), and only such
# a worker does.
#
# 1. Misses that wait on a slow upstream (nbdkit's delay filter, 2 ms
#    a read), one at a time: every worker sleeps in each request, so
#    none yields, even with a budget of 1 µs (worker_yields 0).  A
#    budget counted in time alone, without the sleep, yields after
#    every request here.
# 2. The same image warm, read by many requests at once (nbdcopy, four
#    connections, 64 requests in flight): workers find the next request
#    waiting and serve hits back to back; with a budget of 1 µs they
#    yield (worker_yields > 0), with 0 never (worker_yields 0).
# 3. Misses from an upstream in the same process that never sleeps
#    (the file plugin, page-cached), many at once, a budget of 1 µs:
#    every request reads upstream, the plugin's work, so none yields
#    (worker_yields 0).  Counted as the cache's, they yielded after
#    nearly every read, and random reads ran at 0.75 of the plugin's.
# 4. A bad value is refused at start-up, naming the parameter.
# Every copy cmp's equal to the image.
#
# Truth: the image (cmp), the filter's stats file at a clean stop.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter=delay null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

size=$((32 * 1024 * 1024))
make_random "$TMP/img" "$size"
mkdir -m 700 "$TMP/c"

# proxy YIELD: a proxy of the image behind a 2 ms delay, on the cache.
proxy ()
{
  rm -f "$TMP/stats"
  start_nbdkit -P "$TMP/p.pid" -U "$TMP/p.sock" --filter="$FILTER" \
    --filter=delay file "$TMP/img" rdelay=2ms \
    fscache-dir="$TMP/c" fscache-readahead=0 fscache-worker-yield="$1" \
    fscache-stats="$TMP/stats"
}
# copy TAG NBDCOPY-ARGS...: the whole export, compared with the image.
copy ()
{
  local tag=$1; shift
  rm -f "$TMP/out"
  nbdcopy "$@" "nbd+unix:///?socket=$TMP/p.sock" "$TMP/out"
  cmp "$TMP/img" "$TMP/out" || fail "$tag: the copy differs from the image"
}
yields () { stop_nbdkit "$TMP/p.pid"; stat_value "$TMP/stats" worker_yields; }

# 1. Cold, one request at a time: every read waits 2 ms upstream.
proxy 1
copy "cold" --connections=1 --requests=1 --request-size=65536
y=$(yields)
echo "cold, one at a time: worker_yields $y"
[ "$(stat_value "$TMP/stats" upstream_read_bytes)" -ge "$size" ] ||
  fail "the cold copy did not read the image upstream"
[ "$y" -eq 0 ] ||
  fail "workers that slept in every request yielded $y times"

# 2. Warm, many at once: hits back to back.
proxy 1
copy "warm, budget 1" --connections=4 --requests=64 --request-size=65536
y=$(yields)
echo "warm, budget 1 µs: worker_yields $y, hit_bytes $(stat_value "$TMP/stats" hit_bytes)"
[ "$(stat_value "$TMP/stats" upstream_read_bytes)" -eq 0 ] ||
  fail "the warm copy read upstream"
[ "$y" -gt 0 ] || fail "workers serving hits back to back never yielded"
proxy 0
copy "warm, budget 0" --connections=4 --requests=64 --request-size=65536
y=$(yields)
[ "$y" -eq 0 ] || fail "fscache-worker-yield=0 yielded $y times"

# 3. Cold, many at once, from the file plugin with no delay: misses
#    back to back, each the plugin's work.
rm -rf "$TMP/c"; mkdir -m 700 "$TMP/c"
rm -f "$TMP/stats"
start_nbdkit -P "$TMP/p.pid" -U "$TMP/p.sock" --filter="$FILTER" \
  file "$TMP/img" fscache-dir="$TMP/c" fscache-readahead=0 \
  fscache-worker-yield=1 fscache-stats="$TMP/stats"
copy "cold, no delay" --connections=4 --requests=64 --request-size=65536
y=$(yields)
echo "cold, no delay, budget 1 µs: worker_yields $y," \
  "upstream_read_bytes $(stat_value "$TMP/stats" upstream_read_bytes)"
[ "$(stat_value "$TMP/stats" upstream_read_bytes)" -ge "$size" ] ||
  fail "the cold copy did not read the image upstream"
[ "$y" -eq 0 ] ||
  fail "workers whose every request read upstream yielded $y times"

# 4. Bad values.
for v in x -1 1000001; do
  rc=0
  nbdkit --filter="$FILTER" null 1M fscache-dir="$TMP/c" \
    fscache-worker-yield="$v" --run true 2>"$TMP/err" || rc=$?
  [ "$rc" -ne 0 ] || fail "fscache-worker-yield=$v accepted"
  grep -q "fscache-worker-yield=$v: must be a number of microseconds" \
    "$TMP/err" || fail "fscache-worker-yield=$v: $(cat "$TMP/err")"
done
echo "test-fscache-worker-yield: OK"
