#!/usr/bin/env bash
# nbd-fscache and nbd-fscached with writeback-mode objects whose dirty
# data never reached the upstream.
#
#  1. Two writeback proxies (keys wb1, wb2) in front of upstreams (nbdkit
#     file, reached by the proxies' nbd plugin over a unix socket).  A
#     client connects to each, then the upstream is killed (-9), then
#     the client writes 6 distinct 4 KiB blocks, flushes, writes 4 more,
#     flushes: 10 blocks, 40960 bytes, in 2 epochs, that only the write
#     log holds.  The truth: the client's own model of the image.
#  2. While the proxies run: ls shows wb1 with DIRTY 40.0K, in use;
#     stat --json says dirty_bytes 40960, dirty_epochs 2, an age; stat
#     --prometheus passes prom-check.py (and promtool when installed)
#     and has nbd_fscache_dirty_bytes 40960 and dirty_epochs 2 for wb1.
#     writeback while a proxy holds the log: refused (exit 1).
#  3. Both proxies killed (-9): ls says "dirty" (idle, dirty data);
#     invalidate wb1 without --force refuses (exit 1, the message) and
#     leaves every file.  writeback wb1 to an upstream of another size:
#     refused (exit 1), nothing changed.
#  4. A third object (wb3) written back by its own proxy and stopped
#     cleanly: its log is clean.  nbd-fscached with max-size 4K, every
#     index made old: it culls wb3 whole (its clean .wlog too), never
#     wb1 or wb2, and reports objects_dirty 2, dirty_bytes 81920, and a
#     warning that dirty objects are never culled.
#  5. A fresh upstream for wb1: nbd-fscache writeback --connections 2
#     drains the log: the upstream image then equals the model (cmp),
#     its cached data is discarded (no files of wb1 left), ls shows no
#     dirty data for it; a proxy on it reads the model back.
#  6. invalidate --force wb2: done, the 40960 bytes said, no wb2 file
#     left (.wlog included), the graveyard empty.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$TOOL"
requires test -x "$DAEMON"
requires nbdkit --version
requires nbdkit nbd --dump-plugin
requires nbdkit memory --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires nbdcopy --version
requires "$PYTHON" -c "import nbd"
requires cmp --version

SIZE=$((4 * 1024 * 1024))
cache="$TMP/cache"
uri () { echo "nbd+unix:///?socket=$TMP/$1.sock"; }

start_up ()              # N: nbdkit file up N.img on upN.sock
{
  start_nbdkit -P "$TMP/up$1.pid" -U "$TMP/up$1.sock" file "$TMP/up$1.img"
}
start_proxy ()           # N
{
  start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" --filter="$FILTER" \
    nbd socket="$TMP/up$1.sock" fscache-dir="$cache" fscache-key="wb$1" \
    fscache-mode=writeback
}
files_of () { find "$cache/objects" -name "kwb$1=*" -type f | sort; }
json_get ()              # FILE PYTHON-EXPRESSION-OF-j
{
  "$PYTHON" -c 'import json, sys
j = json.load (open (sys.argv[1]))
print (eval (sys.argv[2]))' "$1" "$2"
}

# The client: connect, wait until GO exists (the upstream is gone),
# write 6 blocks, flush, 4 more, flush, write the model, then touch
# DONE and keep the connection until STOP exists.
client ()                # N
{
  "$PYTHON" -c '
import nbd, os, shutil, sys, time
uri, img, model, go, done, stop = sys.argv[1:]
shutil.copyfile(img, model)
h = nbd.NBD()
h.connect_uri(uri)
while not os.path.exists(go):
    time.sleep(0.02)
with open(model, "r+b") as m:
    for i in range(10):
        off = (7 * i + 3) * 16384          # distinct, not adjacent
        buf = os.urandom(4096)
        h.pwrite(buf, off)
        m.seek(off); m.write(buf)
        if i in (5, 9):
            h.flush()
open(done, "w").close()
while not os.path.exists(stop):
    time.sleep(0.05)
h.shutdown()
' "$(uri px$1)" "$TMP/up$1.img" "$TMP/model$1" "$TMP/go$1" "$TMP/done$1" \
    "$TMP/stop$1" 2>"$TMP/client$1.err" &
  cleanup_fn "touch '$TMP/stop$1'; kill $! 2>/dev/null"
}

# ---- 1. dirty data the upstream never got ------------------------------------
for n in 1 2; do
  make_random "$TMP/up$n.img" $SIZE
  cp "$TMP/up$n.img" "$TMP/orig$n.img"
  start_up $n
  start_proxy $n
  client $n
done
for n in 1 2; do
  # Wait for the client's connection to be open (the object too).
  opened () { tool --dir "$cache" ls | grep -q "^wb$1 .* in use$"; }
  wait_until opened $n || { tool --dir "$cache" ls >&2; fail "wb$n never in use"; }
  kill9_nbdkit "$TMP/up$n.pid"
  touch "$TMP/go$n"
