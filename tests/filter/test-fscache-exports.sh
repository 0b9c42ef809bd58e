#!/usr/bin/env bash
# nbd-fscache: one cache object per export.  The upstream serves several
# exports (nbdkit file dir=DIR: one export per file), the proxy passes
# the client's export name through (nbd plugin dynamic-export=true).
# Two exports of the same size but different contents each get their
# own, correct data, cold and warm, also when read at the same time;
# the cache directory holds one object per export; after a restart
# both are served from the cache (0 bytes upstream); an export read
# for the first time after the restart is fetched cold and correct.
#
# Truth: cmp against the upstream files, the upstream's own request
# log (nbdkit --filter=log: bytes read, and the export of each
# connection) and the files under fscache-dir/objects.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires nbdkit --filter=log null --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit file --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
# nbdkit >= 1.22: file dir= and nbd dynamic-export=
requires nbdkit file dir=/ --dump-plugin
requires sh -c 'nbdkit nbd --help | grep -q dynamic-export'

mkdir "$TMP/exports"
size=$((8 * 1024 * 1024 + 4321))       # a and b: same size on purpose
make_random "$TMP/exports/a" "$size"
make_random "$TMP/exports/b" "$size"
make_random "$TMP/exports/c" $((3 * 1024 * 1024 + 99))
if cmp -s "$TMP/exports/a" "$TMP/exports/b"; then
  echo "$0: test bug: a and b are identical" >&2; exit 1
fi

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file dir="$TMP/exports" logfile="$TMP/up.log"
up_bytes () { log_read_bytes "$TMP/up.log"; }

start_proxy ()
{
  start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" dynamic-export=true \
    fscache-dir="$TMP/cache" fscache-validate=size "$@"
}

read_export ()                  # NAME [OUT]
{
  local out="${2:-$TMP/out-$1}"
  rm -f "$out"
  nbdcopy "nbd+unix:///$1?socket=$TMP/px.sock" "$out"
}
check_export ()                 # NAME WHAT [OUT]
{
  local out="${3:-$TMP/out-$1}"
  if ! cmp "$TMP/exports/$1" "$out"; then
    echo "$0: FAIL: $2: export $1 differs from upstream file $1" >&2
    if cmp -s "$TMP/exports/a" "$out" || cmp -s "$TMP/exports/b" "$out"
    then
      echo "$0: ... it has the data of the other export" >&2
    fi
    exit 1
  fi
  rm -f "$out"
}
expect_up ()                    # WHAT BEFORE EXPECTED
{
  local now
  now=$(up_bytes)
  echo "$1: $((now - $2)) bytes upstream, expected $3"
  if [ $((now - $2)) -ne "$3" ]; then
    echo "$0: FAIL: $1: $((now - $2)) bytes read upstream, expected $3" >&2
    exit 1
  fi
}
count_objects ()
{
  find "$TMP/cache/objects" -type f -name '*.idx' | wc -l
}

start_proxy
b=$(up_bytes)
read_export a; check_export a "cold read"
expect_up "export a, cold" "$b" "$size"
# Upstream connections were for export a only.
if grep ' Connect export=' "$TMP/up.log" | grep -v ' Connect export=a '; then
  echo "$0: FAIL: the proxy opened another upstream export for a" >&2
  exit 1
fi

b=$(up_bytes)
read_export b; check_export b "cold read after a"
expect_up "export b, cold (a cached, same size)" "$b" "$size"

b=$(up_bytes)
read_export a; check_export a "warm read"
read_export b; check_export b "warm read"
expect_up "exports a and b, warm" "$b" 0

# Both at once, warm.
b=$(up_bytes)
read_export a "$TMP/par-a" & pa=$!
read_export b "$TMP/par-b" & pb=$!
wait "$pa"; wait "$pb"
check_export a "warm read in parallel" "$TMP/par-a"
check_export b "warm read in parallel" "$TMP/par-b"
expect_up "exports a and b in parallel, warm" "$b" 0
stop_nbdkit "$TMP/px.pid"

n=$(count_objects)
echo "objects in the cache: $n"
find "$TMP/cache/objects" -type f | sed "s|^$TMP/||"
if [ "$n" -ne 2 ]; then
  echo "$0: FAIL: $n objects in $TMP/cache/objects, expected 2" >&2
  exit 1
fi

# After a restart both are served from the cache.
start_proxy fscache-stats="$TMP/restart.stats"
b=$(up_bytes)
read_export b; check_export b "after restart"
read_export a; check_export a "after restart"
expect_up "exports a and b after restart" "$b" 0

# A third export, new after the restart: cold, correct, its own object.
b=$(up_bytes)
read_export c; check_export c "cold read after restart"
expect_up "export c, cold after restart" "$b" $((3 * 1024 * 1024 + 99))
b=$(up_bytes)
read_export c; check_export c "warm read after restart"
expect_up "export c, warm" "$b" 0
stop_nbdkit "$TMP/px.pid"

n=$(count_objects)
if [ "$n" -ne 3 ]; then
  echo "$0: FAIL: $n objects after export c, expected 3" >&2
  exit 1
fi
reused=$(stat_value "$TMP/restart.stats" objects_reused)
created=$(stat_value "$TMP/restart.stats" objects_created)
echo "after restart: objects_reused=$reused objects_created=$created"
if [ "$reused" -lt 2 ] || [ "$created" -ne 1 ]; then
  echo "$0: FAIL: after restart objects_reused=$reused (expected >= 2)," \
       "objects_created=$created (expected 1)" >&2
  exit 1
fi

echo "$0: OK"
