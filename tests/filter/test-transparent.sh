#!/usr/bin/env bash
# nbd-fscache: in front of any plugin, the filter behaves as the plugin
# alone (issue 29).  Each case runs the plugin alone, then the filter in
# front of it in every mode, and compares what a client sees.
#
#  1. An upstream that cannot write (the pattern plugin; an nbd plugin
#     in front of a read-only server): the plugin alone serves it
#     read-only, and so does the filter in every mode, writeback
#     included, with the same bytes (md5 of a full copy).  Writeback
#     used to refuse every connection ("opening the writer's connection
#     to the upstream: Read-only file system").
#  2. Behind an upstream that enforces its block sizes (blocksize-policy
#     with errors on: a 64K minimum, a 32K maximum), a client obeying
#     them reads and writes the same bytes as with the plugin alone, in
#     every mode: the filter's own requests (the sample, fills, pieces,
#     readahead, writeback) keep the constraints too.
#  3. NBD_CMD_FLAG_NO_HOLE reaches the plugin: a zero sent with it,
#     beside a zero sent without, reaches a log filter below the cache
#     as trim=0 in every mode, as with the plugin alone (writeback used
#     to merge it with its neighbour and send trim=1), and the file
#     behind keeps that range allocated (st_blocks).
#  4. An upstream that can write and offers no multi-conn
#     (tests/multi-conn-plugin.sh, a connection's writes visible to
#     others only after its flush): in writethrough and writearound, a
#     connection opened after every connection flushed reads what it
#     reads with the plugin alone.  (Writeback keeps its writer's own
#     connection: not covered, see the man page.)
#  5. A clean stop in writeback mode below the delay filter: the drain
#     ends at once with a log line saying why (the upstream refuses
#     requests while nbdkit shuts down), instead of retrying for the
#     whole fscache-writeback-drain, and the next proxy writes the
#     backlog back (cmp with what was written).
#  6. Exports of 4 EiB and more (pattern 4E, 2^62 + 4096, and nbdkit's
#     largest, 2^63 - 1) are served as the plugin alone serves them,
#     uncached with a warning, in every mode; they used to be refused.
#  7. A plugin whose can_flush fails (an sh plugin): the plugin alone
#     refuses the connection, and so does the filter in every mode.
#     Writeback used to serve it with can_flush: true.
#
# Truth: the plugin alone, run side by side (nbdinfo's flags, md5sum of
# an nbdcopy of the export, whether the connection opens).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires nbdcopy --version
requires nbdkit pattern --dump-plugin
requires nbdkit sh --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter=delay null --dump-plugin
requires nbdkit --filter=blocksize-policy null --dump-plugin
requires "$PYTHON" -c 'import nbd'
requires test -r "$FILTER"

modes="writethrough writearound writeback"