done
for n in 1 2; do
  wait_until test -e "$TMP/done$n" ||
    { cat "$TMP/client$n.err" >&2; fail "client $n: its writes did not complete"; }
done
cmp -s "$TMP/up1.img" "$TMP/orig1.img" || fail "the dead upstream changed"

# ---- 2. what ls and stat say while the proxies run -------------------------------
tool --dir "$cache" ls > "$TMP/ls" || fail "ls exited $?"
cat "$TMP/ls"
grep -Eq '^wb1 +4\.0M .* 40\.0K .* in use$' "$TMP/ls" ||
  fail "ls: expected wb1 with DIRTY 40.0K, in use"
head -1 "$TMP/ls" | grep -q ' DIRTY ' || fail "ls: no DIRTY column"
tool --dir "$cache" stat wb1 --json > "$TMP/stat.json" || fail "stat --json exited $?"
o='j["objects"][0]'
[ "$(json_get "$TMP/stat.json" "$o['dirty_bytes']")" = 40960 ] &&
  [ "$(json_get "$TMP/stat.json" "$o['dirty_epochs']")" = 2 ] &&
  [ "$(json_get "$TMP/stat.json" "$o['dirty']")" = True ] &&
  [ "$(json_get "$TMP/stat.json" "$o['write_log']")" = ok ] &&
  [ "$(json_get "$TMP/stat.json" "$o['state']")" = "in use" ] &&
  [ "$(json_get "$TMP/stat.json" "0 <= $o['dirty_oldest_age_seconds'] < 60")" = True ] ||
  { cat "$TMP/stat.json" >&2; fail "stat --json: wrong dirty figures"; }
tool --dir "$cache" stat wb1 | grep -Eq '^dirty_bytes +40960 ' ||
  fail "stat: no dirty_bytes 40960 line"
tool --dir "$cache" stat --prometheus --output "$TMP/m.prom" ||
  fail "stat --prometheus exited $?"
"$PYTHON" "$top_srcdir/tests/prom-check.py" "$TMP/m.prom" > "$TMP/m.samples" ||
  { cat "$TMP/m.prom" >&2; fail "prom-check.py refused the output"; }
if command -v promtool > /dev/null; then
  promtool check metrics < "$TMP/m.prom" ||
    { cat "$TMP/m.prom" >&2; fail "promtool refused the output"; }
else
  echo "$0: promtool not installed: only prom-check.py checked the output"
fi
for m in "dirty_bytes 40960" "dirty_epochs 2"; do
  grep -Eq "^nbd_fscache_${m% *}\{key=\"wb1\",object=\"kwb1=[^\"]*\"\} ${m#* }\$" \
    "$TMP/m.samples" || { cat "$TMP/m.samples" >&2; fail "prometheus: no $m for wb1"; }
done
grep -q '^# TYPE nbd_fscache_dirty_oldest_age_seconds gauge$' "$TMP/m.prom" ||
  fail "prometheus: no dirty_oldest_age_seconds gauge"

# The log is the proxy's: writeback refuses.
st=0
nbdkit -U - memory $SIZE --run "'$TOOL' --dir '$cache' writeback wb1 \"\$uri\"" \
  2> "$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "writeback while a proxy holds the log: exit $st, expected 1"
grep -q 'writeback: kwb1=.*: its write log is in use by a running process' "$TMP/err" ||
  fail "writeback: no in-use message"

# ---- 3. the proxies die: dirty, and invalidate refuses -----------------------------
for n in 1 2; do
  kill9_nbdkit "$TMP/px$n.pid"
done
tool --dir "$cache" ls > "$TMP/ls" || fail "ls exited $?"
cat "$TMP/ls"
grep -Eq '^wb1 .* 40\.0K .* dirty$' "$TMP/ls" || fail "ls: wb1 is not 'dirty'"
files_of 1 > "$TMP/files1.before"
grep -q '\.wlog$' "$TMP/files1.before" || fail "wb1 has no .wlog"
grep -q '\.idx$' "$TMP/files1.before" || fail "wb1 has no .idx"
st=0
tool --dir "$cache" invalidate wb1 2> "$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "invalidate of a dirty object: exit $st, expected 1"
grep -qx 'nbd-fscache: invalidate: kwb1=00export=3d: 40960 bytes of dirty data not written back (the only copy); use --force to discard them' \
  "$TMP/err" || fail "invalidate: not the expected refusal"
files_of 1 | cmp -s - "$TMP/files1.before" || fail "invalidate removed files of wb1"

# An upstream of another size: refused, nothing changed.
st=0
nbdkit -U - memory $((2 * SIZE)) --run "'$TOOL' --dir '$cache' writeback wb1 \"\$uri\"" \
  2> "$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "writeback to another size: exit $st, expected 1"
grep -q "written for an upstream of $SIZE bytes, but .* has $((2 * SIZE)) bytes: refusing" \
  "$TMP/err" || fail "writeback: no size message"
