#!/usr/bin/env bash
# Upstream write errors reach the client, and a failed write never
# leaves the cache disagreeing with the upstream.
#
# Upstream: nbdkit --filter=log --filter=error file up.img with
# error-pwrite-rate=20% error-pwrite=EIO (and the same for zero and
# trim); the log filter, above the error filter, records which upstream
# requests failed.  Proxy: fscache in front, each mode.  One python
# libnbd client, on cached and uncached blocks (the export is read
# first, then some blocks are invalidated by writes): 1500 writes
# (unaligned, partial and whole blocks) and 150 each of zero and trim,
# catching errors, with reads of what was written.  Asserts:
#   - the client saw failures, at roughly the injected rate (10%..30%);
#   - every upstream failure reached the client and no other request
#     failed: failed client requests == failed upstream requests (log),
#     per kind;
#   - afterwards 0 blocks differ between the proxy's whole view and
#     up.img read directly (not through the error filter);
#   - the same after a restart of the proxy (the cache is reused).
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log --filter=error null --version
PY=python3                    # functions.sh: the one with libnbd
requires "$PY" -c 'import nbd'
requires test -f "$FILTER"

SIZE=$(( 16*1024*1024 + 1000 ))

cat > "$TMP/client.py" <<'EOF'
import nbd, random, sys
sock, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
h = nbd.NBD(); h.connect_unix(sock)
size = h.get_size()
BS = 65536
# Cache everything first.
for off in range(0, size, 1 << 20):
    h.pread(min(1 << 20, size - off), off)
ops = ["write"] * 1500 + ["zero"] * 150 + ["trim"] * 150
rnd.shuffle(ops)
tried = {"write": 0, "zero": 0, "trim": 0}
failed = {"write": 0, "zero": 0, "trim": 0}
for i, op in enumerate(ops):
    r = rnd.random()
    if r < 0.3:                                   # whole blocks
        off = rnd.randrange(size // BS) * BS
        n = min(BS * rnd.randrange(1, 4), size - off)
    else:                                         # unaligned
        off = rnd.randrange(size - 1)
        n = min(rnd.randrange(1, 3 * BS), size - off)
    tried[op] += 1
    try:
        if op == "write":
            h.pwrite(bytes([rnd.randrange(256)]) * n, off)
        elif op == "zero":
            h.zero(n, off)
        else:
            h.trim(n, off)
    except nbd.Error as e:
        failed[op] += 1
    if i % 5 == 0:
        h.pread(n, off)                           # refill after the write
h.flush()
h.shutdown()
for op in ("write", "zero", "trim"):
    print("%s %d %d" % (op, tried[op], failed[op]))
EOF

cat > "$TMP/compare.py" <<'EOF'
# Count the 64K blocks where the proxy's view differs from the file.
import nbd, sys
sock, img = sys.argv[1], sys.argv[2]
h = nbd.NBD(); h.connect_unix(sock)
size = h.get_size()
data = open(img, "rb").read()
assert size == len(data), (size, len(data))
bad = []
BS = 65536
for off in range(0, size, BS):
    n = min(BS, size - off)
    if h.pread(n, off) != data[off:off + n]:
        bad.append(off)
h.shutdown()
print("%d blocks differ" % len(bad) + (": first at %s" % bad[:5] if bad else ""))
sys.exit(1 if bad else 0)
EOF

# Failed upstream requests of KIND (Write, Zero, Trim) in the log.
upstream_failures ()
{
  grep -E -c "\.\.\.$2 id=[0-9]+ return=-1" "$1" || true
}

seed=1
for mode in writethrough writearound; do
  d="$TMP/$mode"
  mkdir -p "$d"
  make_random "$d/up.img" $SIZE
  start_nbdkit -P "$d/up.pid" -U "$d/up.sock" \
    --filter=log --filter=error file "$d/up.img" logfile="$d/up.log" \
    error-pwrite-rate=20% error-pwrite=EIO \
    error-zero-rate=20% error-zero=EIO \
    error-trim-rate=20% error-trim=EIO
  pxargs=(-P "$d/px.pid" -U "$d/px.sock" --filter="$FILTER"
          nbd socket="$d/up.sock" fscache-dir="$d/cache" fscache-mode="$mode"
          fscache-stats="$d/stats")
  start_nbdkit "${pxargs[@]}"
  "$PY" "$TMP/client.py" "$d/px.sock" $mode $seed > "$d/counts"
  seed=$((seed + 1))

  while read -r op tried failed; do
    case $op in
      write) kind=Write ;; zero) kind=Zero ;; trim) kind=Trim ;;
    esac
    up=$(upstream_failures "$d/up.log" $kind)
    echo "$mode: $op: $tried requests, $failed failed at the client," \
         "$up failed upstream"
    if [ "$failed" -ne "$up" ]; then
      echo "$0: $mode: $op: client saw $failed failures, upstream had $up"
      exit 1
    fi
    if [ $op = write ] &&
       { [ "$failed" -lt $((tried / 10)) ] || [ "$failed" -gt $((tried * 3 / 10)) ]; }; then
      echo "$0: $mode: $failed of $tried writes failed; 20% were injected"
      exit 1
    fi
    if [ "$failed" -eq 0 ]; then
      echo "$0: $mode: $op: no failure reached the client"
      exit 1
    fi
  done < "$d/counts"
  # Nothing else failed upstream either (reads, flushes).
  other=$(grep -E -c "return=-1" "$d/up.log" || true)
  total=$(awk '{ s += $3 } END { print s }' "$d/counts")
  if [ "$other" -ne "$total" ]; then
    echo "$0: $mode: $other upstream failures in the log, $total expected"
    exit 1
  fi

  "$PY" "$TMP/compare.py" "$d/px.sock" "$d/up.img" || {
    echo "$0: $mode: proxy view differs from upstream after failed writes"
    exit 1
  }
  stop_nbdkit "$d/px.pid"
  rm -f "$d/stats"
  start_nbdkit "${pxargs[@]}"
  "$PY" "$TMP/compare.py" "$d/px.sock" "$d/up.img" || {
    echo "$0: $mode: proxy view differs from upstream after a restart"
    exit 1
  }
  stop_nbdkit "$d/px.pid"
  echo "$mode: after restart: hit_bytes=$(stat_value "$d/stats" hit_bytes)"
  stop_nbdkit "$d/up.pid"
done
echo "$0: OK"
