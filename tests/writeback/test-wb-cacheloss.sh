#!/usr/bin/env bash
# fscache-mode=writeback, the cache lost while writeback lags: whatever
# moment the proxy dies and its cache directory is wiped, the upstream
# holds a state the client had at one of its flushes, plus part of the
# epoch after it; never a later write without the earlier epochs'.
# And the check can fail: with a writer that ignores epochs
# (NBD_FSCACHE_WB_UNORDERED=1) it does.
#
# Truth: tests/wb-oracle's write history (4 KiB self-describing blocks
# with sequence numbers, a flush every ~16 writes, depth 4), logged by
# the client; `wb-oracle check IMAGE LOG --initial zero` says at which
# flush K the image is consistent, or fails.
#
# Upstream: nbdkit --filter=log --filter=delay file up.img with
# delay-write=20ms: writeback (an upstream flush per epoch) falls far
# behind the client.  Each round: a fresh zeroed image and cache, 1500
# writes over 2048 blocks through nbdkit --filter=fscache nbd ...
# fscache-mode=writeback, then kill -9 of the proxy and rm -rf of its
# cache directory at a varying moment: rounds 1-5 after 10, 30, 50, 70,
# 90% of the writes were issued (during the writes), rounds 6-10 once
# the writer has finished and 10, 25, 40, 55, 70% as many writes as it
# made have reached the upstream (during writeback).  Then, once the
# upstream has finished the requests it had, up.img must be consistent
# at some flush K; and the upstream must have been behind the client
# (K < the acknowledged flushes) in at least half of the rounds, or
# nothing was lost and the test proves little.
#
# The same rounds, during writeback first, with the proxy started with
# NBD_FSCACHE_WB_UNORDERED=1 (batches span epochs, sent newest first,
# no upstream flush): at least one of up to 5 must fail the check
# (exit 1); it stops at the first failure.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires nbdkit --filter=delay null --version
requires test -f "$FILTER"
ORACLE="$top_builddir/tests/wb-oracle"
[ -x "$ORACLE" ] || fail "$ORACLE is not built"
oracle () { "$ORACLE" "$@"; }

# nbdkit in the foreground (-f) as a background job with its stderr in
# $NBDKIT_STDERR (for a post-mortem), with the test knob if $UNORDERED.
NBDKIT_STDERR=/dev/null
UNORDERED=
nbdkit ()
{
  if [ -n "$UNORDERED" ]; then
    env NBD_FSCACHE_WB_UNORDERED=1 nbdkit -f "$@" 2>"$NBDKIT_STDERR" &
  else
    command nbdkit -f "$@" 2>"$NBDKIT_STDERR" &
  fi
  disown $!                     # no "Killed" notices from kill -9
}

BLOCKS=2048
WRITES=1500
SIZE=$((BLOCKS * 4096))
uri="nbd+unix:///?socket=$TMP/px.sock"
seed0=$((RANDOM * 32768 + RANDOM))
echo "seeds: $seed0 + round"
# Rounds: "w P" kills after P% of the writes were issued, "b P" once
# P% of them reached the upstream.
ROUNDS=("w 10" "w 30" "w 50" "w 70" "w 90" "b 10" "b 25" "b 40" "b 55" "b 70")
BAD_ROUNDS=("b 10" "b 25" "w 50" "w 70" "w 90")

up_count () { grep -c " $1 " "$TMP/up.log" || true; }
up_writes () { log_count "$TMP/up.log" Write; }
up_writes_at_least () { [ "$(up_writes)" -ge "$1" ]; }
# The upstream has finished every request of the connections it had
# (or has exited: nothing more will reach the file).
up_idle ()
{
  [ "$(up_count Connect)" -eq "$(up_count Disconnect)" ] ||
    ! kill -0 "$(cat "$TMP/up.pid")" 2>/dev/null
}
writes_issued ()
{
  if [ -f "$1" ]; then grep -c '^W ' "$1" || true; else echo 0; fi
}
issued_at_least () { [ "$(writes_issued "$1")" -ge "$2" ]; }
# The writer issues 1500 writes in a fraction of a second: wait_until
# (50 ms) is too coarse to stop it at a chosen write; this polls (a
# state, not a time) every 5 ms, for at most 20 s.
wait_fine ()
{
  local i
  for (( i=0; i<4000; i++ )); do
    if "$@"; then return 0; fi
    sleep 0.005
  done
  return 1
}

