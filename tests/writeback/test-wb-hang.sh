#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: a read of cached or dirty data
# never waits for a miss hanging upstream (rule 11, core/wlog/wlog.c).
#
# The upstream is an nbdkit sh plugin (written below) over an image
# whose reads from 2 MiB on block on a FIFO until the test opens it, so
# the miss hangs for exactly as long as the test wants.
#
#  1. 64 KiB at 0 are read through the proxy (now cached).
#  2. A client reads 4 KiB at 3 MiB: the plugin says it has the read
#     (a file), then blocks.
#  3. Another client writes 4 KiB at 64 KiB and flushes; the writer
#     writes it back (the plugin's flush is seen) and retires it: the
#     log is empty again (nbd-fscache stat: dirty_bytes 0).  The retire
#     takes the log's punch lock for writing.
#  4. 200 reads of the cached block and of the written one must all
#     return (within 20 s, while the miss still hangs: its client is
#     still waiting afterwards) with the right bytes.
#  5. The FIFO is opened: the hanging read returns the image's bytes.
#
# Before rule 11 the hanging read held the punch lock (for reading)
# across its miss, the retire waited for it, and every later read
# waited behind the retire (the lock prefers writers): step 4 timed out.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit sh --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'
requires timeout --version
requires mkfifo --version

size=$((4 * 1024 * 1024))
make_random "$TMP/up.img" $size
cp "$TMP/up.img" "$TMP/orig.img"
mkfifo "$TMP/fifo"
cat > "$TMP/hang.sh" <<'SH'
#!/usr/bin/env bash
img="$HANG_DIR/up.img"
case "$1" in
  thread_model) echo parallel ;;
  get_size) stat -L -c %s "$img" ;;
  can_write|can_flush) exit 0 ;;
  pread)
    if [ "$4" -ge $((2 * 1024 * 1024)) ]; then
      : > "$HANG_DIR/reached"
      cat "$HANG_DIR/fifo" > /dev/null
    fi
    dd if="$img" bs=64K skip="$4" count="$3" \
       iflag=skip_bytes,count_bytes status=none ;;
  pwrite)
    dd of="$img" bs=64K seek="$4" count="$3" conv=notrunc \
       iflag=count_bytes,fullblock oflag=seek_bytes status=none ;;
  flush)
    sync "$img"; : > "$HANG_DIR/flushed" ;;
  *) exit 2 ;;
esac
SH
chmod +x "$TMP/hang.sh"
# Whatever happens, the hanging read is released at exit.
cleanup_fn "exec 7<>'$TMP/fifo'; exec 7>&-"

HANG_DIR="$TMP" start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  sh "$TMP/hang.sh"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache" fscache-key=hang fscache-mode=writeback \
  fscache-readahead=0 fscache-validate=size
uri="nbd+unix:///?socket=$TMP/px.sock"

# 1. Cached.
$PYTHON - "$uri" "$TMP/orig.img" <<'PY' || fail "step 1: the first read"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.pread(65536, 0) == open(sys.argv[2], "rb").read(65536)
h.shutdown()
PY

# 2. The miss that hangs.
$PYTHON - "$uri" "$TMP/orig.img" "$TMP/hung.done" <<'PY' &
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
off = 3 * 1024 * 1024
got = h.pread(4096, off)
f = open(sys.argv[2], "rb"); f.seek(off)
open(sys.argv[3], "w").write("ok" if got == f.read(4096) else "wrong")
PY
hung=$!
cleanup_fn "kill $hung 2>/dev/null"
wait_until test -e "$TMP/reached" || fail "step 2: the miss never reached the upstream"

# 3. A write, written back and retired while the miss hangs.
head -c 4096 /dev/urandom > "$TMP/w.bin"
dd if="$TMP/w.bin" of="$TMP/orig.img" bs=4096 seek=16 conv=notrunc \
   status=none
$PYTHON - "$uri" "$TMP/w.bin" <<'PY' || fail "step 3: the write"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(open(sys.argv[2], "rb").read(), 65536)
h.flush()
h.shutdown()
PY
wait_until test -e "$TMP/flushed" || fail "step 3: nothing written back"
dirty () { [ "$(tool stat --dir "$TMP/cache" | stat_value /dev/stdin dirty_bytes)" = 0 ]; }
wait_until dirty || fail "step 3: the log did not empty"

# 4. Cached and written data, while the miss hangs.
timeout 20 $PYTHON - "$uri" "$TMP/orig.img" <<'PY' ||
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
want = open(sys.argv[2], "rb").read(2 * 65536)
for i in range(100):
    assert h.pread(65536, 0) == want[:65536], "cached block wrong"
    assert h.pread(4096, 65536) == want[65536:65536 + 4096], "write wrong"
h.shutdown()
PY
  fail "step 4: reads of cached data waited for the hanging miss"
[ ! -e "$TMP/hung.done" ] || fail "step 4: the miss was not hanging any more"
kill -0 $hung || fail "step 4: the hanging client is gone"

# 5. Release the miss.
exec 7<>"$TMP/fifo"; exec 7>&-
wait $hung || fail "step 5: the hanging read failed"
[ "$(cat "$TMP/hung.done")" = ok ] || fail "step 5: the released read is wrong"
echo "$0: PASS"
