#!/usr/bin/env bash
# nbd-fscache: how big should the cache be?  The miss-ratio curve the
# filter gathers from its clients' reads (core/base/mrc.c: SHARDS-style
# spatial sampling of reuse distances, issue 45), NAME.stats's "mrc"
# lines, nbd-fscache stat's predicted_hit_ratio and nbd-fscache advise.
#
#  1. The shared CloudPhysics trace's reads replayed (nbd-fscache
#     replay) through a proxy with no cap (4 KiB blocks, no readahead,
#     every miss stored), over nbdkit's pattern plugin: the curve it
#     predicts, then the trace replayed again with caps of 5%, 25% and
#     50% of the trace's footprint on fresh caches: each measured hit
#     ratio (blocks not read upstream over block accesses) is within 5
#     points of the prediction at that size.  Not at 1%: there the cap,
#     which counts the index and checksum pages of scattered blocks
#     besides their data, leaves the filter a varying fraction of it
#     for data (3.6% to 7.0% hits in two runs against the curve's 8.2%;
#     issue 45's small-cap problem, left open).
#  2. stat prints predicted_hit_ratio at multiples of the cached size,
#     advise a sentence for the object.
#
# Truth: the replays' own counts (the filter's upstream reads against
# the block accesses the trace makes, computed here from the trace).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit pattern --dump-plugin
requires xzcat --version
requires test -r "$FILTER"
requires test -x "$TOOL"
trace_xz="$top_srcdir/tests/data/cloudphysics-sample.trace.xz"
requires test -r "$trace_xz"

xzcat "$trace_xz" > "$TMP/trace"
BS=4096
info="$top_srcdir/tools/bench/trace-info.py"
read -r footprint accesses size < <("$PYTHON" "$info" footprint "$TMP/trace" "$BS")
echo "trace: $accesses block accesses, footprint $footprint blocks"
export NBD_FSCACHE_TEST_BUDGET=0

# run NAME [CAP]: replay through a fresh proxy; prints its miss ratio.
run ()
{
  local d="$TMP/$1" cap=()
  [ -n "${2:-}" ] && cap=(fscache-max-size="$2")
  mkdir -p -m 700 "$d"
  start_nbdkit -P "$d/pid" -U "$d/sock" --filter="$FILTER" pattern "$size" \
    fscache-dir="$d/c" fscache-block-size=4K fscache-readahead=0 \
    fscache-stats="$d/stats" fscache-key=trace "${cap[@]}"
  "$TOOL" replay "$TMP/trace" "nbd+unix:///?socket=$d/sock" > "$d/replay" ||
    fail "replay through $1"
  stop_nbdkit "$d/pid"
  "$PYTHON" -c "print('%.4f' % ($(stat_value "$d/stats" upstream_read_bytes) / $BS / $accesses))"
}

# ---- 1. the prediction against caps ----
run free > /dev/null
statsfile=$(ls "$TMP"/free/c/objects/*/*.stats)
grep -q '^mrc ' "$statsfile" || fail "part 1: no curve in $statsfile"
predict ()                      # BLOCKS: the predicted hit ratio
{
  "$PYTHON" "$info" predict "$statsfile" "$(( $1 * BS ))"
}
for f in 0.05 0.25 0.50; do
  blocks=$("$PYTHON" -c "print(round($f * $footprint))")
  want=$(predict "$blocks")
  miss=$(run "cap$f" $((blocks * BS)))
  got=$("$PYTHON" -c "print('%.4f' % (1 - $miss))")
  echo "part 1: cap $f of the footprint ($blocks blocks): predicted hits" \
       "$want, measured $got"
  "$PYTHON" -c "import sys; sys.exit(abs($want - $got) > 0.05)" ||
    fail "part 1: at $f the measured hit ratio $got is over 5 points from $want"
done

# ---- 2. stat and advise ----
"$TOOL" --dir "$TMP/free/c" stat trace > "$TMP/stat.out" || fail "part 2: stat"
grep -A6 '^predicted_hit_ratio' "$TMP/stat.out"
[ "$(grep -c '^  at ' "$TMP/stat.out")" = 6 ] ||
  fail "part 2: stat printed no predicted hit ratios"
"$TOOL" --dir "$TMP/free/c" advise > "$TMP/advise.out" || fail "part 2: advise"
cat "$TMP/advise.out"
grep -q "predicted hits: .* at half, .* now, .* at twice" "$TMP/advise.out" &&
  grep -q "would raise hits\|could go\|about right" "$TMP/advise.out" ||
  fail "part 2: advise gave no advice"

echo "$0: OK"
