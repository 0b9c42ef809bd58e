#!/usr/bin/env bash
# nbd-fscache: kill -9 the proxy at 10 random moments while it fills
# the cache, and check after each restart that
#
#  - the whole export reads back identical to the upstream image,
#  - the object is reused (objects_reused, unclean_opens = 1) and never
#    discarded (objects_discarded = 0),
#  - what was committed before the crash is served from the cache
#    (hit_bytes, cross-checked with the bytes the log filter saw going
#    upstream), never shrinks from one round to the next, and grows in
#    the rounds that lasted past the committer's 2 s period.
#
# Fill rounds alternate a cold sequential reader (nbdcopy piped into
# cmp, so whatever was served before the crash is checked too) and a
# random reader (fio's nbd engine, verifying the crc32c headers fio
# wrote into the upstream image).  The upstream is rate limited during
# fills; the kill comes at a random moment after the first upstream
# progress, and only while the reader runs and an upstream read (a
# fill) is in flight, which the test checks from the log filter.
#
# The read-back after each crash runs with fills disabled
# (NBD_FSCACHE_FAULTS=write:data:1+:ENOSPC, which only pauses fills)
# and without readahead, so that hit_bytes is exactly what survived
# the crash, and so that the same partly filled object is crashed
# again in the next round instead of being completed by the check.
# Once an object is half cached the rounds go on with a fresh export
# name (a new object).  A last restart without faults fills the last
# object completely and a final one serves it all from the cache.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires fio --version
requires cmp --version
requires nbdkit --filter=log --filter=rate null --dump-plugin
requires test -r "$FILTER"

SIZE=$((64 * 1024 * 1024))
SAMPLE_BYTES=32768            # fscache-validate=sample reads 8 x 4K
RATE=32M                      # upstream bits/s while filling (4 MB/s)
ROUNDS=10
STRONG_ROUNDS=" 3 6 "          # kill only after >= 1 commit period

up="$TMP/up.img"
cache="$TMP/cache"
sock="$TMP/sock"
pid="$TMP/nbdkit.pid"
# One object per export name: when an object is half cached the
# rounds move on to a fresh export name, so that every kill still
# lands in the middle of filling.
export_no=1
uri="nbd+unix:///e$export_no?socket=$sock"
key=crash-test

# An upstream image with a crc32c header in every 4K block, so that
# fio can verify random reads of it wherever they land.
fio --name=mkimage --filename="$up" --size=$SIZE --bs=4k --rw=write \
    --verify=crc32c --do_verify=0 --ioengine=psync \
    --verify_state_save=0 >/dev/null

log_bytes_over ()        # LOG N: more than N bytes read upstream?
{
  [ -f "$1" ] && [ "$(log_read_bytes "$1")" -gt "$2" ]
}

expect_stat ()           # STATS NAME OP VALUE
{
  local v
  v="$(stat_value "$1" "$2")"
  if ! test "$v" "$3" "$4"; then
    cat "$1" >&2
    fail "round $round: $2 = $v, expected $3 $4"
  fi
}

# A proxy in the foreground of a job of this shell (command: not the
# nbdkit function of tests/functions.sh), so that its exit status is
# seen, and its stop: SIGTERM, after which it must exit with 0.  It
# once died of SIGSEGV at exit, in the unloaded filter, beside a disk
# and CPU load (5 cores in 6 runs of this test): a pool worker closed
# its upstream context after pool_put had stopped waiting for it
# (plugin/pool.c), and a reclaimer that closed its lingering object
# itself was detached, waited for by nobody (core/object/object.c).
fg_proxy ()
{
  rm -f "$sock"
  command nbdkit -f -U "$sock" "$@" 2>>"$TMP/proxy.err" &
  fg_pid=$!
  wait_until test -S "$sock" || fail "round $round: the proxy did not start"
}
term_proxy ()
{
  local st=0
  kill -TERM "$fg_pid"
  wait "$fg_pid" || st=$?
  [ "$st" -eq 0 ] ||
    fail "round $round: the proxy exited with status $st after SIGTERM" \
         "(128 + the signal that killed it)"
}

