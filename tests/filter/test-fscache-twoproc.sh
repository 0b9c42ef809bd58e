#!/usr/bin/env bash
# nbd-fscache: two nbdkit processes sharing one cache directory.
#
#  A. Same upstream, same key: while the first proxy has the object
#     open (a qemu-io client holds a connection), full reads through
#     both proxies at once return the upstream's bytes; the second
#     joins the first's object (share_joins, no "another process"
#     warning), so the two upstreams together serve the export exactly
#     once (each block fetched once for the host, by the process whose
#     client missed it), and the first stores everything.  After both
#     stop, a third proxy reuses the cache: a full read with
#     fscache-validate=size sends 0 bytes upstream.
#  B. Different keys (two upstreams) in one cache directory, from two
#     processes at once: both cache (no warning, nothing busy), and
#     restarted, both serve everything from the cache, each its own
#     data.
#  B2. While one proxy holds the object and the other has joined it,
#     the holder is killed (-9): the other takes the object over
#     without a new connection (share_takeovers, reused, unclean) and
#     serves everything from the cache.
#  C. Two proxies started at the same instant on a fresh cache
#     directory both start (10 tries): creating the directory and its
#     header must not race.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdinfo --version
requires qemu-io --version
requires cmp --version
requires mkfifo --version
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"

SIZE=$((32 * 1024 * 1024))

up="$TMP/up.img"
up2="$TMP/up2.img"
make_random "$up" $SIZE
make_random "$up2" $SIZE

# start_proxy NAME CACHE-DIR KEY UPSTREAM: socket $TMP/NAME.sock.
start_proxy ()
{
  # -v keeps nbdkit's stderr (warnings) once it is in the background.
  start_nbdkit -P "$TMP/$1.pid" -U "$TMP/$1.sock" -v --log=stderr \
    --filter="$FILTER" --filter=log \
    file "$4" fscache-dir="$2" fscache-key="$3" fscache-validate=size \
    logfile="$TMP/$1.log" fscache-stats="$TMP/$1.stats" \
    2>"$TMP/$1.err"
}

uri_of () { echo "nbd+unix:///?socket=$TMP/$1.sock"; }

expect_stat ()           # PROXY NAME OP VALUE
{
  local v
  v="$(stat_value "$TMP/$1.stats" "$2")"
  if ! test "$v" "$3" "$4"; then
    cat "$TMP/$1.stats" >&2
    { grep ' error: ' "$TMP/$1.err" || true; } | tail >&2
    fail "$1: $2 = $v, expected $3 $4"
  fi
}

# A client that keeps a connection (and so the cache object) open
# until told to quit: qemu-io reading commands from a fifo.
hold ()                  # NAME PROXY
{
  local fd
  mkfifo "$TMP/$1.fifo"
  qemu-io -f raw -r "$(uri_of "$2")" < "$TMP/$1.fifo" > "$TMP/$1.out" 2>&1 &
  eval "holder_pid_$1=$!"
  exec {fd}>"$TMP/$1.fifo"
  eval "holder_fd_$1=$fd"
  echo "read 0 64k" >&"$fd"
  wait_until grep -q 'read 65536/65536' "$TMP/$1.out" ||
    { cat "$TMP/$1.out" >&2; fail "holder $1 could not read"; }
}

release ()               # NAME [any: whatever its exit status]
{
  local fd pid
  eval "fd=\$holder_fd_$1 pid=\$holder_pid_$1"
  # (in a subshell ignoring SIGPIPE, in case qemu-io is gone already)
  ( trap '' PIPE; echo quit >&"$fd" ) 2>/dev/null || true
  exec {fd}>&-
  wait "$pid" || [ "${2:-}" = any ] || fail "holder $1 failed"
}

# All connections to PROXY closed (the log filter logs Disconnect once
# the filters above it have finalized, i.e. closed the cache object).
all_closed ()            # PROXY
{
  [ "$(grep -c ' Connect ' "$TMP/$1.log")" -eq \
    "$(grep -c ' Disconnect ' "$TMP/$1.log")" ]
}

