#!/usr/bin/env bash
# nbd-fscache: kill -9 of any process sharing an object, the owner
# included, while they fill it.
#
# Four proxy processes on one cache directory and key, in front of one
# bandwidth-bound upstream (nbdkit file + rate filter, 32 Mbit/s, a
# 96 MiB image: about 25 s to fetch it all once, so that every round
# kills during fills), each with a checking
# reader: one connection reading the export in 256 KiB pieces in a
# random order, pass after pass, every piece compared with the image.
# Process 1 (its reader connects first) owns the object.  10 rounds:
#
#  - a random moment (0.2 to 1 s), then, once an upstream read is in
#    flight (the log filter: a read issued, not yet answered), kill -9
#    of the victim: the current owner (the process that holds the
#    index's flock, from /proc/locks) in rounds 1, 4, 7 and 10, else a
#    random one of the four (the owner, or not);
#  - the victim's reader loses its connection: it must have read no
#    wrong data before;
#  - if the owner died: another process takes the object over with no
#    restart (a live process holds the flock again);
#  - every survivor's reader goes on without an error (a request in
#    flight at the kill is served from the upstream or the new owner)
#    and makes progress;
#  - the victim restarts on the same socket with a new reader.
#
# Afterwards (the link made fast) the same processes (those never
# killed are not restarted) go on reading until a whole pass of every
# reader costs the upstream nothing: every process serves the whole
# export from the one object
# (processes that served uncached would read it upstream on every
# pass).  Then all stop cleanly, `nbd-fscache check` finds every
# cached block's checksum right, and a fresh process on the cache reads
# the image identical (cmp) with nothing upstream but the coherency
# sample.
#
# Truth: the image (every read compared, cmp), the upstream's log
# filter, /proc/locks.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires test -r /proc/locks
requires test -x "$TOOL"
requires nbdkit --filter=log --filter=rate null --dump-plugin
requires python3 -c 'import nbd'
requires test -r "$FILTER"

SIZE=$((96 * 1024 * 1024))
NPROC=4
ROUNDS=10
SAMPLE_MAX=32768
img="$TMP/up.img"
log="$TMP/up.log"
cache="$TMP/cache"
make_random "$img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log --filter=rate file "$img" \
  logfile="$log" rate=32M rate-file="$TMP/rate" burstiness=0.1

# reader.py URI IMAGE FAILFILE PROGRESSFILE STOPFILE: random passes of
# 256 KiB reads, each compared with IMAGE.  PROGRESSFILE: "READS
# PASSES", rewritten every 4 reads.  A wrong read is written to
# FAILFILE (exit 1); a lost connection exits 3.
cat > "$TMP/reader.py" <<'PY'
import mmap, nbd, os, random, sys
uri, img, failf, progf, stopf = sys.argv[1:]
with open(img, "rb") as f:
    data = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
offs = list(range(0, size, 256 << 10))
reads = passes = 0
def progress():
    with open(progf + ".tmp", "w") as f:
        f.write("%d %d\n" % (reads, passes))
    os.rename(progf + ".tmp", progf)
progress()
while not os.path.exists(stopf):
    random.shuffle(offs)
    for off in offs:
        n = min(256 << 10, size - off)
        try:
            buf = h.pread(n, off)
        except nbd.Error as e:
            sys.stderr.write("pass %d: read at %d: %s\n" % (passes, off, e))
            sys.exit(3)
        if buf != data[off:off + n]:
            open(failf, "a").write("pass %d: wrong data at %d\n" % (passes, off))
            sys.exit(1)
        reads += 1
        if reads % 4 == 0:
            progress()
        if os.path.exists(stopf):
            break
    else:
        passes += 1
    progress()
h.shutdown()
PY