prev_cached=0
total_cached=0
for (( round=1; round<=ROUNDS; round++ )); do
  fill_log="$TMP/fill.$round.log"
  cmp_log="$TMP/check.$round.log"
  cmp_stats="$TMP/check.$round.stats"

  # ---- fill, and crash --------------------------------------------
  # Its messages kept (fail prints the last of them): a daemonised
  # nbdkit points its stderr at /dev/null, so it runs in the foreground
  # of a disowned job (NBDKIT_STDERR, tests/functions.sh).
  NBDKIT_STDERR="$TMP/fill.err" start_nbdkit -P "$pid" -U "$sock" \
    --filter="$FILTER" --filter=log --filter=rate \
    file "$up" fscache-dir="$cache" fscache-key="$key" \
    logfile="$fill_log" rate=$RATE

  if (( round % 2 )); then
    kind=sequential
    ( nbdcopy "$uri" - | cmp - "$up" ) > "$TMP/reader.$round.out" 2>&1 &
  else
    kind=random
    # fio's nbd engine makes one pass whatever time_based says: loop
    # (bounded) until the connection breaks.
    ( cd "$TMP"
      for (( i=0; i<100; i++ )); do
        fio --name=rand --ioengine=nbd --uri="$uri" \
          --size=$SIZE --bsrange=4k-256k --verify_interval=4k \
          --verify=crc32c --rw=randread --iodepth=4 --numjobs=2 \
          --verify_state_save=0 || exit
      done ) > "$TMP/reader.$round.out" 2>&1 &
  fi
  reader=$!

  # Progress first (beyond the coherency sample), then a random
  # moment: 0-2 s, or 4 s in the rounds that must see a commit.
  wait_until log_bytes_over "$fill_log" $((SAMPLE_BYTES + 1024 * 1024)) ||
    fail "round $round: no upstream reads within 20 s"
  if [[ "$STRONG_ROUNDS" == *" $round "* ]]; then
    delay=4.0
  else
    delay="$(printf '%d.%03d' $((RANDOM % 3 / 2)) $((RANDOM % 1000)))"
  fi
  sleep "$delay"
  # Kill while a fill is under way: an upstream read issued and not yet
  # answered (the reader may be between hits, or fio between passes:
  # then wait, bounded, for the next fill).
  for (( i=0; i<100; i++ )); do
    kill -0 "$reader" 2>/dev/null ||
      { cat "$TMP/reader.$round.out" >&2;
        fail "round $round: the $kind reader ended before the kill"; }
    inflight=$(( $(grep -c ' Read id=' "$fill_log" || true) -
                 $(grep -c '\.\.\.Read id=' "$fill_log" || true) ))
    [ "$inflight" -gt 0 ] && break
    sleep 0.05
  done
  kill9_nbdkit "$pid"
  [ "$inflight" -gt 0 ] ||
    fail "round $round: no upstream read in flight for 5 s"
  wait "$reader" || true

  # Whatever the reader got before the crash was right.
  if [ $kind = sequential ]; then
    if grep -q differ "$TMP/reader.$round.out"; then
      cat "$TMP/reader.$round.out" >&2
      fail "round $round: wrong data served before the crash"
    fi
  else
    if grep -Eqi 'verify failed|bad header|bad magic|crc32c' \
         "$TMP/reader.$round.out"; then
      grep -Ei 'verify|bad|crc' "$TMP/reader.$round.out" | head >&2
      fail "round $round: fio verify error before the crash"
    fi
  fi

  # ---- restart: read everything back, without filling --------------
  NBD_FSCACHE_FAULTS=write:data:1+:ENOSPC \
    fg_proxy --filter="$FILTER" --filter=log \
      file "$up" fscache-dir="$cache" fscache-key="$key" \
      logfile="$cmp_log" fscache-stats="$cmp_stats" fscache-readahead=0
  rm -f "$TMP/out.img"
  nbdcopy "$uri" "$TMP/out.img" ||
    fail "round $round: client error reading back after the crash"
  cmp "$TMP/out.img" "$up" ||
    fail "round $round: data differs from upstream after the crash"
  term_proxy

  expect_stat "$cmp_stats" objects_reused -ge 1
  expect_stat "$cmp_stats" objects_discarded -eq 0
  expect_stat "$cmp_stats" objects_created -eq 0
  expect_stat "$cmp_stats" unclean_opens -eq 1
  expect_stat "$cmp_stats" withdrawals -eq 0
  expect_stat "$cmp_stats" verify_failures -eq 0
  expect_stat "$cmp_stats" read_errors -eq 0

  hit="$(stat_value "$cmp_stats" hit_bytes)"
  miss="$(stat_value "$cmp_stats" miss_bytes)"
  [ $((hit + miss)) -eq $SIZE ] ||
    fail "round $round: hit_bytes $hit + miss_bytes $miss != $SIZE"
  # Independent count: what the log filter saw going upstream is what
  # the stats say was missed or read ahead, plus one coherency sample
  # per object lookup.
  pre="$(stat_value "$cmp_stats" prefetch_bytes)"
  nopen="$(stat_value "$cmp_stats" objects_opened)"
  upbytes="$(log_read_bytes "$cmp_log")"
  [ "$upbytes" -eq $((miss + pre + nopen * SAMPLE_BYTES)) ] ||
    fail "round $round: log saw $upbytes bytes upstream, stats say" \
         "$miss missed + $pre read ahead + $nopen samples"
  [ "$hit" -ge "$prev_cached" ] ||
    fail "round $round: cached bytes shrank from $prev_cached to $hit"
  if [[ "$STRONG_ROUNDS" == *" $round "* ]]; then
    [ "$hit" -gt "$prev_cached" ] ||
      fail "round $round: killed ${delay}s into the fill, after a" \
           "commit, yet nothing more was served from the cache"
    [ "$upbytes" -lt $SIZE ] ||
      fail "round $round: upstream bytes $upbytes not below the size"
  fi
  echo "round $round: export e$export_no, $kind reader, killed after" \
       "${delay}s with $inflight upstream reads in flight;" \
       "cached now $hit of $SIZE bytes, $upbytes read upstream"
  total_cached=$((total_cached + hit - prev_cached))
  prev_cached=$hit
  if [ "$hit" -ge $((SIZE / 2)) ] && [ $round -lt $ROUNDS ]; then
    export_no=$((export_no + 1))
    uri="nbd+unix:///e$export_no?socket=$sock"
    prev_cached=0
  fi
