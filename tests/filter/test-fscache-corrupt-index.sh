#!/usr/bin/env bash
# nbd-fscache: damaged or foreign object files, found at open.
#
# A filled object's files are damaged with the proxy stopped, then the
# proxy restarts and reads everything:
#
#   index truncated to 0 bytes         new (nothing to discard)
#   index truncated to 100 bytes       truncated-index
#   both superblocks garbled           bad-checksum
#   index zeroed                       bad-magic
#   version 4 in both superblocks      unsupported-version
#   data file of the wrong size        data-file-size
#   sums file of the wrong size        data-file-size
#   another fscache-block-size         block-size-changed
#
# Each starts cold: objects_discarded (or, for the empty index,
# objects_created) counts it, stderr has exactly one line naming the
# reason, nothing is served from the cache, the data is identical, and
# the proxy does not crash.  The next restart then reuses the object
# rebuilt by that read.
#
# Damage the format is designed to survive is checked too:
#
#   format version 1 in both           read and upgraded: reused, one
#   superblocks (the format before     line saying so, and the next
#   pieces)                            restart finds version 3
#   index truncated to 6000 bytes      the complete slot 0 may be used,
#                                      but no block without its record
#   the newest superblock garbled      the other slot is used: reused
#   group 0's records garbled          only group 0 is read upstream
#
# and the cache directory's header: a damaged one is replaced (objects
# are still reused), one from a newer version is refused, untouched.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires od --version
requires truncate --version
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
SET_VERSION="$top_builddir/tests/set-index-version"
requires test -x "$SET_VERSION"

SIZE=$((8 * 1024 * 1024))
BS=65536
GROUP_BYTES=$((64 * BS))      # one group record covers 64 blocks
SAMPLE_BYTES=32768            # fscache-validate=sample reads 8 x 4K

up="$TMP/up.img"
cache="$TMP/cache"
sock="$TMP/sock"
pid="$TMP/nbdkit.pid"
uri="nbd+unix:///?socket=$sock"
make_random "$up" $SIZE


run=""
# Start, read everything, check it, make sure the proxy is still
# alive, stop.  $1 names the run; more parameters follow.
run_proxy ()
{
  run="$1"; shift
  rm -f "$TMP/$run.stats"
  # -v keeps nbdkit's stderr (warnings) once it is in the background.
  start_nbdkit -P "$pid" -U "$sock" -v --log=stderr \
    --filter="$FILTER" --filter=log \
    file "$up" fscache-dir="$cache" fscache-key=corrupt \
    fscache-readahead=0 \
    logfile="$TMP/$run.log" fscache-stats="$TMP/$run.stats" "$@" \
    2>"$TMP/$run.err"
  rm -f "$TMP/out.img"
  nbdcopy "$uri" "$TMP/out.img" || fail "$run: client error"
  cmp "$TMP/out.img" "$up" || fail "$run: data differs"
  kill -0 "$(cat "$pid")" || fail "$run: nbdkit died"
  stop_nbdkit "$pid"
  [ -s "$TMP/$run.stats" ] || fail "$run: no stats at exit (crashed?)"
}

expect_stat ()           # NAME OP VALUE (for the last run)
{
  local v
  v="$(stat_value "$TMP/$run.stats" "$1")"
  if ! test "$v" "$2" "$3"; then
    cat "$TMP/$run.stats" >&2
    grep ' error: ' "$TMP/$run.err" | tail >&2
    fail "$run: $1 = $v, expected $2 $3"
  fi
}

upstream_bytes () { log_read_bytes "$TMP/$run.log"; }
samples () { echo $(( $(stat_value "$TMP/$run.stats" objects_opened) * SAMPLE_BYTES )); }
discard_lines () { grep -c 'discarding cached data' "$TMP/$run.err" || true; }

