#!/usr/bin/env bash
# Writes through the fscache filter, in both write modes, keep the
# proxy's view identical to the upstream.
#
# Upstream: nbdkit file up.img (random data, 32 MiB + 1000 bytes, so
# the last 64K cache block is short).  Proxy: fscache in front of it
# via the nbd plugin.  For fscache-mode=writethrough and writearound:
#
#  1. qemu-io reads the ranges around each planned write (so the blocks
#     are cached), leaves some ranges unread (so they are not), then
#     writes patterns: unaligned inside a block, whole blocks (cached
#     and uncached), straddling 2 and many blocks (partial ends cached
#     or not), at the short end of the export; after each write a read
#     with -P checks the pattern, twice (the second read is a hit in
#     writethrough).  qemu-io exits non-zero on a pattern mismatch.
#  2. 4 python libnbd writers on 4 connections write overlapping,
#     unaligned ranges of one region with different patterns while
#     they also read (fills racing with writes) and flush.
#  3. Truth: the upstream file, read directly, equals the proxy's whole
#     view (nbdcopy --no-extents from the proxy), and again after a
#     proxy restart, where the reused cache must serve hits (so the
#     comparison really covers cached data).
#  4. Stats: writes invalidated cached blocks in both modes; only
#     writethrough stored written blocks.
#  5. The races behind 2., made deterministic: an upstream (nbdkit sh)
#     whose writes of data starting with byte 0xa1 announce themselves
#     (file "started") and then wait until the file "release" exists.
#     While such a write A of a cached block is held upstream, another
#     connection (a) reads the block (a miss, fetched from upstream,
#     still old), (b) writes it (B, not held) or (c) prefetches it with
#     NBD_CMD_CACHE.  Then A is released.
#     Afterwards the proxy must serve what the upstream holds: A's
#     data.  Both modes.  (No timing is involved: the test waits for
#     files, A waits for "release".)
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires qemu-io --version
requires nbdcopy --version
requires cmp --version
PY=python3                    # functions.sh: the one with libnbd
requires "$PY" -c 'import nbd'
requires test -f "$FILTER"

SIZE=$(( 32*1024*1024 + 1000 ))
BS=65536
M=$(( 1024*1024 ))

# Ranges [off, len, pattern] written by qemu-io (non-overlapping, so each
# can be checked by its pattern).  "c" = its blocks were read (cached)
# before the write, "u" = they were not.
WRITES=(
  "c 1000 3000 0x11"                                    # unaligned, in block 0
  "c $((1*BS)) $BS 0x22"                                # whole cached block 1
  "u $((16*M)) $BS 0x23"                                # whole uncached block
  "c $((3*BS - 5000)) 70000 0x33"                       # straddles blocks 2..4
  "c $((6*BS + 777)) $((5*BS + 1234)) 0x44"             # partial ends, 6..11
  "u $((20*M + 12345)) 100000 0x45"                     # uncached straddle
  "c $((24*M - 100)) 200 0x46"                          # tiny straddle
  "c $((SIZE - 700)) 700 0x55"                          # tail of the short end
  "c $((SIZE - 1000 - 3*BS + 10)) $((3*BS - 500)) 0x66" # up to near the end
  "u $((28*M)) $((2*BS)) 0x67"                          # two whole uncached
)

uri () { echo "nbd+unix:///?socket=$1"; }

cat > "$TMP/writer.py" <<'EOF'
# Concurrent writer: overlapping unaligned writes with its own pattern,
# interleaved with reads (fills) and flushes.
import nbd, random, sys
sock, wid, lo, hi, nops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
rnd = random.Random(1000 + wid)
h = nbd.NBD()
h.connect_unix(sock)
pat = bytes([0xa0 + wid])
for i in range(nops):
    off = rnd.randrange(lo, hi - 1)
    n = min(rnd.randrange(1, 200000), hi - off)
    r = rnd.random()
    if r < 0.55:
        h.pwrite(pat * n, off)
    elif r < 0.95:
        h.pread(n, off)
    else:
        h.flush()
h.flush()
h.shutdown()
EOF

