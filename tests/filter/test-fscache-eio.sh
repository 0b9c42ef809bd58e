#!/usr/bin/env bash
# nbd-fscache: I/O errors of the cache's own files under load.
#
# NBD_FSCACHE_FAULTS makes the cache's reads, writes or syncs fail with
# EIO (separate runs):
#
#   read:data:50+:EIO    on a cache filled beforehand (so reads are hits)
#   write:data:20+:EIO   on a cold cache (fills fail)
#   sync:any:2+:EIO      on a cold cache (commits fail)
#
# while 16 readers run at once (4 nbdcopy processes x 4 connections x 4
# requests in flight, the upstream slowed by 10 ms a read) and a client
# FLUSH (qemu-io) comes in the middle of them, round after round until
# the stats show the object withdrawn, and one round more.  Every reader must finish
# without error and with the upstream's exact bytes; withdrawals >= 1
# and the matching error counter >= 1; the warning is logged; and a
# run without faults afterwards finds nothing of the withdrawn object
# to reuse (its files were removed) and serves the right data.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires qemu-io --version
requires nbdkit --filter=log --filter=delay null --dump-plugin
requires test -r "$FILTER"

SIZE=$((32 * 1024 * 1024))
READERS=4                     # nbdcopy processes
CONNS=4                       # connections each
MAX_ROUNDS=15

up="$TMP/up.img"
sock="$TMP/sock"
pid="$TMP/nbdkit.pid"
uri="nbd+unix:///?socket=$sock"
make_random "$up" $SIZE


run=""
start_proxy ()           # NAME CACHE-DIR
{
  run="$1"
  # -v keeps nbdkit's stderr (warnings) once it is in the background.
  start_nbdkit -P "$pid" -U "$sock" -v --log=stderr \
    --filter="$FILTER" --filter=log --filter=delay \
    file "$up" fscache-dir="$2" fscache-key=eio delay-read=10ms \
    logfile="$TMP/$run.log" fscache-stats="$TMP/$run.stats" \
    2>"$TMP/$run.err"
}

expect_stat ()           # NAME OP VALUE (for the last run)
{
  local v
  v="$(stat_value "$TMP/$run.stats" "$1")"
  if ! test "$v" "$2" "$3"; then
    cat "$TMP/$run.stats" >&2
    grep ' error: ' "$TMP/$run.err" | tail >&2
    fail "$run: $1 = $v, expected $2 $3"
  fi
}

full_read ()
{
  rm -f "$TMP/out.img"
  nbdcopy "$uri" "$TMP/out.img" || fail "$run: client error"
  cmp "$TMP/out.img" "$up" || fail "$run: data differs"
  rm -f "$TMP/out.img"
}

any_alive ()
{
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# One round: READERS x CONNS connections reading everything at once,
# and once they have made some progress (fills to commit), a client
# FLUSH, which commits (so sync faults hit while the readers run).
parallel_round ()
{
  local i pids=() before
  before="$(log_read_bytes "$TMP/$run.log")"
  for (( i=0; i<READERS; i++ )); do
    rm -f "$TMP/out.$i"
    nbdcopy --connections=$CONNS --threads=$CONNS --requests=4 \
      "$uri" "$TMP/out.$i" 2>"$TMP/nbdcopy.$i.err" &
    pids+=($!)
  done
  for (( i=0; i<400; i++ )); do
    [ "$(log_read_bytes "$TMP/$run.log")" -gt $((before + 2*1024*1024)) ] &&
      break
    any_alive "${pids[@]}" || break
    sleep 0.02
  done
  if any_alive "${pids[@]}"; then
    qemu-io -f raw -c flush "$uri" >"$TMP/flush.out" 2>&1 ||
      { cat "$TMP/flush.out" >&2; fail "$run: round $1: flush failed"; }
    flushes=$((flushes + 1))
  fi
  for (( i=0; i<READERS; i++ )); do
    wait "${pids[$i]}" ||
      { cat "$TMP/nbdcopy.$i.err" >&2;
        fail "$run: round $1: reader $i got an error"; }
  done
  for (( i=0; i<READERS; i++ )); do
    cmp "$TMP/out.$i" "$up" ||
      fail "$run: round $1: reader $i got wrong data"
    rm -f "$TMP/out.$i"
  done
}

# run_case NAME SPEC PREFILL COUNTER
run_case ()
{
  local name="$1" spec="$2" prefill="$3" counter="$4"
  local cache="$TMP/cache.$name" round seen=0

  if [ "$prefill" = yes ]; then
    start_proxy "$name-prefill" "$cache"
    full_read
    stop_nbdkit "$pid"
    expect_stat withdrawals -eq 0
  fi

  NBD_FSCACHE_FAULTS="$spec" start_proxy "$name" "$cache"
  flushes=0
  for (( round=1; round<=MAX_ROUNDS; round++ )); do
    parallel_round $round
    [ $seen = 1 ] && break
    # The stats file is rewritten at each connection close.
    [ "$(stat_value "$TMP/$run.stats" withdrawals)" -ge 1 ] && seen=1
  done
  stop_nbdkit "$pid"
  [ $seen = 1 ] || fail "$run: no withdrawal after $MAX_ROUNDS rounds"
  conns="$(grep -c ' Connect ' "$TMP/$run.log" || true)"
  [ "$conns" -ge $(( round * READERS * CONNS )) ] ||
    fail "$run: only $conns connections in $round rounds"

  expect_stat withdrawals -ge 1
  expect_stat "$counter" -ge 1
  expect_stat verify_failures -eq 0
  [ "$flushes" -ge 1 ] || fail "$run: the readers never overlapped a flush"
  # The withdrawal is logged at the next request of the object: so it
  # happened while the readers were still reading.
  grep -q 'cache withdrawn' "$TMP/$run.err" ||
    fail "$run: no 'cache withdrawn' warning on stderr"
  echo "$name: $round rounds of $((READERS * CONNS)) readers," \
       "withdrawals $(stat_value "$TMP/$run.stats" withdrawals)," \
       "$counter $(stat_value "$TMP/$run.stats" "$counter")," \
       "hit_bytes $(stat_value "$TMP/$run.stats" hit_bytes)"

  # Nothing of the withdrawn object survives to be trusted later.
  start_proxy "$name-after" "$cache"
  full_read
  stop_nbdkit "$pid"
  expect_stat objects_reused -eq 0
  expect_stat withdrawals -eq 0
  [ "$(log_read_bytes "$TMP/$run.log")" -ge $SIZE ] ||
    fail "$run: not everything was read upstream again"
}

run_case read  read:data:50+:EIO  yes read_errors
run_case write write:data:20+:EIO no  fill_errors
run_case sync  sync:any:2+:EIO    no  commit_errors

echo "$0: PASS"
