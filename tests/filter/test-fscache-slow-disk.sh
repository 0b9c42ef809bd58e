#!/usr/bin/env bash
# nbd-fscache: a cache disk slower than the upstream (issue 18).
#
# The cache directory is on a real slow device: an ext4 file system on
# a loop device whose writes the block layer throttles to RATE bytes/s
# (the blkio controller's throttle.write_bps_device, set in the root
# cgroup so that it also holds for the kernel's writeback threads),
# with the device's dirty page cache capped (strict_limit, max_bytes)
# so that a writer is held to the device's speed instead of filling the
# page cache.  dm-delay or dm-flakey would do as well, but this kernel
# has no device-mapper; the loop device is as real and needs nothing
# else.  Without root, loop devices or the throttle, the test skips.
#
# The upstream is a local file (fast).  A client reads the whole export
# through the proxy, 16 requests in flight.  Then:
#   - the data is identical to the image (tests/stream-reader.py);
#   - the reads were not paced by the cache disk: they took less than
#     half of what writing the bytes beyond the fill queue at RATE
#     would take (with fills inline, as before, they took more than
#     all of it; so they did when readahead's fills, which a stream's
#     reads wait for, went at the disk's speed);
#   - the fill threads wrote several fills at once (fill_depth_max);
#   - the proxy counted fills it skipped (fill_skipped_bytes in its
#     fscache-stats file, and in the object's counters, which
#     nbd-fscache stat --prometheus exports), said so once in its log,
#     and what it did not skip it cached: stored + skipped covers every
#     byte fetched;
#   - a second copy is identical too, and reads upstream only what the
#     first did not cache (cached_bytes of nbd-fscache stat).
# (fscache-catchup=false: the catch-up worker's own upstream reads,
# which test-fscache-catchup.sh measures, would count in these.)

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdkit --filter=log file --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires test "$(id -u)" -eq 0
requires losetup --version
requires mkfs.ext4 -V
requires test -w /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device

rate=$((4 * 1024 * 1024))           # the cache disk: 4 MiB/s of writes
size=$((64 * 1024 * 1024))          # the export
queue=$((16 * 1024 * 1024))         # the fill queue's bound on a disk this
                                    # slow (fsc_fill_bound, core/ops/fill.c)

# The slow device.
truncate -s 256M "$TMP/disk.img"
loop=$(losetup -f --show "$TMP/disk.img") ||
  { echo "$0: SKIP: no loop device"; exit 77; }
cleanup_fn "losetup -d '$loop'"
mm=$(lsblk -dno MAJ:MIN "$loop" | tr -d ' ')
bdi="/sys/class/bdi/$mm"
[ -w "$bdi/strict_limit" ] && [ -w "$bdi/max_bytes" ] ||
  { echo "$0: SKIP: no strict_limit/max_bytes for $bdi (Linux < 6.2)"; exit 77; }
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
mkdir "$TMP/slow"
mount "$loop" "$TMP/slow"
cleanup_fn "umount -l '$TMP/slow'"
throttle=/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device
echo "$mm $rate" > "$throttle"
cleanup_fn "echo '$mm 0' > $throttle"
echo 1 > "$bdi/strict_limit"
echo $((1024 * 1024)) > "$bdi/max_bytes"

# The device really is that slow: 4 MiB written and synced.
t0=$(date +%s.%N)
dd if=/dev/zero of="$TMP/slow/probe" bs=1M count=4 conv=fdatasync status=none
probe=$(seconds_since "$t0")
rm "$TMP/slow/probe"
echo "4 MiB written to the slow device in $probe s"
awk -v t="$probe" 'BEGIN { exit !(t >= 0.5) }' ||
  { echo "$0: SKIP: the throttle does not hold ($probe s for 4 MiB)"; exit 77; }

img="$TMP/upstream.img"
make_random "$img" "$size"
log="$TMP/up.log"
cache="$TMP/slow/cache"
stats="$TMP/px.stats"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" -v --log=stderr \
  --filter="$FILTER" --filter=log file "$img" logfile="$log" \
  fscache-dir="$cache" fscache-validate=size fscache-stats="$stats" \
  fscache-catchup=false 2>"$TMP/px.err"
uri="nbd+unix:///?socket=$TMP/px.sock"

# What writing the bytes beyond the fill queue takes on this disk: a
# client paced by the disk needs at least that.
disk_s=$(awk -v n=$((size - queue)) -v r=$rate 'BEGIN { printf "%.2f\n", n / r }')

# read_all URI: the whole export, 16 reads of 256 KiB in flight, each
# compared with the image (tests/stream-reader.py); prints the seconds
# the reads took, from the first request to the last reply (the
# connection's open, which writes the object's index on the slow disk,
# is not counted).
read_all ()
{
  "$PYTHON" "$top_srcdir/tests/stream-reader.py" "$1" "$img"
}

