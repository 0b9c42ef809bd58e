#!/usr/bin/env bash
# nbd-fscache: big fills bypass the page cache (core/disk/data.c).
#
# 1. A cold copy in 1 MiB requests fills the cache with writes of
#    1 MiB, which go through the data file's O_DIRECT descriptor: the
#    page cache then holds (almost) none of the data file (fincore, the
#    kernel's own count), where buffered fills leave every page of it
#    there.  Readahead off and one connection, so that every read is a
#    miss: a hit would read the data file through the page cache (and
#    the kernel's readahead of it, more), which a fresh clone's run
#    under load saw as 17 MB cached.  The data is right: a second copy through a new proxy reads
#    nothing upstream and cmp's equal to the image, and nbd-fscache
#    check verifies every block's checksum.
# 2. A file system that refuses a direct write (EINVAL, injected with
#    NBD_FSCACHE_FAULTS on the first data write) costs nothing: the
#    write is made buffered, the object stays cached (a second copy
#    reads nothing upstream), and its later fills are buffered (the
#    data file's pages are in the page cache after the cold copy).
# 3. Fills of single 64 KiB blocks (the default block size)
#    of random reads are direct too: written by several fill threads
#    at once (core/ops/fill.c), they need not wait on the disk one by
#    one.
#
# Each proxy stays until its cache holds the whole image (nbd-fscache
# stat), so that what a slow cache disk had skipped is made up by the
# catch-up first (settle, below).
#
# Truth: the image (cmp), the upstream's request log (log filter), the
# kernel's page cache residency (fincore, util-linux).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires fincore --version
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

size=$((64 * 1024 * 1024))
make_random "$TMP/img" "$size"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/img" logfile="$TMP/up.log"

# proxy NAME CACHE: a proxy of the upstream on $TMP/NAME.sock, its
# messages in $TMP/NAME.err (in the foreground of a disowned job: a
# daemonised nbdkit points its stderr at /dev/null).
proxy ()
{
  NBDKIT_STDERR="$TMP/$1.err" start_nbdkit -P "$TMP/$1.pid" \
    -U "$TMP/$1.sock" --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/$2" fscache-validate=size fscache-readahead=0
}
copy ()
{
  rm -f "$TMP/out"
  nbdcopy --connections=1 --request-size=1048576 \
    "nbd+unix:///?socket=$TMP/$1.sock" "$TMP/out"
  cmp "$TMP/img" "$TMP/out" || fail "$2: the copy differs from the image"
}
# resident CACHE: bytes of the object's data file in the page cache.
resident ()
{
  local f
  f=$(find "$TMP/$1" -name '*.data')
  [ -n "$f" ] || fail "no data file in $TMP/$1"
  fincore --bytes --noheadings --output=RES "$f" | tr -d ' '
}

# warm_and_checked NAME CACHE PART: a new proxy's copy reads nothing
# upstream (the object kept all it filled), and nbd-fscache check
# verifies every block.
warm_and_checked ()
{
  local b0 b1
  b0=$(log_read_bytes "$TMP/up.log")
  proxy "$1" "$2"
  copy "$1" "$3, warm"
  stop_nbdkit "$TMP/$1.pid"
  b1=$(log_read_bytes "$TMP/up.log")
  [ "$b1" -eq "$b0" ] ||
    fail "$3: the warm copy read $((b1 - b0)) bytes upstream (the object withdrawn?)"
  tool check --dir "$TMP/$2" > "$TMP/$2.check" 2>&1 ||
    { cat "$TMP/$2.check" >&2; fail "$3: nbd-fscache check found problems"; }
}

# settle CACHE PART: wait until the cache holds the whole image.  On a
# cache disk slower than the upstream (another job's writes on it, as
# in CI) a fill the disk cannot take when asked is skipped and noted
# for the catch-up (fill_skipped_bytes, catchup_noted_bytes), which
# makes it up once the client has gone quiet: stopping the proxy at
# once left 8 to 31 MB of it to the warm copy (4 runs in 8 beside a
# random writer).
cached_all () { [ "$(cached_bytes "$TMP/$1")" -ge "$size" ]; }
settle ()
{
  wait_until cached_all "$1" ||
    fail "$2: only $(cached_bytes "$TMP/$1") of $size bytes cached after the wait"
}

# direct_and_checked NAME CACHE PART WHAT: proxy NAME stopped after WHAT,
# its fills left (almost) none of the data file in the page cache, and
# warm_and_checked.
direct_and_checked ()
{
  local res
  settle "$2" "$3"
  stop_nbdkit "$TMP/$1.pid"
  res=$(resident "$2")
  echo "$3: after $4, $res bytes of the $size-byte data file are in the page cache"
  [ "$res" -le $((size / 16)) ] ||
    fail "$3: $res bytes of the data file in the page cache: the fills were buffered"
  warm_and_checked "$1" "$2" "$3"
}

# ---- 1. Direct fills. ----
proxy p1 c1
copy p1 "part 1, cold"
direct_and_checked p1 c1 "part 1" "the cold copy"

# ---- 2. A direct write refused. ----
NBD_FSCACHE_FAULTS=write:data:1:EINVAL proxy p2 c2
copy p2 "part 2, cold"
settle c2 "part 2"
stop_nbdkit "$TMP/p2.pid"
res=$(resident c2)
echo "part 2: after the cold copy, $res bytes of the data file are in the page cache"
[ "$res" -ge $((size * 3 / 4)) ] ||
  fail "part 2: only $res bytes in the page cache: fills went on direct after EINVAL"
warm_and_checked p2 c2 "part 2"

# ---- 3. Single 64 KiB blocks, in random order, are direct too. ----
proxy p3 c3
"$PYTHON" - "$TMP/p3.sock" "$TMP/img" <<'PY' || fail "part 3: a random read differs"
import nbd, random, sys
sock, img = sys.argv[1], sys.argv[2]
data = open(img, "rb").read()
blocks = list(range(0, len(data), 65536))
random.Random(58).shuffle(blocks)
h = nbd.NBD()
h.connect_unix(sock)
for off in blocks:
    if h.pread(65536, off) != data[off:off + 65536]:
        sys.exit("read at %d differs" % off)
h.shutdown()
PY
direct_and_checked p3 c3 "part 3" "random 64 KiB reads"
echo "$0: PASS"