# round NAME MOMENT PERCENT: one round; sets st (the check's exit
# status), out (its output), k (K, if consistent), nfa, when.
round ()
{
  local name="$1" moment="$2" pct="$3"
  local log="$TMP/log-$name" target wpid wst
  truncate -s 0 "$TMP/up.img"
  truncate -s $SIZE "$TMP/up.img"
  : > "$TMP/up.log"
  NBDKIT_STDERR="$TMP/up-$name.err" UNORDERED='' \
    start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log --filter=delay file "$TMP/up.img" delay-write=20ms \
    logfile="$TMP/up.log" logappend=true
  NBDKIT_STDERR="$TMP/px-$name.err" \
    start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-key="wb-cacheloss-$name" \
    fscache-mode=writeback

  oracle write "$uri" "$log" --blocks $BLOCKS --writes $WRITES \
    --flush-every 16 --depth 4 --seed $((seed0 + r)) \
    2>"$TMP/writer-$name.err" &
  wpid=$!
  cleanup_fn "kill $wpid 2>/dev/null"
  target=$((WRITES * pct / 100))
  if [ "$moment" = w ]; then
    wait_fine issued_at_least "$log" $target ||
      fail "round $name: the writer never issued $target writes"
  else
    wst=0; wait $wpid || wst=$?
    [ $wst -eq 0 ] || { cat "$TMP/writer-$name.err"; fail "round $name: writer exit $wst"; }
    wait_until up_writes_at_least $target ||
      fail "round $name: $target writes never reached the upstream"
  fi
  kill9_nbdkit "$TMP/px.pid"
  rm -rf "$TMP/cache"
  wst=0; wait $wpid || wst=$?
  [ $wst -eq 0 ] || [ $wst -eq 3 ] ||
    { cat "$TMP/writer-$name.err"; fail "round $name: writer exit $wst"; }
  wait_until up_idle || fail "round $name: the upstream did not go idle"
  if [ "$moment" = w ]; then
    when="after $(writes_issued "$log") of $WRITES writes issued"
  else
    when="during writeback, after $(up_writes) upstream writes"
  fi
  nfa=$(grep -c '^FA ' "$log" || true)
  st=0; out=$(oracle check "$TMP/up.img" "$log" --initial zero) || st=$?
  k=$(sed -n 's/^consistent at flush \([0-9]*\) .*/\1/p' <<<"$out")
  stop_nbdkit "$TMP/up.pid"
}

t0=$(date +%s.%N)
behind=0
r=0
for rd in "${ROUNDS[@]}"; do
  r=$((r + 1))
  read -r moment pct <<<"$rd"
  round $r "$moment" "$pct"
  [ $st -eq 0 ] || fail "round $r: killed $when, cache lost: $out"
  [ -n "$k" ] || fail "round $r: cannot parse '$out'"
  [ "$k" -lt "$nfa" ] && behind=$((behind + 1))
  echo "round $r: killed $when (client: $nfa flushes acknowledged)," \
       "cache lost: $out"
done
[ $behind -ge $((${#ROUNDS[@]} / 2)) ] ||
  fail "the upstream was behind the client in only $behind rounds"
echo "ordered writeback: all ${#ROUNDS[@]} rounds consistent," \
     "the upstream behind the client in $behind ($(seconds_since "$t0") s)"

# The same with a writer that ignores epochs: the check must catch it.
t1=$(date +%s.%N)
caught=
r=0
for rd in "${BAD_ROUNDS[@]}"; do
  r=$((r + 1))
  read -r moment pct <<<"$rd"
  UNORDERED=1 round "u$r" "$moment" "$pct"
  echo "unordered round $r: killed $when (client: $nfa flushes acknowledged)," \
       "exit $st: $out"
  case $st in
    0) ;;
    1) caught=$r; break ;;
    *) fail "unordered round $r: the checker failed (exit $st)" ;;
  esac
done
[ -n "$caught" ] ||
  fail "a writer ignoring epochs passed ${#BAD_ROUNDS[@]} rounds: the check cannot tell"
echo "unordered writeback: caught in round $caught ($(seconds_since "$t1") s)"
echo "$0: OK ($(seconds_since "$t0") s)"
