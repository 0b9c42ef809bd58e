#!/usr/bin/env bash
# nbd-fscache in front of a real SSH server: OpenSSH's sshd on
# 127.0.0.1 (a private config, host key and client key, key
# authentication only) serving an image over SFTP, reached through
# nbdkit's ssh plugin (the host key checked against a private
# known_hosts).  Debian 12's ssh plugin (nbdkit 1.32) declares
# serialize_requests, so the filter's readahead must never overlap a
# client's request on one upstream connection: run with the DEFAULT
# readahead (4M), this test is meant to catch that.
# FSCACHE_UP_READAHEAD=SIZE passes fscache-readahead=SIZE.
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
# Truth: cmp and qemu-img compare against the image file sshd serves.
# Upstream cost: nbdkit's log filter placed BELOW fscache in the proxy
# (it sees exactly what the filter asks the upstream; with an explicit
# fscache-key its logfile= does not change the cache's identity), read
# once every upstream connection it logged has disconnected; and the SSH
# server's own count: OpenSSH's sftp-server, run with -l INFO, logs
# 'close "FILE" bytes read N' for each handle (before it answers the
# close), which must add up to exactly what the log filter saw.  (The
# logging sftp-server is the external one with its stderr redirected to
# a file, so sshd runs it through root's shell: a login script of
# root's that printed to stdout would break SFTP.  internal-sftp can
# only log to syslog.)
#
# sshd needs root (its privilege separation directory is /run/sshd).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test "$(id -u)" = 0
requires test -x /usr/sbin/sshd
requires test -x /usr/lib/openssh/sftp-server
requires command -v ssh-keygen
requires nbdkit --version
requires nbdkit ssh --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdcopy --version
requires nbdinfo --version
requires qemu-img --version
requires cmp --version
requires python3 --version
requires nbdkit --filter="$FILTER" null --dump-plugin

SAMPLE_MAX=32768                # 8 x 4 KiB per upstream connection
size=$((16 * 1024 * 1024 + 777))
make_random "$TMP/img.raw" "$size"
chmod a-w "$TMP/img.raw"

ra_args=()
if [ -n "${FSCACHE_UP_READAHEAD:-}" ]; then
  ra_args=(fscache-readahead="$FSCACHE_UP_READAHEAD")
fi
echo "readahead: ${FSCACHE_UP_READAHEAD:-default}"

# ---- sshd ------------------------------------------------------------------
: > "$TMP/sftp.log"
start_sshd "/usr/lib/openssh/sftp-server -e -l INFO 2>>$TMP/sftp.log" || {
  cat "$TMP/sshd.err" >&2; fail "sshd did not start on port $PORT"
}
# The ssh plugin on its own: the key, the host key and the size.
got=$(nbdkit -r -U - ssh "${ssh_args[@]}" "$TMP/img.raw" \
        --run 'nbdinfo --size "$uri"') || {
  cat "$TMP/sshd.err" >&2; fail "nbdkit ssh cannot read the image over sshd"
}
[ "$got" -eq "$size" ] || fail "the ssh plugin sees $got bytes, expected $size"

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
    -r ssh "${ssh_args[@]}" "$TMP/img.raw" logfile="$log" \
    fscache-dir="$2" fscache-key=ssh-img "${ra_args[@]}" "${@:3}"
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
# sftp-server's log: handles opened, closed, and bytes read at close.
# A handle still open when its session ends is closed by sftp-server
# itself and logged as 'forced close "FILE" ...': the plain ssh plugin
# check above ends with nbdkit's exit once --run's command is done, and
# its session can be gone before the plugin's close.  Closed either way.
sftp_opens () { grep -c '^open "' "$TMP/sftp.log" || true; }
sftp_closes () { grep -Ec '^(forced )?close "' "$TMP/sftp.log" || true; }
sftp_quiet () { [ "$(sftp_opens)" -eq "$(sftp_closes)" ]; }
sftp_bytes ()
{
  awk '/^(forced )?close "/ { for (i = 1; i < NF; i++)
                                if ($i == "read") s += $(i + 1) }
       END { printf "%d\n", s }' "$TMP/sftp.log"
}

# mark: remember the counters, once every upstream connection is closed.
mark ()
{
  wait_until up_quiet ||
    fail "the proxy keeps $(( $(up_conns) - $(up_disconns) )) upstream" \
         "connection(s) open after its clients left"
  wait_until sftp_quiet ||
    fail "sftp-server has $(( $(sftp_opens) - $(sftp_closes) )) handle(s)" \
         "open after the proxy's upstream connections closed"
  m_bytes=$(log_read_bytes "$log")
  m_reads=$(log_count "$log" Read)
  m_conns=$(up_conns)
  m_sftp=$(sftp_bytes)
}

# expect WHAT MIN MAX: the upstream read between MIN and MAX bytes since
# the last mark (MAX "sample": at most SAMPLE_MAX per upstream connection,
# and at least one; "sample+N": N plus that); and sftp-server read
# exactly as many bytes.
expect ()
{
  local what="$1" min="$2" max="$3" b0="$m_bytes" n0="$m_reads" c0="$m_conns"
  local s0="$m_sftp" got reads conns sftp
  mark
  got=$((m_bytes - b0)); reads=$((m_reads - n0)); conns=$((m_conns - c0))
  sftp=$((m_sftp - s0)); last_conns=$conns
  echo "$what: $got bytes upstream in $reads reads over $conns" \
       "connection(s); sftp-server read $sftp"
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
  if [ "$sftp" -ne "$got" ]; then
    fail "$what: sftp-server says it read $sftp bytes, but the log" \
         "filter says $got bytes were read upstream"
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
