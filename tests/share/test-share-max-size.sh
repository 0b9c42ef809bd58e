#!/usr/bin/env bash
# nbd-fscache: fscache-max-size with several processes on one object.
#
# Three proxy processes, one cache directory and key, each with
# fscache-max-size=8M, in front of a 64 MiB upstream (nbdkit file, 1 ms
# per read, log filter).  Process 1 opens the object first (a held
# connection): it owns it, 2 and 3 join it.
#
#  1. The cap holds for the object as a whole: twice, at once, a random
#     reader through process 1 (every 64 KiB block once, shuffled) and
#     a sequential nbdcopy through each of 2 and 3.  Every read is
#     identical to the image, and the object's allocated size (du of
#     its files, sampled every 20 ms throughout) never exceeds 8 MiB
#     plus one 64 KiB block, and reaches at least half the cap.
#  2. Scan resistance across processes: a hot 4 MiB region, warmed
#     through process 1, is read at random through process 2 while
#     process 3 scans the whole export (nbdcopy).  The hot reads keep
#     hitting: the upstream reads of the hot region during the scan
#     stay under 1 MiB (a FIFO would fetch the region again on every
#     pass of the 8 MiB cache, about 8 times; a process that did not
#     share the object would read it upstream on every hot read).
#
# Truth: the image (cmp and per-read comparison), du of the object's
# files, the upstream's request log (offsets and counts of reads).
#
# What is cached here must not depend on how busy the machine's disk
# is: NBD_FSCACHE_TEST_BUDGET=0 keeps the fill budget (which, when the
# fills measure slower than the upstream, lets reads bypass the cache)
# out of a test of what eviction keeps.  Under a writer's fdatasync
# loop beside it the fills measured slower than this page-cached
# upstream, nearly every read bypassed the cache (238 MB of
# fill_skipped_bytes), the hot set was never cached, and part 2 failed
# for a reason that has nothing to do with eviction.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
export NBD_FSCACHE_TEST_BUDGET=0

requires nbdkit --version
requires nbdcopy --version
requires du --version
requires nbdkit --filter=log --filter=delay null --dump-plugin
requires python3 -c 'import nbd'
requires test -r "$FILTER"

size=$((64 * 1024 * 1024))
cap=$((8 * 1024 * 1024))
block=65536
hot=$((4 * 1024 * 1024))
img="$TMP/upstream.img"
log="$TMP/up.log"
make_random "$img" "$size"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log --filter=delay file "$img" logfile="$log" delay-read=1ms

for n in 1 2 3; do
  start_nbdkit -P "$TMP/px$n.pid" -U "$TMP/px$n.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" fscache-dir="$TMP/cache" \
    fscache-key=capped fscache-max-size=8M \
    fscache-stats="$TMP/px$n.stats" 2>"$TMP/px$n.err"
done
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }
hold_export "$(uri 1)" "$TMP/release" "$TMP/held"

# object_du, start_sampler, stop_sampler: tests/functions.sh.

# The readers: tests/cap-reader.py.
reader="$top_srcdir/tests/cap-reader.py"

# ---- 1. the cap, three processes filling at once -----------------------
start_sampler
for pass in 1 2; do
  "$PYTHON" "$reader" "$(uri 1)" "$img" random > /dev/null &
  r1=$!
  nbdcopy "$(uri 2)" "$TMP/seq2.img" & c2=$!
  nbdcopy "$(uri 3)" "$TMP/seq3.img" & c3=$!
  wait $r1 || fail "1: pass $pass: the random reader of process 1 failed"
  wait $c2 || fail "1: pass $pass: nbdcopy through process 2 failed"
  wait $c3 || fail "1: pass $pass: nbdcopy through process 3 failed"
  cmp "$img" "$TMP/seq2.img" || fail "1: pass $pass: process 2's copy differs"
  cmp "$img" "$TMP/seq3.img" || fail "1: pass $pass: process 3's copy differs"
done
stop_sampler
max=$(sort -n "$TMP/du.samples" | tail -1)
nsamples=$(wc -l < "$TMP/du.samples")
echo "1: $nsamples du samples, largest $max bytes (cap $cap, +1 block $block)"
[ "$nsamples" -ge 10 ] || fail "1: only $nsamples du samples"
[ "$max" -le $((cap + block)) ] ||
  fail "1: the object grew to $max bytes, over the cap $cap plus one block"
[ "$max" -ge $((cap / 2)) ] ||
  fail "1: the object never held half its cap ($max bytes): nothing cached?"

# ---- 2. scan resistance across processes ---------------------------------
# Warm the hot region through process 1: three passes of scattered
# 4 KiB reads (no two in a row adjacent).
"$PYTHON" - "$(uri 1)" "$img" "$hot" <<'EOF'
import sys, nbd
uri, img, hot = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(img, "rb").read(hot)
h = nbd.NBD(); h.connect_uri(uri)
for rep in range(3):
    for i in range(hot // 4096):
        o = (i * 37) % (hot // 4096) * 4096
        if h.pread(4096, o) != data[o:o + 4096]:
            sys.exit("warm-up: wrong data")
EOF
b0=$(log_read_bytes "$log" "$hot")
rm -f "$TMP/scan-done" "$TMP/scan-done.ready"
"$PYTHON" "$reader" "$(uri 2)" "$img" hot "$hot" "$TMP/scan-done" \
  > "$TMP/hot.count" &
hotpid=$!
wait_until test -e "$TMP/scan-done.ready" || fail "2: the hot reader did not start"
nbdcopy "$(uri 3)" "$TMP/scan.img"
touch "$TMP/scan-done"
wait "$hotpid" || fail "2: the hot reader (process 2) saw wrong data"
cmp "$img" "$TMP/scan.img" || fail "2: the scan's copy (process 3) differs"
got=$(( $(log_read_bytes "$log" "$hot") - b0 ))
echo "2: the hot reader (process 2) did $(cat "$TMP/hot.count") reads during" \
     "the scan (process 3); $got bytes of the hot region read upstream meanwhile"
[ "$(cat "$TMP/hot.count")" -ge 100 ] ||
  fail "2: the hot reader did only $(cat "$TMP/hot.count") reads during the scan"
[ "$got" -le $((1024 * 1024)) ] ||
  fail "2: $got bytes of the hot 4 MiB region were read upstream during" \
       "the scan (the scan from process 3 flushed the hot set of process 2," \
       "or process 2 does not share the object)"

touch "$TMP/release"
for n in 1 2 3; do stop_nbdkit "$TMP/px$n.pid"; done
for n in 1 2 3; do
  echo "  px$n: $(grep -E '^(evicted_blocks|promoted_blocks|cap_skips|objects_busy|share_[a-z]+) ' \
                   "$TMP/px$n.stats" | tr '\n' ' ')"
done
echo "$0: PASS"
