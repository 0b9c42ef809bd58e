# Shared helpers of the shell tests (tests/*/test-*.sh).
#
# Source it first thing:   source "${top_srcdir:-.}/tests/functions.sh"
#
#   requires CMD [ARGS]        skip (exit 77) unless CMD ARGS succeeds
#   cleanup_fn CMD [ARGS]      run CMD ARGS when the test exits
#   start_nbdkit -P PIDFILE -U SOCK ARGS...
#                              start nbdkit in the background, wait until
#                              it serves, stop it when the test exits
#   stop_nbdkit PIDFILE        SIGTERM it and wait until it has exited
#                              (so its unload work, e.g. stats files, is done)
#   kill9_nbdkit PIDFILE       SIGKILL it and wait until it is gone
#   log_read_bytes LOGFILE [BELOW]
#                              bytes read, summed over a log filter's file
#                              (only reads starting below BELOW, if given)
#   log_count LOGFILE WORD     requests of type WORD (Read, Write, Flush...)
#   log_reads_at_once LOGFILE  the most reads in flight at once
#   stat_value STATSFILE NAME  a counter from an fscache-stats file
#   make_random FILE BYTES     FILE filled with BYTES of random data
#   fail MESSAGE               print "$0: FAIL: MESSAGE" and exit 1
#   wait_until CMD [ARGS]      poll CMD every 50 ms until it succeeds;
#                              1 after 20 s (waits for a state, not a time)
#   mount_tmpfs DIR SIZE       a tmpfs of SIZE (e.g. 64m) at DIR, created,
#                              unmounted at exit; skip unless possible
#   start_readers ORDER N...   checking readers (tests/pass-reader.py,
#                              ORDER seq or random) of the exports served
#                              at $TMP/pxN.sock, compared with $TMP/imgN
#   passes N                   whole passes reader N has finished
#   stop_readers               stop them; fail if one saw an error
#   seconds_since T0 [DIGITS] seconds from T0 (date +%s.%N) until now,
#                              with DIGITS decimals (default 2)
#   start_daemon CONF          nbd-fscached -n -s -d -f CONF in the
#                              background ($dpid, messages in $dlog), once
#                              its pid file exists
#   stop_daemon                SIGTERM it; fail unless it exits 0
#   hold_export URI STOPFILE [READYFILE]
#                              keep one client connection to URI open
#                              (its object in use) until STOPFILE exists;
#                              with READYFILE, return once connected (it
#                              has read 4 KiB at 0), and create READYFILE
#   tool ARGS...               nbd-fscache ARGS ($TOOL)
#   start_nginx ROOT FORMAT    nginx serving ROOT on 127.0.0.1:$PORT,
#                              access log $TMP/access.log; http_get PATH
#   free_port                  a free TCP port on 127.0.0.1
#   start_sshd SUBSYSTEM [LINE...]
#                              OpenSSH's sshd on 127.0.0.1:$PORT, keys
#                              of its own; ssh_args for the ssh plugin
#
# $FILTER is the fscache filter to pass to --filter=, $PYTHON the python3
# with the libnbd bindings, $TMP a private
# temporary directory removed at exit, $UPSTREAM_PLUGIN_DIR unused.

set -euo pipefail

: "${top_srcdir:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
FILTER="${FSCACHE_FILTER:-$top_builddir/plugin/.libs/nbdkit-fscache-filter.so}"
export FILTER

