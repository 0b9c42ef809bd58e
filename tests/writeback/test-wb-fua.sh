#!/usr/bin/env bash
# fscache-mode=writeback, FUA order under cache loss (rule 6, atop
# core/wlog/writeback.c): a write sent after a FUA write completed reaches
# the upstream only after it, as on a disk, whose FUA write is durable
# before its completion.  And the check can fail: with the test knob
# NBD_FSCACHE_WB_FUA_UNORDERED=1 (a FUA write leaves its epoch open,
# as before the rule) it does.
#
# Truth: tests/wb-oracle's write history.  200 pairs, one write at a
# time (--depth 1): A_i with FUA, then, once A_i is acknowledged, B_i
# (writes 2i and 2i+1 of --fua-every 2), to random blocks of 4096, and
# one flush at the end only.  `wb-oracle check IMAGE LOG` fails a
# write present on the upstream that was issued after a FUA write
# completed that is not there (nor a later write to its block).
#
# Upstream: nbdkit --filter=log --filter=rate file up.img rate=2M (a
# 2 Mbit/s link: 16 ms per 4 KiB write).  The client is done long
# before the writeback; once 120 of the 400 writes reached the upstream
# (the writeback in progress, about 2 s into it), kill -9 of the proxy
# and rm -rf of its cache; once the upstream has finished what it had,
# up.img is checked.  Then the same with the knob: it must fail.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires nbdkit --filter=rate null --version
requires test -f "$FILTER"
ORACLE="$top_builddir/tests/wb-oracle"
[ -x "$ORACLE" ] || fail "$ORACLE is not built"
oracle () { "$ORACLE" "$@"; }

# nbdkit in the foreground (-f) as a background job, with the test
# knob if $KNOB.
KNOB=
nbdkit ()
{
  if [ -n "$KNOB" ]; then
    env NBD_FSCACHE_WB_FUA_UNORDERED=1 nbdkit -f "$@" 2>>"$TMP/nbdkit.err" &
  else
    command nbdkit -f "$@" 2>>"$TMP/nbdkit.err" &
  fi
  disown $!                     # no "Killed" notices from kill -9
}

BLOCKS=4096
WRITES=400
KILL_AT=120
SIZE=$((BLOCKS * 4096))
uri="nbd+unix:///?socket=$TMP/px.sock"
seed=$((RANDOM * 32768 + RANDOM))
echo "seed: $seed"

up_count () { grep -c " $1 " "$TMP/up.log" || true; }
up_writes () { log_count "$TMP/up.log" Write; }
up_writes_at_least () { [ "$(up_writes)" -ge "$1" ]; }
up_idle ()
{
  [ "$(up_count Connect)" -eq "$(up_count Disconnect)" ] ||
    ! kill -0 "$(cat "$TMP/up.pid")" 2>/dev/null
}

# round NAME: one run; sets st (the check's exit status), out, held
# (the writes the upstream holds).
round ()
{
  local name="$1" log="$TMP/log-$1" wst
  truncate -s 0 "$TMP/up.img"
  truncate -s $SIZE "$TMP/up.img"
  : > "$TMP/up.log"
  KNOB='' start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log --filter=rate file "$TMP/up.img" rate=2M burstiness=0.05 \
    logfile="$TMP/up.log" logappend=true
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-key="wb-fua-$name" \
    fscache-mode=writeback

  wst=0
  oracle write "$uri" "$log" --blocks $BLOCKS --writes $WRITES \
    --flush-every 0 --fua-every 2 --depth 1 --seed $seed \
    2>"$TMP/writer-$name.err" || wst=$?
  [ $wst -eq 0 ] ||
    { cat "$TMP/writer-$name.err"; fail "round $name: writer exit $wst"; }
  [ "$(grep -c ' fua$' "$log")" -eq $((WRITES / 2)) ] ||
    fail "round $name: not $((WRITES / 2)) FUA writes in the log"
  up_writes_at_least $WRITES &&
    fail "round $name: the writeback was done before the client"
  wait_until up_writes_at_least $KILL_AT ||
    fail "round $name: $KILL_AT writes never reached the upstream"
  kill9_nbdkit "$TMP/px.pid"
  rm -rf "$TMP/cache"
  wait_until up_idle || fail "round $name: the upstream did not go idle"
  nup=$(up_writes)
  st=0; out=$(oracle check "$TMP/up.img" "$log" --initial zero) || st=$?
  stop_nbdkit "$TMP/up.pid"
}

t0=$(date +%s.%N)
round ordered
echo "ordered: killed after $nup upstream writes: exit $st: $out"
[ $st -eq 0 ] || fail "ordered: FUA order broken on cache loss: $out"
case "$out" in
  "consistent at flush 0 ("*" blocks from epoch 0)") ;;
  *) fail "ordered: unexpected: $out" ;;
esac
held=$(sed -n 's/^consistent at flush 0 (\([0-9]*\) .*/\1/p' <<<"$out")
# The kill came during the writeback: part of the writes are there.
[ "$held" -ge $((KILL_AT / 2)) ] && [ "$held" -lt $WRITES ] ||
  fail "ordered: the upstream holds $held of $WRITES writes"

# The knob: a FUA write leaves its epoch open; the writer sends the
# pairs of one batch in parallel, in block order.  Caught at once.
KNOB=1 round fua-unordered
echo "fua-unordered: killed after $nup upstream writes: exit $st: $out"
[ $st -eq 1 ] ||
  fail "a writer ignoring FUA order: exit $st, expected 1 (out: $out)"
case "$out" in
  "inconsistent: FUA order: "*) ;;
  *) fail "fua-unordered: caught for another reason: $out" ;;
esac
echo "$0: OK ($(seconds_since "$t0") s)"