# probe LABEL ARGS...: run nbdkit ARGS with a client that prints the
# export's read-only flag, can_flush and the md5 of its bytes, or
# "refused"; on stdout.
probe ()
{
  local label=$1; shift
  local out
  out=$(nbdkit -U - "$@" --run '
      if nbdinfo "$uri" > "$tmpdir/info" 2>/dev/null; then
        ro=$(grep -E "^[[:space:]]*is_read_only:" "$tmpdir/info" | tr -d "[:space:]")
        fl=$(grep -E "^[[:space:]]*can_flush:" "$tmpdir/info" | tr -d "[:space:]")
        sum=$(nbdcopy "$uri" - | md5sum | cut -d" " -f1)
        echo "$ro $fl $sum"
      else
        echo refused
      fi' 2>>"$TMP/nbdkit.err") || true
  echo "$label: ${out:-nbdkit failed}" >&2
  echo "$out"
}

# same WHAT ARGS...: the plugin alone, then the filter in every mode,
# must print the same.
same ()
{
  local what=$1; shift
  local alone got m
  alone=$(probe "$what, alone" "$@")
  for m in $modes; do
    got=$(probe "$what, $m" --filter="$FILTER" "$@" \
                fscache-dir="$TMP/cache-$m" fscache-mode="$m")
    [ "$got" = "$alone" ] ||
      fail "$what, $m: '$got' where the plugin alone gives '$alone'"
  done
}

# tmpdir for the --run scripts (nbdkit's own $tmpdir is its socket's).
export tmpdir="$TMP"

# ---- 1. an upstream that cannot write -----------------------------------
same "pattern 1M" pattern 1M
[ "$(probe check pattern 1M | cut -d' ' -f1)" = "is_read_only:true" ] ||
  fail "test bug: the pattern plugin is not read-only here"
grep -q "fscache-mode=writeback, but the upstream cannot write" \
  "$TMP/nbdkit.err" || fail "writeback over pattern: no log line"

make_random "$TMP/ro.img" $((4 * 1024 * 1024))
start_nbdkit -P "$TMP/ro.pid" -U "$TMP/ro.sock" -r file "$TMP/ro.img"
same "nbd to a read-only server" nbd socket="$TMP/ro.sock"

# ---- 2. the upstream's block-size constraints ---------------------------
# Behind blocksize-policy with errors on, a minimum of 64K, then a
# maximum of 32K: a client that obeys them writes (aligned, within the
# maximum), flushes, reads everything in its smallest legal requests
# and 50 random ones; the md5 of what it read, and of the file once the
# proxy has stopped (writeback: drained), equal the plugin alone's.
# The filter's own requests (the sample, fills, pieces, readahead, the
# writer's) used to break them: every connection refused, or EIO.
cat > "$TMP/bsdrive.py" <<'EOF'
import sys, nbd, hashlib, random
h = nbd.NBD()
h.connect_uri(sys.argv[1])
mn = max(h.get_block_size(nbd.SIZE_MINIMUM), 1)
mx = min(h.get_block_size(nbd.SIZE_MAXIMUM), 32 << 20)
size = h.get_size()
rnd = random.Random(1)
step = max(mn, 4096)
for i in range(20):
    n = min(mx, step * rnd.randrange(1, 4))
    h.pwrite(bytes([i + 1]) * n, rnd.randrange(0, (size - n) // mn) * mn)
h.flush()
dig = hashlib.md5()
for o in range(0, size, min(mx, step)):
    dig.update(h.pread(min(mx, step, size - o), o))
for i in range(50):
    k = min(mx, step * rnd.randrange(1, 8))
    dig.update(h.pread(k, rnd.randrange(0, (size - k) // mn + 1) * mn))
h.shutdown()
print(mn, mx, dig.hexdigest())
EOF
make_random "$TMP/bs0.img" $((8 * 1024 * 1024))
bsrun ()                        # LABEL POLICY [MODE]
{
  local label=$1 policy=$2 mode=${3:-} out
  local filter=()
  cp "$TMP/bs0.img" "$TMP/bs.img"
  [ -z "$mode" ] || filter=(--filter="$FILTER")
  # shellcheck disable=SC2086
  out=$(nbdkit -U - "${filter[@]}" --filter=blocksize-policy \
          file "$TMP/bs.img" $policy blocksize-error-policy=error \
          ${mode:+fscache-dir="$TMP/bsc-$mode" fscache-mode="$mode"} \
          --run "$PYTHON $TMP/bsdrive.py \"\$uri\"" 2>>"$TMP/bs.err") ||
    out="failed"
  out="$out $(md5sum < "$TMP/bs.img" | cut -d' ' -f1)"
  echo "$label: $out" >&2
  echo "$out"
}
for policy in "blocksize-minimum=64K blocksize-preferred=64K" \
              "blocksize-maximum=32K"; do
  alone=$(bsrun "$policy, alone" "$policy")
  case "$alone" in failed*) fail "test bug: $policy fails alone" ;; esac
  for m in $modes; do
    got=$(bsrun "$policy, $m" "$policy" "$m")
    [ "$got" = "$alone" ] ||
      fail "$policy, $m: '$got' where the plugin alone gives '$alone'"
  done
done

# ---- 3. NO_HOLE passes through -------------------------------------------
# Two neighbouring zeroes, the first with NO_HOLE, then a flush; the
# log filter below says how each reached the plugin, and the file's
# allocation afterwards how the plugin took them.
cat > "$TMP/zeroes.py" <<'EOF'
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.zero(1 << 20, 0, nbd.CMD_FLAG_NO_HOLE)
h.zero(1 << 20, 1 << 20)
h.flush()
h.shutdown()
EOF
cat > "$TMP/allocated.py" <<'EOF'
import os, sys
# Whole MiB allocated (st_blocks): a zero that keeps its range
# allocated leaves it counted (ext4 and XFS allocate unwritten extents,
# which SEEK_DATA calls holes), a trimming one does not.
print("%d MiB allocated" % (os.stat(sys.argv[1]).st_blocks * 512 >> 20))
EOF
# nohole LABEL [MODE]: how the zeroes reached the plugin (offset,
# count and trim of each Zero, in order), and the file's allocation
# afterwards; through the filter in MODE, or the plugin alone.
nohole ()
{
  local label=$1 mode=${2:-}
  local filter=()
  if [ -n "$mode" ]; then
    filter=(--filter="$FILTER")
    set -- fscache-dir="$TMP/zc-$mode" fscache-mode="$mode"
  else
    set --
  fi
  rm -f "$TMP/z.log"
  make_random "$TMP/z.img" $((2 * 1024 * 1024))
  start_nbdkit -P "$TMP/z.pid" -U "$TMP/z.sock" "${filter[@]}" \
    --filter=log file "$TMP/z.img" logfile="$TMP/z.log" "$@"
  $PYTHON "$TMP/zeroes.py" "nbd+unix:///?socket=$TMP/z.sock"
  stop_nbdkit "$TMP/z.pid"          # writeback: drained at the stop
  local got
  got="$(grep -o ' Zero id=[0-9]* offset=0x[0-9a-f]* count=0x[0-9a-f]* trim=[0-9]' \
           "$TMP/z.log" | sed 's/ id=[0-9]*//' | tr '\n' ' ')"
  got="$got$($PYTHON "$TMP/allocated.py" "$TMP/z.img")"
  echo "$label: $got" >&2
  echo "$got"
}
alone=$(nohole "NO_HOLE, alone")
case "$alone" in
  *"offset=0x0 count=0x100000 trim=0"*"1 MiB allocated") ;;
  *) fail "test bug: the plugin alone shows '$alone'" ;;
esac
for m in $modes; do
  got=$(nohole "NO_HOLE, $m" "$m")
  [ "$got" = "$alone" ] ||
    fail "NO_HOLE, $m: '$got' where the plugin alone gives '$alone'"
done

# ---- 4. an upstream without multi-conn -------------------------------------
# tests/multi-conn-plugin.sh: each connection its own view, published by
# its flushes.  Two scenarios, each ending with a new connection opened
# after every connection flushed, which must read what the plugin alone
# shows it.  (A) A opens (the coherency sample makes its view), B writes
# "Hello " and flushes, A reads (its view predates B's write), C writes
# "world." and flushes, A flushes, D reads.  (B) A opens, B writes and
# flushes, A reads, A flushes, D reads.  The filter used to cache A's
# view and merge C's write into it: D read "Initiaworld.".
cat > "$TMP/mc.py" <<'EOF'
import sys, nbd
uri, which = sys.argv[1], sys.argv[2]
def c():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h
a = c()
b = c(); b.pwrite(b"Hello ", 0); b.flush(); b.shutdown()
a.pread(32, 0)
if which == "A":
    cc = c(); cc.pwrite(b"world.", 6); cc.flush(); cc.shutdown()
a.flush(); a.shutdown()
d = c()
print(bytes(d.pread(32, 0)).decode().rstrip())
EOF
mcrun ()                        # LABEL SCENARIO [MODE]
{
  local label=$1 which=$2 mode=${3:-} out
  local filter=()
  [ -z "$mode" ] || filter=(--filter="$FILTER")
  # shellcheck disable=SC2086
  out=$(nbdkit -U - "${filter[@]}" sh "$top_srcdir/tests/multi-conn-plugin.sh" \
          ${mode:+fscache-dir="$TMP/mcc-$mode-$which" fscache-mode="$mode"} \
          --run "$PYTHON $TMP/mc.py \"\$uri\" $which" 2>>"$TMP/mc.err") ||
    out=failed
  echo "$label: '$out'" >&2
  echo "$out"
}
for which in A B; do
  alone=$(mcrun "multi-conn $which, alone" $which)
  case "$alone" in "Hello "*) ;; *) fail "test bug: alone, $which: '$alone'" ;; esac
  for m in writethrough writearound; do
    got=$(mcrun "multi-conn $which, $m" $which $m)
    [ "$got" = "$alone" ] ||
      fail "multi-conn $which, $m: '$got' where the plugin alone reads '$alone'"
  done
done

# ---- 5. a clean stop below a filter that sleeps --------------------------
# Writeback over the delay filter: 16 MiB written, then SIGTERM while
# the writer is busy.  nbdkit 1.32 aborts every sleep once it shuts
# down, so nothing more reaches the file: the drain must end at once,
# saying why (it used to retry for all of fscache-writeback-drain and
# say only that time was up), and the next proxy writes the backlog
# back: the file then equals what was written.  (One fscache-key for
# both: a derived key names the filters below the cache.)
make_random "$TMP/d.data" $((16 * 1024 * 1024))
truncate -s 64M "$TMP/d.img"
rm -f "$TMP/d.err"
NBDKIT_STDERR="$TMP/d.err" start_nbdkit -P "$TMP/d.pid" -U "$TMP/d.sock" \
  --filter="$FILTER" \
  --filter=delay file "$TMP/d.img" delay-write=1000ms \
  fscache-dir="$TMP/dc" fscache-key=d fscache-mode=writeback \
  fscache-writeback-drain=5
nbdcopy -- "$TMP/d.data" "nbd+unix:///?socket=$TMP/d.sock"
stop_nbdkit "$TMP/d.pid"
grep -v debug "$TMP/d.err" | tail -3 >&2
grep -q "the upstream refuses requests while nbdkit shuts down" \
  "$TMP/d.err" || fail "the drain below the delay filter did not say why it" \
                       "stopped"
NBDKIT_STDERR="$TMP/d.err" start_nbdkit -P "$TMP/d.pid" -U "$TMP/d.sock" \
  --filter="$FILTER" \
  file "$TMP/d.img" fscache-dir="$TMP/dc" fscache-key=d \
  fscache-mode=writeback fscache-writeback-drain=60
# A connection opens the object and its log, whose writer then starts.
nbdinfo "nbd+unix:///?socket=$TMP/d.sock" > /dev/null
stop_nbdkit "$TMP/d.pid"
cmp -n $((16 * 1024 * 1024)) "$TMP/d.data" "$TMP/d.img" ||
  fail "the next proxy did not write the backlog back"

# ---- 6. exports of 4 EiB and more -----------------------------------------
# Served as by the plugin alone (size, and reads at the start, past
# 4 EiB and at the end), uncached with the warning, in every mode.  The
# filter used to refuse them ("opening the cache object: Invalid
# argument").
cat > "$TMP/ends.py" <<'EOF'
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
s = h.get_size()
print(s, *(h.pread(4096, o).hex()[:32]
           for o in (0, min(1 << 62, s - 8192) + 512, s - 4096)))
EOF
huge ()                         # LABEL SIZE [MODE]
{
  local label=$1 size=$2 mode=${3:-} out
  local args=(pattern "$size")
  if [ -n "$mode" ]; then
    args=(--filter="$FILTER" pattern "$size" fscache-dir="$TMP/hc-$mode"
          fscache-mode="$mode")
  fi
  out=$(nbdkit -U - "${args[@]}" \
          --run "$PYTHON $TMP/ends.py \"\$uri\"" 2>>"$TMP/huge.err") || true
  echo "$label: ${out:-refused}" >&2
  echo "${out:-refused}"
}
for size in 4E $(( (1 << 62) + 4096 )) 9223372036854775807; do
  alone=$(huge "$size, alone" "$size")
  [ "$alone" != refused ] || fail "test bug: pattern $size refused alone"
  for m in $modes; do
    got=$(huge "$size, $m" "$size" "$m")
    [ "$got" = "$alone" ] ||
      fail "pattern $size, $m: '$got' where the plugin alone gives '$alone'"
  done
done
grep -q "cache unusable (File too large); serving it uncached" \
  "$TMP/huge.err" || fail "pattern 4E: no warning that it is served uncached"

# ---- 7. a plugin whose can_flush fails ----------------------------------
cat > "$TMP/badflush.sh" <<'EOF'
#!/usr/bin/env bash
case "$1" in
  get_size) echo 1M ;;
  pread) dd if=/dev/zero count="$3" iflag=count_bytes status=none ;;
  pwrite) cat > /dev/null ;;
  can_write) exit 0 ;;
  can_flush) echo "can_flush broken" >&2; exit 1 ;;
  flush) exit 0 ;;
  *) exit 2 ;;
esac
EOF
chmod +x "$TMP/badflush.sh"
same "sh plugin with a failing can_flush" sh "$TMP/badflush.sh"
[ "$(probe check sh "$TMP/badflush.sh")" = refused ] ||
  fail "test bug: the plugin alone serves a failing can_flush here"

echo "$0: OK"
