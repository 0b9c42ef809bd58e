#!/usr/bin/env bash
# nbd-fscache: the write-history oracle (tests/wb-oracle) passes the
# images it should and fails the ones it should, so that the ordered
# writeback tests built on it can be believed.
#
# Truth: nbdkit's file plugin, no cache: every acknowledged write is
# in the image file.  The broken images are forged from that image
# and the log: a block one write behind while later epochs are
# present, an exact flush state, a write present without a FUA write
# that completed before it was issued, a corrupt byte, torn blocks.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit file --dump-plugin
requires nbdkit --filter=delay null --dump-plugin
requires python3 --version

ORACLE="$top_builddir/tests/wb-oracle"
[ -x "$ORACLE" ] || fail "$ORACLE is not built"
oracle () { "$ORACLE" "$@"; }

bs=4096
nblocks=4096
truncate -s $((nblocks * bs)) "$TMP/disk.img"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" file "$TMP/disk.img"
uri="nbd+unix:///?socket=$TMP/up.sock"
log="$TMP/log"

# ---- a clean run: the final state, at the last flush ------------------
oracle write "$uri" "$log" --writes 2000 --flush-every 16 --depth 4 \
  --fua-every 7 --seed 1 || fail "write exited $?"
nflush=$(grep -c '^F ' "$log")
[ "$(grep -c '^FA ' "$log")" -eq "$nflush" ] || fail "a flush not acked"
[ "$nflush" -ge 60 ] || fail "only $nflush flushes for 2000 writes"
[ "$(grep -c '^A ' "$log")" -eq 2000 ] || fail "not every write acked"
grep -q ' fua$' "$log" || fail "no FUA write in the log"

out=$(oracle check "$TMP/disk.img" "$log" --final --initial zero) ||
  fail "check --final: $out"
out=$(oracle check "$TMP/disk.img" "$log" --initial zero) ||
  fail "check: $out"
[ "$out" = "consistent at flush $nflush (0 blocks from epoch $nflush)" ] ||
  fail "check: '$out', expected the last flush, $nflush"
out=$(oracle check-flushed "$uri" "$log") || fail "check-flushed: $out"
out=$(oracle check-final "$uri" "$log") || fail "check-final: $out"
echo "clean run: $nflush flushes; $out"

# The checker's speed: the whole image and log, well under a second.
t0=$(date +%s.%N)
oracle check "$TMP/disk.img" "$log" >/dev/null
t=$(seconds_since "$t0")
echo "check: $t s"
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || fail "check took $t s"

# forge OUT EDITS...: a copy of the clean image with blocks replaced;
# each edit is BLK:SEQ (that write's block, from the log) or BLK:zero.
forge ()
{
  local out="$1" e b s
  shift
  cp "$TMP/disk.img" "$out"
  for e in "$@"; do
    b=${e%%:*} s=${e#*:}
    if [ "$s" = zero ]; then
      dd if=/dev/zero of="$out" bs=$bs seek="$b" count=1 conv=notrunc \
        status=none
    else
      oracle block "$log" "$s" |
        dd of="$out" bs=$bs seek="$b" count=1 conv=notrunc status=none
    fi
  done
}

# expect_fail WHAT ARGS...: the oracle must exit 1 (a failed check).
expect_fail ()
{
  local what="$1" st=0
  shift
  out=$(oracle "$@") || st=$?
  [ "$st" -eq 1 ] || fail "$what: exit $st, expected 1 (out: $out)"
  echo "$what: fails as it should: $out"
}

# The log as Python sees it: W lines, per block in issue order.
cat > "$TMP/hist.py" <<'EOF'
import sys
W = {}                     # seq -> (blk, epoch)
per = {}                   # blk -> [seq...]
for l in open(sys.argv[1]):
    t = l.split()
    if t and t[0] == "W":
        s, b, e = int(t[1]), int(t[2]), int(t[3])
        W[s] = (b, e)
        per.setdefault(b, []).append(s)
nf = sum(1 for l in open(sys.argv[1]) if l.startswith("F "))
EOF

# ---- (a) one block a write behind, later epochs present: must fail ----
# A block whose last write is of an early epoch holds its previous
# version instead; the blocks of the last epoch rule out every flush
# before it.
edit=$(python3 - "$log" <<'EOF'
import sys; exec(open(sys.argv[1].rsplit("/", 1)[0] + "/hist.py").read())
for b, ss in sorted(per.items()):
    if len(ss) >= 2 and W[ss[-1]][1] <= nf - 3:
        print("%d:%d" % (b, ss[-2]))
        break
EOF
)
[ -n "$edit" ] || fail "no block for case (a) in the log"
forge "$TMP/a.img" "$edit"
expect_fail "(a) lost write $edit" check "$TMP/a.img" "$log"
case "$out" in
  *"block ${edit%%:*} "*) ;;
  *) fail "(a) names another block" ;;
