#!/usr/bin/env bash
# kill -9 of the proxy during random 4K writes never leaves a stale or
# lost block behind: after each restart the proxy's view equals the
# upstream file and every acknowledged write reads back.
#
# Upstream: nbdkit --filter=log file up.img (32 MiB + 1000 bytes); the
# log counts the writes that reached it, which tells when to kill.
# Each of 5 rounds:
#   - the whole export is read through the proxy first, so every block
#     is cached (and, after a flush, durable in the index) before it is
#     overwritten;
#   - load: fio (ioengine=nbd, rw=randwrite, bs=4k, iodepth=16,
#     verify=crc32c so that each 4K block carries a unique header,
#     do_verify=0) over [16 MiB, 32 MiB), and 2 python libnbd writers on
#     their own connections over [0, 16 MiB): synchronous 4K writes to
#     4K slots they own (slot % 2), each logged to a file before it is
#     sent ("I seq slot") and after it is acknowledged ("A seq"), with
#     a flush (index commit) every 64 writes;
#   - after between 8000 and 10000 writes reached the upstream (the
#     issue asks 10k per round; a little less keeps the test < 60 s),
#     kill -9 the proxy, restart it with the same parameters and check:
#       * the restart really reused the crashed index ("did not shut
#         down cleanly ... kept") with fscache-validate=size, or
#         discarded it as unclean-after-writes with validate=sample;
#       * the proxy's whole view (nbdcopy --no-extents) == up.img;
#       * in [0, 16 MiB) each slot holds its last acknowledged write
#         (or the write that was in flight at the kill, or its content
#         before the round if never acknowledged).
# Rounds: writethrough/size, writearound/size, writethrough/size,
# writearound/size, writethrough/sample.
#
# Note: fio's own verify pass (verify_only=1 with verify_state_load=1
# after the kill) was tried with fio 3.33 and ioengine=nbd: it issued no
# reads at all, so it would check nothing; hence the python writers'
# acknowledgement log.  Readers racing with writers are left out here on
# purpose: they are covered by test-fscache-write.sh, and this test
# isolates crash safety.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires nbdcopy --version
requires fio --version
requires sh -c 'fio --enghelp 2>&1 | grep -qw nbd'
requires nbdinfo --version
PY=python3                    # functions.sh: the one with libnbd
requires "$PY" -c 'import nbd'
requires test -f "$FILTER"

# nbdkit discards its stderr when it forks into the background, and the
# restart's warnings are needed: while NBDKIT_STDERR names a file, run
# nbdkit in the foreground (-f) as a background job of this shell with
# stderr to that file.  start_nbdkit still waits for the pid file and
# registers the cleanup.
NBDKIT_STDERR=
nbdkit ()
{
  if [ -n "$NBDKIT_STDERR" ]; then
    command nbdkit -f "$@" 2>"$NBDKIT_STDERR" &
    disown $!                   # no "Killed" notices from kill -9
  else
    command nbdkit "$@"
  fi
}

SIZE=$(( 32*1024*1024 + 1000 ))
NTHREADS=2
ROUNDS=("writethrough size" "writearound size" "writethrough size"
        "writearound size" "writethrough sample")

make_random "$TMP/up.img" $SIZE
start_upstream ()
{
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log file "$TMP/up.img" logfile="$TMP/up.log" logappend=true
}
start_upstream
uri="nbd+unix:///?socket=$TMP/px.sock"

