#!/usr/bin/env bash
# nbd-fscache: a process that opens a shared object with settings the
# owner cannot share is refused, and the owner goes on.
#
# Process 1 (fscache-block-size=64K, fscache-validate=sample: the
# defaults) caches a 16 MiB export and keeps a connection open: it owns
# the object.  Then, on the same cache directory and key:
#
#  - process 2 with fscache-block-size=128K, and
#  - process 3 with fscache-validate=size
#
# must refuse their clients: nbdinfo fails, and nbdkit's stderr says
# "refusing" (instead of restarting the object cold under the owner, or
# serving it silently uncached).  Afterwards:
#
#  - process 1 still serves the image (nbdcopy, cmp) from its cache:
#    its upstream serves nothing but, at most, one coherency sample;
#  - process 4, with the owner's settings, joins and reads the image
#    from the cache (its upstream: at most the sample per connection).
#
# Truth: the image (cmp), nbdinfo's exit status, the upstreams' log
# filters (each process has its own upstream server).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdinfo --version
requires cmp --version
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"

SIZE=$((16 * 1024 * 1024))
SAMPLE_MAX=32768
img="$TMP/up.img"
make_random "$img" $SIZE

proxy ()                        # N fscache-PARAM=VALUE...
{
  local n="$1"
  shift
  start_nbdkit -P "$TMP/u$n.pid" -U "$TMP/u$n.sock" \
    --filter=log file "$img" logfile="$TMP/u$n.log"
  start_nbdkit -P "$TMP/px$n.pid" -U "$TMP/px$n.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/u$n.sock" \
    fscache-dir="$TMP/cache" fscache-key=shared \
    fscache-stats="$TMP/px$n.stats" "$@" 2>"$TMP/px$n.err"
}
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }
connects () { grep -c ' Connect ' "$1" || true; }

proxy 1
nbdcopy "$(uri 1)" "$TMP/copy1.img"
cmp "$img" "$TMP/copy1.img" || fail "owner: the cold copy differs"
hold_export "$(uri 1)" "$TMP/release" "$TMP/held"

refused ()                      # N WHAT
{
  if nbdinfo "$(uri "$1")" > "$TMP/info$1.out" 2>&1; then
    head -3 "$TMP/info$1.out"
    fail "process $1 ($2): nbdinfo succeeded; the process was not refused"
  fi
  grep -q refusing "$TMP/px$1.err" || {
    tail -5 "$TMP/px$1.err" >&2
    fail "process $1 ($2): nbdinfo failed, but nbdkit's stderr does not" \
         "say \"refusing\""
  }
  echo "process $1 ($2): refused: $(grep -m1 refusing "$TMP/px$1.err")"
}
proxy 2 fscache-block-size=128K
refused 2 fscache-block-size=128K
proxy 3 fscache-validate=size
refused 3 fscache-validate=size

# The owner is unharmed: everything from its cache.
b0=$(log_read_bytes "$TMP/u1.log")
c0=$(connects "$TMP/u1.log")
rm -f "$TMP/copy1.img"
nbdcopy "$(uri 1)" "$TMP/copy1.img"
cmp "$img" "$TMP/copy1.img" || fail "owner: after the refusals the data differs"
b=$(( $(log_read_bytes "$TMP/u1.log") - b0 ))
c=$(( $(connects "$TMP/u1.log") - c0 ))
echo "owner after the refusals: $b bytes upstream over $c connection(s)"
[ "$b" -le $((SAMPLE_MAX * c)) ] ||
  fail "owner: $b bytes read upstream after the refusals: its cache was" \
       "discarded or withdrawn"

# A process with the owner's settings joins, and hits.
proxy 4
nbdcopy "$(uri 4)" "$TMP/copy4.img"
cmp "$img" "$TMP/copy4.img" || fail "process 4: the copy differs"
b=$(log_read_bytes "$TMP/u4.log")
c=$(connects "$TMP/u4.log")
echo "process 4 (the owner's settings): $b bytes upstream over $c connection(s)"
[ "$b" -le $((SAMPLE_MAX * c)) ] ||
  fail "process 4: $b bytes read upstream: it did not share the owner's object"

touch "$TMP/release"
for n in 1 2 3 4; do stop_nbdkit "$TMP/px$n.pid"; done
for n in 1 2 3 4; do
  echo "  px$n: $(grep -E '^(objects_busy|objects_discarded|share_[a-z]+) ' \
                   "$TMP/px$n.stats" 2>/dev/null | tr '\n' ' ')"
done
echo "$0: PASS"
