#!/usr/bin/env bash
# nbd-fscache-proxy runs a serial plugin as two processes (issue 42).
#
#  1. --dry-run: plugin=curl (serialize_requests) prints a back (curl,
#     with the conf's filter= lines and upstream= parameters) and a
#     front (the fscache filter over the nbd plugin, with a pool of 16,
#     and not the URL); split=no prints one nbdkit with curl;
#     plugin=nbd (parallel) is never split; split=maybe is refused
#     with the file and line.
#  2. By hand (no systemd), nginx through curl, 10 ms per read (the
#     delay filter, a filter= line, in the back): one client connection
#     with 16 random 4 KiB reads in flight, each checked against the
#     image: the back's reads overlap (a log filter in the back: at
#     least 2 at once), and the back's socket directory is private
#     (mode 0700).
#  3. The back killed (-9) while the client reads on: it is started
#     again, and the client's reads go on without an error (the
#     front's connections to it reconnect).
#  4. Stopping the proxy (SIGTERM to it) stops the back too.
#  4b. The back down (killed, its supervisor stopped) for 12 s, longer
#     than the front retries a connect: a client that opens meanwhile
#     is served once the back is up again, the data right.
#  5. Socket activated (systemd-socket-activate, as the service unit
#     runs it): the activated process is the front nbdkit, the back
#     does not hold the listening socket, and a copy under which the
#     back is killed (-9) completes, identical; SIGTERM stops both.
#  6. ssh (sshd started by the test), read-only, a 0444 image:
#     split by default, the copy identical, multi-conn advertised, and
#     sshd accepted several sessions (the front's pool at the back).
#
# Truth: the image, the back's request log, /proc.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit curl --dump-plugin
requires nbdkit --filter=delay null --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nginx -v
requires setpriv --version
requires "$PYTHON" -c 'import nbd'
requires test -r "$FILTER"

proxy="$top_builddir/tools/nbd-fscache-proxy/nbd-fscache-proxy"
requires test -x "$proxy"

mkdir -p "$TMP/conf" "$TMP/www"
size=$((32 * 1024 * 1024))
make_random "$TMP/www/img" "$size"
start_nginx "$TMP/www" '$status $request_method $uri $body_bytes_sent'
url="http://127.0.0.1:$PORT/img"

# ---- 1. --dry-run ----
conf ()                         # NAME LINES...
{
  local n=$1; shift
  printf '%s\n' "$@" > "$TMP/conf/$n.conf"
  chmod 0644 "$TMP/conf/$n.conf"
}
conf img plugin=curl "upstream=url=$url" filter=log \
  "upstream=logfile=$TMP/back.log" filter=delay upstream=rdelay=10ms \
  fscache-key=img "fscache-dir=$TMP/cache" "socket=$TMP/px.sock" \
  fscache-readahead=0
dry="$("$proxy" --filter="$FILTER" --confdir "$TMP/conf" --dry-run img)" ||
  fail "--dry-run img failed"
echo "$dry"
back=$(sed -n 's/^back: //p' <<<"$dry")
front=$(sed -n 's/^front: //p' <<<"$dry")
[ -n "$back" ] && [ -n "$front" ] || fail "plugin=curl: not split: $dry"
case "$back" in
  *"--filter=log --filter=delay curl url=$url logfile="*"rdelay=10ms"*) ;;
  *) fail "the back is not curl with its filters: $back" ;;
esac
case "$front" in
  *" nbd socket=$TMP/px.sock.back/sock "*fscache-upstream-connections=16*) ;;
  *) fail "the front is not the filter over the back: $front" ;;
esac
case "$front" in *"$url"*) fail "the front names the URL: $front" ;; esac
conf one plugin=curl "upstream=url=$url" fscache-key=one split=no
one="$("$proxy" --confdir "$TMP/conf" --dry-run one)"
[ "$(wc -l <<<"$one")" = 1 ] && [[ "$one" == *" curl url=$url "* ]] ||
  fail "split=no: $one"
conf par plugin=nbd upstream=socket=/nowhere fscache-key=par
par="$("$proxy" --confdir "$TMP/conf" --dry-run par)"
[ "$(wc -l <<<"$par")" = 1 ] || fail "plugin=nbd was split: $par"
conf bad plugin=curl "upstream=url=$url" fscache-key=bad split=maybe
rc=0
"$proxy" --confdir "$TMP/conf" --dry-run bad 2>"$TMP/bad.err" || rc=$?
[ "$rc" = 1 ] && grep -q "bad.conf:4: split=maybe" "$TMP/bad.err" ||
  fail "split=maybe: status $rc, $(cat "$TMP/bad.err")"

# ---- 2. by hand: reads at queue depth reach the back in parallel ----
"$proxy" --filter="$FILTER" --confdir "$TMP/conf" img 2>"$TMP/px.err" &
px=$!
cleanup_fn "kill $px 2>/dev/null"
wait_until test -S "$TMP/px.sock" || fail "the proxy did not start"
[ "$(stat -c %a "$TMP/px.sock.back")" = 700 ] ||
  fail "the back's socket directory is not private"