cat > "$TMP/writer.py" <<'EOF'
# Synchronous 4K writes to the slots this writer owns; log intent and
# acknowledgement, line by line.
import nbd, random, struct, sys
sock, rnd_no, tid, nthreads, nslots, logf = sys.argv[1:7]
rnd_no, tid, nthreads, nslots = int(rnd_no), int(tid), int(nthreads), int(nslots)
rnd = random.Random(rnd_no * 100 + tid)
log = open(logf, "w", buffering=1)
h = nbd.NBD()
h.connect_unix(sock)
seq = 0
try:
    while True:
        seq += 1
        slot = rnd.randrange(nslots // nthreads) * nthreads + tid
        data = struct.pack("<IIQ", rnd_no * 16 + tid, slot, seq) * 256
        log.write("I %d %d\n" % (seq, slot))
        h.pwrite(data, slot * 4096)
        log.write("A %d\n" % seq)
        if seq % 64 == 0:
            h.flush()
except nbd.Error:
    pass                        # the proxy was killed
EOF

cat > "$TMP/check.py" <<'EOF'
# Every acknowledged write of this round reads back from VIEW.
import struct, sys
view, before, rnd_no, nthreads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
logs = sys.argv[5:]
v = open(view, "rb").read()
b = open(before, "rb").read()
acked_total = 0
bad = 0
for tid, logf in enumerate(logs):
    last = {}                   # slot -> seq of last acked write
    pending = None              # (seq, slot) sent, not acknowledged
    for line in open(logf):
        f = line.split()
        if len(f) == 3 and f[0] == "I":
            pending = (int(f[1]), int(f[2]))
        elif len(f) == 2 and f[0] == "A" and pending and int(f[1]) == pending[0]:
            last[pending[1]] = pending[0]
            acked_total += 1
            pending = None
    def data(seq, slot):
        return struct.pack("<IIQ", rnd_no * 16 + tid, slot, seq) * 256
    slots = set(last)
    if pending:
        slots.add(pending[1])
    for slot in slots:
        got = v[slot * 4096:(slot + 1) * 4096]
        ok = [data(last[slot], slot)] if slot in last else [b[slot * 4096:(slot + 1) * 4096]]
        if pending and pending[1] == slot:
            ok.append(data(pending[0], slot))
        if got not in ok:
            bad += 1
            if bad <= 5:
                print("slot %d (offset %d): expected write seq %s of writer %d, got header %r"
                      % (slot, slot * 4096, last.get(slot), tid, got[:16].hex()))
print("acknowledged writes: %d, wrong slots: %d" % (acked_total, bad))
sys.exit(1 if bad or acked_total == 0 else 0)
EOF

# start_proxy MODE VALIDATE STDERR-FILE
start_proxy ()
{
  NBDKIT_STDERR="$3" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-mode="$1" fscache-validate="$2" \
    fscache-stats="$TMP/stats"
}

upstream_writes () { log_count "$TMP/up.log" Write; }

r=0
for round in "${ROUNDS[@]}"; do
  r=$((r + 1))
  read -r mode validate <<<"$round"
  start_proxy "$mode" "$validate" "$TMP/px-$r.err"

  # Cache everything, make it durable, snapshot the truth.
  nbdcopy --no-extents --flush "$uri" null:
  "$PY" -c "import nbd; h = nbd.NBD(); h.connect_unix('$TMP/px.sock'); h.flush(); h.shutdown()"
  cp "$TMP/up.img" "$TMP/before.img"

  base=$(upstream_writes)
  target=$(( base + 8000 + RANDOM % 2000 ))

  cat > "$TMP/fio.job" <<EOF
[randwrite]
ioengine=nbd
uri=$uri
rw=randwrite
bs=4k
offset=16M
size=16M
iodepth=16
verify=crc32c
do_verify=0
verify_state_save=0
time_based=1
runtime=40
randseed=$r
EOF
  fio "$TMP/fio.job" --output="$TMP/fio-$r.out" >/dev/null 2>&1 &
  fiopid=$!
  cleanup_fn "kill $fiopid 2>/dev/null"
  wpids=()
  for (( t=0; t<NTHREADS; t++ )); do
    "$PY" "$TMP/writer.py" "$TMP/px.sock" $r $t $NTHREADS 4096 \
      "$TMP/w-$r-$t.log" &
    wpids+=($!)
    cleanup_fn "kill $! 2>/dev/null"
  done

  # Wait (polling the upstream log) until enough writes went through.
  for (( i=0; i<3000; i++ )); do
    [ "$(upstream_writes)" -ge $target ] && break
    sleep 0.01
  done
  n=$(( $(upstream_writes) - base ))
  kill9_nbdkit "$TMP/px.pid"
  wait $fiopid || true
  for p in "${wpids[@]}"; do wait "$p" || true; done
  # nbdkit 1.32 serving the upstream has been seen to exit (no signal
  # from this test, nothing in the kernel log) a few milliseconds after
  # its clients vanish mid-request, in about one kill in ten.  The
  # upstream is not what this test is about and its data is the file:
  # start it again, and say so.
  if ! kill -0 "$(cat "$TMP/up.pid")" 2>/dev/null ||
     ! nbdinfo --size "nbd+unix:///?socket=$TMP/up.sock" >/dev/null 2>&1; then
    echo "  note: the upstream nbdkit exited with the proxy; restarted"
    kill -9 "$(cat "$TMP/up.pid")" 2>/dev/null || true
    start_upstream
  fi
  if [ $n -lt 1000 ]; then
    echo "$0: round $r: only $n writes reached upstream before the kill"
    exit 1
  fi
  echo "round $r ($mode, validate=$validate): killed after $n upstream writes"

  # Restart with the same parameters.
  rm -f "$TMP/stats"
  start_proxy "$mode" "$validate" "$TMP/px-$r-restart.err"
  nbdcopy --no-extents "$uri" "$TMP/view.img"
  if [ $validate = size ]; then
    grep -q "did not shut down cleanly" "$TMP/px-$r-restart.err" || {
      cat "$TMP/px-$r-restart.err"
      echo "$0: round $r: the crashed index was not reused (nothing tested)"
      exit 1
    }
  else
    grep -E -q "did not shut down cleanly|discarding cached data \(unclean-after-writes\)" \
      "$TMP/px-$r-restart.err" || {
      cat "$TMP/px-$r-restart.err"
      echo "$0: round $r: no unclean-shutdown message after kill -9"
      exit 1
    }
  fi
  hits=$(stat_value "$TMP/stats" hit_bytes)
  echo "  restart: $(grep -E -o "did not shut down cleanly|discarding cached data \([a-z-]*\)" \
                  "$TMP/px-$r-restart.err" | head -1); full read: $hits bytes were hits"
  if [ $validate = size ] && [ "$hits" -eq 0 ]; then
    echo "$0: round $r: nothing was served from the crashed cache"
    exit 1
  fi
  if ! cmp "$TMP/up.img" "$TMP/view.img"; then
    echo "$0: round $r: proxy view differs from upstream after kill -9"
    cmp -l "$TMP/up.img" "$TMP/view.img" | awk '{ print int(($1-1)/4096) }' |
      uniq | head -10 | sed 's/^/  differing 4K block: /'
    exit 1
  fi
  logs=()
  for (( t=0; t<NTHREADS; t++ )); do logs+=("$TMP/w-$r-$t.log"); done
  if ! "$PY" "$TMP/check.py" "$TMP/view.img" "$TMP/before.img" $r \
       $NTHREADS "${logs[@]}"; then
    echo "$0: round $r: acknowledged writes lost or stale after kill -9"
    exit 1
  fi
  stop_nbdkit "$TMP/px.pid"
done
echo "$0: OK"
