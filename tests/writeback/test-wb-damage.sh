#!/usr/bin/env bash
# A damaged write log is never a shorter log (Rule 7 atop core/wlog/wlog.c):
# damage before a durable point refuses the export, is shown by the
# tools, survives invalidate without --force and the culling daemon,
# and a salvage writes back exactly the intact records before it; a
# damaged record after the last flush marker is a torn tail, dropped
# without a word.
#
# Three writeback proxies (keys wb1, wb2, wb3), each before its own
# upstream (nbdkit file, a 4 MiB random image).  A client connects,
# then the upstream is killed (-9), so that nothing is written back;
# the client writes 20 distinct 4 KiB blocks with a flush after every
# 5 (wb3: then 2 more, not flushed), and keeps its own model of the
# export after 2 and after 20 writes: the truth.  Then the proxy is
# killed (-9) and the header of one record is overwritten on disk
# (found by walking the log's records, docs/format.md "Write log"):
#
#  wb1: the 3rd record (a write of epoch 1, a marker after it).
#    - A proxy (the upstream back) refuses the export: the error names
#      the log file, the record (3, its byte offset) and the way out.
#    - ls says "damaged" (state and DIRTY column); stat says write_log
#      damaged and where; check reports it as a problem (exit 1).
#    - invalidate without --force refuses (exit 1) and leaves every
#      file; writeback without --salvage refuses, saying what is lost.
#    - writeback --salvage reports record 3 and the 17 intact writes
#      after it as lost, writes back the 2 intact ones: the upstream
#      then equals the model after 2 writes (cmp); the log is gone, and
#      a proxy opens the export again and serves that image.
#  wb2: the 1st record (so that the damage leaves no intact record).
#    - nbd-fscached with max-size 4K and every file a day old never
#      culls it: it counts it as dirty, and its files are all there;
#      it logs that 2 objects (wb1, wb2) have a damaged write log.
#    - a proxy in fscache-mode=writethrough refuses it as damaged.
#  wb3: the first record after the last marker (write 21, unflushed).
#    - A torn tail: a proxy opens the export without an error, and
#      serves (then writes back) the model after 20 writes.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$TOOL"
requires test -x "$DAEMON"
requires nbdkit --version
requires nbdkit --filter="$FILTER" null --dump-plugin
requires nbdcopy --version
requires "$PYTHON" -c "import nbd"
requires cmp --version

SIZE=$((4 * 1024 * 1024))
cache="$TMP/cache"
uri () { echo "nbd+unix:///?socket=$TMP/$1.sock"; }

# While NBDKIT_STDERR names a file, nbdkit runs in the foreground (-f)
# as a background job with its stderr there (the proxies' messages).
NBDKIT_STDERR=
nbdkit ()
{
  if [ -n "$NBDKIT_STDERR" ]; then
    command nbdkit -f "$@" 2>"$NBDKIT_STDERR" &
    disown $!
  else
    command nbdkit "$@"
  fi
}
start_up () { start_nbdkit -P "$TMP/up$1.pid" -U "$TMP/up$1.sock" file "$TMP/up$1.img"; }
start_proxy ()           # N STDERR-FILE
{
  NBDKIT_STDERR="$2" start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" \
    --filter="$FILTER" nbd socket="$TMP/up$1.sock" fscache-dir="$cache" \
    fscache-key="wb$1" fscache-mode=writeback
}
files_of () { find "$cache/objects" -name "kwb$1=*" -type f | sort; }
wlog_of () { find "$cache/objects" -name "kwb$1=*.wlog" -type f; }

# The client: connect, wait until GO exists (the upstream is gone),
# write 20 blocks (a flush after every 5) and EXTRA unflushed ones,
# the model after 2 and after 20 writes, then DONE; hold on until STOP.
client ()                # N EXTRA
{
  "$PYTHON" -c '
import nbd, os, shutil, sys, time
uri, img, model, go, done, stop, extra = sys.argv[1:]
shutil.copyfile(img, model)
h = nbd.NBD()
h.connect_uri(uri)
while not os.path.exists(go):
    time.sleep(0.02)
with open(model, "r+b") as m:
    for i in range(20 + int(extra)):
        off = (9 * i + 5) * 16384          # distinct, not adjacent
        buf = os.urandom(4096)
        h.pwrite(buf, off)
        if i < 20:
            m.seek(off); m.write(buf); m.flush()
        if i % 5 == 4 and i < 20:
            h.flush()
        if i == 1:
            shutil.copyfile(model, model + "-2")
open(done, "w").close()
while not os.path.exists(stop):
    time.sleep(0.05)
' "$(uri px$1)" "$TMP/up$1.img" "$TMP/model$1" "$TMP/go$1" "$TMP/done$1" \
    "$TMP/stop$1" "$2" 2>"$TMP/client$1.err" &
  cleanup_fn "touch '$TMP/stop$1'; kill $! 2>/dev/null"
}

