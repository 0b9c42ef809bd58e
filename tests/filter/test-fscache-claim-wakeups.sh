#!/usr/bin/env bash
# nbd-fscache: reads waiting for another's fetch wake for their blocks,
# not for every change to the object (core/internal.h, fsc_claim_wake).
#
# A cold stream through a link (the rate filter) with readahead: the
# client's reads at the stream's front wait for the claims readahead's
# fetches hold.  When they all waited on the object's one condition,
# each fill stored, each claim released and each commit woke every one
# of them: 50 to 100 wakeups per wait (dedup_wakeups / dedup_waits),
# and a third of the stream's CPU in context switches.  Now each waits
# on a queue hashed from its block, woken by the releases of that
# block's claims: a handful per wait.
#
# Truth: cmp against the image; the filter's own counts of waits and
# wakeups (each wakeup is a return from pthread_cond_wait, counted
# where it happens).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

# Fills neither skipped nor probed for their cost (core/ops/fill.c):
# every miss claims its blocks, so the reads wait on claims.
export NBD_FSCACHE_TEST_BUDGET=0

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires nbdkit --filter=rate null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

size=$((256 * 1024 * 1024))
make_random "$TMP/upstream.img" "$size"

start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" --filter=rate file "$TMP/upstream.img" rate=800M \
  fscache-dir="$TMP/cache" fscache-stats="$TMP/px.stats"
nbdcopy "nbd+unix:///?socket=$TMP/px.sock" "$TMP/out.img"
stop_nbdkit "$TMP/px.pid"
if ! cmp "$TMP/upstream.img" "$TMP/out.img"; then
  echo "$0: FAIL: the copy differs from the image" >&2
  exit 1
fi

waits=$(stat_value "$TMP/px.stats" dedup_waits)
wakeups=$(stat_value "$TMP/px.stats" dedup_wakeups)
echo "dedup_waits $waits, dedup_wakeups $wakeups"
if [ "$waits" -lt 3 ]; then
  echo "$0: FAIL: $waits reads waited for another's fetch: the stream" \
       "did not wait at its front, so this test measured nothing" >&2
  exit 1
fi
if [ "$wakeups" -gt $((30 * waits)) ]; then
  echo "$0: FAIL: $wakeups wakeups for $waits waits (more than 30 each):" \
       "the waiting reads are woken by changes to other blocks" >&2
  exit 1
fi
echo "$0: OK"
