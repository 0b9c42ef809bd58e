#!/usr/bin/env bash
# nbd-fscache in front of a real NBD server: qemu-nbd (qemu-utils)
# exporting a raw image read-only on 127.0.0.1 over TCP, persistent
# (-t) and shared by up to 8 clients, reached through nbdkit's nbd
# plugin, with the DEFAULT readahead (FSCACHE_UP_READAHEAD=SIZE passes
# fscache-readahead=SIZE).
#
#   1. validate=sample (default): a cold nbdcopy --connections=4; warm,
#      qemu-img compare and nbdcopy --connections=4 at once; after
#      restarting the proxy on the same cache, nbdcopy --connections=4.
#      The cold read costs the export once (plus at most the 32 KiB
#      coherency sample per upstream connection); every later read at
#      most the sample.
#   2. validate=size, another cache: two cold nbdcopy --connections=4 at
#      once cost exactly the export size upstream (each block fetched
#      once, readahead included); warm, qemu-img compare costs exactly
#      0; after a restart, nbdcopy --connections=4 and qemu-img compare
#      at once cost exactly 0.
#
# Truth: cmp and qemu-img compare against the image file qemu-nbd
# exports.  Upstream cost: nbdkit's log filter placed BELOW fscache in
# the proxy (it sees exactly what the filter asks the upstream; with an
# explicit fscache-key its logfile= does not change the cache's
# identity), read once every upstream connection it logged has
# disconnected; and, as the server's own count, the rchar of qemu-nbd's
# /proc/PID/io (one process; its I/O threads' reads count too): it grows
# by what qemu-nbd read from the image plus a few bytes of its eventfd
# notifications (sockets are read with recvmsg, not counted), bounded
# below.
#
# qemu's raw driver rounds an image's size up to 512 bytes, so the
# image is a multiple of 512 bytes (but not of 4 KiB or of the 64 KiB
# cache block: the last block is partial).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires qemu-nbd --version
requires nbdkit --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdcopy --version
requires nbdinfo --version
requires qemu-img --version
requires cmp --version
requires python3 --version
requires nbdkit --filter="$FILTER" null --dump-plugin

SAMPLE_MAX=32768                # 8 x 4 KiB per upstream connection
size=$((20 * 1024 * 1024 + 3 * 512))
make_random "$TMP/img.raw" "$size"
chmod a-w "$TMP/img.raw"

ra_args=()
if [ -n "${FSCACHE_UP_READAHEAD:-}" ]; then
  ra_args=(fscache-readahead="$FSCACHE_UP_READAHEAD")
fi
echo "readahead: ${FSCACHE_UP_READAHEAD:-default}"

