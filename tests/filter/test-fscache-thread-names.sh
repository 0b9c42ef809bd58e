#!/usr/bin/env bash
# nbd-fscache: the filter's own threads carry names (fsc_thread_name,
# core/utils.h), so that top -H, perf sched and gdb tell them from
# nbdkit's workers.
#
# 1. A proxy, and a second process joined to its cache.  A client of
#    the first reads the image in order on one connection (fills, and
#    readahead's workers, which live as long as the connection) and,
#    still connected, reads the image through the joiner, and, both
#    connections open, the names of the first process's threads
#    (/proc/PID/task/*/comm): the owner's share listener and the
#    threads serving the joiner live while the joiner has the object
#    open.  They
#    must include fsc-commit, fsc-fill, fsc-readahead, fsc-share and
#    fsc-share-conn.
# 2. A writeback proxy (its cache is not shared) written to: fsc-wb-
#    writer.
# In both, every thread must be nbdkit's ("nbdkit") or one of ours
# ("fsc-*"): a thread the filter starts and does not name fails the
# test.  Without the names every thread read "nbdkit".
#
# Truth: the kernel's record of each thread's name; the image (cmp).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter="$FILTER" null --dump-plugin

size=$((16 * 1024 * 1024))
make_random "$TMP/img" "$size"
cp "$TMP/img" "$TMP/up"
mkdir -m 700 "$TMP/c" "$TMP/w"

# check WHAT NAMES-FILE WANT...: every name nbdkit's or ours, and each
# WANT among them.
check ()
{
  local what=$1 file=$2 want other; shift 2
  sort "$file" | uniq -c
  for want in "$@"; do
    grep -qx "$want" "$file" ||
      fail "$what: no thread named $want: $(sort -u "$file" | tr '\n' ' ')"
  done
  other=$(grep -vx -e nbdkit -e 'fsc-.*' "$file" || true)
  [ -z "$other" ] || fail "$what: threads neither nbdkit's nor named: $other"
}

# 1.
start_nbdkit -P "$TMP/a.pid" -U "$TMP/a.sock" --filter="$FILTER" \
  file "$TMP/img" fscache-dir="$TMP/c"
start_nbdkit -P "$TMP/b.pid" -U "$TMP/b.sock" --filter="$FILTER" \
  file "$TMP/img" fscache-dir="$TMP/c"
"$PYTHON" - "nbd+unix:///?socket=$TMP/a.sock" "$TMP/img" \
  "nbd+unix:///?socket=$TMP/b.sock" "$(cat "$TMP/a.pid")" "$TMP/names1" \
  <<'PY' || fail "a read differs from the image"
import glob, sys
import nbd
uri, img, joiner, pid, names = sys.argv[1:]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
step = 256 * 1024
for off in range(0, len(data), step):
    if h.pread(step, off) != data[off:off + step]:
        sys.exit("the read at %d differs from the image" % off)
j = nbd.NBD()
j.connect_uri(joiner)
for off in range(0, len(data), step):
    if j.pread(step, off) != data[off:off + step]:
        sys.exit("the joiner's read at %d differs from the image" % off)
with open(names, "w") as f:
    for p in glob.glob("/proc/%s/task/*/comm" % pid):
        try:                    # a thread may end meanwhile
            f.write(open(p).read())
        except FileNotFoundError:
            pass
j.shutdown()
h.shutdown()
PY
check "a proxy and its joiner" "$TMP/names1" \
  fsc-commit fsc-fill fsc-readahead fsc-share fsc-share-conn
stop_nbdkit "$TMP/b.pid"
stop_nbdkit "$TMP/a.pid"

# 2.
start_nbdkit -P "$TMP/w.pid" -U "$TMP/w.sock" --filter="$FILTER" \
  file "$TMP/up" fscache-dir="$TMP/w" fscache-mode=writeback
# The image's own bytes, written: the log and its writer.
nbdcopy "$TMP/img" "nbd+unix:///?socket=$TMP/w.sock"
# Threads of the copy's connection may end meanwhile: what is gone is
# skipped.
for f in /proc/"$(cat "$TMP/w.pid")"/task/*/comm; do
  cat "$f" 2>/dev/null || true
done > "$TMP/names2"
check "a writeback proxy" "$TMP/names2" fsc-commit fsc-wb-writer
stop_nbdkit "$TMP/w.pid"
cmp "$TMP/img" "$TMP/up" || fail "the upstream differs from what was written"
echo "test-fscache-thread-names: OK"
