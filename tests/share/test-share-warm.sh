#!/usr/bin/env bash
# nbd-fscache: one object for the whole host, warm.
#
# Process 0 reads a 32 MiB export whole (nbdcopy) and keeps a
# connection open: it holds the object (the owner).  Then four more
# processes on the same cache directory and key read everything at
# once (one nbdcopy each).  Each process has its own upstream server
# (nbdkit file + log filter, the same image), so the upstream reads of
# every process are counted apart:
#
#  - every copy is identical to the image (cmp);
#  - each of the four reads from its upstream nothing but the
#    coherency sample: only reads the sample makes (their offsets and
#    lengths measured first, in a baseline: a process on another cache
#    directory with the same key that opens the export and reads
#    nothing), at most one sample per upstream connection;
#  - the owner's upstream serves nothing while the four read: their
#    reads were hits, not misses fetched by the owner.
#
# Truth: the image (cmp), the upstreams' log filters.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires nbdkit --filter=log null --dump-plugin
requires python3 -c 'import nbd'
requires test -r "$FILTER"

SIZE=$((32 * 1024 * 1024))
NPROC=4
img="$TMP/up.img"
make_random "$img" $SIZE

# proxy N CACHEDIR: process N, with its own upstream server uN.
proxy ()
{
  start_nbdkit -P "$TMP/u$1.pid" -U "$TMP/u$1.sock" \
    --filter=log file "$img" logfile="$TMP/u$1.log"
  start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/u$1.sock" \
    fscache-dir="$2" fscache-key=shared \
    fscache-stats="$TMP/px$1.stats" 2>"$TMP/px$1.err"
}
uri () { echo "nbd+unix:///?socket=$TMP/px$1.sock"; }

# Upstream reads of a log as "OFFSET COUNT" lines (hex, as logged).
reads_of ()
{
  grep ' Read id=' "$1" | grep -v '\.\.\.Read' |
    sed -E 's/.* offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+).*/\1 \2/' | sort
}
connects () { grep -c ' Connect ' "$1" || true; }

# ---- baseline: what the coherency sample reads ------------------------
proxy b "$TMP/cache-baseline"
python3 -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.shutdown()
' "$(uri b)"
stop_nbdkit "$TMP/pxb.pid"
stop_nbdkit "$TMP/ub.pid"
sample_bytes=$(log_read_bytes "$TMP/ub.log")
reads_of "$TMP/ub.log" | sort -u > "$TMP/sample.reads"
echo "baseline: the coherency sample is $(wc -l < "$TMP/sample.reads")" \
     "reads, $sample_bytes bytes, over $(connects "$TMP/ub.log") connection(s)"
[ "$sample_bytes" -gt 0 ] || fail "baseline: no sample read (validate=sample?)"

# ---- the owner, warm ------------------------------------------------------
proxy 0 "$TMP/cache"
nbdcopy "$(uri 0)" "$TMP/copy0.img"
cmp "$img" "$TMP/copy0.img" || fail "owner: the cold copy differs"
hold_export "$(uri 0)" "$TMP/release" "$TMP/held"
owner_before=$(log_read_bytes "$TMP/u0.log")
echo "owner: cold copy, $owner_before bytes upstream"

# ---- four more processes, at once -----------------------------------------
for (( n=1; n<=NPROC; n++ )); do proxy $n "$TMP/cache"; done
pids=()
t0=$(date +%s.%N)
for (( n=1; n<=NPROC; n++ )); do
  nbdcopy "$(uri $n)" "$TMP/copy$n.img" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "an nbdcopy failed"; done
echo "warm: $NPROC copies at once in $(seconds_since "$t0")s"
for (( n=1; n<=NPROC; n++ )); do
  cmp "$img" "$TMP/copy$n.img" || fail "process $n: the copy differs"
done

for (( n=1; n<=NPROC; n++ )); do
  b=$(log_read_bytes "$TMP/u$n.log")
  c=$(connects "$TMP/u$n.log")
  extra=$(reads_of "$TMP/u$n.log" | sort -u | comm -23 - "$TMP/sample.reads")
  echo "process $n: $b bytes upstream over $c connection(s)"
  if [ -n "$extra" ]; then
    echo "$extra" | head -5 >&2
    fail "process $n: $(echo "$extra" | wc -l) distinct upstream reads" \
         "beyond the coherency sample (the first above): misses on a warm object"
  fi
  [ "$b" -le $((sample_bytes * c)) ] ||
    fail "process $n: $b bytes upstream, more than one sample" \
         "($sample_bytes) per upstream connection ($c)"
done
owner_after=$(log_read_bytes "$TMP/u0.log")
[ "$owner_after" -eq "$owner_before" ] ||
  fail "the owner's upstream served $((owner_after - owner_before)) bytes" \
       "while the others read a warm object"

touch "$TMP/release"
for (( n=0; n<=NPROC; n++ )); do stop_nbdkit "$TMP/px$n.pid"; done
for (( n=0; n<=NPROC; n++ )); do
  echo "  px$n: $(grep -E '^(hit_bytes|miss_bytes|objects_busy|share_[a-z]+) ' \
                   "$TMP/px$n.stats" | tr '\n' ' ')"
done
echo "$0: PASS"
