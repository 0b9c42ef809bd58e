#!/usr/bin/env bash
# nbd-fscache: the filter never breaks its upstream's thread model.
#
# The upstream is tests/serial-plugin.sh, an nbdkit sh plugin that
# declares serialize_requests (like Debian 12's curl and ssh plugins)
# or serialize_all_requests (the sh plugin's default) and records any
# call that overlaps another one its model forbids.  Through the
# filter with its default settings (readahead on), several clients at
# once run the whole workload: parallel nbdcopy, sequential small reads
# (readahead), NBD_CMD_CACHE, qemu-img compare, writes, trims, zeroes
# and flushes, then a restart.
#
# Truth: the plugin's overlap log must stay empty, every client must
# succeed, and every byte read must equal the upstream image (cmp, and
# the python clients compare each read with the file).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdinfo --version
requires flock --version
requires nbdkit sh --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'

plugin="$top_srcdir/tests/serial-plugin.sh"
size=$((12 * 1024 * 1024 + 4096 * 3))

# The python client: MODE is seqread (64 KiB reads from start to end,
# which starts readahead), cache (NBD_CMD_CACHE of everything, then
# reads) or write (random writes, trims, zeroes and flushes, each read
# back).  It checks every read against the image file, which is the
# plugin's backing store and so the upstream's truth.  Each client
# works in [LO, HI) (thirds of the export: "0/3" is the first third, "-"
# everything), so writers never race each other's checks.
cat > "$TMP/client.py" <<'EOF'
import os, random, sys
import nbd
uri, img, mode, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
lo, hi = 0, size
if len(sys.argv) > 5 and sys.argv[5] != "-":
    i, n = map(int, sys.argv[5].split("/"))
    lo, hi = size * i // n, size * (i + 1) // n
rnd = random.Random(seed)
def check(off, n):
    got = h.pread(n, off)
    with open(img, "rb") as f:
        f.seek(off)
        want = f.read(n)
    if got != want:
        sys.exit("%s: read at %d+%d differs from the upstream image"
                 % (mode, off, n))
if mode == "seqread":
    off = lo
    while off < hi:
        n = min(65536, hi - off)
        check(off, n)
        off += n
elif mode == "cache":
    off = 0
    while off < size:
        n = min(1 << 20, size - off)
        h.cache(n, off)
        off += n
    for _ in range(200):
        n = rnd.randrange(1, 200000)
        off = rnd.randrange(0, size - n)
        check(off, n)
elif mode == "write":
    for i in range(60):
        n = rnd.randrange(1, 100000)
        off = rnd.randrange(lo, hi - n)
        op = rnd.randrange(10)
        if op < 6:
            h.pwrite(os.urandom(n), off)
        elif op == 6:
            h.trim(n, off)
        elif op == 7:
            h.zero(n, off)
        else:
            h.flush()
        h.flush()
        a = max(lo, off - 70000)
        b = min(hi, off + n + 70000)
        check(a, b - a)
h.shutdown()
EOF

# check_overlaps WHAT: the plugin saw no forbidden overlap.
check_overlaps ()
{
  if [ -s "$TMP/sp/overlaps" ]; then
    echo "$0: overlapping upstream calls ($1):" >&2
    head -20 "$TMP/sp/overlaps" >&2
    fail "$1: $(wc -l < "$TMP/sp/overlaps") upstream calls overlapped" \
         "another one that the plugin's thread model forbids"
  fi
}

# run_all CMD...: run commands in parallel, fail if any failed.
run_all ()
{
  local pids=() c st=0
  for c in "$@"; do
    bash -c "$c" &
    pids+=($!)
  done
  for c in "${pids[@]}"; do
    wait "$c" || st=1
  done
  return $st
}

start_proxy ()
{
  SERIAL_IMG="$TMP/upstream.img" SERIAL_DIR="$TMP/sp" SERIAL_MODEL="$model" \
    start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" sh "$plugin" \
    fscache-dir="$TMP/cache-$model" fscache-key=serial "$@"
}

for model in serialize_requests serialize_all_requests; do
  echo "== thread model $model"
  rm -rf "$TMP/sp"; mkdir "$TMP/sp"
  make_random "$TMP/upstream.img" "$size"
  start_proxy
  uri="nbd+unix:///?socket=$TMP/px.sock"
  py="$PYTHON $TMP/client.py '$uri' '$TMP/upstream.img'"

  # Reads: 4-connection copy, a sequential reader, a CACHE client, a
  # second sequential reader and connections opening and closing (the
  # plugin's open, get_size, can_* and close), all at once; then a
  # qemu-img compare.
  if ! run_all \
      "nbdcopy --connections=4 '$uri' '$TMP/copy1.img'" \
      "$py seqread 1" \
      "$py cache 2" \
      "$py seqread 3" \
      "for i in \$(seq 12); do nbdinfo --size '$uri' >/dev/null || exit 1; done"; then
    check_overlaps "$model, reads"
    fail "$model: a client failed during the parallel reads"
  fi
  check_overlaps "$model, reads"
  cmp "$TMP/upstream.img" "$TMP/copy1.img" ||
    fail "$model: nbdcopy --connections=4 copy differs from the upstream"
  if command -v qemu-img >/dev/null; then
    qemu-img compare -f raw -F raw "$TMP/upstream.img" "$uri" ||
      fail "$model: qemu-img compare found a difference"
  fi
  reads=$(grep -c '^pread' "$TMP/sp/calls" || true)
  echo "reads: ok, $reads upstream preads, no overlap"

  # Writes beside reads and readahead: two writers and a sequential
  # reader, each in its own third of the export.
  if ! run_all "$py write 4 0/3" "$py write 5 1/3" "$py seqread 6 2/3"; then
    check_overlaps "$model, writes"
    fail "$model: a client failed during the writes"
  fi
  check_overlaps "$model, writes"
  nbdcopy "$uri" "$TMP/copy2.img"
  cmp "$TMP/upstream.img" "$TMP/copy2.img" ||
    fail "$model: after the writes the proxy's data differs from upstream"
  echo "writes: ok, $(grep -c '^pwrite' "$TMP/sp/calls" || true) upstream pwrites"

  # After a restart: the cache is reused, still identical, no overlap.
  stop_nbdkit "$TMP/px.pid"
  start_proxy
  run_all "nbdcopy --connections=4 '$uri' '$TMP/copy3.img'" "$py seqread 7" ||
    { check_overlaps "$model, restart"; fail "$model: a client failed after restart"; }
  check_overlaps "$model, restart"
  cmp "$TMP/upstream.img" "$TMP/copy3.img" ||
    fail "$model: after a restart the data differs from upstream"
  stop_nbdkit "$TMP/px.pid"
  echo "restart: ok"
done

echo "$0: OK"