# Full reads through several proxies at once: read_all NAME:PROXY:IMAGE...
read_all ()
{
  local spec name proxy img pids=() specs=() i
  for spec in "$@"; do
    IFS=: read -r name proxy img <<< "$spec"
    rm -f "$TMP/$name.img"
    nbdcopy "$(uri_of "$proxy")" "$TMP/$name.img" 2>"$TMP/$name.nbdcopy" &
    pids+=($!)
    specs+=("$spec")
  done
  for (( i=0; i<${#pids[@]}; i++ )); do
    IFS=: read -r name proxy img <<< "${specs[$i]}"
    wait "${pids[$i]}" ||
      { cat "$TMP/$name.nbdcopy" >&2; fail "$name: client error via $proxy"; }
    cmp "$TMP/$name.img" "$img" || fail "$name: wrong data via $proxy"
    rm -f "$TMP/$name.img"
  done
}

# ---- A. same key ------------------------------------------------------
cache="$TMP/cache"
start_proxy p1 "$cache" same "$up"
start_proxy p2 "$cache" same "$up"
hold h1 p1
read_all r1:p1:"$up" r2:p2:"$up"
release h1
stop_nbdkit "$TMP/p1.pid"
stop_nbdkit "$TMP/p2.pid"

expect_stat p1 objects_created -eq 1
expect_stat p1 objects_busy -eq 0
expect_stat p1 fill_bytes -eq $SIZE
expect_stat p1 withdrawals -eq 0
expect_stat p2 share_joins -ge 1
expect_stat p2 fill_bytes -eq 0         # the holder stores (and counts)
expect_stat p2 objects_discarded -eq 0
for p in p1 p2; do
  if grep -q 'another process' "$TMP/$p.err"; then
    grep ' error: ' "$TMP/$p.err" >&2
    fail "$p warned about another process (serving uncached)"
  fi
done
both=$(( $(log_read_bytes "$TMP/p1.log") + $(log_read_bytes "$TMP/p2.log") ))
[ "$both" -eq $SIZE ] ||
  fail "the two upstreams served $both bytes, not the export once ($SIZE)"

start_proxy p3 "$cache" same "$up"
read_all r3:p3:"$up"
stop_nbdkit "$TMP/p3.pid"
expect_stat p3 objects_reused -ge 1
expect_stat p3 objects_busy -eq 0
expect_stat p3 hit_bytes -eq $SIZE
[ "$(log_read_bytes "$TMP/p3.log")" -eq 0 ] ||
  fail "p3: $(log_read_bytes "$TMP/p3.log") bytes read upstream, expected 0"
echo "A: the second process joined the first's object; its cache was reused"

# ---- B. different keys, one directory, two processes ------------------
cache="$TMP/cache2"
start_proxy p4 "$cache" alpha "$up"
start_proxy p5 "$cache" beta "$up2"
hold h4 p4
hold h5 p5
read_all r4:p4:"$up" r5:p5:"$up2" r4b:p4:"$up" r5b:p5:"$up2"
release h4
release h5
stop_nbdkit "$TMP/p4.pid"
stop_nbdkit "$TMP/p5.pid"
for p in p4 p5; do
  expect_stat $p objects_created -eq 1
  expect_stat $p objects_busy -eq 0
  expect_stat $p fill_bytes -eq $SIZE
  if grep -q 'another process' "$TMP/$p.err"; then
    fail "$p warned about another process"
  fi
done
[ "$(find "$cache/objects" -name '*.idx' | wc -l)" -eq 2 ] ||
  fail "expected two objects in $cache"

start_proxy p6 "$cache" alpha "$up"
start_proxy p7 "$cache" beta "$up2"
read_all r6:p6:"$up" r7:p7:"$up2"
stop_nbdkit "$TMP/p6.pid"
stop_nbdkit "$TMP/p7.pid"
for p in p6 p7; do
  expect_stat $p objects_reused -ge 1
  expect_stat $p hit_bytes -eq $SIZE
  [ "$(log_read_bytes "$TMP/$p.log")" -eq 0 ] ||
    fail "$p: $(log_read_bytes "$TMP/$p.log") bytes read upstream"
done
echo "B: two keys cached side by side by two processes"

# ---- B2. the holder crashes: the other process takes the cache over ----
cache="$TMP/cache"                      # the one A filled
start_proxy p8 "$cache" same "$up"
start_proxy p9 "$cache" same "$up"
hold h8 p8
hold h9 p9                              # p9 joins p8's object
kill9_nbdkit "$TMP/p8.pid"
release h8 any
b9=$(log_read_bytes "$TMP/p9.log")
read_all r9b:p9:"$up"                   # p9 takes the object over
release h9
stop_nbdkit "$TMP/p9.pid"
expect_stat p9 share_joins -eq 1
expect_stat p9 share_takeovers -eq 1
# The holder only served hits: its kill may leave the index clean
# (the not-clean mark comes before the first change, commit.c).
expect_stat p9 unclean_opens -le 1
expect_stat p9 hit_bytes -ge $SIZE          # and its hold's read, a hit too
[ "$(log_read_bytes "$TMP/p9.log")" -eq "$b9" ] ||
  fail "p9 read upstream after taking the object over"
echo "B2: after the holder's crash the other process took the cache over"

# ---- C. two processes creating one cache directory at once ------------
for (( i=1; i<=10; i++ )); do
  dir="$TMP/fresh$i"
  pids=()
  for p in a b; do
    rm -f "$TMP/$p$i.pid"
    nbdkit -P "$TMP/$p$i.pid" -U "$TMP/$p$i.sock" --filter="$FILTER" \
      file "$up" fscache-dir="$dir" fscache-key=fresh \
      2>"$TMP/$p$i.err" &
    pids+=($!)
  done
  ok=yes
  for p in a b; do
    # The launcher exits once nbdkit is in the background (0), or on a
    # startup error; the daemon writes its pid file a moment later.
    if wait "${pids[0]}"; then
      wait_until test -s "$TMP/$p$i.pid" || fail "try $i: no pid file"
      cleanup_fn "kill -9 $(cat "$TMP/$p$i.pid") 2>/dev/null"
    else
      ok=no
    fi
    pids=("${pids[@]:1}")
  done
  if [ $ok = no ]; then
    cat "$TMP/a$i.err" "$TMP/b$i.err" >&2
    fail "try $i: of two proxies started at once on a new cache" \
         "directory, one did not start"
  fi
  for p in a b; do
    [ "$(nbdinfo --size "nbd+unix:///?socket=$TMP/$p$i.sock")" -eq $SIZE ] ||
      fail "try $i: proxy $p does not serve"
    stop_nbdkit "$TMP/$p$i.pid"
  done
done
echo "C: concurrent creation of a cache directory"

echo "$0: PASS"