# damage LOG WHICH: overwrite the 64-byte header of a record, WHICH
# "3rd" (the third record: a write a marker follows), "1st", or
# "tail" (the first record after the last marker).  Prints its
# sequence number and byte offset.
damage ()
{
  "$PYTHON" -c '
import struct, sys
path, which = sys.argv[1:]
data = open(path, "rb").read()
recs, pos = [], 8192
while pos + 64 <= len(data):
    magic, typ = struct.unpack_from("<IB", data, pos)
    if magic != 0x524c5746:
        break
    seq, epoch, off, ln, nunits = struct.unpack_from("<QQQQI", data, pos + 8)
    recs.append((pos, typ, seq))
    size = 64 + 8 * nunits + (ln if typ == 1 else 0)
    pos += (size + 7) // 8 * 8
kinds = "".join("M" if t == 4 else "W" for _, t, _ in recs)
if which == "3rd":
    i = 2
elif which == "1st":
    i = 0
else:
    i = kinds.rindex("M") + 1
if i >= len(recs) or recs[i][1] != 1 or "M" not in kinds[i:] and which != "tail":
    sys.exit("unexpected records %s for %s" % (kinds, which))
p = recs[i][0]
with open(path, "r+b") as f:
    f.seek(p)
    f.write(b"\xa5" * 64)
print(recs[i][2], p, kinds)
' "$1" "$2"
}

# ---- dirty logs the upstream never got ---------------------------------------
for n in 1 2 3; do
  make_random "$TMP/up$n.img" $SIZE
  cp "$TMP/up$n.img" "$TMP/orig$n.img"
  start_up $n
  start_proxy $n "$TMP/px$n.err"
  client $n $(( n == 3 ? 2 : 0 ))
done
for n in 1 2 3; do
  opened () { tool --dir "$cache" ls | grep -q "^wb$1 .* in use$"; }
  wait_until opened $n || { tool --dir "$cache" ls >&2; fail "wb$n never in use"; }
  kill9_nbdkit "$TMP/up$n.pid"
  touch "$TMP/go$n"
done
for n in 1 2 3; do
  wait_until test -e "$TMP/done$n" ||
    { cat "$TMP/client$n.err" >&2; fail "client $n: its writes did not complete"; }
  kill9_nbdkit "$TMP/px$n.pid"
  cmp -s "$TMP/up$n.img" "$TMP/orig$n.img" || fail "the dead upstream $n changed"
done
read -r seq1 pos1 kinds1 < <(damage "$(wlog_of 1)" 3rd) || fail "damage wb1"
read -r seq2 pos2 kinds2 < <(damage "$(wlog_of 2)" 1st) || fail "damage wb2"
read -r seq3 pos3 kinds3 < <(damage "$(wlog_of 3)" tail) || fail "damage wb3"
echo "wb1: record $seq1 at byte $pos1 damaged ($kinds1)"
echo "wb2: record $seq2 at byte $pos2 damaged ($kinds2)"
echo "wb3: record $seq3 at byte $pos3 damaged ($kinds3)"
[ "$seq1" = 3 ] || fail "wb1: the 3rd record is number $seq1"

# ---- wb1: the export is refused, loudly ---------------------------------------
cp "$(wlog_of 1)" "$TMP/wlog1.before"
start_up 1
start_proxy 1 "$TMP/px1-restart.err"
if nbdcopy "$(uri px1)" "$TMP/read1" 2>/dev/null; then
  cmp -s "$TMP/read1" "$TMP/orig1.img" &&
    fail "wb1: the proxy served the upstream's old bytes for the flushed writes"
  fail "wb1: the proxy opened the export of a damaged log"
fi
stop_nbdkit "$TMP/px1.pid"
cat "$TMP/px1-restart.err"
grep -q "export \"\" (wb1): its write log .*/objects/@[0-9a-f]*/kwb1=.*\.wlog is DAMAGED: record 3 (at byte $pos1 of the file)" \
  "$TMP/px1-restart.err" || fail "wb1: no error naming the log and the record"
