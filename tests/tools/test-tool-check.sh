#!/usr/bin/env bash
# nbd-fscache check [--repair] on a real cache.
#
#  1. A 16 MiB export read whole through a proxy: check exits 0.
#  2. One byte of block 37 flipped in NAME.data: check exits 1 and
#     names block 37 (and no other); check --repair drops it (exit 0),
#     a second check exits 0; a full read through a new proxy is
#     identical to the image and fetched from upstream exactly that
#     block's 64 KiB (the log filter counts; fscache-validate=size so
#     that no coherency sample is read).
#  3. While a client holds the export: check --repair refuses (exit 2,
#     "in use"), a read-only check runs and says it may race.
#  4. Both superblocks overwritten with garbage: check reports the
#     index as not valid (exit 1, a message, no crash); --repair
#     discards the object through the graveyard (exit 0); then ls shows
#     no object and check exits 0.
#  5. fscache.hdr damaged: check reports it (exit 1), ls refuses
#     (exit 2), check --repair writes a new one (exit 0), then both
#     work.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$TOOL"
requires nbdkit --version
requires nbdcopy --version
requires od --version
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

SIZE=$((16 * 1024 * 1024))
BS=65536
img="$TMP/img"
cache="$TMP/cache"
sock="$TMP/sock"
pid="$TMP/px.pid"
uri="nbd+unix:///?socket=$sock"
make_random "$img" $SIZE

start_proxy ()           # LOGFILE
{
  start_nbdkit -P "$pid" -U "$sock" --filter="$FILTER" --filter=log \
    file "$img" fscache-dir="$cache" fscache-key=check \
    fscache-readahead=0 fscache-validate=size logfile="$1"
}

check_st ()              # WANT-STATUS ARGS...: run check, keep its output
{
  local want="$1" st=0
  shift
  tool --dir "$cache" check "$@" > "$TMP/check.out" 2> "$TMP/check.err" ||
    st=$?
  cat "$TMP/check.out" "$TMP/check.err"
  [ "$st" -eq "$want" ] || fail "check $*: exit status $st, expected $want"
}

flip_byte ()             # FILE OFFSET
{
  local b
  b="$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')"
  printf "$(printf '\\%03o' $(( b ^ 0xff )))" |
    dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# ---- 1. a good cache -------------------------------------------------------
start_proxy "$TMP/fill.log"
nbdcopy "$uri" "$TMP/out" || fail "fill"
stop_nbdkit "$pid"
check_st 0
grep -q '256 blocks verified: 0 problems' "$TMP/check.out" ||
  fail "check: not every block verified"

# ---- 2. a flipped byte -----------------------------------------------------
data="$(find "$cache/objects" -name '*.data')"
flip_byte "$data" $(( 37 * BS + 12345 ))
check_st 1
grep -q 'block 37 (offset 2424832, 65536 bytes): data does not match' \
  "$TMP/check.out" || fail "check did not name block 37"
[ "$(grep -c ': block ' "$TMP/check.out")" -eq 1 ] ||
  fail "check reported other blocks"
check_st 0 --repair
grep -q '1 problems, 1 repaired' "$TMP/check.out" || fail "repair: no summary"
check_st 0
grep -q '255 blocks verified: 0 problems' "$TMP/check.out" ||
  fail "after repair: expected 255 good blocks"

start_proxy "$TMP/reread.log"
nbdcopy "$uri" "$TMP/out" || fail "reread"
stop_nbdkit "$pid"
cmp "$TMP/out" "$img" || fail "reread: data differs"
[ "$(log_read_bytes "$TMP/reread.log")" -eq $BS ] ||
  fail "reread: $(log_read_bytes "$TMP/reread.log") bytes from upstream, expected $BS"
[ "$(log_read_bytes "$TMP/reread.log" $(( 37 * BS + 1 )))" -eq $BS ] &&
  [ "$(log_read_bytes "$TMP/reread.log" $(( 37 * BS )))" -eq 0 ] ||
  fail "reread: the upstream read was not block 37"
check_st 0

# ---- 3. in use --------------------------------------------------------------
start_proxy "$TMP/held.log"
hold_export "$uri" "$TMP/stop-hold"
in_use () { tool --dir "$cache" ls | grep -q ' in use$'; }
wait_until in_use || fail "ls never said in use"
check_st 2 --repair
grep -q ": ok" "$TMP/check.out" && fail "check --repair refused, yet said ok"
grep -q 'nbd-fscache: check: .*: in use by a running process: refusing to repair' \
  "$TMP/check.err" || fail "check --repair: no refusal message"
check_st 0
grep -q 'note: in use by a running process: what this check finds may be a race' \
  "$TMP/check.out" || fail "check: no note that it may race"
touch "$TMP/stop-hold"
stop_nbdkit "$pid"

# ---- 4. a garbled index -------------------------------------------------------
idx="$(find "$cache/objects" -name '*.idx')"
head -c 8192 /dev/urandom | dd of="$idx" conv=notrunc status=none
check_st 1
grep -q 'index not valid: bad-magic (superblock slot 0: bad-magic, slot 1: bad-magic)' \
  "$TMP/check.out" || fail "check: no report of the garbled index"
check_st 0 --repair
grep -q ': discarded$' "$TMP/check.out" || fail "repair did not discard"
[ -z "$(find "$cache/objects" -type f)" ] || fail "files left: $(find "$cache/objects" -type f)"
[ -z "$(ls -A "$cache/graveyard")" ] || fail "the graveyard is not empty"
check_st 0
grep -q '^0 objects' "$TMP/check.out" || fail "check: objects left"

# ---- 5. a damaged cache header ---------------------------------------------
# The filter writes a new header over a damaged one; check reports it
# (exit 1) and --repair writes it (exit 0); other subcommands refuse.
printf 'garbage' | dd of="$cache/fscache.hdr" conv=notrunc status=none
check_st 1
grep -q '^fscache.hdr: damaged' "$TMP/check.out" ||
  fail "check: no report of the damaged header"
st=0; "$TOOL" --dir "$cache" ls > "$TMP/ls.out" 2>&1 || st=$?
[ "$st" -eq 2 ] || fail "ls on a damaged header: exit $st, expected 2"
check_st 0 --repair
grep -q '^fscache.hdr: repaired' "$TMP/check.out" || fail "repair: header not rewritten"
check_st 0
"$TOOL" --dir "$cache" ls > /dev/null || fail "ls after the repair failed"

echo "$0: PASS"