files_of 1 | cmp -s - "$TMP/files1.before" || fail "a refused writeback changed wb1's files"
[ "$(tool --dir "$cache" stat wb1 --json |
     "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["objects"][0]["dirty_bytes"])')" \
  = 40960 ] || fail "a refused writeback changed wb1's log"

# ---- 4. the daemon culls the clean object, never the dirty ones ------------------------
make_random "$TMP/up3.img" $SIZE
start_up 3
start_proxy 3
"$PYTHON" -c '
import nbd, os, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(os.urandom(8192), 65536); h.flush(); h.shutdown()' "$(uri px3)"
stop_nbdkit "$TMP/px3.pid"       # drains: the log is clean
stop_nbdkit "$TMP/up3.pid"
files_of 3 | grep -q '\.wlog$' || fail "wb3 has no .wlog"
[ "$(tool --dir "$cache" ls --json | "$PYTHON" -c '
import json, sys
print([o["dirty_bytes"] for o in json.load(sys.stdin)["objects"] if o["key"] == "wb3"][0])')" \
  = 0 ] || fail "wb3 is dirty after a clean stop"
for n in 1 2 3; do
  touch -d '1 day ago' $(files_of $n)
done
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
settled ()
{
  [ -s "$stats" ] && [ "$(stat_value "$stats" culled_objects)" -ge 1 ] &&
    [ "$(stat_value "$stats" objects_dirty)" -eq 2 ]
}
wait_until settled || { cat "$dlog" "$stats" >&2; fail "the daemon did not cull wb3"; }
warned () { grep -q 'dirty 2 objects hold 81920 bytes .* never culled' "$dlog"; }
wait_until warned || { cat "$dlog" >&2; fail "the daemon did not warn about dirty objects"; }
stop_daemon
cat "$stats"
[ "$(stat_value "$stats" culled_objects)" -eq 1 ] ||
  fail "culled $(stat_value "$stats" culled_objects) objects, expected 1 (wb3)"
[ "$(stat_value "$stats" dirty_bytes)" -eq 81920 ] ||
  fail "dirty_bytes $(stat_value "$stats" dirty_bytes), expected 81920"
[ -z "$(files_of 3)" ] || fail "wb3 was not culled whole: $(files_of 3)"
files_of 1 | cmp -s - "$TMP/files1.before" || fail "the daemon touched wb1's files"
files_of 2 | grep -q '\.wlog$' || fail "the daemon culled wb2's log"
[ -z "$(ls -A "$cache/graveyard")" ] || fail "the graveyard is not empty"

# ---- 5. writeback to a fresh upstream -----------------------------------------------
start_nbdkit -P "$TMP/up1b.pid" -U "$TMP/up1b.sock" file "$TMP/up1.img"
tool --dir "$cache" writeback wb1 "$(uri up1b)" --connections 2 > "$TMP/out" ||
  fail "writeback exited $?"
cat "$TMP/out"
grep -q '^kwb1=00export=3d: wrote back 40960 bytes in 2 epochs to .*; its cached data was discarded' \
  "$TMP/out" || fail "writeback: no summary line"
cmp "$TMP/up1.img" "$TMP/model1" || fail "the upstream is not the client's writes"
[ -z "$(files_of 1)" ] || fail "wb1's files are still there: $(files_of 1)"
tool --dir "$cache" ls --json > "$TMP/ls.json"
[ "$(json_get "$TMP/ls.json" "[o['dirty_bytes'] for o in j['objects'] if o['key'] == 'wb1'] in ([], [0])")" = True ] &&
  [ "$(json_get "$TMP/ls.json" "sum(o['dirty_bytes'] for o in j['objects'])")" = 40960 ] ||
  { cat "$TMP/ls.json" >&2; fail "ls: dirty figures after writeback"; }
# A proxy starts cold and serves the written data.
start_nbdkit -P "$TMP/px1.pid" -U "$TMP/px1.sock" --filter="$FILTER" \
  nbd socket="$TMP/up1b.sock" fscache-dir="$cache" fscache-key=wb1 \
  fscache-mode=writeback
nbdcopy "$(uri px1)" "$TMP/read1" || fail "read after writeback"
cmp "$TMP/read1" "$TMP/model1" || fail "a proxy after writeback serves other data"
stop_nbdkit "$TMP/px1.pid"

# ---- 6. invalidate --force -------------------------------------------------------------
tool --dir "$cache" invalidate --force wb2 > "$TMP/out" || fail "invalidate --force exited $?"
cat "$TMP/out"
grep -q '^wb2: invalidated (kwb2=00export=3d), 40960 bytes of dirty data discarded$' \
  "$TMP/out" || fail "invalidate --force: no such line"
[ -z "$(files_of 2 | grep -v '\.stats$')" ] || fail "wb2's files are still there: $(files_of 2)"
[ -z "$(ls -A "$cache/graveyard")" ] || fail "the graveyard is not empty"
cmp -s "$TMP/up2.img" "$TMP/orig2.img" || fail "the upstream of wb2 changed"

echo "$0: PASS"
