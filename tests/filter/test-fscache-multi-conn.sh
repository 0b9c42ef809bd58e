#!/usr/bin/env bash
# nbd-fscache: multi-conn through the filter (issue 42).
#
#  1. An upstream that can write and offers no multi-conn
#     (tests/multi-conn-plugin.sh: a connection sees another's flushed
#     writes only once it flushes itself).  Alone it says no
#     multi-conn.  Through the filter, in writethrough, writearound and
#     writeback, and under -r, it says yes, and keeps the promise: of
#     two connections, B reads the image, A writes and flushes, and B's
#     next read shows A's write (with the plugin alone B would still
#     read its old view).
#  2. nginx through the curl plugin, read-only (-r): the filter says
#     multi-conn (curl alone does not), and nbdcopy --connections=4
#     --threads=2 copies through 2 connections at least (a log filter
#     in front of the cache counts those that read), identical.  It
#     used to use one, silently.
#
# Truth: the plugin alone (can_multi_conn), the bytes a connection
# reads after another's flush, the image (cmp), a log filter's
# connections.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit sh --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
requires "$PYTHON" -c 'import nbd'

plugin="$top_srcdir/tests/multi-conn-plugin.sh"

cat > "$TMP/mc.py" <<'EOF'
import sys, nbd
uri, mode = sys.argv[1], sys.argv[2]
a, b = nbd.NBD(), nbd.NBD()
a.connect_uri(uri)
b.connect_uri(uri)
mc = a.can_multi_conn()
print("multi-conn:", mc)
if mode == "alone":
    sys.exit(0 if not mc else "the plugin alone says multi-conn (test bug?)")
if not mc:
    sys.exit("%s: no multi-conn through the filter" % mode)
first = b.pread(32, 0)
if mode == "ro":
    sys.exit(0)
a.pwrite(b"Hello from connection A.        ", 0)
a.flush()
after = b.pread(32, 0)
if after != b"Hello from connection A.        ":
    sys.exit("%s: after A's flush, B reads %r (before: %r)" % (mode, after, first))
print("%s: B reads A's flushed write" % mode)
EOF

# ---- 1. the multi-conn test plugin ----
nbdkit -U - sh "$plugin" --run "$PYTHON $TMP/mc.py \"\$uri\" alone" ||
  fail "part 1: the plugin alone"
for mode in writethrough writearound writeback; do
  nbdkit -U - --filter="$FILTER" sh "$plugin" fscache-dir="$TMP/c-$mode" \
    fscache-mode=$mode --run "$PYTHON $TMP/mc.py \"\$uri\" $mode" ||
    fail "part 1: $mode"
done
nbdkit -r -U - --filter="$FILTER" sh "$plugin" fscache-dir="$TMP/c-ro" \
  --run "$PYTHON $TMP/mc.py \"\$uri\" ro" || fail "part 1: -r"

# ---- 2. curl, read-only, four connections ----
if ! nginx -v 2>/dev/null || ! nbdkit curl --dump-plugin >/dev/null 2>&1; then
  echo "$0: SKIP: part 2 needs nginx and the curl plugin (part 1 passed)"
  exit 77
fi
# nbdcopy gives each thread 128 MiB of the image at a time, a thread
# its own connection: 256 MiB (sparse, with data in both halves) for
# two threads.
mkdir -p "$TMP/www"
truncate -s 256M "$TMP/www/img"
for s in 0 130; do
  head -c $((2 * 1024 * 1024)) /dev/urandom |
    dd of="$TMP/www/img" bs=1M seek=$s conv=notrunc status=none
done
start_nginx "$TMP/www" '$status $request_method $uri $body_bytes_sent'
alone=0
nbdkit -r -U - curl "http://127.0.0.1:$PORT/img" \
  --run 'nbdinfo --can multi-conn "$uri"' || alone=$?
echo "curl alone: nbdinfo --can multi-conn exits $alone"
start_nbdkit -r -P "$TMP/px.pid" -U "$TMP/px.sock" --filter=log \
  --filter="$FILTER" curl "http://127.0.0.1:$PORT/img" \
  logfile="$TMP/px.log" fscache-dir="$TMP/c-curl"
nbdinfo --can multi-conn "nbd+unix:///?socket=$TMP/px.sock" ||
  fail "part 2: no multi-conn through the filter over curl, read-only"
nbdcopy --connections=4 --threads=2 "nbd+unix:///?socket=$TMP/px.sock" \
  "$TMP/copy"
stop_nbdkit "$TMP/px.pid"
cmp "$TMP/www/img" "$TMP/copy" || fail "part 2: the copy differs"
conns=$(grep -c ' Connect export=' "$TMP/px.log" || true)
reading=$(grep ' Read id=' "$TMP/px.log" | grep -v '\.\.\.Read' |
          grep -o 'connection=[0-9]*' | sort -u | wc -l)
echo "curl through the filter: $conns connections, $reading of them read"
[ "$reading" -ge 2 ] || fail "part 2: nbdcopy read through $reading connection(s)"
echo "$0: OK"