run_mode ()
{
  local mode="$1"
  local d="$TMP/$mode"
  mkdir -p "$d"
  make_random "$d/up.img" $SIZE

  start_nbdkit -P "$d/up.pid" -U "$d/up.sock" file "$d/up.img"
  local pxargs=(-P "$d/px.pid" -U "$d/px.sock" --log=stderr
                --filter="$FILTER" nbd socket="$d/up.sock"
                fscache-dir="$d/cache" fscache-mode="$mode"
                fscache-stats="$d/stats")
  start_nbdkit "${pxargs[@]}" 2>>"$d/px.err"

  # 1. qemu-io: read (cache) the blocks around the "c" writes, then
  # write, then read back twice with the pattern checked.
  local cmds=() w kind off len pat b0 b1
  for w in "${WRITES[@]}"; do
    read -r kind off len pat <<<"$w"
    if [ "$kind" = c ]; then
      b0=$(( off / BS * BS ))
      b1=$(( (off + len + BS - 1) / BS * BS ))
      [ $b1 -gt $SIZE ] && b1=$SIZE
      cmds+=(-c "read $b0 $((b1 - b0))")
    fi
  done
  for w in "${WRITES[@]}"; do
    read -r kind off len pat <<<"$w"
    cmds+=(-c "write -P $pat $off $len"
           -c "read -P $pat $off $len"
           -c "read -P $pat $off $len")
  done
  if ! qemu-io -f raw "$(uri "$d/px.sock")" "${cmds[@]}" > "$d/qemu-io.out"; then
    cat "$d/qemu-io.out"
    echo "$0: $mode: qemu-io writes/reads through the proxy failed"
    exit 1
  fi
  if grep -qi "fail" "$d/qemu-io.out"; then
    cat "$d/qemu-io.out"
    echo "$0: $mode: qemu-io reported a failure"
    exit 1
  fi
  # Neighbouring bytes of the unaligned writes must be the old ones: a
  # whole-file comparison with the upstream now already catches this.
  nbdcopy --no-extents "$(uri "$d/px.sock")" "$d/view1.img"
  if ! cmp "$d/up.img" "$d/view1.img"; then
    echo "$0: $mode: proxy view differs from upstream after qemu-io writes"
    exit 1
  fi

  # 2. Four concurrent writers on four connections, overlapping ranges
  # of [2 MiB, 6 MiB), which is cached first.
  qemu-io -f raw "$(uri "$d/px.sock")" -c "read $((2*M)) $((4*M))" >/dev/null
  local pids=() i
  for i in 0 1 2 3; do
    "$PY" "$TMP/writer.py" "$d/px.sock" $i $((2*M)) $((6*M)) 150 &
    pids+=($!)
    cleanup_fn "kill $! 2>/dev/null"
  done
  local fail=0
  for i in "${pids[@]}"; do wait "$i" || fail=1; done
  if [ $fail -ne 0 ]; then
    echo "$0: $mode: a concurrent writer failed"
    exit 1
  fi

  # 3. Truth: the upstream file against the proxy's whole view.
  nbdcopy --no-extents "$(uri "$d/px.sock")" "$d/view2.img"
  if ! cmp "$d/up.img" "$d/view2.img"; then
    echo "$0: $mode: proxy view differs from upstream after concurrent writes"
    cmp -l "$d/up.img" "$d/view2.img" | head -5 || true
    exit 1
  fi

  stop_nbdkit "$d/px.pid"
  local inval stored
  inval=$(stat_value "$d/stats" invalidated_blocks)
  stored=$(stat_value "$d/stats" stored_blocks)
  echo "$mode: invalidated_blocks=$inval stored_blocks=$stored"
  if [ "$inval" -eq 0 ]; then
    echo "$0: $mode: writes over cached blocks invalidated nothing"
    exit 1
  fi
  if [ $mode = writethrough ] && [ "$stored" -eq 0 ]; then
    echo "$0: writethrough stored no written block"
    exit 1
  fi
  if [ $mode = writearound ] && [ "$stored" -ne 0 ]; then
    echo "$0: writearound stored written blocks"
    exit 1
  fi

  # Restart: the cache is reused (hits) and still agrees with upstream.
  rm -f "$d/stats"
  start_nbdkit "${pxargs[@]}" 2>>"$d/px.err"
  nbdcopy --no-extents "$(uri "$d/px.sock")" "$d/view3.img"
  if ! cmp "$d/up.img" "$d/view3.img"; then
    echo "$0: $mode: proxy view differs from upstream after restart"
    cmp -l "$d/up.img" "$d/view3.img" | head -5 || true
    exit 1
  fi
  stop_nbdkit "$d/px.pid"
  local hits
  hits=$(stat_value "$d/stats" hit_bytes)
  echo "$mode: after restart hit_bytes=$hits"
  if [ "$hits" -eq 0 ]; then
    cat "$d/px.err"
    echo "$0: $mode: the cache was not reused after a clean restart"
    exit 1
  fi
  stop_nbdkit "$d/up.pid"
}