done

[ "$total_cached" -gt 0 ] || fail "nothing ever survived a crash"

# ---- a normal restart completes the object, the next serves it all --
# Every fill stored (NBD_FSCACHE_TEST_BUDGET=0): from this local file,
# faster than the cache disk's direct writes, the fill budget would
# skip some past its first 64 MiB (fill.c), and the next proxy read
# them upstream (seen beside a disk load).
round=final1
NBD_FSCACHE_TEST_BUDGET=0 \
  fg_proxy --filter="$FILTER" --filter=log \
    file "$up" fscache-dir="$cache" fscache-key="$key" \
    logfile="$TMP/final1.log" fscache-stats="$TMP/final1.stats" \
    fscache-readahead=0
rm -f "$TMP/out.img"
nbdcopy "$uri" "$TMP/out.img"
cmp "$TMP/out.img" "$up"
term_proxy
expect_stat "$TMP/final1.stats" objects_reused -ge 1
expect_stat "$TMP/final1.stats" unclean_opens -eq 0
expect_stat "$TMP/final1.stats" hit_bytes -eq "$prev_cached"
expect_stat "$TMP/final1.stats" withdrawals -eq 0

round=final2
fg_proxy --filter="$FILTER" --filter=log \
  file "$up" fscache-dir="$cache" fscache-key="$key" \
  logfile="$TMP/final2.log" fscache-stats="$TMP/final2.stats"
rm -f "$TMP/out.img"
nbdcopy "$uri" "$TMP/out.img"
cmp "$TMP/out.img" "$up"
term_proxy
expect_stat "$TMP/final2.stats" hit_bytes -eq $SIZE
expect_stat "$TMP/final2.stats" miss_bytes -eq 0
nopen="$(stat_value "$TMP/final2.stats" objects_opened)"
[ "$(log_read_bytes "$TMP/final2.log")" -eq $((nopen * SAMPLE_BYTES)) ] ||
  fail "final read went upstream for more than the coherency sample"

echo "$0: PASS"
