#!/usr/bin/env bash
# nbd-fscache: the pool of upstream contexts survives its upstream
# (issue 40, plugin/pool.c).
#
#  1. Refusals, then room again.  A serial upstream (tests/serial-plugin.sh,
#     serialize_requests) behind nbdkit's limit filter (4 connections),
#     reached by the filter through the nbd plugin under noparallel
#     serialize=requests (so that the pool is used).  Another client
#     (the "hog") holds 2 connections to it before the proxy's two
#     clients connect (1 each): every context the pool opens is
#     refused.  The two clients read 16 MiB with readahead (64 KiB
#     reads, each checked against the image): no error, no crash.
#     Then the hog lets go while one client stays connected and goes on
#     reading 4 MiB at a time: the pool grows again, and the serial
#     upstream's reads overlap (at least 2 at once, from its call log)
#     after the hog left.  It used to stay at the size it fell to (0:
#     every miss on the client's own context, one at a time) for as
#     long as a connection used the export.
#  2. Read-only: under -r, with the image on a read-only mount behind
#     sshd (the ssh plugin opens O_RDWR unless told the export is
#     read-only, which fails there even for root), the pool's contexts
#     open: no refusal in the proxy's log, and the upstream reads
#     overlap (a log filter between the cache and ssh).  They used to
#     be opened read-write, refused, and the pool fell to 0.
#  3. The upstream restarted while a client stays connected (the nbd
#     plugin, fscache-upstream-connections=4):
#     a. with the same image: the client's next reads, of blocks not
#        cached, succeed with the right data (each pool context's read
#        fails on its dead connection and is tried once more on a new
#        one); they used to fail with EIO;
#     b. with another image of another size: the next reads of blocks
#        not cached fail (EIO; three tried), the proxy says why, and its object is
#        withdrawn; a proxy started again over the first image with
#        fscache-validate=size (which checks the size alone) then reads
#        exactly the first image: nothing of the second was cached
#        under its key.
#
# Truth: the images (cmp and checks in the readers), the serial
# plugin's call log, the log filter's request log, the proxy's log.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires flock --version
requires nbdkit sh --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=limit null --dump-plugin
requires nbdkit --filter=noparallel null --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

plugin="$top_srcdir/tests/serial-plugin.sh"
M=$((1024 * 1024))
img="$TMP/img"
make_random "$img" $((256 * M))

# ---- 1. refusals, then room again -----------------------------------------
export SERIAL_IMG="$img" SERIAL_MODEL=serialize_requests
export SERIAL_DIR="$TMP/sp"
mkdir -p "$SERIAL_DIR"
start_nbdkit -P "$TMP/back.pid" -U "$TMP/back.sock" --filter=limit \
  sh "$plugin" limit=4
NBDKIT_STDERR="$TMP/px.err" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" --filter=noparallel nbd socket="$TMP/back.sock" \
  serialize=requests fscache-dir="$TMP/cache1" \
  fscache-upstream-connections=4 fscache-readahead=4M
uri="nbd+unix:///?socket=$TMP/px.sock"

# The hog: 2 connections to the upstream until $TMP/lift exists.
$PYTHON - "nbd+unix:///?socket=$TMP/back.sock" "$TMP" <<'EOF' &
import os, sys, time, nbd
hs = []
for _ in range(2):
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    hs.append(h)
open(os.path.join(sys.argv[2], "hog-ready"), "w").close()
end = time.time() + 300
while not os.path.exists(os.path.join(sys.argv[2], "lift")) and time.time() < end:
    time.sleep(0.05)
for h in hs:
    h.shutdown()
EOF
hog=$!
wait_until test -e "$TMP/hog-ready" || fail "the hog did not connect"

# The client that stays: 16 MiB in 64 KiB reads; then, once $TMP/lift
# holds the time the hog left (ns), 4 MiB reads further on until the
# serial plugin's reads overlap after that time (or 120 s).
cat > "$TMP/stayer.py" <<'EOF'
import os, sys, time, nbd
uri, img, tmp, calls = sys.argv[1:5]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
for o in range(0, 16 << 20, 65536):
    if h.pread(65536, o) != data[o:o + 65536]:
        sys.exit("stayer: wrong data at %d" % o)
