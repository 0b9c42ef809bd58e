#!/usr/bin/env bash
# nbd-fscache: the latency guard (issue 44, core/ops/guard.c).
#
# The cache directory is on a slow device: an ext4 file system on a
# loop device whose reads the block layer holds to 20 a second (the
# blkio controller's throttle.read_iops_device), the way a cache disk
# saturated by other work answers a read in tens of milliseconds.  The
# upstream is a local file (fast).  Without root, loop devices or the
# throttle, the test skips.
#
#  1. The export is read whole through the proxy (the throttle not yet
#     set), so that the cache holds it; the proxy stops cleanly, and
#     the cache files' pages are dropped from the page cache
#     (posix_fadvise), so that hits read the device.
#  2. The throttle set, the proxy started again (the guard on, its
#     default): 200 random 4 KiB reads at queue depth 1, each compared
#     with the image (G1: a rerouted hit is the upstream's bytes,
#     which are the image's).  The guard rerouted hits
#     (hits_rerouted > 0: the disk's 50 ms against the upstream's
#     microseconds), and the object's route changed at most once a
#     second (G2: guard_switches at most the seconds the reads took,
#     plus one).
#  3. The pages dropped again, the proxy with fscache-latency-guard=false:
#     40 reads, right, and no hit rerouted (every one from the disk).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
# The guard's default, on (tests/functions.sh turns it off elsewhere).
unset NBD_FSCACHE_TEST_GUARD

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdkit --filter=log file --dump-plugin
requires test "$(id -u)" -eq 0
requires losetup --version
requires mkfs.ext4 -V
requires test -w /sys/fs/cgroup/blkio/blkio.throttle.read_iops_device

size=$((64 * 1024 * 1024))

truncate -s 256M "$TMP/disk.img"
loop=$(losetup -f --show "$TMP/disk.img") ||
  { echo "$0: SKIP: no loop device"; exit 77; }
cleanup_fn "losetup -d '$loop'"
mm=$(lsblk -dno MAJ:MIN "$loop" | tr -d ' ')
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
mkdir "$TMP/slow"
mount "$loop" "$TMP/slow"
cleanup_fn "umount -l '$TMP/slow'"
throttle=/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device

img="$TMP/upstream.img"
make_random "$img" "$size"
cache="$TMP/slow/cache"
stats="$TMP/px.stats"
uri="nbd+unix:///?socket=$TMP/px.sock"
proxy ()
{
  rm -f "$stats"
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" --filter=log file "$img" logfile="$TMP/up.log" \
    fscache-dir="$cache" fscache-validate=size fscache-stats="$stats" \
    fscache-catchup=false "$@"
}
# Drop the cache files' pages: the next hits read the device.
drop_pages ()
{
  sync
  find "$cache" -type f -print0 | xargs -0 "$PYTHON" -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)'
}
# random_reads N: N random 4 KiB reads, one at a time, each compared
# with the image; prints the seconds they took.
random_reads ()
{
  "$PYTHON" - "$uri" "$img" "$1" <<'PY'
import nbd, random, sys, time
uri, img, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
rnd = random.Random(44)
t0 = time.monotonic()
for _ in range(n):
    off = rnd.randrange(len(data) // 4096) * 4096
    if h.pread(4096, off) != data[off:off + 4096]:
        sys.exit("read at %d differs from the image" % off)
print("%.2f" % (time.monotonic() - t0))
h.shutdown()
PY
}

# ---- 1. cached whole ----
# (No fill skipped for the fast upstream: NBD_FSCACHE_TEST_BUDGET=0.)
NBD_FSCACHE_TEST_BUDGET=0 proxy
nbdcopy "$uri" "$TMP/out" || fail "part 1: the copy failed"
cmp "$img" "$TMP/out" || fail "part 1: the copy differs from the image"
stop_nbdkit "$TMP/px.pid"
cached=$(cached_bytes "$cache")
echo "part 1: $cached bytes cached of $size"
[ "$cached" = "$size" ] || fail "part 1: only $cached bytes cached"
drop_pages

# ---- 2. the guard on, the device slow ----
echo "$mm 20" > "$throttle"
cleanup_fn "echo '$mm 0' > $throttle"
proxy
secs=$(random_reads 200) || fail "part 2: a read differs from the image"
stop_nbdkit "$TMP/px.pid"
rer=$(stat_value "$stats" hits_rerouted)
sw=$(stat_value "$stats" guard_switches)
hits=$(stat_value "$stats" hit_bytes)
echo "part 2: 200 reads in $secs s: $rer hits rerouted, $sw route changes," \
     "$hits bytes of hits"
[ "$rer" -gt 0 ] || fail "part 2: no hit rerouted around the slow disk"
awk -v s="$sw" -v t="$secs" 'BEGIN { exit !(s >= 1 && s <= t + 1) }' ||
  fail "part 2: $sw route changes in $secs s (G2: at most one a second)"

# ---- 3. the guard off ----
drop_pages
proxy fscache-latency-guard=false
secs=$(random_reads 40) || fail "part 3: a read differs from the image"
stop_nbdkit "$TMP/px.pid"
rer=$(stat_value "$stats" hits_rerouted)
echo "part 3: the guard off: 40 reads in $secs s, $rer hits rerouted"
[ "$rer" = 0 ] || fail "part 3: $rer hits rerouted with the guard off"
echo "$0: OK"
