#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: a full cache disk (rule 9 of
# core/wlog/wlog.c).  The cache is a 24 MiB tmpfs mounted by the test; the
# upstream (nbdkit file behind the error filter) fails every write
# while $TMP/errors-on exists, so what the clients write stays in the
# log.
#
#  a. Reserved.  fscache-dirty-max=4M is reserved when the proxy
#     starts; then the tmpfs is filled to the last byte, and a client
#     writes about 1.5 MiB (each write read back, a flush every 8):
#     every write succeeds, from the reserved space.  Then the space is
#     freed and the upstream errors stop: the upstream image becomes
#     the client's model.
#  b. Not reserved, then space again.  fscache-dirty-max=64M cannot be
#     reserved on the 24 MiB disk: the proxy says so.  The disk is
#     filled; a write fails with EIO (ENOSPC on the log), and
#     so does a flush after it; the proxy says why.  Then the space is
#     freed and, without a restart, a client writes 40 times, reads
#     back and flushes: all succeed, and once the upstream errors stop
#     the upstream image is the client's model (the failed write is
#     not in it: its slot became a void record).
#
# Truth: the client's model (tests/wb-client.py, every write read
# back), the upstream image file (cmp), the proxy's stderr.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=error null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'
requires cmp --version

CLIENT="$top_srcdir/tests/wb-client.py"
uri="nbd+unix:///?socket=$TMP/px.sock"
size=$((16 * 1024 * 1024))
mount_tmpfs "$TMP/c" 24M

# start_proxy NAME [PARAMS]: stderr in $TMP/NAME.err, cache $TMP/c/NAME.
start_proxy ()
{
  NBDKIT_STDERR="$TMP/$1.err" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/c/$1" fscache-key=wb fscache-mode=writeback "${@:2}"
}
fill_disk () { dd if=/dev/zero of="$TMP/c/fill" bs=64k 2>/dev/null || true; }
same () { cmp -s "$1" "$2"; }
wait_long ()
{
  local t=$1 i
  shift
  for (( i=0; i<t*20; i++ )); do
    "$@" && return 0
    sleep 0.05
  done
  return 1
}

make_random "$TMP/up.img" "$size"
cp "$TMP/up.img" "$TMP/orig.img"
touch "$TMP/errors-on"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=error file "$TMP/up.img" error=EIO \
  error-pwrite-rate=100% error-pwrite-file="$TMP/errors-on" \
  error-zero-rate=100% error-zero-file="$TMP/errors-on"

# ---- a. reserved -----------------------------------------------------------
start_proxy a fscache-dirty-max=4M
# The proxy opens the log at the first connection: one that only reads.
$PYTHON -c 'import nbd,sys; h=nbd.NBD(); h.connect_uri(sys.argv[1]); h.pread(4096, 0); h.shutdown()' "$uri" ||
  fail "a: cannot connect"
fill_disk
echo "a: cache disk full: $(df -k "$TMP/c" | tail -1)"
$PYTHON "$CLIENT" "$uri" "$TMP/up.img" "$TMP/a.model" 1 --count 150 \
  --units 1-4 --no-final-read 2>"$TMP/a.client.err" ||
  { cat "$TMP/a.client.err" "$TMP/a.err" >&2;
    fail "a: a write failed with the log's space reserved"; }
grep -q 'could not reserve' "$TMP/a.err" &&
  { cat "$TMP/a.err" >&2; fail "a: the proxy could not reserve 4M"; }
rm "$TMP/c/fill" "$TMP/errors-on"
wait_long 30 same "$TMP/up.img" "$TMP/a.model" ||
  fail "a: the upstream did not get the client's writes"
echo "a: 150 writes on a full cache disk succeeded and were written back"
stop_nbdkit "$TMP/px.pid"

# ---- b. not reserved, then space again ------------------------------------
touch "$TMP/errors-on"
cp "$TMP/up.img" "$TMP/b.before"
mkdir -p "$TMP/c/b"
start_proxy b fscache-dirty-max=64M
# The log is opened (and its reservation tried) at the first
# connection: 64M do not fit.  Then the disk is filled, and a client
# writes once, and flushes.
$PYTHON -c 'import nbd,sys; h=nbd.NBD(); h.connect_uri(sys.argv[1]); h.pread(4096, 0); h.shutdown()' "$uri" ||
  fail "b: cannot connect"
fill_disk
$PYTHON - "$uri" > "$TMP/b.first" 2>&1 <<'PY' ||
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for what, f in (("write", lambda: h.pwrite(b"\xab" * 65536, 1 << 20)),
                ("flush", lambda: h.flush())):
    try:
        f()
        print(what, "ok")
    except nbd.Error as e:
        print(what, "failed", e.errno)
h.shutdown()
PY
  { cat "$TMP/b.first" "$TMP/b.err" >&2; fail "b: the client could not connect on a full disk"; }
cat "$TMP/b.first"
grep -q 'could not reserve' "$TMP/b.err" ||
  { cat "$TMP/b.err" >&2; fail "b: the proxy did not say it could not reserve the log's space"; }
grep -q '^write failed' "$TMP/b.first" ||
  fail "b: a write to a full cache disk without a reservation succeeded?"
grep -q 'a write to the write log failed' "$TMP/b.err" ||
  { cat "$TMP/b.err" >&2; fail "b: the proxy did not say why the write failed"; }
rm "$TMP/c/fill"
$PYTHON "$CLIENT" "$uri" "$TMP/b.before" "$TMP/b.model" 2 --count 40 \
  --units 1-4 2>"$TMP/b.client.err" ||
  { cat "$TMP/b.client.err" "$TMP/b.err" >&2;
    fail "b: writes did not resume once the disk had space"; }
rm "$TMP/errors-on"
wait_long 30 same "$TMP/up.img" "$TMP/b.model" ||
  fail "b: the upstream is not the client's model"
echo "b: writes resumed without a restart once the disk had space"
grep -q 'writes and flushes now fail' "$TMP/b.err" &&
  { cat "$TMP/b.err" >&2; fail "b: the log failed for good"; }
stop_nbdkit "$TMP/px.pid"
exit 0