free_port ()
{
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# ---- qemu-nbd --------------------------------------------------------------
PORT=$(free_port)
qemu-nbd -r -f raw -b 127.0.0.1 -p "$PORT" -x img --shared=8 -t \
  "$TMP/img.raw" > "$TMP/qemu-nbd.out" 2>&1 &
server_pid=$!
cleanup_fn "kill -TERM $server_pid 2>/dev/null; wait $server_pid 2>/dev/null"
server_up ()
{
  kill -0 "$server_pid" 2>/dev/null &&
    nbdinfo --size "nbd://127.0.0.1:$PORT/img" >/dev/null 2>&1
}
wait_until server_up || {
  cat "$TMP/qemu-nbd.out" >&2; fail "qemu-nbd does not serve on port $PORT"
}
got=$(nbdinfo --size "nbd://127.0.0.1:$PORT/img")
[ "$got" -eq "$size" ] || fail "qemu-nbd exports $got bytes, expected $size"

# ---- the proxy -------------------------------------------------------------
# nbdkit runs in the foreground as a background job so that its stderr
# (discard warnings, crash messages) lands in a file.
NBDKIT_STDERR=
nbdkit ()
{
  if [ -n "$NBDKIT_STDERR" ]; then
    command nbdkit -f "$@" 2>"$NBDKIT_STDERR" &
    disown $!
  else
    command nbdkit "$@"
  fi
}
uri="nbd+unix:///?socket=$TMP/px.sock"
proxy_name=
log=

# start_proxy NAME CACHEDIR [fscache-PARAM=VALUE...]; upstream log
# $TMP/NAME.log, stderr $TMP/NAME.err.
start_proxy ()
{
  proxy_name="$1"
  log="$TMP/$1.log"
  rm -f "$log"
  NBDKIT_STDERR="$TMP/$1.err" start_nbdkit \
    -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" --filter=log \
    nbd hostname=127.0.0.1 port="$PORT" export=img logfile="$log" \
    fscache-dir="$2" fscache-key=qemu-nbd-img "${ra_args[@]}" "${@:3}"
}
proxy_check ()
{
  if ! kill -0 "$(cat "$TMP/px.pid")" 2>/dev/null; then
    tail -20 "$TMP/$proxy_name.err" >&2 || true
    fail "$proxy_name: nbdkit (the proxy) died"
  fi
}
stop_proxy ()
{
  proxy_check
  stop_nbdkit "$TMP/px.pid"
}
client_fail ()                  # MESSAGE: a client failed
{
  echo "--- the proxy's stderr ($TMP/$proxy_name.err), last lines:" >&2
  tail -5 "$TMP/$proxy_name.err" >&2 || true
  if ! kill -0 "$(cat "$TMP/px.pid")" 2>/dev/null; then
    fail "$* (and nbdkit, the proxy, died)"
  fi
  fail "$*"
}

# ---- upstream counters -----------------------------------------------------
up_conns () { grep -c ' Connect export=' "$log" || true; }
up_disconns () { grep -c ' Disconnect ' "$log" || true; }
up_quiet () { [ "$(up_conns)" -eq "$(up_disconns)" ]; }
server_rchar () { awk '$1 == "rchar:" { print $2 }' "/proc/$server_pid/io"; }

# mark: remember the counters, once every upstream connection is closed.
mark ()
{
  wait_until up_quiet ||
    fail "the proxy keeps $(( $(up_conns) - $(up_disconns) )) upstream" \
         "connection(s) open after its clients left"
  m_bytes=$(log_read_bytes "$log")
  m_reads=$(log_count "$log" Read)
  m_conns=$(up_conns)
  m_rchar=$(server_rchar)
}

# expect WHAT MIN MAX: the upstream read between MIN and MAX bytes since
# the last mark (MAX "sample": at most SAMPLE_MAX per upstream connection,
# and at least one; "sample+N": N plus that); and qemu-nbd's rchar grew
# by that plus at most 32 bytes per request and 1 KiB per connection.
expect ()
{
  local what="$1" min="$2" max="$3" b0="$m_bytes" n0="$m_reads" c0="$m_conns"
  local r0="$m_rchar" got reads conns rchar
  mark
  got=$((m_bytes - b0)); reads=$((m_reads - n0)); conns=$((m_conns - c0))
  rchar=$((m_rchar - r0)); last_conns=$conns
  echo "$what: $got bytes upstream in $reads reads over $conns" \
       "connection(s); qemu-nbd rchar +$rchar"
  case "$max" in
    sample)
      [ "$conns" -ge 1 ] || fail "$what: no upstream connection"
      max=$((SAMPLE_MAX * conns)) ;;
    sample+*)
      max=$(( ${max#sample+} + SAMPLE_MAX * conns )) ;;
  esac
  if [ "$got" -lt "$min" ] || [ "$got" -gt "$max" ]; then
    fail "$what: $got bytes read upstream, expected $min to $max"
  fi
  if [ "$rchar" -lt "$got" ] ||
     [ "$rchar" -gt $((got + 32 * reads + 1024 * conns)) ]; then
    fail "$what: qemu-nbd's rchar grew by $rchar bytes, but the log" \
         "says $got bytes in $reads reads over $conns connection(s)"
  fi
}
expect_no_discard ()
{
  if grep -q "discarding" "$TMP/$1.err"; then
    cat "$TMP/$1.err" >&2
    fail "$1: the cache was discarded although nothing changed"
  fi
}

# ---- clients ---------------------------------------------------------------
copy ()                         # OUT WHAT: nbdcopy, 4 connections, cmp
{
  rm -f "$1"
  nbdcopy --connections=4 --threads=4 "$uri" "$1" ||
    client_fail "$2: nbdcopy failed"
  cmp "$TMP/img.raw" "$1" ||
    client_fail "$2: nbdcopy: data differs from the image"
  rm -f "$1"
}
compare ()                      # WHAT: qemu-img compare
{
  qemu-img compare -q -f raw -F raw "$TMP/img.raw" "$uri" ||
    client_fail "$1: qemu-img compare: the export differs from the image"
}
at_once ()                      # "CMD ARGS" ...: run all at once
{
  local c p pids=() rc=0
  for c in "$@"; do eval "$c" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$rc" -eq 0 ] || fail "at once: $*"
  proxy_check
}

SECONDS=0

# ---- 1. validate=sample (default) ------------------------------------------
start_proxy sample "$TMP/cache-a"
if ! nbdinfo --can multi-conn "$uri"; then
  fail "the proxy does not advertise multi-conn (nbdcopy would use 1 connection)"
fi
mark
copy "$TMP/out.raw" "cold (sample)"
proxy_check
expect "cold: nbdcopy --connections=4 (sample)" "$size" "sample+$size"
[ "$last_conns" -ge 4 ] ||
  fail "nbdcopy --connections=4 made $last_conns upstream connection(s), expected 4"
at_once "compare 'warm (sample)'" "copy '$TMP/a.raw' 'warm (sample)'"
expect "warm: qemu-img compare and nbdcopy at once (sample)" 0 sample
stop_proxy
expect_no_discard sample

start_proxy sample-restart "$TMP/cache-a"
mark
copy "$TMP/out.raw" "after restart (sample)"
expect "after restart: nbdcopy --connections=4 (sample)" 0 sample
stop_proxy
expect_no_discard sample-restart

# ---- 2. validate=size: exact counts -----------------------------------------
start_proxy size "$TMP/cache-b" fscache-validate=size
mark
at_once "copy '$TMP/a.raw' 'cold (size) a'" "copy '$TMP/b.raw' 'cold (size) b'"
expect "cold: two nbdcopy --connections=4 at once (size)" "$size" "$size"
compare "warm (size)"
expect "warm: qemu-img compare (size)" 0 0
stop_proxy

start_proxy size-restart "$TMP/cache-b" fscache-validate=size
mark
at_once "copy '$TMP/a.raw' 'after restart (size)'" \
        "compare 'after restart (size)'"
expect "after restart: nbdcopy and qemu-img compare at once (size)" 0 0
stop_proxy
expect_no_discard size-restart

echo "${SECONDS}s"
echo "$0: OK"