open(os.path.join(tmp, "stayer-read"), "w").close()
lift = os.path.join(tmp, "lift")
while not (os.path.exists(lift) and os.path.getsize(lift) > 0):
    time.sleep(0.05)
t_lift = int(open(lift).read())

def most_after(t):
    ev = []
    for line in open(calls):
        f = line.split()
        if f[0] == "pread" and len(f) >= 6 and int(f[4]) >= t:
            ev += [(int(f[4]), 1), (int(f[5]), -1)]
    ev.sort()
    cur = most = 0
    for _, d in ev:
        cur += d
        most = max(most, cur)
    return most

o = 16 << 20
end = time.time() + 120
while True:
    n = 4 << 20
    if o + n > len(data):
        sys.exit("stayer: read the whole image without an overlap")
    if h.pread(n, o) != data[o:o + n]:
        sys.exit("stayer: wrong data at %d" % o)
    o += n
    m = most_after(t_lift)
    if m >= 2:
        print("stayer: %d upstream reads at once after the lift, by %d MiB"
              % (m, o >> 20))
        break
    if time.time() > end:
        sys.exit("stayer: the upstream reads never overlapped after the lift")
h.shutdown()
EOF
$PYTHON "$TMP/stayer.py" "$uri" "$img" "$TMP" "$SERIAL_DIR/calls" &
stayer=$!
$PYTHON - "$uri" "$img" <<'EOF' || fail "refusals: the second reader failed"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
data = open(sys.argv[2], "rb").read()
for o in range(0, 16 << 20, 65536):
    if h.pread(65536, o) != data[o:o + 65536]:
        sys.exit("reader: wrong data at %d" % o)
h.shutdown()
EOF
wait_until test -e "$TMP/stayer-read" || fail "refusals: the stayer is stuck"
refused=$(grep -c "the upstream refused another connection" "$TMP/px.err" || true)
echo "refusals: $refused warning(s) that the upstream refused a connection"
[ "$refused" -ge 1 ] || fail "refusals: the pool was never refused (test bug?)"
date +%s%N > "$TMP/lift.tmp"
touch "$TMP/lift"
wait "$hog"
mv "$TMP/lift.tmp" "$TMP/lift"
wait "$stayer" || fail "refusals: the pool did not grow again after the lift"
kill -0 "$(cat "$TMP/px.pid")" || fail "refusals: the proxy died"
stop_nbdkit "$TMP/px.pid"
stop_nbdkit "$TMP/back.pid"
if [ -s "$SERIAL_DIR/overlaps" ]; then
  cat "$SERIAL_DIR/overlaps" >&2
  fail "refusals: calls overlapped on one upstream connection"
fi

# ---- 2. read-only, over ssh -----------------------------------------------
if [ -x /usr/sbin/sshd ] && nbdkit ssh --dump-plugin >/dev/null 2>&1 &&
   mount_tmpfs "$TMP/ro" 64m 2>/dev/null; then
  head -c $((32 * M)) "$img" > "$TMP/ro/img"
  chmod 0444 "$TMP/ro/img"
  mount -o remount,ro "$TMP/ro" || fail "read-only: cannot remount ro"
  start_sshd /usr/lib/openssh/sftp-server || fail "read-only: sshd did not start"
  NBDKIT_STDERR="$TMP/ssh-px.err" start_nbdkit -r -P "$TMP/sp.pid" \
    -U "$TMP/sp.sock" --filter="$FILTER" --filter=log ssh "${ssh_args[@]}" \
    path="$TMP/ro/img" logfile="$TMP/ssh.log" fscache-dir="$TMP/cache2" \
    fscache-upstream-connections=4
  nbdcopy --connections=1 --requests=8 --request-size=4194304 \
    "nbd+unix:///?socket=$TMP/sp.sock" "$TMP/copy-ssh" ||
    fail "read-only: the copy failed"
  cmp "$TMP/ro/img" "$TMP/copy-ssh" || fail "read-only: the copy differs"
  stop_nbdkit "$TMP/sp.pid"
  most=$(log_reads_at_once "$TMP/ssh.log")
  echo "read-only ssh: at most $most upstream reads at once"
  ! grep -q "refused another connection" "$TMP/ssh-px.err" ||
    fail "read-only: the pool's contexts were refused"
  [ "$most" -ge 2 ] || fail "read-only: the upstream reads never overlapped"
