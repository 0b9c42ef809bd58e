#!/usr/bin/env bash
# nbd-fscache: an upstream faster than the cache disk (issue 18).
#
# The upstream is the file plugin in the proxy's own process, over a
# page-cached image: reads from it cost a copy, while a fill costs a
# write into the page cache and the commit's sync of it.  When fills
# are slower than the upstream, client reads fill only within the
# budget (core/ops/fill.c: a first 64 MiB, then a fiftieth of the fills'
# rate); past it they bypass the cache, and readahead pauses.  Whether
# the rates engage it depends on the machine (a short burst of fills
# into the page cache can keep up), so the test runs twice: as the
# rates decide, and with NBD_FSCACHE_TEST_BUDGET, which engages it
# whatever they say.  Each time two clients read the whole 384 MiB
# export at once, in the same order, 16 reads of 256 KiB in flight
# each, so that hits on what was filled, reads served from queued
# fills, budgeted fills and bypasses of the same blocks by both run
# side by side.  Then:
#   - every byte each client read is the image's;
#   - what was fetched was either stored or counted as skipped
#     (fill_bytes + fill_skipped_bytes = upstream_read_bytes, which the
#     log filter confirms); with the budget engaged, some was skipped;
#   - after a restart (no knob, readahead off), a third read is
#     identical too and fetches from the upstream only what the cache
#     does not hold
#     (cached_bytes of nbd-fscache stat): what the budget let through
#     was stored whole and is served as hits;
#   - nbd-fscache check finds the object sound.
# (fscache-catchup=false: the catch-up worker's upstream reads would
# count in the log filter's sums; test-fscache-catchup.sh tests it.)

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires "$PYTHON" -c 'import nbd'
requires nbdkit --filter=log file --dump-plugin
requires test -r "$FILTER"
requires test -x "$TOOL"

size=$((384 * 1024 * 1024))
img="$TMP/upstream.img"
make_random "$img" "$size"
log="$TMP/up.log"
cache="$TMP/cache"
stats="$TMP/px.stats"
# proxy [budget|PARAM...]: the proxy; with "budget",
# NBD_FSCACHE_TEST_BUDGET set; else more fscache parameters.
px_start ()
{
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" --filter=log file "$img" logfile="$log" \
    fscache-dir="$cache" fscache-validate=size fscache-stats="$stats" \
    fscache-catchup=false "$@"
}
proxy ()
{
  rm -f "$stats"
  if [ "${1:-}" = budget ]; then
    NBD_FSCACHE_TEST_BUDGET=1 px_start
  else
    [ -n "${1-x}" ] || shift       # cold's "" for no budget
    px_start "$@"
  fi
}
uri="nbd+unix:///?socket=$TMP/px.sock"

# check_all: the whole export, checked (tests/stream-reader.py).
check_all ()
{
  "$PYTHON" "$top_srcdir/tests/stream-reader.py" "$uri" "$img" > /dev/null
}

# cold WHAT [budget]: two clients at once on an empty cache, checked;
# then a restart and a third read, checked.
cold ()
{
  local what="$1"
  rm -rf "$cache" "$log"
  proxy "${2:-}"
  check_all & a=$!
  check_all & b=$!
  wait "$a" || fail "$what: the first client read wrong data"
  wait "$b" || fail "$what: the second client read wrong data"
  stop_nbdkit "$TMP/px.pid"     # finishes the queued fills and commits

  fetched=$(stat_value "$stats" upstream_read_bytes)
  stored=$(stat_value "$stats" fill_bytes)
  skipped=$(stat_value "$stats" fill_skipped_bytes)
  [ "$fetched" -eq "$(log_read_bytes "$log")" ] ||
    fail "$what: upstream_read_bytes $fetched, the log says" \
         "$(log_read_bytes "$log")"
  echo "$what: fetched $fetched, stored $stored, skipped $skipped (fills" \
       "$(stat_value "$stats" fill_busy_us) us busy, upstream" \
       "$(stat_value "$stats" upstream_busy_us) us)"
  [ $((stored + skipped)) -eq "$fetched" ] ||
    fail "$what: stored $stored + skipped $skipped != fetched $fetched"
  [ "$stored" -gt 0 ] || fail "$what: nothing was cached at all"
  [ "$fetched" -le $((2 * size)) ] ||
    fail "$what: fetched $fetched, more than twice the export"
  cached=$(cached_bytes "$cache")
  [ "$cached" -le "$stored" ] || fail "$what: cached $cached > stored $stored"

  # Readahead off for this read: a client's read that the budget
  # sends around the cache claims nothing, so a prefetch may fetch the
  # same uncached blocks again (core/ops/fill.c), which is no re-fetch
  # of what was cached: a fresh clone saw 256 KiB more than the
  # uncached bytes so.  What this read checks is that cached bytes
  # are hits.
  mv "$log" "$TMP/cold.log"
  proxy fscache-readahead=0
  check_all || fail "$what: the read after the restart got wrong data"
  stop_nbdkit "$TMP/px.pid"
  local up2
  up2=$(log_read_bytes "$log")
  echo "$what: after the restart $up2 bytes upstream, $cached were cached"
  [ "$up2" -le $((size - cached)) ] ||
    fail "$what: read $up2 bytes upstream after the restart, more than" \
         "the $((size - cached)) not cached"
  tool --dir "$cache" check > "$TMP/check.out" 2>&1 ||
    { cat "$TMP/check.out" >&2; fail "$what: nbd-fscache check"; }
}

cold "as the rates decide"
if [ "$skipped" -gt 0 ]; then
  echo "the budget engaged: $((stored * 100 / fetched))% of the bytes stored"
else
  echo "the budget did not engage: the fills kept up here"
fi

cold "budget engaged" budget
[ "$skipped" -gt 0 ] || fail "budget engaged: nothing skipped"
[ "$stored" -lt "$fetched" ] || fail "budget engaged: everything stored"
echo "budget engaged: $((stored * 100 / fetched))% of the bytes stored"
