#!/usr/bin/env bash
# nbd-fscache invalidate: objects discarded safely.
#
#  1. Two 8 MiB exports (keys inv1, inv2) cached whole by real proxies.
#  2. invalidate inv1: its files are gone, inv2's are not; a new proxy
#     reads all of inv1 from upstream (8 MiB in the log filter's
#     count) and none of inv2 (0 bytes), both identical to the images;
#     inv1's counters went on (NAME.stats kept as its history):
#     invalidations 1, last_reason invalidated, both opens counted.
#  3. While a client holds inv2, invalidate inv2 refuses (exit 1, "in
#     use") and leaves it whole: the holder's proxy still serves it
#     from the cache.
#  4. invalidate --all (nothing held): no object left, the graveyard
#     empty; a new proxy fetches everything again.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$TOOL"
requires nbdkit --version
requires nbdcopy --version
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

SIZE=$((8 * 1024 * 1024))
cache="$TMP/cache"
make_random "$TMP/img1" $SIZE
make_random "$TMP/img2" $SIZE

run=0
read_through ()          # N: a new proxy, a full read; upstream bytes -> $up
{
  run=$((run + 1))
  local log="$TMP/run$run.log"
  start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" --filter="$FILTER" \
    --filter=log file "$TMP/img$1" fscache-dir="$cache" fscache-key="inv$1" \
    fscache-readahead=0 fscache-validate=size logfile="$log"
  nbdcopy "nbd+unix:///?socket=$TMP/px$1.sock" "$TMP/out" ||
    fail "run $run: read of inv$1"
  stop_nbdkit "$TMP/px$1.pid"
  cmp "$TMP/out" "$TMP/img$1" || fail "run $run: inv$1 differs"
  up=$(log_read_bytes "$log")
}
# The object's files; NAME.stats stays behind as its history.
files_of () { find "$cache/objects" -name "kinv$1=*" ! -name '*.stats' -type f | wc -l; }
counter ()               # N COUNTER: from stat --json
{
  tool --dir "$cache" stat "inv$1" --json | "$PYTHON" -c '
import json, sys
o = json.load(sys.stdin)["objects"][0]
print(o["last_reason"] if sys.argv[1] == "last_reason" else o["counters"][sys.argv[1]])' "$2"
}

# ---- 1. fill -------------------------------------------------------------------
read_through 1; [ "$up" -eq $SIZE ] || fail "fill inv1: $up bytes upstream"
read_through 2; [ "$up" -eq $SIZE ] || fail "fill inv2: $up bytes upstream"
[ "$(files_of 1)" -ge 3 ] && [ "$(files_of 2)" -ge 3 ] || fail "no objects"

# ---- 2. invalidate one -----------------------------------------------------------
tool --dir "$cache" invalidate inv1 || fail "invalidate inv1 exited $?"
[ "$(files_of 1)" -eq 0 ] || fail "inv1's files are still there"
[ "$(files_of 2)" -ge 3 ] || fail "inv2's files went too"
[ -z "$(ls -A "$cache/graveyard")" ] || fail "the graveyard is not empty"
read_through 1; [ "$up" -eq $SIZE ] || fail "inv1 after invalidate: $up bytes upstream, expected all $SIZE"
# Its history went on: the invalidation counted, the earlier opens kept.
[ "$(counter 1 invalidations)" = 1 ] && [ "$(counter 1 last_reason)" = invalidated ] &&
  [ "$(counter 1 opens)" = 2 ] && [ "$(counter 1 miss_bytes)" = $((2 * SIZE)) ] ||
  { tool --dir "$cache" stat inv1 >&2; fail "inv1: the invalidation was not counted"; }
read_through 2; [ "$up" -eq 0 ] || fail "inv2: $up bytes upstream, expected none"

# ---- 3. refused while held -----------------------------------------------------------
start_nbdkit -P "$TMP/px2.pid" -U "$TMP/px2.sock" --filter="$FILTER" \
  --filter=log file "$TMP/img2" fscache-dir="$cache" fscache-key=inv2 \
  fscache-readahead=0 fscache-validate=size logfile="$TMP/held.log"
hold_export "nbd+unix:///?socket=$TMP/px2.sock" "$TMP/stop-hold"
in_use () { tool --dir "$cache" ls | grep -q '^inv2 .* in use$'; }
wait_until in_use || fail "ls never said inv2 is in use"
st=0
tool --dir "$cache" invalidate inv2 2> "$TMP/err" || st=$?
cat "$TMP/err"
[ "$st" -eq 1 ] || fail "invalidate of a held object: exit status $st, expected 1"
grep -q '^nbd-fscache: invalidate: kinv2=.*: in use by a running process: not invalidated$' \
  "$TMP/err" || fail "invalidate: no refusal message"
[ "$(files_of 2)" -ge 3 ] || fail "the held object lost files"
nbdcopy "nbd+unix:///?socket=$TMP/px2.sock" "$TMP/out" || fail "held: read"
cmp "$TMP/out" "$TMP/img2" || fail "held: data differs"
[ "$(log_read_bytes "$TMP/held.log")" -eq 0 ] || fail "held: read upstream"
touch "$TMP/stop-hold"
stop_nbdkit "$TMP/px2.pid"

# ---- 4. --all ----------------------------------------------------------------------
tool --dir "$cache" invalidate --all || fail "invalidate --all exited $?"
[ -z "$(find "$cache/objects" -type f ! -name '*.stats')" ] || fail "objects left after --all"
[ -z "$(ls -A "$cache/graveyard")" ] || fail "the graveyard is not empty"
tool --dir "$cache" ls --json | "$PYTHON" -c '
import json, sys
sys.exit(len(json.load(sys.stdin)["objects"]))' || fail "ls still lists objects"
read_through 1; [ "$up" -eq $SIZE ] || fail "inv1 after --all: $up bytes upstream"
read_through 2; [ "$up" -eq $SIZE ] || fail "inv2 after --all: $up bytes upstream"

echo "$0: PASS"
