#!/usr/bin/env bash
# nbd-fscache ls and stat against what a real proxy did.
#
#  1. A 16 MiB export (readahead off, so that a cold read is all
#     misses) is read whole twice through one proxy: stat --json says
#     exactly hit_bytes = miss_bytes = 16 MiB, 2 opens, 256 blocks and
#     16 MiB cached, and agrees with the filter's own fscache-stats
#     file; ls says 100% cached and 50% hits, idle; both --json parse.
#  2. Live: a new proxy, one client holding the export open; ls says
#     "in use"; 4 MiB more are read over a second connection, and stat
#     (from NAME.stats while the proxy runs) comes to show the new
#     hit_bytes, source "live", without the proxy stopping.
#  3. --prometheus --output FILE: FILE appears whole (no temporary file
#     left), passes promtool check metrics when promtool exists and the
#     strict parser tests/prom-check.py always, and its hit_bytes
#     counter is the JSON's.
#  4. The proxy killed (-9) after a write, while the client holds the
#     export: its index is left without CLEAN, and ls says "needs
#     check".

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$TOOL"
requires nbdkit --version
requires nbdcopy --version
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter="$FILTER" null --dump-plugin

SIZE=$((16 * 1024 * 1024))
img="$TMP/img"
cache="$TMP/cache"
sock="$TMP/sock"
pid="$TMP/px.pid"
uri="nbd+unix:///?socket=$sock"
make_random "$img" $SIZE

start_proxy ()
{
  start_nbdkit -P "$pid" -U "$sock" --filter="$FILTER" file "$img" \
    fscache-dir="$cache" fscache-key=lsstat fscache-readahead=0 \
    fscache-stats="$TMP/filter${1:-}.stats"
}

json_get ()              # FILE PYTHON-EXPRESSION-OF-j
{
  "$PYTHON" -c 'import json, sys
j = json.load (open (sys.argv[1]))
print (eval (sys.argv[2]))' "$1" "$2"
}

# ---- 1. two full reads ---------------------------------------------------
# A proxy each, so that the object is opened twice: through one proxy
# the second copy's connection may find it still open from the first
# (its close is the server's, after the client has gone), and a fresh
# clone saw "opens = 1".
start_proxy 1
nbdcopy "$uri" "$TMP/out1" || fail "cold read"
stop_nbdkit "$pid"
start_proxy 2
nbdcopy "$uri" "$TMP/out2" || fail "warm read"
stop_nbdkit "$pid"
cmp "$TMP/out1" "$img" && cmp "$TMP/out2" "$img" || fail "data differs"

tool --dir "$cache" stat lsstat --json > "$TMP/stat.json" ||
  fail "stat --json exited $?"
python3 -m json.tool "$TMP/stat.json" > /dev/null || fail "stat --json: not JSON"
obj='j["objects"][0]'
c="$obj[\"counters\"]"
for want in "hit_bytes $SIZE" "miss_bytes $SIZE" "opens 2" \
            "present_blocks 256" "cached_bytes $SIZE" "upstream_bytes $SIZE" \
            "verify_failures 0"; do
  set -- $want
  got=$(json_get "$TMP/stat.json" "$c[\"$1\"]")
  [ "$got" = "$2" ] || { cat "$TMP/stat.json" >&2; fail "stat: $1 = $got, expected $2"; }