# Process N, generation G (restarts): socket pxN.sock, reader N.G.
declare -A gen reader_pid
start_proxy ()                  # N
{
  start_nbdkit -P "$TMP/px$1.pid" -U "$TMP/px$1.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$cache" fscache-key=shared \
    fscache-stats="$TMP/px$1.stats" 2>>"$TMP/px$1.err"
}
start_reader ()                 # N
{
  local n=$1 g=$(( ${gen[$1]:-0} + 1 ))
  gen[$n]=$g
  python3 "$TMP/reader.py" "nbd+unix:///?socket=$TMP/px$n.sock" "$img" \
    "$TMP/fail.$n.$g" "$TMP/prog.$n.$g" "$TMP/stop" 2>"$TMP/reader.$n.$g.err" &
  reader_pid[$n]=$!
  cleanup_fn "touch '$TMP/stop'; kill $! 2>/dev/null"
  wait_until test -s "$TMP/prog.$n.$g" ||
    { cat "$TMP/reader.$n.$g.err" >&2; fail "reader $n.$g did not connect"; }
}
reads_of () { local r; read -r r _ < "$TMP/prog.$1.${gen[$1]}"; echo "$r"; }
passes_of () { local p; read -r _ p < "$TMP/prog.$1.${gen[$1]}"; echo "$p"; }
check_reader_alive ()           # N
{
  if ! kill -0 "${reader_pid[$1]}" 2>/dev/null; then
    cat "$TMP/fail.$1.${gen[$1]}" "$TMP/reader.$1.${gen[$1]}.err" >&2 2>/dev/null
    fail "round $round: the reader of survivor $1 stopped (error above)"
  fi
}

# The pid that holds the index's flock (the owner), or nothing.
owner_pid ()
{
  local idx ino
  idx=$(find "$cache/objects" -name '*.idx' 2>/dev/null | head -1)
  [ -n "$idx" ] || return 0
  ino=$(stat -c %i "$idx")
  awk -v ino="$ino" '$2 == "FLOCK" && $4 == "WRITE" {
      n = split ($6, a, ":"); if (a[n] == ino) print $5 }' /proc/locks |
    head -1
}
proc_of_pid ()                  # PID: the process number N, or nothing
{
  local n
  for (( n=1; n<=NPROC; n++ )); do
    [ "$(cat "$TMP/px$n.pid")" = "$1" ] && { echo $n; return; }
  done
}
has_owner () { local p; p=$(owner_pid); [ -n "$p" ] && [ -n "$(proc_of_pid "$p")" ]; }
inflight ()
{
  [ $(( $(grep -c ' Read id=' "$log" || true) -
        $(grep -c '\.\.\.Read id=' "$log" || true) )) -gt 0 ]
}

for (( n=1; n<=NPROC; n++ )); do start_proxy $n; done
start_reader 1
wait_until has_owner || fail "process 1's reader connected, yet nobody holds the object"
[ "$(proc_of_pid "$(owner_pid)")" = 1 ] || fail "the owner is not process 1"
for (( n=2; n<=NPROC; n++ )); do start_reader $n; done

owner_kills=0
for (( round=1; round<=ROUNDS; round++ )); do
  owner=$(proc_of_pid "$(owner_pid)")
  [ -n "$owner" ] || fail "round $round: no process holds the object"
  if (( round % 3 == 1 )); then victim=$owner
  else victim=$(( RANDOM % NPROC + 1 )); fi
  [ "$victim" = "$owner" ] && owner_kills=$((owner_kills + 1))

  sleep "0.$(( RANDOM % 9 + 2 ))"         # a random moment, not a wait
  wait_until inflight || fail "round $round: no upstream read in flight for 20 s"
  declare -A before=()
  for (( n=1; n<=NPROC; n++ )); do before[$n]=$(reads_of $n); done
  kill9_nbdkit "$TMP/px$victim.pid"
  wait "${reader_pid[$victim]}" && st=0 || st=$?
  if [ -s "$TMP/fail.$victim.${gen[$victim]}" ]; then
    cat "$TMP/fail.$victim.${gen[$victim]}" >&2
    fail "round $round: the victim's reader read wrong data before the kill"
  fi
  [ $st -eq 3 ] || fail "round $round: the victim's reader exited $st, not" \
                        "with a lost connection (3)"

  # (A survivor's reader that failed is said first.)
  survivors_alive ()
  {
    local n
    for (( n=1; n<=NPROC; n++ )); do
      [ $n = "$victim" ] || check_reader_alive $n
    done
  }
  new_owner_or_error () { survivors_alive; has_owner; }
  if [ "$victim" = "$owner" ]; then
    wait_until new_owner_or_error ||
      fail "round $round: the owner (process $victim) was killed and no" \
           "other process took the object over"
  fi
  new_owner=$(proc_of_pid "$(owner_pid)")
  # Every survivor goes on without an error: 2 more reads each.
  survivors_progress ()
  {
    local n
    for (( n=1; n<=NPROC; n++ )); do
      [ $n = "$victim" ] && continue
      check_reader_alive $n
      [ "$(reads_of $n)" -ge $(( before[$n] + 2 )) ] || return 1
    done
  }
  wait_until survivors_progress ||
    fail "round $round: a survivor made no progress for 20 s after the kill"
  echo "round $round: killed process $victim$([ "$victim" = "$owner" ] &&
        echo " (the owner)"); owner now process ${new_owner:-none};" \
       "$(log_read_bytes "$log") bytes read upstream so far"
  start_proxy "$victim"
  start_reader "$victim"
