#!/usr/bin/env bash
# nbd-fscache: writes through one process of a shared object, reads
# through another: never stale.
#
# Two proxy processes P and Q on one cache directory and key, in front
# of a writable upstream (nbdkit file; 100 ms per read, 10 ms per
# write, so that fills are long).  P opens the object first (it owns
# it), Q joins it.  Each has two background connections that read the
# range of the current round again and again, so that whenever a write
# drops its blocks they are being filled again (a fill of old data that
# lands after a write is what would leave a stale block).  Then, for
# each mode (writethrough, then writearound), 12 rounds in each
# direction: writes through Q (a joiner: its writes must drop the
# blocks in the owner before they go upstream), then through P (the
# owner: a block a joiner is fetching must not be stored with the old
# data).  Each round, at a random offset and length (4 KiB aligned or
# not, up to 192 KiB):
#
#   - the range is read through both processes (cached, if it was not);
#   - qemu-io writes a pattern (write -P 0xNN) through one process, and
#     at once another one (while the background readers fill the range
#     again after the first);
#   - once qemu-io returns (the write acknowledged), qemu-io read -P
#     through the OTHER process, and through the same one, must find
#     the last pattern over the whole range.
#
# At the end, readers stopped: a full copy through P, one through Q,
# the upstream file and a model (the same writes applied by qemu-io to
# a local copy of the original image) are identical.
#
# Truth: qemu-io's pattern checks, the model image (cmp).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires qemu-io --version
requires cmp --version
requires nbdkit --filter=delay null --dump-plugin
requires python3 -c 'import nbd'
requires test -r "$FILTER"

SIZE=$((16 * 1024 * 1024))
REGION=$((4 * 1024 * 1024))
ROUNDS=12
img="$TMP/up.img"
model="$TMP/model.img"
make_random "$img" $SIZE
cp "$img" "$model"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=delay file "$img" delay-read=100ms delay-write=10ms