done
# The filters counted the same bytes in their own stats files.
for k in hit_bytes miss_bytes; do
  [ "$(( $(stat_value "$TMP/filter1.stats" $k) + $(stat_value "$TMP/filter2.stats" $k) ))" = \
    "$(json_get "$TMP/stat.json" "$c[\"$k\"]")" ] ||
    fail "stat: $k differs from the filters' fscache-stats"
done
[ "$(json_get "$TMP/stat.json" "len(j['objects'])")" = 1 ] &&
  [ "$(json_get "$TMP/stat.json" "j['cache']['objects']")" = 1 ] &&
  [ "$(json_get "$TMP/stat.json" "j['total']['hit_bytes']")" = $SIZE ] ||
  fail "stat: the cache's facts are wrong"
du_bytes=$(du -sB1 "$cache/objects" | cut -f1)
alloc=$(json_get "$TMP/stat.json" "j['cache']['allocated_bytes']")
[ "$alloc" -ge $SIZE ] && [ "$alloc" -le "$du_bytes" ] ||
  fail "stat: allocated_bytes $alloc, du says $du_bytes"

tool --dir "$cache" ls > "$TMP/ls" || fail "ls exited $?"
cat "$TMP/ls"
grep -Eq '^lsstat +16\.0M +16\.0M +100\.0 +50\.0 .* idle$' "$TMP/ls" ||
  fail "ls: expected lsstat 16.0M cached of 16.0M, 100%, 50% hits, idle"
tool --dir "$cache" ls --json > "$TMP/ls.json" || fail "ls --json exited $?"
python3 -m json.tool "$TMP/ls.json" > /dev/null || fail "ls --json: not JSON"
[ "$(json_get "$TMP/ls.json" "j['objects'][0]['cached_bytes']")" = $SIZE ] &&
  [ "$(json_get "$TMP/ls.json" "j['objects'][0]['size']")" = $SIZE ] &&
  [ "$(json_get "$TMP/ls.json" "j['objects'][0]['hit_ratio']")" = 0.5 ] ||
  fail "ls --json: wrong numbers"

# ---- 2. live numbers ------------------------------------------------------
start_proxy
hold_export "$uri" "$TMP/stop-hold"
in_use () { tool --dir "$cache" ls | grep -q '^lsstat .* in use$'; }
wait_until in_use || { tool --dir "$cache" ls >&2; fail "ls never said in use"; }
"$PYTHON" -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for off in range(0, 4 << 20, 1 << 20):
    h.pread(1 << 20, off)
h.shutdown()' "$uri"
# The holder read 4 KiB too, a hit like the 4 MiB.
want=$(( 2 * SIZE + 4 * 1024 * 1024 + 4096 - SIZE ))
live_hits ()
{
  tool --dir "$cache" stat lsstat --json > "$TMP/live.json" &&
    [ "$(json_get "$TMP/live.json" "$c[\"hit_bytes\"]")" = "$want" ] &&
    [ "$(json_get "$TMP/live.json" "$obj[\"source\"]")" = live ]
}
wait_until live_hits || { cat "$TMP/live.json" >&2; fail "stat never showed the live hits"; }
kill -0 "$(cat "$pid")" || fail "the proxy stopped"
in_use || fail "not in use any more"

# ---- 3. Prometheus --------------------------------------------------------
tool --dir "$cache" stat --prometheus --output "$TMP/m.prom" ||
  fail "stat --prometheus exited $?"
[ -s "$TMP/m.prom" ] || fail "no $TMP/m.prom"
ls "$TMP" | grep -q 'm\.prom\.tmp' && fail "a temporary file was left"
touch "$TMP/stop-hold"
"$PYTHON" "$top_srcdir/tests/prom-check.py" "$TMP/m.prom" > "$TMP/m.samples" ||
  { cat "$TMP/m.prom" >&2; fail "prom-check.py refused the output"; }
if command -v promtool > /dev/null; then
  promtool check metrics < "$TMP/m.prom" ||
    { cat "$TMP/m.prom" >&2; fail "promtool refused the output"; }
else
  echo "$0: promtool not installed: only prom-check.py checked the output"
fi
name=$(json_get "$TMP/live.json" "$obj[\"name\"]")
grep -qxF "nbd_fscache_hit_bytes_total{key=\"lsstat\",object=\"$name\"} $want" \
  "$TMP/m.samples" || { cat "$TMP/m.samples" >&2; fail "prometheus: wrong hit_bytes"; }
grep -qx 'nbd_fscache_objects{} 1' "$TMP/m.samples" ||
  fail "prometheus: wrong object count"
grep -q '^nbd_fscache_last_use_timestamp_seconds{' "$TMP/m.samples" ||
  fail "prometheus: no last_use gauge"

# ---- 4. a crash leaves it needing a check -----------------------------------
# Only a change marks the index not clean (before it is made: commit.c,
# rule 5); a proxy that only served hits leaves it clean.  So the held
# connection writes back 4 KiB it read, and then the proxy is killed.
hold_export "$uri" "$TMP/stop-hold2"
wait_until in_use || fail "ls never said in use again"
"$PYTHON" -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(h.pread(4096, 0), 0)
h.flush()
h.shutdown()' "$uri"
kill9_nbdkit "$pid"
needs_check () { tool --dir "$cache" ls | grep -q '^lsstat .* needs check$'; }
wait_until needs_check || { tool --dir "$cache" ls >&2; fail "ls: not 'needs check' after a crash"; }

echo "$0: PASS"