cat > "$TMP/rand.py" <<'EOF'
import os, random, sys, time, nbd
uri, img, tmp = sys.argv[1:4]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
rnd = random.Random(7)
def burst(n):
    offs = [rnd.randrange(len(data) // 4096) * 4096 for _ in range(n)]
    flight = []
    while offs or flight:
        while offs and len(flight) < 16:
            o = offs.pop()
            b = nbd.Buffer(4096)
            flight.append((h.aio_pread(b, o), b, o))
        h.poll(-1)
        for t in flight[:]:
            if h.aio_command_completed(t[0]):
                if t[1].to_bytearray() != data[t[2]:t[2] + 4096]:
                    sys.exit("wrong data at %d" % t[2])
                flight.remove(t)
burst(200)
open(os.path.join(tmp, "burst1"), "w").close()
while not os.path.exists(os.path.join(tmp, "burst2.go")):
    time.sleep(0.05)
burst(200)
h.shutdown()
EOF
$PYTHON "$TMP/rand.py" "nbd+unix:///?socket=$TMP/px.sock" "$TMP/www/img" \
  "$TMP" & reader=$!
wait_until test -e "$TMP/burst1" || { wait $reader; fail "part 2: the reads failed"; }
most=$(log_reads_at_once "$TMP/back.log")
echo "part 2: at most $most reads at once in the back"
[ "$most" -ge 2 ] || fail "part 2: the back's reads never overlapped"

# ---- 3. the back killed ----
# back_of LOG: the back process whose log filter writes LOG.
# (Empty if there is none: the callers say so, rather than pipefail
# ending the test without a word.)
back_of () { pgrep -f -- "^nbdkit -f --exit-with-parent .* logfile=$1( |\$)" | head -n 1 || true; }
backpid=$(back_of "$TMP/back.log")
[ -n "$backpid" ] || fail "part 3: no back process"
kill -9 "$backpid"
back_again () {
  local p
  p=$(back_of "$TMP/back.log")
  [ -n "$p" ] && [ "$p" != "$backpid" ]
}
wait_until back_again || fail "part 3: the back was not started again"
touch "$TMP/burst2.go"
wait $reader || fail "part 3: the client's reads failed after the back was killed"
grep -q "the back process exited" "$TMP/px.err" ||
  fail "part 3: the proxy did not say the back exited"
echo "part 3: the back was killed and started again; the reads went on"

# ---- 4. stopping the proxy stops the back ----
kill -TERM $px
wait $px || true
no_back () { [ -z "$(back_of "$TMP/back.log")" ]; }
wait_until no_back || fail "part 4: the back outlived the proxy"

# ---- 4b. a client opens while the back is down ----
# The back killed and kept down (its supervisor stopped) for 12 s,
# longer than the front's nbd plugin tries to connect (retry=10, a
# second apart): a client that opens meanwhile waits, in the back
# socket's backlog, and is served once the back is up again.  When the
# back's socket went with it (a loop that bound it again), that open
# failed after the tenth refused connect.
conf op plugin=curl "upstream=url=$url" filter=log \
  "upstream=logfile=$TMP/op-back.log" fscache-key=op \
  "fscache-dir=$TMP/cache-op" "socket=$TMP/op.sock" fscache-readahead=0
"$proxy" --filter="$FILTER" --confdir "$TMP/conf" op 2>"$TMP/op.err" &
op=$!
cleanup_fn "pkill -9 -P $op; kill -9 $op 2>/dev/null"
wait_until test -S "$TMP/op.sock" || fail "part 4b: the proxy did not start"
# The back runs once a client has been served through it.
$PYTHON -c 'import sys, nbd; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pread(4096, 0)' \
  "nbd+unix:///?socket=$TMP/op.sock" || fail "part 4b: the first client failed"
opback=$(back_of "$TMP/op-back.log")
[ -n "$opback" ] || fail "part 4b: no back process"
supervisor=$(ps -o ppid= -p "$opback" | tr -d ' ')
[ "$(cat "/proc/$supervisor/comm")" = perl ] ||
  fail "part 4b: the back's parent is $(cat "/proc/$supervisor/comm"), not the supervisor"
kill -STOP "$supervisor"
kill -9 "$opback"
$PYTHON - "nbd+unix:///?socket=$TMP/op.sock" "$TMP/www/img" <<'EOF' &
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
if h.pread(4096, 65536) != open(sys.argv[2], "rb").read()[65536:65536 + 4096]:
    sys.exit("part 4b: wrong data")
EOF
opener=$!
sleep 12                        # the back down: what is tested, not a wait
kill -CONT "$supervisor"
wait $opener ||
  { cat "$TMP/op.err" >&2; fail "part 4b: a client's open failed while the back was down"; }
kill -TERM $op
wait $op || true
echo "part 4b: a client opened while the back was down for 12 s: served once it was up"

# ---- 5. socket activated, as the service runs it ----
if ! command -v systemd-socket-activate >/dev/null; then
  echo "$0: SKIP: part 5 needs systemd-socket-activate (parts 1-4 passed)"
  exit 77
fi
rm -rf "$TMP/cache"
conf sa plugin=curl "upstream=url=$url" filter=log \
  "upstream=logfile=$TMP/sa-back.log" filter=delay upstream=rdelay=2ms \
  fscache-key=sa "fscache-dir=$TMP/cache-sa" "socket=$TMP/sa.sock" \
  fscache-readahead=0
systemd-socket-activate -l "$TMP/sa.sock" \
  "$proxy" --confdir "$TMP/conf" --filter "$FILTER" sa 2>"$TMP/sa.err" &
sa=$!
cleanup_fn "pkill -9 -P $sa; kill -9 $sa 2>/dev/null"
wait_until test -S "$TMP/sa.sock" || fail "part 5: no socket"
nbdcopy --requests=4 "nbd+unix:///?socket=$TMP/sa.sock" "$TMP/sa-copy" &
copy=$!
sa_back () { back_of "$TMP/sa-back.log"; }
has_back () { [ -n "$(sa_back)" ]; }
wait_until has_back || fail "part 5: no back process"
first=$(sa_back)
# The back must not hold the listening socket (fd 3) systemd passed.
for fd in /proc/"$first"/fd/*; do
  [ "$(readlink "$fd")" != "$(readlink "/proc/$sa/fd/3")" ] ||
    fail "part 5: the back inherited the listening socket"
done
# Under the copy: once the back serves its fills (reads of 64 KiB or
# more, not the 4 KiB sample reads),
# after the client's open (whose coherency sample, read once on the
# client's own connection to the back, fails with the back killed
# under it: seen once in CI, and left as it is, see issue 42's note).
fills () { grep -q ' Read id=.* count=0x[0-9a-f]\{5,\} ' "$TMP/sa-back.log" 2>/dev/null; }
wait_until fills || fail "part 5: the back served no fill"
kill -9 "$first"
wait $copy || { cat "$TMP/sa.err" >&2; fail "part 5: the copy failed after the back was killed"; }
cmp "$TMP/www/img" "$TMP/sa-copy" || fail "part 5: the copy differs"
[ "$(cat "/proc/$sa/comm")" = nbdkit ] ||
  fail "part 5: the activated process is not the front nbdkit"
kill -TERM $sa
wait $sa || true
no_sa_back () { [ -z "$(sa_back)" ]; }
wait_until no_sa_back || fail "part 5: the back outlived the proxy"
echo "part 5: socket activated: the back killed under a copy, the copy right"

# ---- 6. ssh, read-only ----
if [ ! -x /usr/sbin/sshd ] || ! nbdkit ssh --dump-plugin >/dev/null 2>&1; then
  echo "$0: SKIP: part 6 needs sshd and the ssh plugin (parts 1-5 passed)"
  exit 77
fi
start_sshd internal-sftp "MaxStartups 100" || fail "part 6: sshd did not start"
chmod 0444 "$TMP/www/img"
{ echo plugin=ssh
  for a in "${ssh_args[@]}"; do echo "upstream=$a"; done
  echo "upstream=$TMP/www/img"
  echo "fscache-key=ssh"; echo "fscache-dir=$TMP/cache-ssh"
  echo "socket=$TMP/ssh.sock"; echo readonly=true; } > "$TMP/conf/ssh.conf"
chmod 0644 "$TMP/conf/ssh.conf"
sshdry="$("$proxy" --filter="$FILTER" --confdir "$TMP/conf" --dry-run ssh)"
[ "$(wc -l <<<"$sshdry")" = 2 ] || fail "part 6: plugin=ssh was not split: $sshdry"
"$proxy" --filter="$FILTER" --confdir "$TMP/conf" ssh 2>"$TMP/ssh-px.err" &
sp=$!
cleanup_fn "kill $sp 2>/dev/null"
wait_until test -S "$TMP/ssh.sock" || fail "part 6: the proxy did not start"
nbdcopy "nbd+unix:///?socket=$TMP/ssh.sock" "$TMP/ssh-copy" ||
  { cat "$TMP/ssh-px.err" >&2; fail "part 6: the copy over ssh failed"; }
cmp "$TMP/www/img" "$TMP/ssh-copy" || fail "part 6: the copy over ssh differs"
nbdinfo --can multi-conn "nbd+unix:///?socket=$TMP/ssh.sock" ||
  fail "part 6: no multi-conn on the read-only export"
sessions=$(grep -c "Accepted publickey" "$TMP/sshd.err" || true)
kill -TERM $sp; wait $sp || true
echo "part 6: ssh, read-only, split: the copy right, $sessions ssh sessions"
[ "$sessions" -ge 2 ] || fail "part 6: one ssh session: the front's pool never reached the back"

echo "$0: OK"