copy_s=$(read_all "$uri") || fail "first copy differs from the image"
echo "first copy: $copy_s s (the disk would need $disk_s s)"
awk -v c="$copy_s" -v d="$disk_s" 'BEGIN { exit !(c < d / 2) }' ||
  fail "the copy took $copy_s s: paced by the cache disk ($disk_s s)"
up1=$(log_read_bytes "$log")

# The stats file is written when a connection closes: the copy's are.
wait_until test -s "$stats" || fail "no stats file"
skipped=$(stat_value "$stats" fill_skipped_bytes)
nskips=$(stat_value "$stats" fill_skipped)
echo "fill_skipped $nskips, fill_skipped_bytes $skipped, upstream $up1"
[ "$skipped" -gt 0 ] && [ "$nskips" -gt 0 ] || fail "no skipped fills counted"
# The fill threads (core/ops/fill.c) kept more than one write in flight
# on the slow disk, whose queue was full: one thread's writes, one at a
# time, made the fill meter take that pace for the disk's.
depth=$(stat_value "$stats" fill_depth_max)
echo "fills written at once, at most: $depth"
[ "$depth" -ge 2 ] || fail "the fill threads wrote $depth fill(s) at once"
# Said once (at most once a minute), not once per skip.
notes=$(grep -c "cache disk is slower than the upstream" "$TMP/px.err" || true)
[ "$notes" -eq 1 ] || { cat "$TMP/px.err" >&2; fail "$notes notes of skipped fills"; }

# A clean stop finishes the queued fills and commits.
stop_nbdkit "$TMP/px.pid"
cp "$stats" "$TMP/first.stats"
stored=$(stat_value "$stats" fill_bytes)
up_stat=$(stat_value "$stats" upstream_read_bytes)
echo "stored $stored + skipped $skipped of $up_stat fetched"
[ $((stored + skipped)) -eq "$up_stat" ] ||
  fail "stored $stored + skipped $skipped != fetched $up_stat"
[ "$stored" -gt 0 ] || fail "nothing was cached at all"
cached=$(cached_bytes "$cache")
echo "cached after the clean stop: $cached"
tool stat --dir "$cache" --prometheus > "$TMP/prom"
grep -q "^nbd_fscache_fill_skipped_bytes_total{.*} $skipped\$" "$TMP/prom" ||
  { grep fill_skipped "$TMP/prom" >&2; fail "prometheus: fill_skipped_bytes"; }

# Again, on the same cache: identical, and what was cached is not read
# upstream again.
mv "$log" "$TMP/first.log"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" --filter=log file "$img" logfile="$log" \
  fscache-dir="$cache" fscache-validate=size fscache-stats="$stats" \
  fscache-catchup=false
read_all "$uri" >/dev/null || fail "second copy differs from the image"
up2=$(log_read_bytes "$log")
echo "second copy: $up2 bytes upstream ($cached were cached)"
[ "$up2" -le $((size - cached)) ] ||
  fail "second copy read $up2 bytes upstream, more than the $((size - cached)) not cached"
stop_nbdkit "$TMP/px.pid"

# A link only a little faster than the disk (issue 44): 6 MiB/s from
# the upstream (nbdkit's rate filter, so a remote upstream: each read
# takes milliseconds) against the disk's 4 MiB/s.  The fills are
# slower than the link, so the budget engages, but it admits fills at
# most of their own rate (core/ops/fill.c, LINK_DUTY_PCT), not 2% of
# it: at least half of what the client read is stored.  With the old
# share (2% whatever the link) 97% of a random read through a
# 1.6 Gbit/s link went unstored.
rm -rf "$cache"
rm -f "$stats"
# The budget's first burst (64 MiB) would hold the whole read: 1 MiB.
NBD_FSCACHE_TEST_BURST=$((1024 * 1024)) \
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" --filter=rate file "$img" rate=$((48 * 1024 * 1024)) \
  burstiness=0.1 fscache-dir="$cache" fscache-validate=size \
  fscache-stats="$stats" fscache-catchup=false fscache-readahead=0
"$PYTHON" - "$uri" "$img" <<'PY' || fail "link: a read differs from the image"
import nbd, random, sys
uri, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
blocks = list(range(0, len(data) // 2, 65536))
random.Random(44).shuffle(blocks)
bufs = []
for off in blocks:
    if h.pread(65536, off) != data[off:off + 65536]:
        sys.exit("read at %d differs" % off)
h.shutdown()
PY
stop_nbdkit "$TMP/px.pid"
fetched=$(stat_value "$stats" upstream_read_bytes)
stored=$(stat_value "$stats" fill_bytes)
skipped=$(stat_value "$stats" fill_skipped_bytes)
echo "link 6 MiB/s, disk 4 MiB/s: fetched $fetched, stored $stored," \
     "skipped $skipped"
[ "$stored" -ge $((fetched / 2)) ] ||
  fail "link: only $stored of $fetched bytes stored (the budget's share)"