esac
expect_fail "(a) --final" check "$TMP/a.img" "$log" --final

# ---- (b) an exact flush state, then part of the next epoch: must pass --
# S_K: the last write of an epoch < K to each block (zeroes if none);
# then the first half of epoch K's writes on top.
K=$((nflush - 4))
for half in 0 1; do
  mapfile -t edits < <(python3 - "$log" "$K" "$half" <<'EOF'
import sys; exec(open(sys.argv[1].rsplit("/", 1)[0] + "/hist.py").read())
k, half = int(sys.argv[2]), int(sys.argv[3])
epk = [s for s in sorted(W) if W[s][1] == k]
keep = set(epk[:len(epk) // 2]) if half else set()
newer = set()
for b, ss in sorted(per.items()):
    if W[ss[-1]][1] < k:
        continue                # the clean image has it right already
    old = [s for s in ss if W[s][1] < k or s in keep]
    print("%d:%s" % (b, old[-1] if old else "zero"))
    if old and W[old[-1]][1] == k:
        newer.add(b)
print("newer %d" % len(newer))
EOF
)
  newer=${edits[-1]#newer }
  unset 'edits[-1]'
  forge "$TMP/b.img" "${edits[@]}"
  out=$(oracle check "$TMP/b.img" "$log" --initial zero) ||
    fail "(b) state at flush $K (+$newer): $out"
  [ "$out" = "consistent at flush $K ($newer blocks from epoch $K)" ] ||
    fail "(b) '$out', expected flush $K with $newer newer blocks"
  echo "(b) flush $K + $newer blocks of epoch $K: $out"
done
[ "$newer" -gt 0 ] || fail "(b) no block of epoch $K kept"
# Not the final state.
expect_fail "(b) --final" check "$TMP/b.img" "$log" --final

# ---- (d) FUA order: a write issued after a FUA write completed -------
# On S_k (an exact flush state; k = K or the first epoch below it with
# such writes), write Y of epoch k, the first issued after the
# acknowledgement of a FUA write of epoch k, with every FUA write of
# epoch k acknowledged before Y was issued: must pass.  The
# same without one of those FUA writes, X (what a writer that ignores
# FUA order leaves after a cache loss): must fail, naming X's block;
# under the flush-only model it is a state at flush k, plus part of
# epoch k.
mapfile -t fua < <(python3 - "$log" "$K" <<'EOF2'
import sys
W, A, per = {}, {}, {}
for n, l in enumerate(open(sys.argv[1])):
    t = l.split()
    if t and t[0] == "W":
        W[int(t[1])] = (int(t[2]), int(t[3]), len(t) == 5, n)
        per.setdefault(int(t[2]), []).append(int(t[1]))
    elif t and t[0] == "A":
        A[int(t[1])] = n

def case(k):
    base = []
    for b, ss in sorted(per.items()):
        if W[ss[-1]][1] < k:
            continue
        old = [s for s in ss if W[s][1] < k]
        base.append("%d:%s" % (b, old[-1] if old else "zero"))
    for x in sorted(s for s in W if W[s][1] == k and W[s][2] and s in A):
        later = [s for s in sorted(W) if W[s][3] > A[x] and W[s][1] == k]
        if not later:
            continue
        y = later[0]
        fs = [s for s in sorted(W) if W[s][1] == k and W[s][2] and s in A
              and A[s] < W[y][3]]
        if W[y][0] == W[x][0] or \
           any(W[s][0] == W[x][0] for s in fs if s != x):
            continue
        print(" ".join(base + ["%d:%d" % (W[s][0], s) for s in fs]
                       + ["%d:%d" % (W[y][0], y)]))
        print(" ".join(base + ["%d:%d" % (W[s][0], s) for s in fs if s != x]
                       + ["%d:%d" % (W[y][0], y)]))
        print(k, W[x][0], x, y)
        return True
    return False

# The first epoch from K down that has such a pair (FUA writes acked
# after the last write of their epoch was issued have none).
for k in range(int(sys.argv[2]), 0, -1):
    if case(k):
        break
EOF2
)
[ ${#fua[@]} -eq 3 ] || fail "(d) no FUA write with a later write in its epoch"
read -r kd xb xs ys <<<"${fua[2]}"
read -r -a edits <<<"${fua[0]}"
forge "$TMP/d.img" "${edits[@]}"
out=$(oracle check "$TMP/d.img" "$log" --initial zero) ||
  fail "(d) FUA write $xs and write $ys after it: $out"
case "$out" in
  "consistent at flush $kd "*) ;;
  *) fail "(d) '$out', expected flush $kd" ;;
esac
echo "(d) FUA write $xs, then write $ys: $out"
read -r -a edits <<<"${fua[1]}"
forge "$TMP/d.img" "${edits[@]}"
expect_fail "(d) write $ys without FUA write $xs" check "$TMP/d.img" "$log" \
  --initial zero
case "$out" in
  "inconsistent: FUA order: block $xb "*) ;;
  *) fail "(d) names another block or reason: $out" ;;
esac

# ---- (c) a corrupt byte, torn blocks: must fail -----------------------
read -r cb cs < <(python3 - "$log" <<'EOF'
import sys; exec(open(sys.argv[1].rsplit("/", 1)[0] + "/hist.py").read())
b, ss = max(per.items(), key=lambda i: len(i[1]))
print(b, ss[-2])
EOF
)
cp "$TMP/disk.img" "$TMP/c.img"
printf '\x5a' |
  dd of="$TMP/c.img" bs=1 seek=$((cb * bs + 2000)) conv=notrunc status=none
cmp -s "$TMP/c.img" "$TMP/disk.img" && fail "(c) the byte was already 0x5a"
expect_fail "(c) corrupt byte in block $cb" check "$TMP/c.img" "$log"
expect_fail "(c) corrupt byte, --final" check "$TMP/c.img" "$log" --final

# Torn at a sector: the header sector of the previous version over the
# last one, then the header sector lost (zero) over the last one.
cp "$TMP/disk.img" "$TMP/t.img"
oracle block "$log" "$cs" |
  dd of="$TMP/t.img" bs=512 seek=$((cb * 8)) count=1 conv=notrunc status=none
expect_fail "(c) torn, two versions" check "$TMP/t.img" "$log"
cp "$TMP/disk.img" "$TMP/t.img"
dd if=/dev/zero of="$TMP/t.img" bs=512 seek=$((cb * 8)) count=1 \
  conv=notrunc status=none
expect_fail "(c) torn, header sector old" check "$TMP/t.img" "$log"

# A block of this run in another block's place (a misdirected write).
forge "$TMP/m.img" "$((cb + 1 < nblocks ? cb + 1 : cb - 1)):$cs"
expect_fail "(c) misplaced block" check "$TMP/m.img" "$log"

# ---- the server killed mid-run: exit 3, a usable log ------------------
truncate -s $((nblocks * bs)) "$TMP/disk2.img"
start_nbdkit -P "$TMP/up2.pid" -U "$TMP/up2.sock" \
  --filter=delay file "$TMP/disk2.img" wdelay=2ms
uri2="nbd+unix:///?socket=$TMP/up2.sock"
st=0
oracle write "$uri2" "$TMP/log2" --writes 100000 --flush-every 8 \
  --depth 4 --seed 2 2>"$TMP/write2.err" &
wpid=$!
log_lines_over () { [ -f "$1" ] && [ "$(wc -l < "$1")" -gt "$2" ]; }
wait_until log_lines_over "$TMP/log2" 400 ||
  fail "the writer did not get going"
kill9_nbdkit "$TMP/up2.pid"
wait "$wpid" || st=$?
cat "$TMP/write2.err"
[ "$st" -eq 3 ] || fail "write after the server died: exit $st, expected 3"
grep -q '^E ' "$TMP/log2" || fail "no E line in the log"
acked=$(grep -c '^FA ' "$TMP/log2" || true)
out=$(oracle check "$TMP/disk2.img" "$TMP/log2" --initial zero) ||
  fail "check after the kill: $out"
k=$(echo "$out" | awk '{ print $4 }')
[ "$k" -ge "$acked" ] || fail "after the kill: $out, but $acked flushes acked"
echo "killed: $acked flushes acked; $out"
# The file plugin wrote every acknowledged write: nothing was lost.
out=$(oracle check "$TMP/disk2.img" "$TMP/log2" --final) ||
  fail "check --final after the kill: $out"
start_nbdkit -P "$TMP/up3.pid" -U "$TMP/up3.sock" file "$TMP/disk2.img"
out=$(oracle check-flushed "nbd+unix:///?socket=$TMP/up3.sock" \
  "$TMP/log2") || fail "check-flushed after the kill: $out"

echo "$0: OK"
