#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: the writer never breaks a serial
# upstream's thread model, and what it writes back is exactly what the
# clients wrote.
#
# The writer has an upstream context of its own (a "shared" nbdkit
# context opened from the backend, outside any client connection).
# Under serialize_all_requests its calls must take the server's gate
# with the client connections' calls; under serialize_requests the
# context is one more connection, one call at a time.
#
#  1. tests/serial-plugin.sh (an nbdkit sh plugin that catches any call
#     overlapping another one its declared thread model forbids, see
#     test-fscache-serial.sh), as serialize_all_requests and as
#     serialize_requests.
#  2. OpenSSH's sshd on 127.0.0.1 (started here, as in
#     test-fscache-up-ssh.sh) through nbdkit's ssh plugin, which
#     declares serialize_requests.  Overlaps are caught by nbdkit's log
#     filter placed below fscache: on each upstream connection
#     (including the writer's), a request must not start before the
#     previous one returned.  Skipped (the rest still runs) unless sshd
#     can run: it needs root.
#
# Each time: two clients (tests/wb-client.py) on two connections write
# about 2 MiB each with flushes, aligned and not (the unaligned ones read
# the rest of a unit from the upstream on the client's connection,
# while the writer writes), zeroes too, each in its own half of the
# export, every write read back; then SIGTERM makes the proxy drain
# everything (fscache-writeback-drain=60), and the upstream image must
# equal the clients' models (cmp), the proxy must not say it left dirty
# data, and no overlap may have been seen.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit sh --dump-plugin
requires flock --version
requires nbdinfo --version
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'
requires cmp --version

CLIENT="$top_srcdir/tests/wb-client.py"
plugin="$top_srcdir/tests/serial-plugin.sh"
uri="nbd+unix:///?socket=$TMP/px.sock"
size=$((8 * 1024 * 1024))
half=$((size / 2))
wb=(fscache-mode=writeback fscache-writeback-drain=60)

# write_both NAME: the two clients at once, then the expected image
# $TMP/NAME.want from their models.
write_both ()
{
  local p0 p1 st=0
  $PYTHON "$CLIENT" "$uri" "$TMP/orig.img" "$TMP/$1.m0" 10 --region 0/2 \
    --count 60 --units 1-16 --unaligned --zero --flush-every 6 &
  p0=$!
  $PYTHON "$CLIENT" "$uri" "$TMP/orig.img" "$TMP/$1.m1" 11 --region 1/2 \
    --count 60 --units 1-16 --unaligned --zero --flush-every 6 &
  p1=$!
  wait $p0 || st=1
  wait $p1 || st=1
  return $st
}
want ()
{
  { head -c $half "$TMP/$1.m0"; tail -c +$((half + 1)) "$TMP/$1.m1"; } \
    > "$TMP/$1.want"
  [ "$(stat -c %s "$TMP/$1.want")" -eq $size ] || fail "$1: bad model"
}
# drained NAME: stop the proxy (it drains), then the upstream is the want.
drained ()
{
  kill -0 "$(cat "$TMP/px.pid")" 2>/dev/null || fail "$1: the proxy died"
  stop_nbdkit "$TMP/px.pid"
  if grep -q 'left in the cache' "$TMP/$1.err"; then
    cat "$TMP/$1.err" >&2
    fail "$1: the proxy left dirty data behind after SIGTERM"
  fi
  grep -q 'Assertion\|ERROR' "$TMP/$1.err" &&
    { cat "$TMP/$1.err" >&2; fail "$1: the proxy logged an error"; }
  cmp "$TMP/$2" "$TMP/$1.want" ||
    fail "$1: after the drain the upstream differs from what the clients wrote"
}

SECONDS=0