else
  echo "read-only ssh: skipped (no sshd, ssh plugin or tmpfs mount)" >&2
  ro_skipped=1
fi

# ---- 3. the upstream restarted --------------------------------------------
head -c $((64 * M)) "$img" > "$TMP/A"
make_random "$TMP/B" $((48 * M))
start_back () { start_nbdkit -P "$TMP/b3.pid" -U "$TMP/b3.sock" file "$1"; }
start_back "$TMP/A"
NBDKIT_STDERR="$TMP/px3.err" start_nbdkit -P "$TMP/p3.pid" -U "$TMP/p3.sock" \
  --filter="$FILTER" nbd socket="$TMP/b3.sock" fscache-dir="$TMP/cache3" \
  fscache-key=restart fscache-validate=size fscache-readahead=0 \
  fscache-upstream-connections=4
uri3="nbd+unix:///?socket=$TMP/p3.sock"
cat > "$TMP/restart.py" <<'EOF'
import os, sys, time, nbd
uri, a, tmp = sys.argv[1:4]
data = open(a, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
def step(name):
    open(os.path.join(tmp, name), "w").close()
    go = os.path.join(tmp, name + ".go")
    while not os.path.exists(go):
        time.sleep(0.05)
def check(o, n, what):
    if h.pread(n, o) != data[o:o + n]:
        sys.exit("restart: %s: wrong data at %d" % (what, o))
check(0, 8 << 20, "before")
step("r1")                      # the upstream restarts with A
check(8 << 20, 8 << 20, "after a restart with the same image")
print("restart, same image: the reads went on")
step("r2")                      # the upstream restarts with B
# Three tries: the first may fail on the pool's dead connections alone.
for i in range(3):
    try:
        h.pread(4 << 20, (16 + 4 * i) << 20)
        sys.exit("restart: the upstream changed size, and a read succeeded")
    except nbd.Error as e:
        print("restart, another image: read %d failed: %s" % (i, e.string))
h.shutdown()
EOF
$PYTHON "$TMP/restart.py" "$uri3" "$TMP/A" "$TMP" & rs=$!
wait_until test -e "$TMP/r1" || fail "restart: the client did not start"
kill9_nbdkit "$TMP/b3.pid"; start_back "$TMP/A"; touch "$TMP/r1.go"
wait_until test -e "$TMP/r2" || { wait "$rs"; fail "restart: the client failed after a restart with the same image"; }
kill9_nbdkit "$TMP/b3.pid"; start_back "$TMP/B"; touch "$TMP/r2.go"
wait "$rs" || fail "restart: the client's checks failed"
kill -0 "$(cat "$TMP/p3.pid")" || fail "restart: the proxy died"
stop_nbdkit "$TMP/p3.pid"
grep -q "the upstream was replaced under the cache; withdrawing" "$TMP/px3.err" ||
  fail "restart: the proxy did not say it withdrew the object"
# The first image again, a proxy on the same cache and key: exactly A.
kill9_nbdkit "$TMP/b3.pid"; start_back "$TMP/A"
start_nbdkit -P "$TMP/p4.pid" -U "$TMP/p4.sock" --filter="$FILTER" \
  nbd socket="$TMP/b3.sock" fscache-dir="$TMP/cache3" fscache-key=restart \
  fscache-validate=size fscache-readahead=0
nbdcopy "nbd+unix:///?socket=$TMP/p4.sock" "$TMP/copy-A"
cmp "$TMP/A" "$TMP/copy-A" ||
  fail "restart: the cache served bytes of the other image under A's key"
stop_nbdkit "$TMP/p4.pid"

[ -z "${ro_skipped:-}" ] || exit 77
echo "$0: OK"
