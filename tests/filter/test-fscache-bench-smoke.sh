#!/usr/bin/env bash
# Smoke test of the benchmark suite, tools/bench/compare.sh: a
# test-sized run (--quick: a 16M image, 1 s per phase) completes, prints
# a row for every phase x configuration, records in its results.tsv
# that the upstream byte counts add up, and that fscache's warm phases
# (and the sequential read after a proxy restart) read nothing upstream.
#
# The run uses fscache-validate=size: with the default (sample) every
# connection reads a 32 KiB coherency sample upstream, which is not a
# cache miss; with size the warm phases must read exactly 0 bytes.

source "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/functions.sh"

requires fio --version
requires fio --enghelp=nbd
requires python3 --version
requires nbdkit --version
requires nbdkit --filter=log --filter=stats --filter=rate --filter=delay \
  --filter=cache null --version
requires nbdkit nbd --version
requires test -f "$FILTER"

bench="$top_srcdir/tools/bench/compare.sh"
out="$TMP/bench"
phases="cold-seq-1m warm-seq-1m warm-rand-4k restart-seq-1m
        cold-rand-4k-qd16 cold-rand-64k-qd16 cold-seq-64k-qd1
        cold-rand-4k-bw cold-mixed"
configs="nocache nbdcache fscache local"
size=$((16 * 1024 * 1024))

fail ()
{
  echo "$0: FAIL: $*" >&2
  echo "---- compare.sh output ----" >&2
  cat "$TMP/bench.log" >&2 || true
  echo "---- results.tsv ----" >&2
  cat "$out/results.tsv" >&2 || true
  exit 1
}

start=$(date +%s)
if ! FSCACHE_FILTER="$FILTER" VALIDATE=size \
     timeout 300 "$bench" --quick --out="$out" > "$TMP/bench.log" 2>&1; then
  fail "compare.sh --quick failed"
fi
elapsed=$(( $(date +%s) - start ))
echo "$0: compare.sh --quick took ${elapsed}s"

[ -s "$out/results.tsv" ] || fail "no results.tsv"
[ -s "$out/table.txt" ] || fail "no table.txt"

# A TSV field of the row PHASE CONFIG, by column name.
field ()
{
  awk -F'\t' -v p="$1" -v c="$2" -v k="$3" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == p && $2 == c { print $col[k]; found = 1 }
    END { if (!found) print "MISSING" }' "$out/results.tsv"
}

# Every phase x configuration: a row in the printed table with numbers,
# and a row in results.tsv with status ok and some bytes read.
for p in $phases; do
  for c in $configs; do
    grep -Eq "^$p +$c +[0-9.]+ +[0-9]+ " "$TMP/bench.log" ||
      fail "no table row for $p $c"
    [ "$(field "$p" "$c" status)" = ok ] || fail "$p $c: status not ok"
    b=$(field "$p" "$c" io_bytes)
    [ "$b" -gt 0 ] 2>/dev/null || fail "$p $c: io_bytes=$b"
  done
done

# The accounting is live: without a cache the remote serves every byte
# of a whole sequential pass, and a cold fscache fetches each byte once.
b=$(field cold-seq-1m nocache upstream_bytes)
[ "$b" = "$size" ] || fail "cold-seq-1m nocache: upstream_bytes=$b, want $size"
b=$(field cold-seq-1m fscache upstream_bytes)
[ "$b" = "$size" ] || fail "cold-seq-1m fscache: upstream_bytes=$b, want $size"
b=$(field cold-seq-1m fscache fscache_upstream_bytes)
[ "$b" = "$size" ] ||
  fail "cold-seq-1m fscache: fscache_upstream_bytes=$b, want $size"

# Warm, and after a restart of the proxy: nothing upstream, as counted
# by the remote's log filter and by fscache's own counters.
for p in warm-seq-1m warm-rand-4k restart-seq-1m; do
  b=$(field "$p" fscache upstream_bytes)
  [ "$b" = 0 ] || fail "$p fscache: upstream_bytes=$b, want 0"
  b=$(field "$p" fscache fscache_upstream_bytes)
  [ "$b" = 0 ] || fail "$p fscache: fscache_upstream_bytes=$b, want 0"
done

# nbdkit's cache filter loses its cache with its process: the contrast
# the restart phase is there to show.
b=$(field restart-seq-1m nbdcache upstream_bytes)
[ "$b" = "$size" ] ||
  fail "restart-seq-1m nbdcache: upstream_bytes=$b, want $size"

# The fio JSON of every run is kept.
n=$(find "$out/raw" -name "*.json" | wc -l)
[ "$n" = 36 ] || fail "$n fio JSON files in raw/, want 36"

# No warnings or errors from the fscache proxy.
if [ -s "$out/raw/nbdkit-fscache.log" ]; then
  fail "fscache proxy logged: $(head -3 "$out/raw/nbdkit-fscache.log")"
fi

# Rounds: two of one phase, the configurations alternating; the table
# gives medians with their spread, and the ratio within each round.
out2="$TMP/bench2"
if ! FSCACHE_FILTER="$FILTER" VALIDATE=size \
     timeout 300 "$bench" --quick --rounds=2 --phases=cold-rand-4k-bw \
       --configs="nocache fscache" --out="$out2" > "$TMP/bench2.log" 2>&1; then
  cat "$TMP/bench2.log" >&2
  fail "compare.sh --rounds=2 failed"
fi
order=$(grep -o 'round [0-9] of 2, configuration [a-z]*' "$TMP/bench2.log" |
        awk '{ printf "%s%s ", $2, $6 }')
[ "$order" = "1nocache 1fscache 2fscache 2nocache " ] ||
  fail "round order: '$order'"
rows=$(awk -F'\t' 'NR > 1 { print $1, $2, $NF }' "$out2/results.tsv" | sort | tr '\n' ,)
[ "$rows" = "cold-rand-4k-bw fscache 1,cold-rand-4k-bw fscache 2,cold-rand-4k-bw nocache 1,cold-rand-4k-bw nocache 2," ] ||
  fail "rounds in results.tsv: $rows"
grep -Eq '^cold-rand-4k-bw +fscache +[0-9.]+ \([0-9.]+\.\.[0-9.]+\)' "$TMP/bench2.log" ||
  fail "no median (min..max) row for fscache"
grep -q 'cold random 4k, bw link: upstream <= 1.1x read' "$TMP/bench2.log" ||
  fail "no upstream-cost check"

echo "$0: PASS"
