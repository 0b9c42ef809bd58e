#!/usr/bin/env bash
# nbd-fscache, fscache-mode=writeback: overlapping writes are
# serialized per unit, whatever their alignment (rule 10, core/wlog/wlog.c).
#
# 1,000 rounds, each on a unit of its own that is not yet cached: one
# connection writes 100 bytes in the middle of the unit (unaligned: the
# log reads the rest of the unit from the upstream, 5 ms late through
# nbdkit's delay filter), a second connection at the same time writes
# the whole unit.  A plain file allows only this: the bytes outside the
# patch are the whole-unit write's, the patch is either write's.  Checked
# through the proxy, and in the upstream image after the proxy drained
# its log on SIGTERM (fscache-writeback-drain).
#
# Before rule 10 the whole-unit write could land while the unaligned
# write read the old unit, which was then logged over it: the whole-unit
# write's bytes outside the patch were lost.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=delay null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import nbd'

rounds=1000
unit=4096
stride=65536                    # one block of the cache per round
size=$((rounds * stride))

truncate -s $size "$TMP/up.img"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=delay file "$TMP/up.img" delay-read=5ms
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache" fscache-key=overlap fscache-mode=writeback \
  fscache-readahead=0 fscache-writeback-drain=60

# The rounds, then the checks through the proxy; each round's two
# patterns are derived from its number.
$PYTHON - "$rounds" "$stride" "$unit" "nbd+unix:///?socket=$TMP/px.sock" \
  <<'PY' ||
import nbd, sys
rounds, stride, unit = map(int, sys.argv[1:4])
uri = sys.argv[4]
h1 = nbd.NBD(); h1.connect_uri(uri)
h2 = nbd.NBD(); h2.connect_uri(uri)
P0, PL = 1000, 100

def whole(i): return bytes([(i * 7 + 1) % 251 + 1]) * unit
def patch(i): return bytes([(i * 11 + 3) % 251 + 2]) * PL

def check(i, got, where):
    w, p = whole(i), patch(i)
    if got[:P0] != w[:P0] or got[P0 + PL:] != w[P0 + PL:]:
        bad = sum(1 for a, b in zip(got, w)
                  if a != b) - sum(1 for k in range(P0, P0 + PL)
                                   if got[k] != w[k])
        return "%s: round %d: %d bytes of the whole-unit write outside " \
               "the patch lost" % (where, i, bad)
    mid = got[P0:P0 + PL]
    if mid != p[:PL] and mid != w[P0:P0 + PL]:
        return "%s: round %d: the patch is neither write" % (where, i)
    return None

for i in range(rounds):
    off = i * stride
    c1 = h1.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(patch(i))),
                       off + P0)
    c2 = h2.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(whole(i))), off)
    for h, c in ((h1, c1), (h2, c2)):
        while not h.aio_command_completed(c):
            h.poll(-1)
errs = []
for i in range(rounds):
    e = check(i, h1.pread(unit, i * stride), "proxy")
    if e: errs.append(e)
h1.flush()
h1.shutdown(); h2.shutdown()
if errs:
    print("\n".join(errs[:5]), file=sys.stderr)
    print("%d of %d rounds wrong through the proxy" % (len(errs), rounds),
          file=sys.stderr)
    sys.exit(1)
PY
  fail "overlapping writes through the proxy"

# Drain the log to the upstream, then check the image itself.
stop_nbdkit "$TMP/px.pid"
$PYTHON - "$rounds" "$stride" "$unit" "$TMP/up.img" <<'PY' ||
import sys
rounds, stride, unit = map(int, sys.argv[1:4])
P0, PL = 1000, 100
img = open(sys.argv[4], "rb").read()
bad = 0
for i in range(rounds):
    got = img[i * stride:i * stride + unit]
    w = bytes([(i * 7 + 1) % 251 + 1]) * unit
    p = bytes([(i * 11 + 3) % 251 + 2]) * PL
    if got[:P0] != w[:P0] or got[P0 + PL:] != w[P0 + PL:] or \
       got[P0:P0 + PL] not in (p, w[P0:P0 + PL]):
        bad += 1
if bad:
    print("%d of %d rounds wrong in the upstream image" % (bad, rounds),
          file=sys.stderr)
    sys.exit(1)
PY
  fail "overlapping writes in the upstream image"
echo "$0: $rounds rounds of overlapping writes: PASS"