done
[ $owner_kills -ge 4 ] || fail "the owner was killed only $owner_kills times"

# Every process serves the whole export from the object: poll passes
# until one whole pass of every reader reads nothing upstream.  (The
# rest of the export is fetched first: waits go on as long as the
# readers make progress, and fail after 20 s without any.)
total_reads ()
{
  local n t=0
  for (( n=1; n<=NPROC; n++ )); do t=$(( t + $(reads_of $n) )); done
  echo $t
}
wait_progressing ()             # CMD...: wait_until CMD, while reads go on
{
  local last=-1 now
  while :; do
    wait_until "$@" && return 0
    now=$(total_reads)
    [ "$now" -gt "$last" ] || return 1
    last=$now
  done
}
all_passed ()
{
  local n
  for (( n=1; n<=NPROC; n++ )); do
    check_reader_alive $n
    [ "$(passes_of $n)" -ge $(( mark[$n] + 2 )) ] || return 1
  done
}
# The kills are over: the link fast (the rate filter's rate file), so
# that what is left is fetched in a few seconds however busy the host.
echo 2000M > "$TMP/rate.tmp" && mv "$TMP/rate.tmp" "$TMP/rate"
declare -A mark
for (( n=1; n<=NPROC; n++ )); do mark[$n]=$(passes_of $n); done
b0=$(log_read_bytes "$log")
converged=0
for (( k=1; k<=6; k++ )); do
  wait_progressing all_passed ||
    fail "the readers made no progress for 20 s after the kills"
  b1=$(log_read_bytes "$log")
  echo "after the kills: two more passes of every reader, $((b1 - b0)) bytes upstream"
  if [ "$b1" -eq "$b0" ]; then converged=1; break; fi
  for (( n=1; n<=NPROC; n++ )); do mark[$n]=$(passes_of $n); done
  b0=$b1
done
[ $converged = 1 ] ||
  fail "the processes still read upstream after 6 times two passes:" \
       "they do not all serve the export from the one object"

touch "$TMP/stop"
for (( n=1; n<=NPROC; n++ )); do
  wait "${reader_pid[$n]}" || {
    cat "$TMP/fail.$n.${gen[$n]}" "$TMP/reader.$n.${gen[$n]}.err" >&2 2>/dev/null
    fail "the reader of process $n failed"; }
done
for (( n=1; n<=NPROC; n++ )); do stop_nbdkit "$TMP/px$n.pid"; done
for (( n=1; n<=NPROC; n++ )); do
  echo "  px$n (${gen[$n]} start(s)): $(grep -E '^(unclean_opens|share_[a-z]+) ' \
                   "$TMP/px$n.stats" | tr '\n' ' ')"
done

tool --dir "$cache" check > "$TMP/check.out" 2>&1 ||
  { cat "$TMP/check.out" >&2; fail "nbd-fscache check found damage"; }

# A fresh restart of one process on the cache.
b0=$(log_read_bytes "$log")
start_proxy 1
nbdcopy "nbd+unix:///?socket=$TMP/px1.sock" "$TMP/final.img"
cmp "$img" "$TMP/final.img" || fail "after a restart the data differs"
stop_nbdkit "$TMP/px1.pid"
b=$(( $(log_read_bytes "$log") - b0 ))
echo "restart: identical, $b bytes upstream"
[ "$b" -le $((SAMPLE_MAX * 4)) ] ||
  fail "after a restart $b bytes were read upstream: the object was not whole"
echo "$0: PASS"