cat > "$TMP/gated.sh" <<'GATED'
#!/usr/bin/env bash
# nbdkit sh plugin: the file $GATE_DIR/up.img; a write whose data starts
# with 0xa1 creates $GATE_DIR/started, then waits for $GATE_DIR/release.
f="$GATE_DIR/up.img"
case "$1" in
  thread_model) echo parallel ;;
  get_size) stat -L -c %s "$f" ;;
  can_write|can_flush|flush) exit 0 ;;
  pread) dd if="$f" skip="$4" count="$3" iflag=skip_bytes,count_bytes status=none ;;
  pwrite)
    tmp="$(mktemp "$GATE_DIR/w.XXXXXX")"
    cat > "$tmp"
    if [ "$(head -c1 "$tmp" | od -An -tx1 | tr -d ' ')" = a1 ]; then
      touch "$GATE_DIR/started"
      while [ ! -e "$GATE_DIR/release" ]; do sleep 0.01; done
    fi
    dd if="$tmp" of="$f" seek="$4" oflag=seek_bytes conv=notrunc status=none
    rm -f "$tmp" ;;
  *) exit 2 ;;
esac
GATED
chmod +x "$TMP/gated.sh"

cat > "$TMP/race.py" <<'EOF'
# One race per block: A (0xa1, held upstream) against a read or a write
# from a second connection.  Prints one line per case; exit 1 if stale.
import nbd, os, sys
sock, gdir, mode = sys.argv[1:4]
BS = 65536
h1 = nbd.NBD(); h1.connect_unix(sock)
h2 = nbd.NBD(); h2.connect_unix(sock)
def wait_for(path):
    for _ in range(3000):
        if os.path.exists(path):
            return
        h1.poll(10)             # keep A moving while we wait
    sys.exit("timed out waiting for " + path)
bad = 0
for blk, other in ((0, "read"), (1, "write"), (2, "cache")):
    off = blk * BS
    for f in ("started", "release"):
        if os.path.exists(os.path.join(gdir, f)):
            os.unlink(os.path.join(gdir, f))
    h2.pread(BS, off)                               # cached, old data
    c = h1.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"\xa1" * BS)), off)
    wait_for(os.path.join(gdir, "started"))         # A is upstream, held
    if other == "read":
        h2.pread(BS, off)                           # a miss during A
    elif other == "cache":
        h2.cache(BS, off)                           # a prefetch during A
    else:
        h2.pwrite(b"\xa2" * BS, off)                # B overtakes A
    open(os.path.join(gdir, "release"), "w").close()
    while not h1.aio_command_completed(c):
        h1.poll(-1)
    with open(os.path.join(gdir, "up.img"), "rb") as f:
        f.seek(off)
        up = f.read(BS)
    px = h2.pread(BS, off)
    ok = up == px
    print("%s: %s during a held write: upstream has 0x%02x, proxy serves 0x%02x: %s"
          % (mode, other, up[0], px[0], "ok" if ok else "STALE"))
    bad += not ok
sys.exit(1 if bad else 0)
EOF

run_race ()
{
  local mode="$1"
  local d="$TMP/race-$mode"
  mkdir -p "$d"
  head -c $((4*BS)) /dev/zero > "$d/up.img"
  GATE_DIR="$d" start_nbdkit -P "$d/up.pid" -U "$d/up.sock" sh "$TMP/gated.sh"
  start_nbdkit -P "$d/px.pid" -U "$d/px.sock" --filter="$FILTER" \
    nbd socket="$d/up.sock" fscache-dir="$d/cache" fscache-mode=$mode
  "$PY" "$TMP/race.py" "$d/px.sock" "$d" $mode || race_failed=1
  stop_nbdkit "$d/px.pid"
  stop_nbdkit "$d/up.pid"
}

race_failed=0
run_race writethrough
run_race writearound
run_mode writethrough
run_mode writearound
if [ $race_failed -ne 0 ]; then
  echo "$0: FAIL: the cache kept data older than the upstream's after a race"
  exit 1
fi
echo "$0: OK"
