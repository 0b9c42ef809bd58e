#!/usr/bin/env bash
# nbd-fscache: the derived object key names the plugin and the filters
# below this one (issue 26, item 10; plugin/identity.c).
#
# pattern 16M and memory 16M take the same parameters.  With no
# fscache-key and fscache-validate=size (no data sample to tell them
# apart), the second must not be served the first's cached data:
#   1. pattern 16M, read whole (cached); then memory 16M: what it serves
#      equals its own upstream (zeros), and it is another object;
#   2. memory 16M with --filter=nozero below fscache: another object
#      again; pattern 16M once more, and memory named by the path of its
#      .so: their old objects (no new one), data right;
#   3. an explicit fscache-key with fscache-validate=size is warned
#      about.
#
# Truth: cmp against what each upstream holds (nbdcopy of the plugin
# without the filter), and the number of objects (index files).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter="$FILTER" null --dump-plugin
requires nbdkit pattern --dump-plugin
requires nbdkit memory --dump-plugin
requires nbdkit --filter=nozero null --dump-plugin

cache="$TMP/cache"
nobj () { find "$cache/objects" -name '*.idx' | wc -l; }

# truth PLUGIN ARGS...: the upstream's bytes, without the filter.
truth ()
{
  local out="$1"; shift
  nbdkit -U - "$@" --run "nbdcopy \"\$uri\" '$out'"
}
truth "$TMP/pattern.img" pattern 16M
truth "$TMP/memory.img" memory 16M
cmp -s "$TMP/pattern.img" "$TMP/memory.img" &&
  fail "setup: pattern and memory serve the same bytes"

# serve NAME TRUTH [--filter=X...] PLUGIN ARGS...: copy through the
# filter (derived key, validate=size) and cmp with TRUTH.
serve ()
{
  local name="$1" want="$2"; shift 2
  local filters=()
  while [[ "$1" == --filter=* ]]; do filters+=("$1"); shift; done
  start_nbdkit -P "$TMP/$name.pid" -U "$TMP/$name.sock" -v --log=stderr \
    --filter="$FILTER" "${filters[@]}" "$@" \
    fscache-dir="$cache" fscache-validate=size 2>"$TMP/$name.err"
  # --no-extents: every byte is read (memory reports all as holes, and
  # nbdcopy would write zeros without reading them).
  nbdcopy --no-extents "nbd+unix:///?socket=$TMP/$name.sock" "$TMP/$name.out"
  stop_nbdkit "$TMP/$name.pid"
  cmp "$want" "$TMP/$name.out" ||
    fail "$name: not its own upstream's data"
}

# ---- 1 ------------------------------------------------------------------
serve pattern "$TMP/pattern.img" pattern 16M
[ "$(nobj)" -eq 1 ] || fail "1: $(nobj) objects after pattern"
serve memory "$TMP/memory.img" memory 16M
[ "$(nobj)" -eq 2 ] || fail "1: memory 16M shared pattern 16M's object"
echo "1: pattern 16M and memory 16M: two objects, each its own data"

# ---- 2 ------------------------------------------------------------------
serve nozero "$TMP/memory.img" --filter=nozero memory 16M
[ "$(nobj)" -eq 3 ] || fail "2: a filter below did not change the key"
grep -q "nbdkit-filters-below=nozero" "$TMP/nozero.err" ||
  fail "2: the filter below is not in the derived key"
serve pattern2 "$TMP/pattern.img" pattern 16M
[ "$(nobj)" -eq 3 ] || fail "2: pattern 16M's key is not stable"
grep -q "ok, [1-9][0-9]* blocks cached" "$TMP/pattern2.err" ||
  fail "2: pattern 16M did not find its cached copy again"
# The plugin named by its path is the same plugin: the same object.
plugindir="$(nbdkit --dump-config | sed -n 's/^plugindir=//p')"
[ -f "$plugindir/nbdkit-memory-plugin.so" ] ||
  fail "no nbdkit-memory-plugin.so in nbdkit's plugindir '$plugindir'"
serve bypath "$TMP/memory.img" "$plugindir/nbdkit-memory-plugin.so" 16M
[ "$(nobj)" -eq 3 ] || fail "2: memory named by its path is another object"
echo "2: a filter below is another object; the key is stable"

# ---- 3 ------------------------------------------------------------------
nbdkit -U - --filter="$FILTER" memory 16M fscache-dir="$cache" \
  fscache-key=same fscache-validate=size --run true 2>"$TMP/w.err"
grep -q "warning: fscache-key=same with fscache-validate=size" "$TMP/w.err" ||
  { cat "$TMP/w.err" >&2; fail "3: no warning"; }
echo "3: an explicit key with validate=size is warned about"
