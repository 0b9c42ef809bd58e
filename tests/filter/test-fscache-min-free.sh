#!/usr/bin/env bash
# nbd-fscache: the free space floor (fscache-min-free) and the stop
# mark (DIR/fscache.stop).
#
# The cache directory is on a 64 MiB tmpfs.  Part of an export is
# cached first; then a ballast file leaves the filesystem below the
# floor (fscache-min-free=25%).  From then on:
#   - reads are identical to the image, misses come from upstream
#     (the upstream log shows every byte of each cold read, each time:
#     nothing new is cached), and the object does not grow (du);
#   - hits of what was cached before keep working (0 bytes upstream);
#   - removing the ballast lets caching resume (a read is then warm).
# The same with the stop mark instead of the ballast; and with it,
# readahead on, a sequential read costs the upstream the image once
# (no prefetch read only to be dropped).
#
# Truth: cmp against the image, the upstream's log, du of the object.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'

mount_tmpfs "$TMP/mnt" 64m

size=$((16 * 1024 * 1024))
half=$((size / 4))              # the second quarter: the one measured
img="$TMP/upstream.img"
log="$TMP/up.log"
make_random "$img" "$size"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$img" logfile="$log"
uri="nbd+unix:///?socket=$TMP/px.sock"
cache="$TMP/mnt/cache"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" fscache-dir="$cache" \
  fscache-key=floor fscache-validate=size fscache-readahead=0 \
  fscache-min-free=25% fscache-stats="$TMP/px.stats"

object_du () { du -B1 -s "$cache/objects" | cut -f1; }
up_bytes () { log_read_bytes "$log"; }

# read_range OFF LEN: read through the proxy, compare with the image.
read_range ()
{
  $PYTHON - "$uri" "$img" "$1" "$2" <<'EOF'
import sys, nbd
uri, img, off, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD(); h.connect_uri(uri)
with open(img, "rb") as f:
    f.seek(off)
    want = f.read(n)
got = bytearray()
for o in range(off, off + n, 1 << 20):
    got += h.pread(min(1 << 20, off + n - o), o)
if bytes(got) != want:
    sys.exit("read %d+%d: wrong data" % (off, n))
EOF
}

# The first quarter is cached while there is room.
read_range 0 "$half" || fail "first read"
read_range 0 "$half" || fail "warm read"
b=$(up_bytes)
read_range 0 "$half" || fail "warm read"
[ "$(up_bytes)" -eq "$b" ] || fail "the first quarter was not cached"

# checks WHAT: below the floor (or stopped), nothing new is cached.
checks ()
{
  local du0 b0 b1 b2
  # The floor is looked at every 500 ms at most, by a fill: poke with
  # reads of single blocks of the last quarter, each read twice, until
  # the second read of one also goes upstream (not cached any more).
  poke_k=$(( ${poke_k:-0} ))
  noticed ()
  {
    local off=$(( 3 * size / 4 + poke_k * 65536 )) a b
    poke_k=$((poke_k + 1))
    [ "$off" -lt "$size" ] || return 2
    read_range "$off" 65536 || return 2
    a=$(up_bytes)
    read_range "$off" 65536 || return 2
    b=$(up_bytes)
    [ "$b" -gt "$a" ]
  }
  wait_until noticed || fail "$1: blocks kept being cached"
  du0=$(object_du)
  b0=$(up_bytes)
  read_range "$half" "$half" || fail "$1: cold read: wrong data"
  b1=$(up_bytes)
  [ $((b1 - b0)) -eq "$half" ] ||
    fail "$1: a cold read cost $((b1 - b0)) bytes upstream, expected $half"
  read_range 0 "$half" || fail "$1: hit: wrong data"
  b2=$(up_bytes)
  [ "$b2" -eq "$b1" ] ||
    fail "$1: hits of cached blocks cost $((b2 - b1)) bytes upstream"
  [ "$(object_du)" -le "$du0" ] || fail "$1: the object grew"
  echo "$1: misses from upstream ($half bytes each read), hits still hit," \
       "du $(object_du)"
}

