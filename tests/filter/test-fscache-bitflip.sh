#!/usr/bin/env bash
# nbd-fscache: corrupt cached blocks in the data file behind the
# proxy's back (bit rot, a stray writer) and check what fscache-verify
# buys.
#
#  1. Fill the cache, stop the proxy, flip one byte in each of 3 cached
#     blocks of objects/@xx/*.data.
#  2. Restart (fscache-verify defaults to true): the full read is
#     identical to upstream, verify_failures = 3, and exactly those 3
#     blocks (plus the coherency sample) were read upstream again.
#  3. The blocks were refilled: one more restart reads everything from
#     the cache, no failure.
#  4. Flip 2 bytes again and restart with fscache-verify=false: the
#     corrupted bytes ARE served (cmp finds exactly those 2 bytes
#     different), nothing is counted and nothing goes upstream.  This
#     is what verification buys.
#  5. A restart with verification on again catches both and serves the
#     right data.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires od --version
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"

SIZE=$((32 * 1024 * 1024))
BS=65536                      # the default fscache-block-size
SAMPLE_BYTES=32768            # fscache-validate=sample reads 8 x 4K

up="$TMP/up.img"
cache="$TMP/cache"
sock="$TMP/sock"
pid="$TMP/nbdkit.pid"
uri="nbd+unix:///?socket=$sock"
make_random "$up" $SIZE


# Run the proxy once: full read into $TMP/out.img, then stop it so
# that the stats file is final.  $1 names the run; more parameters
# follow.
run=""
run_proxy ()
{
  run="$1"; shift
  start_nbdkit -P "$pid" -U "$sock" --filter="$FILTER" --filter=log \
    file "$up" fscache-dir="$cache" fscache-key=bitflip \
    fscache-readahead=0 \
    logfile="$TMP/$run.log" fscache-stats="$TMP/$run.stats" "$@"
  rm -f "$TMP/out.img"
  nbdcopy "$uri" "$TMP/out.img" || fail "$run: client error"
  stop_nbdkit "$pid"
}

expect_stat ()           # NAME OP VALUE (for the last run)
{
  local v
  v="$(stat_value "$TMP/$run.stats" "$1")"
  if ! test "$v" "$2" "$3"; then
    cat "$TMP/$run.stats" >&2
    fail "$run: $1 = $v, expected $2 $3"
  fi
}

upstream_bytes ()
{
  log_read_bytes "$TMP/$run.log"
}

# Replace the byte at OFFSET of FILE by its complement.
flip_byte ()
{
  local b
  b="$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')"
  printf "$(printf '\\%03o' $(( b ^ 0xff )))" |
    dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# ---- 1. fill -----------------------------------------------------------
run_proxy fill
cmp "$TMP/out.img" "$up" || fail "fill: data differs"
expect_stat objects_created -eq 1
expect_stat fill_bytes -eq $SIZE

data="$(find "$cache/objects" -name '*.data')"
[ "$(echo "$data" | wc -l)" -eq 1 ] || fail "expected one data file: $data"
[ "$(stat -c %s "$data")" -eq $SIZE ] || fail "data file has the wrong size"
cmp "$data" "$up" || fail "the data file does not hold the upstream bytes"

# ---- 2. flip a byte in 3 blocks; verify catches each -------------------
blocks=(3 200 511)            # the first, middle, last part of the image
for b in "${blocks[@]}"; do
  flip_byte "$data" $(( b * BS + (RANDOM % BS) ))
done
[ "$( { cmp -l "$data" "$up" || true; } | wc -l)" -eq 3 ] ||
  fail "could not corrupt"

run_proxy verify
cmp "$TMP/out.img" "$up" || fail "verify: corrupted data was served"
expect_stat verify_failures -eq 3
expect_stat hit_bytes -eq $(( SIZE - 3 * BS ))
expect_stat miss_bytes -eq $(( 3 * BS ))
expect_stat objects_reused -eq 1
expect_stat withdrawals -eq 0
nopen="$(stat_value "$TMP/$run.stats" objects_opened)"
[ "$(upstream_bytes)" -eq $(( 3 * BS + nopen * SAMPLE_BYTES )) ] ||
  fail "verify: $(upstream_bytes) bytes read upstream, expected the 3" \
       "bad blocks and the coherency sample"
cmp "$data" "$up" || fail "verify: the bad blocks were not refilled"

# ---- 3. repaired for good ----------------------------------------------
run_proxy repaired
cmp "$TMP/out.img" "$up" || fail "repaired: data differs"
expect_stat verify_failures -eq 0
expect_stat hit_bytes -eq $SIZE
nopen="$(stat_value "$TMP/$run.stats" objects_opened)"
[ "$(upstream_bytes)" -eq $(( nopen * SAMPLE_BYTES )) ] ||
  fail "repaired: $(upstream_bytes) bytes read upstream"

# ---- 4. without verification the corruption is served ------------------
off1=$(( 17 * BS + 1234 ))
off2=$(( 400 * BS + BS - 1 ))
flip_byte "$data" $off1
flip_byte "$data" $off2
run_proxy noverify fscache-verify=false
diffs="$( { cmp -l "$TMP/out.img" "$up" || true; } |
         awk '{ print $1 - 1 }' | tr '\n' ' ')"
[ "$diffs" = "$off1 $off2 " ] ||
  fail "noverify: expected exactly bytes $off1 and $off2 to differ," \
       "got: ${diffs:-none}"
expect_stat verify_failures -eq 0
expect_stat hit_bytes -eq $SIZE
nopen="$(stat_value "$TMP/$run.stats" objects_opened)"
[ "$(upstream_bytes)" -eq $(( nopen * SAMPLE_BYTES )) ] ||
  fail "noverify: $(upstream_bytes) bytes read upstream"

# ---- 5. the checksums still catch it once verification is back ---------
run_proxy reverify
cmp "$TMP/out.img" "$up" || fail "reverify: corrupted data was served"
expect_stat verify_failures -eq 2
expect_stat miss_bytes -eq $(( 2 * BS ))

echo "$0: PASS"