# The background readers: two connections per process, each reading
# the range named in $TMP/target ("OFFSET LENGTH", the range of the
# round) again and again, or random ranges of the region when there is
# none.
cat > "$TMP/bg.py" <<'PY'
import nbd, os, random, sys, threading
uri, region, stop, failf, ready, target = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
counts = []
def reader(i):
    h = nbd.NBD()
    h.connect_uri(uri)
    open(ready + str(i), "w").close()
    rnd = random.Random()
    n = 0
    while not os.path.exists(stop):
        try:
            off, k = map(int, open(target).read().split())
        except (OSError, ValueError):
            off = rnd.randrange(0, region // 4096) * 4096
            k = min(rnd.choice([4096, 65536, 262144]), region - off)
        try:
            h.pread(k, off)
        except nbd.Error as e:
            open(failf, "a").write("read %d+%d: %s\n" % (off, k, e))
            return
        n += 1
    h.shutdown()
    counts.append(n)
ts = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
for t in ts: t.start()
for t in ts: t.join()
open(ready, "w").close()
print(sum(counts))
sys.exit(0 if len(counts) == 2 else 1)
PY

qio ()                          # PROCESS COMMAND
{
  qemu-io -f raw "nbd+unix:///?socket=$TMP/$1.sock" -c "$2" \
    > "$TMP/qio.out" 2>&1
}

round_no=0
for mode in writethrough writearound; do
  rm -f "$TMP/stop" "$TMP"/*.ready* "$TMP"/*.bgfail "$TMP/target"
  for p in P Q; do
    start_nbdkit -P "$TMP/$p.pid" -U "$TMP/$p.sock" -v --log=stderr \
      --filter="$FILTER" nbd socket="$TMP/up.sock" \
      fscache-dir="$TMP/cache" fscache-key=shared fscache-mode=$mode \
      fscache-stats="$TMP/$p.$mode.stats" 2>"$TMP/$p.$mode.err"
  done
  # P's reader first: P owns the object.
  bgpids=()
  for p in P Q; do
    python3 "$TMP/bg.py" "nbd+unix:///?socket=$TMP/$p.sock" $REGION \
      "$TMP/stop" "$TMP/$p.bgfail" "$TMP/$p.ready" "$TMP/target" \
      > "$TMP/$p.bgcount" &
    bgpids+=($!)
    cleanup_fn "touch '$TMP/stop'; kill $! 2>/dev/null"
    wait_until test -e "$TMP/$p.ready1" || fail "$mode: $p's readers did not connect"
  done

  for writer in Q P; do
    if [ $writer = Q ]; then other=P; else other=Q; fi
    for (( r=1; r<=ROUNDS; r++ )); do
      round_no=$((round_no + 1))
      pat1=$(printf '0x%02x' $(( (round_no * 74) % 255 + 1 )))
      pat2=$(printf '0x%02x' $(( (round_no * 74 + 37) % 255 + 1 )))
      if (( RANDOM % 2 )); then
        off=$(( RANDOM % (REGION / 4096 - 48) * 4096 ))
        len=$(( (RANDOM % 48 + 1) * 4096 ))
      else
        off=$(( RANDOM * 97 % (REGION - 200000) ))
        len=$(( RANDOM % 196608 + 1 ))
      fi
      what="$mode, round $r, writes through $writer at $off+$len"
      rm -f "$TMP/target"
      qio $other "read $off $len" || { cat "$TMP/qio.out"; fail "$what: read"; }
      qio $writer "read $off $len" || { cat "$TMP/qio.out"; fail "$what: read"; }
      # The background readers now read this range all the time: after
      # the first write drops its blocks they fill them again (100 ms
      # each upstream), and the second write comes while they do.
      echo "$off $len" > "$TMP/target.tmp" && mv "$TMP/target.tmp" "$TMP/target"
      for pat in $pat1 $pat2; do
        qio $writer "write -P $pat $off $len" ||
          { cat "$TMP/qio.out"; fail "$what: the write of $pat failed"; }
        qemu-io -f raw "$model" -c "write -P $pat $off $len" > /dev/null
      done
      qio $other "read -P $pat2 $off $len" ||
        { cat "$TMP/qio.out"; fail "$what: $other served stale data" \
                                   "(not $pat2, the last write's pattern)"; }
      qio $writer "read -P $pat2 $off $len" ||
        { cat "$TMP/qio.out"; fail "$what: $writer served stale data" \
                                   "(not $pat2, the last write's pattern)"; }
    done
    echo "$mode: $ROUNDS rounds of two writes through $writer, each read" \
         "back new through $other and $writer"
  done

  rm -f "$TMP/target"
  touch "$TMP/stop"
  for p in "${bgpids[@]}"; do wait "$p" || fail "$mode: a background reader failed"; done
  for p in P Q; do
    if [ -s "$TMP/$p.bgfail" ]; then
      cat "$TMP/$p.bgfail" >&2
      fail "$mode: $p's background reader saw errors"
    fi
  done
  echo "$mode: background reads: P $(cat "$TMP/P.bgcount"), Q $(cat "$TMP/Q.bgcount")"

  for p in P Q; do
    rm -f "$TMP/copy.img"
    nbdcopy "nbd+unix:///?socket=$TMP/$p.sock" "$TMP/copy.img"
    cmp "$model" "$TMP/copy.img" || fail "$mode: the copy through $p differs from the model"
  done
  cmp "$model" "$img" || fail "$mode: the upstream differs from the model"
  for p in P Q; do stop_nbdkit "$TMP/$p.pid"; done
  for p in P Q; do
    echo "  $p: $(grep -E '^(invalidated_blocks|stored_blocks|objects_busy|share_[a-z]+) ' \
                   "$TMP/$p.$mode.stats" | tr '\n' ' ')"
  done
done
echo "$0: PASS"