# Write bytes (given as printf %b escapes) at OFFSET of FILE.
poke () { printf '%b' "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
# Overwrite N bytes at OFFSET of FILE with random bytes.
garble () { head -c "$3" /dev/urandom | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
# Little-endian u64 at OFFSET of FILE.
le64 () { od -An -tu8 -j "$2" -N8 --endian=little "$1" | tr -d ' '; }

# ---- fill, and keep a pristine copy -------------------------------------
run_proxy fill
expect_stat objects_created -eq 1
idx="$(find "$cache/objects" -name '*.idx')"
[ "$(echo "$idx" | wc -l)" -eq 1 ] || fail "expected one object: $idx"
base="${idx%.idx}"
mkdir "$TMP/pristine"
cp -p "$base".* "$TMP/pristine/"
run_proxy warm
expect_stat objects_reused -eq 1
expect_stat hit_bytes -eq $SIZE
cp -p "$base".* "$TMP/pristine/"       # as closed cleanly after a reuse

restore ()
{
  rm -f "$base".*
  cp -p "$TMP/pristine/"* "$(dirname "$base")/"
}

# ---- damage that must discard the object --------------------------------
# cold_case NAME REASON DAMAGE-COMMAND [PROXY PARAMS...]
cold_case ()
{
  local name="$1" reason="$2" damage="$3"
  shift 3
  restore
  eval "$damage"
  run_proxy "$name" "$@"
  expect_stat hit_bytes -eq 0
  expect_stat miss_bytes -eq $SIZE
  expect_stat objects_reused -eq 0
  expect_stat objects_created -eq 1
  [ "$(upstream_bytes)" -ge $SIZE ] ||
    fail "$run: only $(upstream_bytes) bytes read upstream"
  if [ "$reason" = new ]; then
    expect_stat objects_discarded -eq 0
    [ "$(discard_lines)" -eq 0 ] || fail "$run: a discard was logged"
  else
    expect_stat objects_discarded -eq 1
    [ "$(discard_lines)" -eq 1 ] ||
      { grep ' error: ' "$TMP/$run.err" >&2;
        fail "$run: expected one line saying 'discarding cached data'"; }
    grep -q "discarding cached data ($reason)" "$TMP/$run.err" ||
      { grep 'discarding' "$TMP/$run.err" >&2;
        fail "$run: the discard line does not name '$reason'"; }
  fi
  # The cold read rebuilt it: the next restart reuses all of it.
  run_proxy "$name-again" "$@"
  expect_stat objects_reused -eq 1
  expect_stat objects_discarded -eq 0
  expect_stat hit_bytes -eq $SIZE
  [ "$(upstream_bytes)" -eq "$(samples)" ] ||
    fail "$run: $(upstream_bytes) bytes read upstream after the rebuild"
  echo "$name: cold ($reason), then reused"
}

cold_case trunc0 new 'truncate -s 0 "$base.idx"'
cold_case trunc100 truncated-index 'truncate -s 100 "$base.idx"'
cold_case garbled-sbs bad-checksum \
  'garble "$base.idx" 200 64; garble "$base.idx" $((4096 + 200)) 64'
cold_case zeroed bad-magic \
  'sz=$(stat -c %s "$base.idx"); head -c $sz /dev/zero > "$base.idx"'
cold_case future-version unsupported-version \
  '"$SET_VERSION" "$base.idx" 4'
cold_case short-data data-file-size 'truncate -s $((SIZE / 2)) "$base.data"'
cold_case long-data data-file-size 'truncate -s $((SIZE + 4096)) "$base.data"'
if [ -f "$TMP/pristine/$(basename "$base").sums" ]; then
  cold_case short-sums data-file-size 'truncate -s 1000 "$base.sums"'
fi
cold_case block-size block-size-changed ':' fscache-block-size=128K

# ---- damage the format survives ----------------------------------------
# The format before pieces (docs/format.md, "Index versions"): read as
# it is, and upgraded.
restore
"$SET_VERSION" "$base.idx" 1
run_proxy version1
expect_stat objects_reused -eq 1
expect_stat objects_upgraded -eq 1
expect_stat hit_bytes -eq $SIZE
[ "$(discard_lines)" -eq 0 ] || fail "$run: discarded"
[ "$(grep -c 'format version 1 read and upgraded to version 3' \
      "$TMP/$run.err")" -eq 1 ] ||
  { grep ' error: ' "$TMP/$run.err" >&2; fail "$run: no upgrade line"; }
run_proxy version1-again
expect_stat objects_reused -eq 1
expect_stat objects_upgraded -eq 0
expect_stat hit_bytes -eq $SIZE
for slot in 0 4096; do
  v="$(od -An -tu4 -j $((slot + 8)) -N4 --endian=little "$base.idx" | tr -d ' ')"
  [ "$v" -eq 3 ] || fail "$run: superblock at $slot has version $v"
done
echo "version1: read, upgraded, version 3 after two restarts"

# Truncated inside slot 1: slot 0 (complete) may be used, but with no
# group record left nothing may be served from the cache.
restore
truncate -s 6000 "$base.idx"
run_proxy trunc6000
expect_stat hit_bytes -eq 0
expect_stat miss_bytes -eq $SIZE
[ "$(upstream_bytes)" -ge $SIZE ] || fail "$run: served from a lost index"
[ "$(discard_lines)" -le 1 ] || fail "$run: more than one discard line"
echo "trunc6000: nothing served from the cache" \
     "(reused $(stat_value "$TMP/$run.stats" objects_reused)," \
     "discarded $(stat_value "$TMP/$run.stats" objects_discarded))"

# The newest superblock garbled: the other slot still describes it.
restore
seq0="$(le64 "$base.idx" 16)"
seq1="$(le64 "$base.idx" $((4096 + 16)))"
if [ "$seq1" -gt "$seq0" ]; then newest=4096; else newest=0; fi
garble "$base.idx" $((newest + 200)) 64
run_proxy newest-sb-garbled
expect_stat objects_reused -eq 1
expect_stat objects_discarded -eq 0
expect_stat hit_bytes -eq $SIZE
[ "$(discard_lines)" -eq 0 ] || fail "$run: discarded"
echo "newest-sb-garbled: the older slot (seq $seq0/$seq1) was used"

# Group 0's two record slots garbled: its 64 blocks are read again,
# the rest is served from the cache.
restore
garble "$base.idx" $((8192 + 100)) 16
garble "$base.idx" $((8192 + 1024 + 100)) 16
run_proxy group0-garbled
expect_stat objects_reused -eq 1
expect_stat objects_discarded -eq 0
expect_stat miss_bytes -eq $GROUP_BYTES
expect_stat hit_bytes -eq $((SIZE - GROUP_BYTES))
[ "$(upstream_bytes)" -eq $((GROUP_BYTES + $(samples))) ] ||
  fail "$run: $(upstream_bytes) bytes read upstream"
echo "group0-garbled: one group refetched"

# ---- the cache directory's header ---------------------------------------
# Damaged: replaced; the objects validate themselves and are reused.
restore
hdr="$cache/fscache.hdr"
cp -p "$hdr" "$TMP/hdr.orig"
garble "$hdr" 100 8
run_proxy header-garbled
expect_stat objects_reused -eq 1
expect_stat hit_bytes -eq $SIZE
cmp -s "$hdr" "$TMP/hdr.orig" && fail "$run: damaged header kept"
echo "header-garbled: header rewritten, object reused"

# From a newer version: refused, and nothing touched.
poke "$hdr" 8 "\x02"
find "$cache" -printf '%p %s %T@\n' | sort > "$TMP/before"
rm -f "$TMP/v2.pid"
if nbdkit -P "$TMP/v2.pid" -U "$TMP/v2.sock" --filter="$FILTER" \
     file "$up" fscache-dir="$cache" fscache-key=corrupt 2>"$TMP/v2.err"; then
  for (( i=0; i<100; i++ )); do [ -s "$TMP/v2.pid" ] && break; sleep 0.05; done
  kill "$(cat "$TMP/v2.pid")" 2>/dev/null || true
  fail "started on a cache directory from a newer version"
fi
grep -q 'newer' "$TMP/v2.err" ||
  { cat "$TMP/v2.err" >&2; fail "no clear message for a newer header"; }
find "$cache" -printf '%p %s %T@\n' | sort | diff "$TMP/before" - ||
  fail "the newer cache directory was modified"
echo "header-version-2: refused, untouched"

echo "$0: PASS"
