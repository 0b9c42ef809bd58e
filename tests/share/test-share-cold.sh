#!/usr/bin/env bash
# nbd-fscache: one object for the whole host, cold.
#
# Four proxy processes (nbdkit --filter=fscache, each on its own Unix
# socket) with one cache directory and one fscache-key, in front of one
# bandwidth-bound upstream (nbdkit file + rate filter, 64 Mbit/s, a
# 32 MiB image: about 4 s for one copy).  Each process gets its own
# reader, an nbdcopy of the whole export, all four started at once on
# an empty cache.  The processes share the object (the first to open
# it owns it, the others join it), so:
#
#  - every copy is identical to the image (cmp);
#  - the upstream serves at most 1.1 x the export in all (each block
#    once for the host, plus coherency samples and slack), where
#    processes that each cached on their own, or served uncached
#    (today's objects_busy), would cost about 4 x.
#
# Then, the readers gone and the processes still running, a second
# round of four copies at once costs the upstream nothing but the
# coherency samples: what the four filled is in the one object.
#
# Truth: the image (cmp), the upstream's log filter (bytes of every
# read it served).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires nbdkit --filter=log --filter=rate null --dump-plugin
requires test -r "$FILTER"

SIZE=$((32 * 1024 * 1024))
NPROC=4
SAMPLE_MAX=32768                # validate=sample: 8 x 4 KiB per open
img="$TMP/up.img"
log="$TMP/up.log"
make_random "$img" $SIZE

# The bandwidth-bound link: the rate is for all connections together,
# with a small bucket (the default, 2 s, would let 16 MB through at
# once).
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log --filter=rate file "$img" \
  logfile="$log" rate=64M burstiness=0.1

for (( n=1; n<=NPROC; n++ )); do
  start_nbdkit -P "$TMP/px$n.pid" -U "$TMP/px$n.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-key=shared \
    fscache-stats="$TMP/px$n.stats" 2>"$TMP/px$n.err"
done

connects () { grep -c ' Connect ' "$log" || true; }

# copies ROUND: one nbdcopy per process, all at once, each checked.
copies ()
{
  local n pids=() rc=0
  for (( n=1; n<=NPROC; n++ )); do
    rm -f "$TMP/copy$n.img"
    nbdcopy "nbd+unix:///?socket=$TMP/px$n.sock" "$TMP/copy$n.img" &
    pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n" || rc=1; done
  [ $rc -eq 0 ] || fail "$1: an nbdcopy failed"
  for (( n=1; n<=NPROC; n++ )); do
    cmp "$img" "$TMP/copy$n.img" || fail "$1: the copy through proxy $n differs"
  done
}

t0=$(date +%s.%N)
copies cold
t=$(seconds_since "$t0")
cold=$(log_read_bytes "$log")
c1=$(connects)
echo "cold: $NPROC copies at once in ${t}s, $cold bytes upstream" \
     "($(awk -v a="$cold" -v b=$SIZE 'BEGIN { printf "%.3f", a / b }') x" \
     "the export) over $c1 upstream connections"
for (( n=1; n<=NPROC; n++ )); do
  echo "  px$n: $(grep -E '^(hit_bytes|miss_bytes|objects_busy|share_[a-z]+) ' \
                   "$TMP/px$n.stats" | tr '\n' ' ')"
done
[ "$cold" -ge "$SIZE" ] ||
  fail "cold: only $cold bytes upstream for a $SIZE bytes export (not cold?)"
[ "$cold" -le $((SIZE + SIZE / 10)) ] ||
  fail "cold: the upstream served $cold bytes, over 1.1 x the export" \
       "($SIZE): the processes did not fill one object together"

# Warm: the same four processes, four new copies at once.
copies warm
warm=$(( $(log_read_bytes "$log") - cold ))
c2=$(( $(connects) - c1 ))
echo "warm: $warm bytes upstream over $c2 upstream connections"
[ "$warm" -le $((SAMPLE_MAX * c2)) ] ||
  fail "warm: the upstream served $warm bytes, more than the coherency" \
       "samples ($SAMPLE_MAX x $c2 connections)"

for (( n=1; n<=NPROC; n++ )); do
  stop_nbdkit "$TMP/px$n.pid"
done
echo "$0: PASS"
