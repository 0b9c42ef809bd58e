#!/usr/bin/env bash
# nbd-fscache replay (issue 45): a block trace sent through an NBD
# server in its order, one request at a time.  Truth: nbdkit's log
# filter in front of a memory disk records every request.
#
#  1. Reads only (the default): the server saw exactly the trace's R
#     lines, in order, offsets and lengths as written, and nothing
#     else; a request past the end was skipped, one crossing it cut.
#  2. --writes: the W lines too, in their place among the reads.
#  3. A malformed line: exit 1, naming the line.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --dump-plugin
requires test -x "$TOOL"

cat > "$TMP/trace" <<'EOT'
0 4096 R
8192 512 W
1048576 65536 R
4096 4096 W
2093056 8192 R
9999999999 4096 R
12288 1000 R
EOT
run ()                          # LOG [replay options]: the requests seen
{
  local log=$1; shift
  rm -f "$log"
  nbdkit -U - --filter=log memory 2M logfile="$log" \
    --run "$TOOL replay $* $TMP/trace \"\$uri\"" > "$TMP/out" ||
    fail "replay $*"
  "$PYTHON" -c '
import re, sys
for l in open(sys.argv[1]):
    m = re.search(r" (Read|Write) id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)", l)
    if m:
        print(int(m.group(2), 16), int(m.group(3), 16), m.group(1)[0])' "$log"
}

# 2 MiB: the read at 2093056 crosses the end (cut to 4096 bytes), the
# one at 9999999999 starts past it (skipped).
run "$TMP/log1" > "$TMP/seen1"
printf '0 4096 R\n1048576 65536 R\n2093056 4096 R\n12288 1000 R\n' > "$TMP/want1"
diff -u "$TMP/want1" "$TMP/seen1" || fail "part 1: the server saw other requests"
grep -q "reads 4 read_bytes 74728 writes 0 write_bytes 0 past_end 1 cut 1" "$TMP/out" ||
  fail "part 1: the summary: $(cat "$TMP/out")"
echo "part 1: the trace's reads, in order: $(cat "$TMP/out")"

run "$TMP/log2" --writes > "$TMP/seen2"
printf '0 4096 R\n8192 512 W\n1048576 65536 R\n4096 4096 W\n2093056 4096 R\n12288 1000 R\n' \
  > "$TMP/want2"
diff -u "$TMP/want2" "$TMP/seen2" || fail "part 2: the server saw other requests"
echo "part 2: with --writes, the writes in their place"

printf '0 4096 R\n4096 x R\n' > "$TMP/trace"
rc=0
nbdkit -U - memory 2M --run "$TOOL replay $TMP/trace \"\$uri\"" \
  2> "$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "part 3: exit $rc for a malformed line"
grep -q "trace:2: not OFFSET LENGTH" "$TMP/err" || fail "part 3: $(cat "$TMP/err")"
echo "part 3: a malformed line named, exit 1"

echo "$0: OK"
