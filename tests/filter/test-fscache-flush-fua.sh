#!/usr/bin/env bash
# FLUSH and FUA through the fscache filter reach the upstream before the
# client's reply.
#
# The log filter sits below fscache (on the upstream server); it writes
# each request's line and its reply's line as they happen, so when a
# client's request returns, the upstream log must already show:
#   - for every client FLUSH: an upstream Flush that was issued after the
#     reply of the upstream Write of the client's last write, and has
#     itself replied (return=0).  Checked on the connection that wrote
#     and, since the proxy advertises multi-conn, on a second connection
#     (its flush must cover the first one's write); also a flush with no
#     write before it must still reach upstream;
#   - for every client write with FUA (pwrite, zero and trim, on cached
#     and uncached blocks, both modes): the upstream Write/Zero/Trim with
#     fua=1, replied, or else an upstream Flush issued after its reply.
# The data written must of course also be there: the proxy's view equals
# the upstream file at the end.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires cmp --version
PY=python3                    # functions.sh: the one with libnbd
requires "$PY" -c 'import nbd'
requires test -f "$FILTER"

SIZE=$(( 8*1024*1024 + 1000 ))

cat > "$TMP/check.py" <<'EOF'
import nbd, re, sys
sock, logf, mode = sys.argv[1:4]
BS = 65536
REQ = re.compile(r"connection=(\d+) (\w+) id=(\d+)(.*)")
REP = re.compile(r"connection=(\d+) \.\.\.(\w+) id=(\d+) return=(-?\d+)")

def parse():
    """Requests as dicts with the index of their line and reply line."""
    reqs, byid = [], {}
    with open(logf) as f:
        for i, line in enumerate(f):
            m = REP.search(line)
            if m:
                r = byid.get((m.group(1), m.group(3)))
                if r is not None and r["op"] == m.group(2):
                    r["reply"] = i
                    r["ret"] = int(m.group(4))
                continue
            m = REQ.search(line)
            if m:
                args = dict(kv.split("=", 1) for kv in m.group(4).split()
                            if "=" in kv)
                r = {"conn": m.group(1), "op": m.group(2), "line": i,
                     "reply": None, "ret": None, "args": args}
                reqs.append(r)
                byid[(m.group(1), m.group(3))] = r
    return reqs

def upstream_op(reqs, op, off, cnt):
    """The last upstream request OP of exactly [off, off+cnt)."""
    for r in reversed(reqs):
        if (r["op"] == op and int(r["args"].get("offset", "-1"), 16) == off
                and int(r["args"].get("count", "-1"), 16) == cnt):
            return r
    return None

def flush_after(reqs, idx):
    """An upstream Flush issued after line IDX that has replied 0."""
    return any(r["op"] == "Flush" and r["line"] > idx and
               r["reply"] is not None and r["ret"] == 0 for r in reqs)

fails = 0
def fail(msg):
    global fails
    fails += 1
    print("%s: FAIL: %s" % (mode, msg))

h1 = nbd.NBD(); h1.connect_unix(sock)
h2 = nbd.NBD(); h2.connect_unix(sock)
if not h1.can_multi_conn():
    print("%s: note: no multi-conn, skipping the cross-connection flushes" % mode)

def nflushes(reqs):
    return sum(1 for r in reqs if r["op"] == "Flush" and r["ret"] == 0)

# A flush with nothing written before it still reaches upstream.
before = nflushes(parse())
h1.flush()
if nflushes(parse()) <= before:
    fail("a flush with no write before it did not reach upstream")

checked_flush = checked_fua = 0
for i in range(40):
    # Alternate: cached blocks (read first) and uncached ones, aligned
    # and unaligned, whole and partial blocks.
    off = (i * 3 + 1) * BS + (0 if i % 2 else 1000 + i)
    cnt = BS if i % 4 == 1 else 5000 + 97 * i
    if i % 3 == 0:
        h1.pread(2 * BS, off - off % BS)
    buf = bytes([i + 1]) * cnt
    kind = i % 4
    if kind in (0, 1):
        # write, then FLUSH on this connection or (multi-conn) the other
        h1.pwrite(buf, off)
        fl = h2 if (i % 8 == 1 and h1.can_multi_conn()) else h1
        fl.flush()
        reqs = parse()
        w = upstream_op(reqs, "Write", off, cnt)
        if w is None or w["reply"] is None or w["ret"] != 0:
            fail("write %d@%d: no replied upstream Write" % (cnt, off))
        elif not flush_after(reqs, w["reply"]):
            fail("write %d@%d then flush (conn %s): no upstream Flush after "
                 "the Write before the flush's reply"
                 % (cnt, off, "2" if fl is h2 else "1"))
        checked_flush += 1
    else:
        # FUA write, zero or trim
        if kind == 2:
            op = "Write"
            h1.pwrite(buf, off, nbd.CMD_FLAG_FUA)
        elif i % 8 == 3:
            op = "Zero"
            h1.zero(cnt, off, nbd.CMD_FLAG_FUA)
        else:
            op = "Trim"
            h1.trim(cnt, off, nbd.CMD_FLAG_FUA)
        reqs = parse()
        w = upstream_op(reqs, op, off, cnt)
        if w is None or w["reply"] is None or w["ret"] != 0:
            fail("FUA %s %d@%d: no replied upstream %s" % (op, cnt, off, op))
        elif w["args"].get("fua") != "1" and not flush_after(reqs, w["reply"]):
            fail("FUA %s %d@%d: upstream %s has fua=%s and no Flush follows "
                 "before the reply" % (op, cnt, off, op, w["args"].get("fua")))
        checked_fua += 1
h1.shutdown(); h2.shutdown()
print("%s: %d flushes and %d FUA requests checked, %d failures"
      % (mode, checked_flush, checked_fua, fails))
sys.exit(1 if fails else 0)
EOF

for mode in writethrough writearound; do
  d="$TMP/$mode"
  mkdir -p "$d"
  make_random "$d/up.img" $SIZE
  start_nbdkit -P "$d/up.pid" -U "$d/up.sock" \
    --filter=log file "$d/up.img" logfile="$d/up.log"
  start_nbdkit -P "$d/px.pid" -U "$d/px.sock" --filter="$FILTER" \
    nbd socket="$d/up.sock" fscache-dir="$d/cache" fscache-mode=$mode
  "$PY" "$TMP/check.py" "$d/px.sock" "$d/up.log" $mode
  # The proxy's whole view equals the upstream file.
  "$PY" -c "
import nbd, sys
h = nbd.NBD(); h.connect_unix('$d/px.sock')
size = h.get_size(); out = bytearray()
for off in range(0, size, 1 << 20):
    out += h.pread(min(1 << 20, size - off), off)
h.shutdown()
sys.exit(0 if bytes(out) == open('$d/up.img', 'rb').read() else 1)
" || { echo "$0: $mode: proxy view differs from upstream"; exit 1; }
  stop_nbdkit "$d/px.pid"
  stop_nbdkit "$d/up.pid"
done
echo "$0: OK"
