#!/usr/bin/env bash
# nbd-fscache tests: an nbdkit sh plugin that declares a serial thread
# model and catches any call that overlaps another one it forbids.
#
#   SERIAL_IMG=FILE SERIAL_DIR=DIR SERIAL_MODEL=MODEL \
#     nbdkit --filter=fscache sh tests/serial-plugin.sh ...
#
# MODEL is serialize_requests (one call at a time per connection, like
# Debian 12's curl and ssh plugins) or serialize_all_requests (one in
# the whole server, the sh plugin's default).  Every call that reaches
# the plugin takes `flock -n` on a lock file: per connection (its
# handle) for serialize_requests, one for the whole server otherwise.
# If the lock is already held, two calls overlap that the thread model
# forbids: the call appends a line to DIR/overlaps, fails with EIO and
# says so on stderr.  The lock is held for the call's whole life (the
# fd is inherited by dd and closed when the script exits, before nbdkit
# sees the reply), so a call can never be blamed for its predecessor.
#
# Each call also appends "method offset count" to DIR/calls, so a test
# can count what really reached the upstream (a pread adds its
# connection and its start and end times in ns).
set -u
img="${SERIAL_IMG:?}"
dir="${SERIAL_DIR:?}"
model="${SERIAL_MODEL:-serialize_requests}"

method="$1"

# lock NAME: take the lock or report an overlap and fail the call.
lock ()
{
  exec 9>"$dir/lock.$1"
  if ! flock -n 9; then
    echo "$method ${2:-} pid=$$" >> "$dir/overlaps"
    echo "serial-plugin: OVERLAP: $method overlaps another call" \
         "(thread model $model)" >&2
    echo "EIO overlapping call" >&2
    exit 1
  fi
}

# Calls that touch a connection take its lock (the whole server's for
# serialize_all_requests).  Which lock: the handle, or "all".
scope ()
{
  if [ "$model" = serialize_requests ]; then
    echo "${1##*/}"
  else
    echo all
  fi
}

case "$method" in
  thread_model)
    echo "$model" ;;
  open)
    # A new connection has no lock of its own yet: only the server's.
    [ "$model" = serialize_requests ] || lock all
    mktemp -d "$dir/conn-XXXXXX" ;;
  close)
    lock "$(scope "$2")" ;;
  get_size)
    lock "$(scope "$2")"
    stat -L -c %s "$img" ;;
  can_write|can_flush|can_trim|can_zero)
    lock "$(scope "$2")"
    exit 0 ;;
  can_multi_conn)
    exit 0 ;;
  can_cache)
    echo emulate ;;
  pread)
    lock "$(scope "$2")" "$4+$3"
    t0=$(date +%s%N)
    # Widen the window in which an overlapping call would be caught.
    sleep 0.002
    dd if="$img" bs=64K skip="$4" count="$3" \
       iflag=skip_bytes,count_bytes status=none
    # Its connection (handle) and when it ran, in ns: tests measure how
    # many calls were in flight at once (on different connections).
    echo "pread $4 $3 ${2##*/} $t0 $(date +%s%N)" >> "$dir/calls" ;;
  pwrite)
    lock "$(scope "$2")" "$4+$3"
    echo "pwrite $4 $3" >> "$dir/calls"
    dd of="$img" bs=64K seek="$4" count="$3" conv=notrunc \
       iflag=count_bytes,fullblock oflag=seek_bytes status=none ;;
  trim|zero)
    lock "$(scope "$2")" "$4+$3"
    echo "$method $4 $3" >> "$dir/calls"
    dd if=/dev/zero of="$img" bs=64K seek="$4" count="$3" conv=notrunc \
       iflag=count_bytes oflag=seek_bytes status=none ;;
  flush)
    lock "$(scope "$2")"
    echo "flush" >> "$dir/calls"
    sync "$img" ;;
  *)
    exit 2 ;;
esac