# ---- 1. the serial sh plugin -----------------------------------------------
for model in serialize_all_requests serialize_requests; do
  rm -rf "$TMP/sp"; mkdir "$TMP/sp"
  make_random "$TMP/upstream.img" "$size"
  cp "$TMP/upstream.img" "$TMP/orig.img"
  SERIAL_IMG="$TMP/upstream.img" SERIAL_DIR="$TMP/sp" SERIAL_MODEL="$model" \
    NBDKIT_STDERR="$TMP/$model.err" \
    start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" sh "$plugin" \
    fscache-dir="$TMP/cache-$model" fscache-key=serial "${wb[@]}"
  if ! write_both "$model"; then
    [ -s "$TMP/sp/overlaps" ] && head "$TMP/sp/overlaps" >&2
    fail "$model: a client failed"
  fi
  want "$model"
  drained "$model" upstream.img
  if [ -s "$TMP/sp/overlaps" ]; then
    head -20 "$TMP/sp/overlaps" >&2
    fail "$model: $(wc -l < "$TMP/sp/overlaps") upstream calls overlapped" \
         "another one that the plugin's thread model forbids"
  fi
  w=$(grep -c '^pwrite' "$TMP/sp/calls" || true)
  f=$(grep -c '^flush' "$TMP/sp/calls" || true)
  [ "$w" -gt 0 ] && [ "$f" -gt 0 ] ||
    fail "$model: the plugin saw $w pwrites and $f flushes"
  echo "$model: ok, $w upstream pwrites and $f flushes, no overlap (${SECONDS}s)"
done

# ---- 2. sshd through the ssh plugin ----------------------------------------
ssh_skip ()
{
  echo "ssh: SKIP: $*"
  echo "$0: OK (${SECONDS}s)"
  exit 0
}
[ "$(id -u)" = 0 ] || ssh_skip "sshd needs root"
[ -x /usr/sbin/sshd ] || ssh_skip "no /usr/sbin/sshd"
command -v ssh-keygen >/dev/null || ssh_skip "no ssh-keygen"
nbdkit ssh --dump-plugin >/dev/null 2>&1 || ssh_skip "no nbdkit ssh plugin"
nbdkit --filter=log null --dump-plugin >/dev/null 2>&1 ||
  ssh_skip "no nbdkit log filter"

start_sshd internal-sftp ||
  ssh_skip "sshd did not start: $(tail -1 "$TMP/sshd.err")"

make_random "$TMP/ssh.img" "$size"
cp "$TMP/ssh.img" "$TMP/orig.img"
got=$(nbdkit -U - ssh "${ssh_args[@]}" "$TMP/ssh.img" \
        --run 'nbdinfo --size "$uri"' 2>"$TMP/ssh-probe.err") ||
  { cat "$TMP/ssh-probe.err" "$TMP/sshd.err" >&2
    fail "nbdkit ssh cannot open the image over sshd"; }
[ "$got" -eq "$size" ] || fail "ssh: the ssh plugin sees $got bytes, not $size"

NBDKIT_STDERR="$TMP/ssh.err" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" --filter=log ssh "${ssh_args[@]}" "$TMP/ssh.img" \
  logfile="$TMP/ssh.log" \
  fscache-dir="$TMP/cache-ssh" fscache-key=ssh "${wb[@]}"
write_both ssh || fail "ssh: a client failed"
want ssh
drained ssh ssh.img

# On each upstream connection the log filter numbers, a request's line
# ("connection=N Write id=I ...") must come after the previous one's
# return line ("connection=N ...Write id=I return=...").
awk -v cf="$TMP/ssh.conns" '{
       c = ""
       for (i = 1; i < NF - 1; i++)
         if ($i ~ /^connection=/) { c = $i; w = $(i + 1); id = $(i + 2); break }
       if (c == "" || id !~ /^id=/) next
       if (w ~ /^\.\.\./) { delete busy[c]; next }
       if (c in busy) { print "overlap: " $0 " / in flight: " busy[c]; bad++ }
       busy[c] = w " " id
       n[c]++
     }
     END {
       for (c in n) printf "%s: %d requests\n", c, n[c] > cf
       exit bad > 0
     }' "$TMP/ssh.log" > "$TMP/ssh.overlaps" || {
  head -20 "$TMP/ssh.overlaps" >&2
  fail "ssh: $(wc -l < "$TMP/ssh.overlaps") upstream requests started while" \
       "another was in flight on the same connection (serialize_requests)"
}
conns=$(wc -l < "$TMP/ssh.conns")
writes=$(grep -c ' Write id=' "$TMP/ssh.log" || true)
[ "$conns" -ge 3 ] ||
  fail "ssh: the log filter saw $conns upstream connection(s), expected the" \
       "two clients' and the writer's"
[ "$writes" -gt 0 ] || fail "ssh: no write reached the ssh plugin"
echo "ssh: ok, $writes upstream writes over $conns connections, no overlap" \
     "(${SECONDS}s)"

echo "$0: OK (${SECONDS}s)"