grep -q "nbd-fscache --dir $cache writeback --salvage kwb1=.* URI" "$TMP/px1-restart.err" &&
  grep -q "nbd-fscache --dir $cache invalidate --force kwb1=" "$TMP/px1-restart.err" ||
  fail "wb1: the error gives no way out"
cmp -s "$(wlog_of 1)" "$TMP/wlog1.before" || fail "wb1: the refused open changed the log"

# ---- wb1: the tools say damaged ------------------------------------------------
tool --dir "$cache" ls > "$TMP/ls" || fail "ls exited $?"
cat "$TMP/ls"
grep -Eq '^wb1 .* damaged .* damaged$' "$TMP/ls" ||
  fail "ls: wb1 is not shown damaged"
tool --dir "$cache" stat wb1 > "$TMP/stat" || fail "stat exited $?"
grep -Eq '^write_log +damaged$' "$TMP/stat" &&
  grep -Eq "^write_log_damage +record 3 at byte $pos1 " "$TMP/stat" ||
  { cat "$TMP/stat"; fail "stat: wb1's log not shown damaged"; }
[ "$(tool --dir "$cache" stat wb1 --json | "$PYTHON" -c '
import json, sys
o = json.load(sys.stdin)["objects"][0]
print(o["write_log"], o["dirty"])')" = "damaged True" ] ||
  fail "stat --json: wb1 not damaged and dirty"
st=0
tool --dir "$cache" check wb1 > "$TMP/check" 2>&1 || st=$?
cat "$TMP/check"
[ "$st" -eq 1 ] || fail "check of a damaged log: exit $st, expected 1"
grep -q "write log DAMAGED: record 3 at byte $pos1" "$TMP/check" ||
  fail "check: the damage is not reported"

# ---- wb1: nothing discards it without being told to ------------------------------
files_of 1 > "$TMP/files1.before"
grep -q '\.wlog$' "$TMP/files1.before" || fail "wb1 has no .wlog"
st=0
tool --dir "$cache" invalidate wb1 2> "$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "invalidate of a damaged log: exit $st, expected 1"
grep -q 'invalidate: kwb1=.*: its write log is DAMAGED (record 3 at byte' "$TMP/err" ||
  fail "invalidate: not the expected refusal"
st=0
tool --dir "$cache" writeback wb1 "$(uri up1)" > "$TMP/out" 2> "$TMP/err" || st=$?
cat "$TMP/out" "$TMP/err"
[ "$st" -eq 1 ] || fail "writeback of a damaged log without --salvage: exit $st, expected 1"
grep -q 'record 3 (at byte .*) cannot be read .* 2 records (8192 bytes) before it are intact, and it and every record after it (17 intact writes, 69632 bytes) would be lost.  Refusing: run again with --salvage' \
  "$TMP/err" || fail "writeback: no refusal saying what would be lost"
files_of 1 | cmp -s - "$TMP/files1.before" || fail "wb1's files changed"
cmp -s "$(wlog_of 1)" "$TMP/wlog1.before" || fail "wb1's log changed"
cmp -s "$TMP/up1.img" "$TMP/orig1.img" || fail "a refused writeback wrote to the upstream"

# ---- wb2: the daemon never culls a damaged log ------------------------------------
files_of 2 > "$TMP/files2.before"
cp "$(wlog_of 2)" "$TMP/wlog2.before"
touch -d '1 day ago' $(files_of 2)
cat > "$TMP/d.conf" <<EOF
dir $cache
max-size 4K
brun 2%
bcull 1%
bstop 0%
frun 2%
fcull 1%
fstop 0%
EOF
start_daemon "$TMP/d.conf"
stats="$cache/nbd-fscached.stats"
# wb1 and wb2 are dirty (damaged), wb3 dirty too (its tail torn but
# the rest flushed): all three counted, none culled.
settled () { [ -s "$stats" ] && [ "$(stat_value "$stats" objects_dirty)" -eq 3 ]; }
wait_until settled || { cat "$dlog" "$stats" >&2; fail "the daemon did not count 3 dirty objects"; }
warned () { grep -q 'dirty 3 objects hold .* never culled' "$dlog"; }
wait_until warned || { cat "$dlog" >&2; fail "the daemon did not see it could cull nothing"; }
grep -q '2 objects have a damaged write log holding flushed writes not written back: never culled' "$dlog" ||
  { cat "$dlog" >&2; fail "the daemon did not say loudly that 2 write logs are damaged"; }
stop_daemon
cat "$stats"
[ "$(stat_value "$stats" culled_objects)" -eq 0 ] ||
  fail "the daemon culled $(stat_value "$stats" culled_objects) objects"
files_of 2 | cmp -s - "$TMP/files2.before" || fail "the daemon touched wb2's files"
files_of 1 | cmp -s - "$TMP/files1.before" || fail "the daemon touched wb1's files"

# ---- wb2: a proxy in another mode refuses it too (no record is intact) ------------
start_up 2
NBDKIT_STDERR="$TMP/px2-wt.err" start_nbdkit -P "$TMP/px2.pid" -U "$TMP/px2.sock" \
  --filter="$FILTER" nbd socket="$TMP/up2.sock" fscache-dir="$cache" \
  fscache-key=wb2 fscache-mode=writethrough
if nbdcopy "$(uri px2)" "$TMP/read2" 2>/dev/null; then
  fail "wb2: a writethrough proxy served the export of a damaged log"
fi
stop_nbdkit "$TMP/px2.pid"
stop_nbdkit "$TMP/up2.pid"
cat "$TMP/px2-wt.err"
grep -q "kwb2=.*\.wlog is DAMAGED: record 1 (at byte 8192 of the file)" "$TMP/px2-wt.err" ||
  fail "wb2: the writethrough proxy did not say the log is damaged"
# The proxy opens the object before it looks at the log (the open race
# of plugin/fscache.c), so it may leave the object's live statistics
# (.stats) behind; no other file comes or goes, and the log is as it
# was, byte for byte.
files_of 2 | grep -v '\.stats$' | cmp -s - "$TMP/files2.before" ||
  fail "the writethrough proxy changed wb2's files"
cmp -s "$(wlog_of 2)" "$TMP/wlog2.before" ||
  fail "the writethrough proxy changed wb2's log"

# ---- wb1: salvage ---------------------------------------------------------------
st=0
tool --dir "$cache" writeback --salvage wb1 "$(uri up1)" > "$TMP/out" 2> "$TMP/err" || st=$?
[ "$st" -eq 0 ] || { cat "$TMP/out" "$TMP/err"; fail "writeback --salvage exited $st"; }
cat "$TMP/out" "$TMP/err"
grep -q "the write log is damaged at record 3 (byte $pos1 of the log" "$TMP/out" &&
  grep -q 'salvaging: the 2 intact records before it (8192 bytes in 1 epochs) are written back' "$TMP/out" &&
  grep -q 'LOST: record 3 (unreadable: what it held is unknown) and every record after it, up to record 24: 17 intact writes, zeroes or trims of 69632 bytes within bytes' "$TMP/out" &&
  grep -q 'wrote back 8192 bytes in 1 epoch to ' "$TMP/out" &&
  grep -q 'the damaged write log was discarded: the export opens again' "$TMP/out" ||
  fail "writeback --salvage: not the expected report"
cmp "$TMP/up1.img" "$TMP/model1-2" ||
  fail "the salvaged upstream is not the image after the 2 intact writes"
[ -z "$(files_of 1)" ] || fail "wb1's files are still there: $(files_of 1)"
start_proxy 1 "$TMP/px1-after.err"
nbdcopy "$(uri px1)" "$TMP/read1" || { cat "$TMP/px1-after.err"; fail "wb1: no export after the salvage"; }
cmp "$TMP/read1" "$TMP/model1-2" || fail "wb1: the export after the salvage serves other data"
stop_nbdkit "$TMP/px1.pid"
stop_nbdkit "$TMP/up1.pid"

# ---- wb3: a torn tail is dropped without a word -----------------------------------
start_up 3
start_proxy 3 "$TMP/px3-restart.err"
nbdcopy "$(uri px3)" "$TMP/read3" || { cat "$TMP/px3-restart.err"; fail "wb3: the export was refused"; }
cmp "$TMP/read3" "$TMP/model3" || fail "wb3: the export is not the image after the 20 flushed writes"
stop_nbdkit "$TMP/px3.pid"
cat "$TMP/px3-restart.err"
if grep -i "error" "$TMP/px3-restart.err" | grep -v "found in the cache; writing them back" |
   grep -v "previous user did not shut down cleanly; the cache was checked and kept"; then
  fail "wb3: errors for a torn tail"
fi
cmp "$TMP/up3.img" "$TMP/model3" || fail "wb3: the upstream after the drain is not the flushed image"
stop_nbdkit "$TMP/up3.pid"
echo "$0: OK"