# The latency guard (core/ops/guard.c) is off by default in tests:
# they count the bytes read upstream to see what the cache holds, and
# the guard reads hits upstream whenever the cache disk answers
# slower than the upstream, which the suite's own load on this
# machine's disk makes happen (hits of what a fill wrote directly come
# from the disk, core/disk/data.c).  test-fscache-guard.sh tests the
# guard with its default restored; a test that passes
# fscache-latency-guard gets what it passes (plugin/fscache.c).
# Benchmarks (tools/bench/) measure the defaults, the guard included.
case "$0" in
  */tools/bench/*) unset NBD_FSCACHE_TEST_GUARD ;;
  *) export NBD_FSCACHE_TEST_GUARD=0 ;;
esac

# Debian's python3 has the libnbd bindings (python3-libnbd); a python3
# from pyenv or a venv earlier in PATH would not.  $PYTHON names it for
# subshells and background jobs, which do not see the function.
PYTHON=python3
if [ -x /usr/bin/python3 ]; then
  PYTHON=/usr/bin/python3
  python3 () { /usr/bin/python3 "$@"; }
fi

# nbdkit discards its stderr when it forks: while NBDKIT_STDERR names a
# file, nbdkit runs in the foreground (-f) as a background job, its
# stderr appended there (a test that wants another way defines its own
# nbdkit function after sourcing this file).
NBDKIT_STDERR=
nbdkit ()
{
  if [ -n "$NBDKIT_STDERR" ]; then
    command nbdkit -f "$@" 2>>"$NBDKIT_STDERR" &
    disown $!
  else
    command nbdkit "$@"
  fi
}

_cleanup_cmds=()
cleanup_fn ()
{
  _cleanup_cmds+=("$*")
}
_run_cleanup ()
{
  local status=$?
  local i
  for (( i=${#_cleanup_cmds[@]}-1; i>=0; i-- )); do
    eval "${_cleanup_cmds[$i]}" || true
  done
  exit $status
}
trap _run_cleanup EXIT

requires ()
{
  if ! "$@" >/dev/null 2>&1; then
    echo "$0: SKIP: requires $*"
    exit 77
  fi
}

TMP="$(mktemp -d /tmp/fscache-test.XXXXXX)"
# FSCACHE_TEST_KEEP=1 keeps $TMP (logs, caches) for a post-mortem.
if [ "${FSCACHE_TEST_KEEP:-0}" = 1 ]; then
  echo "$0: keeping $TMP"
else
  cleanup_fn "rm -rf '$TMP'"
fi

# Wait for a pid file to appear and its socket to accept connections.
start_nbdkit ()
{
  local pidfile="" sock="" args=("$@")
  local i
  for (( i=0; i<${#args[@]}; i++ )); do
    case "${args[$i]}" in
      -P) pidfile="${args[$((i+1))]}" ;;
      -U) sock="${args[$((i+1))]}" ;;
    esac
  done
  if [ -z "$pidfile" ]; then
    echo "$0: start_nbdkit: -P PIDFILE is required" >&2
    return 1
  fi
  rm -f "$pidfile"
  [ -n "$sock" ] && rm -f "$sock"
  nbdkit "$@"
  # nbdkit writes the pid file only once it is ready to serve.
  for (( i=0; i<300; i++ )); do
    [ -s "$pidfile" ] && break
    sleep 0.1
  done
  if [ ! -s "$pidfile" ]; then
    echo "$0: start_nbdkit: nbdkit did not start: $*" >&2
    return 1
  fi
  cleanup_fn "kill -9 $(cat "$pidfile") 2>/dev/null"
}

_wait_gone ()
{
  local pid="$1" i state
  for (( i=0; i<600; i++ )); do
    kill -0 "$pid" 2>/dev/null || return 0
    # A daemonised nbdkit is not our child: once it exits it stays a
    # zombie until init reaps it.  A zombie has finished its work.
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)
    case "$state" in Z|X|gone) return 0 ;; esac
    sleep 0.05
  done
  echo "$0: process $pid did not exit" >&2
  return 1
}

stop_nbdkit ()
{
  local pid
  pid="$(cat "$1")"
  kill -TERM "$pid" 2>/dev/null || true
  _wait_gone "$pid"
}

kill9_nbdkit ()
{
  local pid
  pid="$(cat "$1")"
  kill -9 "$pid" 2>/dev/null || true
  _wait_gone "$pid"
}

log_read_bytes ()
{
  # Request lines look like: "connection=1 Read id=1 offset=0x0 count=0x1000 ..."
  # (mawk has no strtonum: convert the hex by hand.)  With BELOW, only
  # reads starting below that offset count.
  awk -v below="${2:--1}" 'function hex(s,   i, c, v) {
         v = 0; s = tolower (substr (s, 3))
         for (i = 1; i <= length (s); i++) {
           c = index ("0123456789abcdef", substr (s, i, 1)) - 1
           v = v * 16 + c
         }
         return v
       }
       / Read id=/ && !/\.\.\.Read/ {
         off = 0; cnt = 0
         for (i = 1; i <= NF; i++) {
           if ($i ~ /^offset=/) { sub ("offset=", "", $i); off = hex($i) }
           if ($i ~ /^count=/) { sub ("count=", "", $i); cnt = hex($i) }
         }
         if (below < 0 || off < below) s += cnt
       } END { printf "%d\n", s }' "$1"
}

log_count ()
{
  grep -c " $2 id=" "$1" || true
}

# log_reads_at_once LOGFILE: the most reads in flight at once in a log
# filter's file ("... connection=N Read id=I ..." at a read's start,
# "... connection=N ...Read id=I return=..." at its end).
log_reads_at_once ()
{
  "$PYTHON" - "$1" <<'EOF'
import re, sys
cur = most = 0
for line in open(sys.argv[1]):
    if re.search(r" Read id=\d+ ", line) and "return=" not in line:
        cur += 1
        most = max(most, cur)
    elif re.search(r"\.\.\.Read id=\d+ return=", line):
        cur -= 1
print(most)
EOF
}

stat_value ()
{
  awk -v k="$2" '$1 == k { print $2; found = 1 } END { if (!found) print 0 }' "$1"
}

make_random ()
{
  head -c "$2" /dev/urandom > "$1"
}

# On failure, the end of each server's stderr kept in $TMP (*.err, as
# NBDKIT_STDERR names them) goes into the test's log too: $TMP is gone
# after the exit, and a failure that does not come back (a fleet's
# node killed at the wrong moment) is otherwise left with one line.
fail ()
{
  local f
  echo "$0: FAIL: $*" >&2
  for f in "$TMP"/*.err; do
    [ -s "$f" ] || continue
    echo "--- the last 20 lines of $f:"
    tail -n 20 "$f"
  done >&2
  exit 1
}

mount_tmpfs ()
{
  [ "$(id -u)" -eq 0 ] || { echo "$0: SKIP: mounting a tmpfs needs root"; exit 77; }
  mkdir -p "$1"
  mount -t tmpfs -o size="$2",mode=0700 tmpfs "$1" ||
    { echo "$0: SKIP: cannot mount a tmpfs"; exit 77; }
  cleanup_fn "umount -l '$1'"
}

# Each reader keeps one connection (so its object stays in use) and
# makes whole passes until stop_readers; failures go to $TMP/failN.
_reader_pids=""
_readers=""
start_readers ()
{
  local order="$1" n
  shift
  for n; do
    { "$PYTHON" "$top_srcdir/tests/pass-reader.py" \
        "nbd+unix:///?socket=$TMP/px$n.sock" "$TMP/img$n" "$order" \
        "$TMP/fail$n" "$TMP/passes$n" "$TMP/stop-readers" \
        2>>"$TMP/reader$n.err" ||
        echo "reader exited with status $?" >> "$TMP/fail$n"; } &
    _reader_pids="$_reader_pids $!"
    _readers="$_readers $n"
  done
  cleanup_fn "touch '$TMP/stop-readers'; kill $_reader_pids 2>/dev/null; wait"
}

passes ()
{
  cat "$TMP/passes$1" 2>/dev/null || echo 0
}

# mark_passes: remember how many passes each running reader has made.
# readers_passed N: true once every running reader has made N more
# passes since the last mark (since it started, without one).
_pass_marks=""
mark_passes ()
{
  local n
  _pass_marks=""
  for n in $_readers; do
    _pass_marks="$_pass_marks $n:$(passes "$n")"
  done
}

readers_passed ()
{
  local n m base
  for n in $_readers; do
    base=0
    for m in $_pass_marks; do
      [ "${m%%:*}" = "$n" ] && base="${m#*:}"
    done
    [ "$(passes "$n")" -ge $((base + $1)) ] || return 1
  done
}

stop_readers ()
{
  local n
  touch "$TMP/stop-readers"
  # shellcheck disable=SC2086
  wait $_reader_pids || true
  for n in $_readers; do
    if [ -s "$TMP/fail$n" ]; then
      cat "$TMP/fail$n" "$TMP/reader$n.err" >&2
      fail "reader of export $n saw errors"
    fi
    echo "reader $n: $(passes "$n") passes, all identical"
  done
}

seconds_since ()
{
  awk -v a="$1" -v b="$(date +%s.%N)" -v d="${2:-2}" \
    'BEGIN { printf "%.*f\n", d, b - a }'
}

DAEMON="$top_builddir/tools/nbd-fscached/nbd-fscached"
dpid=""
dlog="$TMP/d.log"
start_daemon ()
{
  "$DAEMON" -n -s -d -f "$1" -p "$TMP/d.pid" 2>"$dlog" &
  dpid=$!
  cleanup_fn "kill -9 $dpid 2>/dev/null"
  wait_until test -s "$TMP/d.pid" || { cat "$dlog" >&2; fail "daemon: no pid file"; }
}

stop_daemon ()
{
  local st=0
  kill -TERM "$dpid"
  wait "$dpid" || st=$?
  [ "$st" -eq 0 ] || { cat "$dlog" >&2; fail "daemon exit status $st"; }
}

TOOL="$top_builddir/tools/nbd-fscache/nbd-fscache"
tool ()
{
  "$TOOL" "$@"
}

# cached_bytes DIR: the bytes the cache in DIR holds, all objects
# together, as nbd-fscache stat reads them from the indexes on disk.
cached_bytes ()
{
  tool stat --dir "$1" | awk '$1 == "cached_bytes" { print $2 }'
}

hold_export ()
{
  "$PYTHON" -c '
import nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(4096, 0)
if sys.argv[3]:
    open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
h.shutdown()
' "$1" "$2" "${3:-}" &
  cleanup_fn "touch '$2'; kill $! 2>/dev/null; wait $! 2>/dev/null"
  if [ -n "${3:-}" ]; then
    wait_until test -e "$3" || fail "hold_export: no connection to $1"
  fi
}

wait_until ()
{
  local i
  for (( i=0; i<400; i++ )); do
    if "$@"; then return 0; fi
    sleep 0.05
  done
  return 1
}

# write_junk FILE: 4 KiB of junk every 64 KiB of FILE from 16 MiB to 64
# MiB (768 extents): space in a data file that no index names, for the
# tests of the walk that reclaims it.
write_junk ()
{
  "$PYTHON" - "$1" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
for off in range(16 << 20, 64 << 20, 64 << 10):
    os.pwrite(fd, b'\xa5' * 4096, off)
os.fsync(fd)
os.close(fd)
EOF
}

# The allocated bytes (du) of the objects' .idx, .data and .sums files
# in $TMP/cache (what fscache-max-size caps).
object_du ()
{
  local files
  files=$(find "$TMP/cache/objects" -type f \( -name '*.idx' -o \
          -name '*.data' -o -name '*.sums' \))
  [ -n "$files" ] || { echo 0; return; }
  # shellcheck disable=SC2086
  du -B1 -c $files | awk 'END { print $1 }'
}

# Sample object_du into $TMP/du.samples every 20 ms, in the background,
# from start_sampler until stop_sampler.
start_sampler ()
{
  rm -f "$TMP/stop-sampler" "$TMP/du.samples"
  (
    while [ ! -e "$TMP/stop-sampler" ]; do
      object_du >> "$TMP/du.samples"
      sleep 0.02
    done
  ) &
  sampler=$!
  cleanup_fn "touch '$TMP/stop-sampler'"
}
stop_sampler ()
{
  touch "$TMP/stop-sampler"
  wait "$sampler"
}

# free_port: a free TCP port on 127.0.0.1.
free_port ()
{
  $PYTHON -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_sshd SUBSYSTEM [LINE...]: OpenSSH's sshd on 127.0.0.1:$PORT
# (set here), with a host key, a client key, authorized_keys,
# known_hosts and an empty ssh_config of its own in $TMP, key
# authentication only, root allowed, SFTP served by SUBSYSTEM (an
# sshd_config "Subsystem sftp" value: internal-sftp, or a command), and
# each LINE added to its config; in the foreground as a background job,
# its messages in $TMP/sshd.err, stopped at exit.  Sets PORT, sshd_pid
# and ssh_args (the ssh plugin's parameters, all but the file).  1 if
# sshd rejects its config or does not start, the reason in
# $TMP/sshd.err.  Needs root (sshd's privilege separation directory is
# /run/sshd).
start_sshd ()
{
  local subsystem=$1 line
  shift
  PORT=$(free_port)
  rm -f "$TMP/host_key" "$TMP/host_key.pub" "$TMP/client_key" \
    "$TMP/client_key.pub"
  ssh-keygen -q -t ed25519 -N '' -C fscache-test-host -f "$TMP/host_key"
  ssh-keygen -q -t ed25519 -N '' -C fscache-test-client -f "$TMP/client_key"
  cp "$TMP/client_key.pub" "$TMP/authorized_keys"
  echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$TMP/host_key.pub")" \
    > "$TMP/known_hosts"
  : > "$TMP/ssh_config"         # the ssh plugin reads this, not ~/.ssh/config
  cat > "$TMP/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $TMP/host_key
AuthorizedKeysFile $TMP/authorized_keys
PubkeyAuthentication yes
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile $TMP/sshd.pid
LogLevel INFO
Subsystem sftp $subsystem
EOF
  for line in "$@"; do
    echo "$line" >> "$TMP/sshd_config"
  done
  mkdir -p /run/sshd
  /usr/sbin/sshd -t -f "$TMP/sshd_config" 2>"$TMP/sshd.err" || return 1
  /usr/sbin/sshd -D -e -f "$TMP/sshd_config" > "$TMP/sshd.err" 2>&1 &
  sshd_pid=$!
  cleanup_fn "kill -TERM $sshd_pid 2>/dev/null; wait $sshd_pid 2>/dev/null"
  wait_until _sshd_up || return 1
  ssh_args=(host=127.0.0.1 port="$PORT" user=root
            identity="$TMP/client_key" known-hosts="$TMP/known_hosts"
            config="$TMP/ssh_config" timeout=20)
}
_sshd_up ()
{
  kill -0 "$sshd_pid" 2>/dev/null &&
    grep -q "Server listening on 127.0.0.1 port $PORT" "$TMP/sshd.err"
}

# start_nginx ROOT FORMAT: nginx serving ROOT on 127.0.0.1:$PORT (set
# here), its access log in $TMP/access.log in log_format FORMAT (nginx
# variables, quoted so that the shell leaves them alone; "off": no
# access log, for a benchmark, which should not pay for one), /status its
# stub_status (not logged); waited for (ROOT/ready is created for it),
# stopped at exit.  Sets PORT and nginx_pid.
start_nginx ()
{
  local root=$1 format=$2 log
  mkdir -p "$TMP/nginx-tmp"
  : > "$root/ready"
  PORT=$(free_port)
  log="log_format fmt '$format';
  access_log $TMP/access.log fmt;"
  [ "$format" != off ] || log="access_log off;"
  cat > "$TMP/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
user root;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log info;
events { worker_connections 256; }
http {
  default_type application/octet-stream;
  $log
  client_body_temp_path $TMP/nginx-tmp/body;
  proxy_temp_path $TMP/nginx-tmp/proxy;
  fastcgi_temp_path $TMP/nginx-tmp/fastcgi;
  uwsgi_temp_path $TMP/nginx-tmp/uwsgi;
  scgi_temp_path $TMP/nginx-tmp/scgi;
  server {
    listen 127.0.0.1:$PORT;
    root $root;
    location = /status { stub_status; access_log off; }
  }
}
EOF
  nginx -e "$TMP/nginx-error.log" -c "$TMP/nginx.conf" -p "$TMP/" \
    > "$TMP/nginx.out" 2>&1 &
  nginx_pid=$!
  cleanup_fn "kill -TERM $nginx_pid 2>/dev/null; wait $nginx_pid 2>/dev/null"
  if ! wait_until _nginx_up; then
    cat "$TMP/nginx.out" "$TMP/nginx-error.log" >&2 || true
    fail "nginx did not start on port $PORT"
  fi
}
_nginx_up () { kill -0 "$nginx_pid" 2>/dev/null && http_get /ready >/dev/null; }

# http_get PATH: the body of nginx's answer to GET PATH on $PORT, or
# fail unless it is a 200 (HTTP/1.0 over bash's /dev/tcp: no HTTP
# client needed).
http_get ()
{
  local resp
  resp=$(exec 2>/dev/null && exec 3<>"/dev/tcp/127.0.0.1/$PORT" &&
         printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3 &&
         cat <&3) || return 1
  [[ $resp == "HTTP/1."?" 200 "* ]] || return 1
  printf '%s\n' "${resp#*$'\r\n\r\n'}"
}
