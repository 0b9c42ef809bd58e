#!/usr/bin/env bash
# nbd-fscache: groups paged in and out (core/disk/groups.c) under a real
# proxy, and kill -9 while it loads them, 10 rounds.
#
# The proxy keeps 4 groups of 64 blocks resident
# (NBD_FSCACHE_RESIDENT_GROUPS=4, a test knob) over a 32 MiB export of
# 4 KiB blocks (128 groups), with fscache-max-size=8M, so that nearly
# every read loads a group record on demand and nearly every fill makes
# the eviction read groups in to find victims.  Each round a random
# reader (4 KiB .. 64 KiB reads, each compared with the upstream image
# as it comes) runs against a fresh proxy, which is killed at a random
# moment: during loads, fills, evictions and commits.
#
# Checked: every byte any reader got is the image's; afterwards a
# whole read through a last proxy equals the image (cmp); the object
# stays within its cap; `nbd-fscache check` finds every present block's
# data matching its checksum; the gauges the filter saved at its clean
# stop (present blocks, cached bytes, kept for the groups not in
# memory) equal what `nbd-fscache ls` counts in the index; and the
# next proxy serves the cached blocks without the upstream.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter=log null --dump-plugin
requires "$PYTHON" -c 'import nbd'
requires test -r "$FILTER"
requires test -x "$TOOL"

SIZE=$((32 * 1024 * 1024))
CAP=$((8 * 1024 * 1024))
make_random "$TMP/img" "$SIZE"

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/img" logfile="$TMP/up.log"

proxy ()
{
  NBD_FSCACHE_RESIDENT_GROUPS=4 NBD_FSCACHE_FAULTS="${NBD_FSCACHE_FAULTS:-}" \
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" --filter="$FILTER" \
    nbd socket="$TMP/up.sock" fscache-dir="$TMP/cache" fscache-key=k \
    fscache-block-size=4096 fscache-max-size="${MAXSIZE:-$CAP}" \
    fscache-readahead=0 fscache-validate=size \
    fscache-stats="$TMP/px.stats" 2>>"$TMP/px.err"
}
uri="nbd+unix:///?socket=$TMP/px.sock"

# Random reads, each compared with the image; prints the bytes
# compared.  A dropped connection (the kill) ends it quietly.
cat > "$TMP/reader.py" <<'EOF'
import nbd, random, sys
uri, img, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(img, 'rb').read()
rnd = random.Random(seed)
h = nbd.NBD()
done = 0
try:
    h.connect_uri(uri)
    for _ in range(20000):
        n = rnd.choice([4096, 8192, 65536])
        # A hot quarter and the rest: hits and misses both.
        hi = len(data) // 4 if rnd.random() < 0.5 else len(data)
        off = rnd.randrange(0, hi - n) // 4096 * 4096
        if h.pread(n, off) != data[off:off + n]:
            print("MISMATCH at %d (%d bytes)" % (off, n))
            sys.exit(1)
        done += n
except nbd.Error:
    pass
print(done)
EOF

total=0
for round in $(seq 1 10); do
  proxy
  "$PYTHON" "$TMP/reader.py" "$uri" "$TMP/img" "$round" > "$TMP/read.out" &
  reader=$!
  # A random moment in the first 1.5 s.
  sleep "$((RANDOM % 2)).$(printf %02d $((RANDOM % 100)))"
  kill9_nbdkit "$TMP/px.pid"
  wait "$reader" || fail "round $round: $(cat "$TMP/read.out")"
  got=$(cat "$TMP/read.out")
  total=$((total + got))
  echo "round $round: reader compared $got bytes"
done
echo "$total bytes compared in 10 rounds"

# A whole read through a last proxy, then a clean stop.
proxy
nbdcopy "$uri" "$TMP/copy.img"
cmp "$TMP/img" "$TMP/copy.img" || fail "the last whole read differs"
# The walk for space a crash left runs while a client holds the object.
hold_export "$uri" "$TMP/release"
object_du ()
{
  # shellcheck disable=SC2046
  du -B1 -c $(find "$TMP/cache/objects" -type f \( -name '*.idx' -o \
              -name '*.data' -o -name '*.sums' \)) | awk 'END { print $1 }'
}
capped () { [ "$(object_du)" -le $((CAP + 65536)) ]; }
wait_until capped || fail "over the cap: $(object_du) bytes"
touch "$TMP/release"
stop_nbdkit "$TMP/px.pid"
cat "$TMP/px.stats" | grep -E '^(evict|cap_|reclaimed|unclean)' || true

tool --dir "$TMP/cache" check > "$TMP/check.out" 2>&1 || {
  cat "$TMP/check.out" >&2
  fail "nbd-fscache check found problems"
}
# The filter's gauges (saved at the clean stop) against the index.
ls_blocks=$(tool --dir "$TMP/cache" ls --json |
            "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["objects"][0]["present_blocks"])')
st_blocks=$(tool --dir "$TMP/cache" stat --json |
            "$PYTHON" -c 'import json,sys; j=json.load(sys.stdin); print(j["objects"][0]["counters"]["present_blocks"])')
echo "present blocks: $ls_blocks in the index, $st_blocks in the filter's gauge"
[ "$ls_blocks" -gt 0 ] || fail "nothing cached"
[ "$ls_blocks" -eq "$st_blocks" ] ||
  fail "the gauge says $st_blocks present blocks, the index $ls_blocks"

# The next proxy serves them from the cache: with fills paused and a
# cap above the export (a fill makes room before it writes, and the
# paused write would lose what was evicted for it), exactly the cached
# blocks hit.
PAUSE=write:data:1+:ENOSPC
NBD_FSCACHE_FAULTS=$PAUSE MAXSIZE=1G proxy
: > "$TMP/up.log"
nbdcopy "$uri" "$TMP/copy2.img"
cmp "$TMP/img" "$TMP/copy2.img" || fail "the read after the restart differs"
stop_nbdkit "$TMP/px.pid"
hits=$(stat_value "$TMP/px.stats" hit_bytes)
up=$(log_read_bytes "$TMP/up.log")
echo "after the restart: $hits bytes hit, $up bytes upstream"
[ "$hits" -eq $((ls_blocks * 4096)) ] ||
  fail "$hits bytes hit, but $ls_blocks blocks of 4 KiB were cached"
[ $((hits + up)) -eq "$SIZE" ] || fail "hits and upstream do not add up"