# resumes WHAT: caching works again.
resumes ()
{
  cached_again ()
  {
    local a
    read_range "$half" "$half" || return 2
    a=$(up_bytes)
    read_range "$half" "$half" || return 2
    [ "$(up_bytes)" -eq "$a" ]
  }
  wait_until cached_again || fail "$1: caching did not resume"
  echo "$1: caching resumed"
}

# ---- below fscache-min-free ---------------------------------------------
avail=$(df -B1 --output=avail "$TMP/mnt" | tail -1)
total=$(df -B1 --output=size "$TMP/mnt" | tail -1)
# Leave 15% free: under the 25% floor.
ballast=$(( avail - total * 15 / 100 ))
head -c "$ballast" /dev/zero > "$TMP/mnt/ballast"
checks "below the floor"
rm "$TMP/mnt/ballast"
resumes "above the floor"

# ---- the stop mark ---------------------------------------------------------
# Start from a cold cache: restart with the mark in place.
stop_nbdkit "$TMP/px.pid"
rm -rf "$cache/objects"
touch "$cache/fscache.stop"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" fscache-dir="$cache" \
  fscache-key=floor fscache-validate=size fscache-readahead=0 \
  fscache-min-free=0% fscache-stats="$TMP/px.stats"
b=$(up_bytes)
read_range 0 "$half" || fail "stop mark: read"
read_range 0 "$half" || fail "stop mark: read"
[ $(( $(up_bytes) - b )) -eq $((2 * half)) ] ||
  fail "stop mark: reads were cached although fscache.stop exists"
echo "stop mark: nothing cached while it exists"
# Small sequential reads of blocks not cached: each costs the upstream
# its own bytes.  Claimed as misses, they fetched whole 64 KiB blocks
# (a sequential read's rule) only for the fill to drop them, and then
# again for the next 4 KiB: 17 MiB upstream for 2 MiB read (stop 57).
b=$(up_bytes)
$PYTHON - "$uri" "$img" "$half" <<'EOF' || fail "stop mark: 4 KiB reads"
import sys, nbd
uri, img, off = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nbd.NBD(); h.connect_uri(uri)
want = open(img, "rb").read()[off:off + (1 << 20)]
got = b"".join(h.pread(4096, off + o) for o in range(0, 1 << 20, 4096))
if got != want:
    sys.exit("wrong data")
EOF
sr=$(( $(up_bytes) - b ))
echo "stop mark: 1 MiB read in 4 KiB requests cost $sr bytes upstream"
[ "$sr" -eq $((1 << 20)) ] ||
  fail "stop mark: 1 MiB read in 4 KiB requests cost $sr bytes upstream"
# Readahead on (the default, 4M): a sequential read costs the upstream
# the image once.  Readahead's prefetches, which cannot be stored,
# used to read ahead only to drop the bytes, which the stream then read
# again.
stop_nbdkit "$TMP/px.pid"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" fscache-dir="$cache" \
  fscache-key=floor fscache-validate=size \
  fscache-min-free=0% fscache-stats="$TMP/px.stats"
b=$(up_bytes)
read_range 0 "$size" || fail "stop mark, readahead: read"
ra=$(( $(up_bytes) - b ))
echo "stop mark, readahead on: a sequential read of $size bytes read $ra upstream"
[ "$ra" -eq "$size" ] ||
  fail "stop mark, readahead on: $ra bytes upstream for a $size-byte read"
rm "$cache/fscache.stop"
resumes "stop mark removed"
stop_nbdkit "$TMP/px.pid"
grep -E '^lowspace' "$TMP/px.stats"
[ "$(stat_value "$TMP/px.stats" lowspace_skips)" -gt 0 ] ||
  fail "lowspace_skips is 0"
echo "$0: OK"
