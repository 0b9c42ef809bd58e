#!/usr/bin/env bash
# nbd-fscache: a new owner makes every joiner's view new before it
# serves anything (issue 26, item 1).
#
# For each mode (writethrough, writearound) and each way the owner
# goes (a clean stop, kill -9):
#
#   - A opens the object first (it owns it), J joins it; a client of J,
#     connected all along, reads 1 MiB (the owner fills it), and once
#     the cache holds it (nbd-fscache stat) three times more (J serves
#     it from the shared files itself, from its map:
#     share_direct_bytes);
#   - A goes; a third process B opens the object (B's client is first:
#     B owns it now, J has not used its socket since);
#   - B's client writes a pattern over the same 1 MiB (qemu-io write
#     -P), and once that is acknowledged
#   - J's client (the same connection) reads the range: it must be the
#     pattern, never the old bytes (in writearound the write only drops
#     the blocks from B's index: the bytes in the data file and the map
#     J holds still agree, so no checksum can catch a stale hit).
#
# Truth: the pattern written, the upstream file (cmp at the end).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires qemu-io --version
requires nbdcopy --version
requires cmp --version
requires python3 -c 'import nbd'
requires test -r "$FILTER"
requires test -x "$TOOL"

SIZE=$((8 * 1024 * 1024))
LEN=$((1024 * 1024))
img="$TMP/up.img"
make_random "$img" $SIZE
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$img"

# client.py URI: one connection; each line "OFFSET LENGTH" on stdin is
# read and answered with the first byte (hex) and the number of
# distinct byte values in the range.
cat > "$TMP/client.py" <<'PY'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    off, n = map(int, line.split())
    b = h.pread(n, off)
    print("%02x %d" % (b[0], len(set(b))), flush=True)
h.shutdown()
PY

proxy ()                        # NAME MODE
{
  start_nbdkit -P "$TMP/$1.pid" -U "$TMP/$1.sock" -v --log=stderr \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$TMP/cache" fscache-key=shared fscache-mode=$2 \
    fscache-stats="$TMP/$1.stats" 2>>"$TMP/$1.err"
}

# stored: the cache holds the round's range (a fresh cache each round).
stored ()
{
  local c
  c=$(cached_bytes "$TMP/cache")
  [ "${c:-0}" -ge $LEN ]
}

round=0
for mode in writethrough writearound; do
  for how in stop kill; do
    round=$((round + 1))
    pat=$(printf '0x%02x' $(( round * 40 + 7 )))
    off=$(( (round - 1) * LEN ))
    what="$mode, owner gone by $how"
    rm -rf "$TMP/cache"
    proxy A $mode
    proxy J $mode
    # A's client first (connected all along): A owns the object.
    hold_export "nbd+unix:///?socket=$TMP/A.sock" "$TMP/A.$round.stop" \
      "$TMP/A.$round.ready"
    coproc JC { python3 "$TMP/client.py" "nbd+unix:///?socket=$TMP/J.sock"; }
    cleanup_fn "kill $JC_PID 2>/dev/null"
    read -r line <&"${JC[0]}"
    [ "$line" = ready ] || fail "$what: J's client did not connect"
    # The first read misses and the owner fills the range; once the
    # fill is stored (committed: A's index on disk holds it), the others
    # are J's to serve from the shared files.  (Four reads back to back
    # used to stand in for that wait: on a loaded machine the owner's
    # fill was still queued while they ran, and J served none itself.)
    echo "$off $LEN" >&"${JC[1]}"
    read -r first distinct <&"${JC[0]}"
    wait_until stored || fail "$what: the owner never stored the range"
    for i in 2 3 4; do
      echo "$off $LEN" >&"${JC[1]}"
      read -r first distinct <&"${JC[0]}"
    done
    expect=$(od -An -tx1 -j $off -N1 "$img" | tr -d ' ')
    [ "$first" = "$expect" ] || fail "$what: J read $first at $off, not $expect"
    [ "$distinct" -gt 1 ] || fail "$what: J read uniform bytes before the write"

    # (nbdkit stops once its clients have gone.)
    if [ $how = stop ]; then
      touch "$TMP/A.$round.stop"
      stop_nbdkit "$TMP/A.pid"
    else kill9_nbdkit "$TMP/A.pid"; fi
    proxy B $mode
    hold_export "nbd+unix:///?socket=$TMP/B.sock" "$TMP/B.$round.stop" \
      "$TMP/B.$round.ready"
    qemu-io -f raw "nbd+unix:///?socket=$TMP/B.sock" \
      -c "write -P $pat $off $LEN" > "$TMP/qio.out" 2>&1 ||
      { cat "$TMP/qio.out"; fail "$what: the write through B failed"; }
    # The write is acknowledged: J's client must read it.
    echo "$off $LEN" >&"${JC[1]}"
    read -r first distinct <&"${JC[0]}"
    [ "$first $distinct" = "${pat#0x} 1" ] ||
      fail "$what: J's client read the old bytes after B's write was" \
           "acknowledged (first byte $first, $distinct distinct values," \
           "not ${pat#0x} alone)"
    echo "$what: J read the new pattern"
    exec {JC[1]}>&-
    wait $JC_PID || fail "$what: J's client failed"
    touch "$TMP/B.$round.stop" "$TMP/A.$round.stop"
    stop_nbdkit "$TMP/J.pid"
    stop_nbdkit "$TMP/B.pid"
    # J joined A and served the second read itself (the stale path).
    [ "$(stat_value "$TMP/J.stats" share_joins)" -ge 1 ] ||
      fail "$what: J never joined the object"
    [ "$(stat_value "$TMP/J.stats" share_direct_bytes)" -ge $LEN ] ||
      fail "$what: J served nothing from the shared files itself"
  done
done

# The upstream file took every write: a fresh process reads it all.
proxy F writethrough
nbdcopy "nbd+unix:///?socket=$TMP/F.sock" "$TMP/final.img"
stop_nbdkit "$TMP/F.pid"
cmp "$img" "$TMP/final.img" || fail "a fresh process reads other data than the upstream"
echo "$0: PASS"
