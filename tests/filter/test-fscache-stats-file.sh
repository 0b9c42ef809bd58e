#!/usr/bin/env bash
# nbd-fscache: the files a user names, fscache-stats=FILE,
# fscache-trace=FILE and nbd-fscache stat --output FILE, are never
# written through a link planted by someone else (issue 26, item 8).
#
#  1. FILE is a symlink to a victim file: nbdkit refuses to start, says
#     why, and the victim is untouched.
#  2. A symlink planted at the temporary name the filter used to write
#     through (FILE.PID.tmp, predictable once the server's pid is known)
#     pointing at a victim: after a client has connected and closed
#     (the stats are written), the victim is untouched and FILE is a
#     regular file holding the counters, readable as documented.
#
#  3. fscache-trace=FILE where FILE is a symlink to the victim, or a
#     FIFO: nbdkit refuses to start (within a timeout), the victim
#     untouched.
#  4. nbd-fscache stat --prometheus --output FILE: FILE a symlink is
#     refused; a link at the old temporary name FILE.tmp.PID is not
#     followed (the pid is the tool's: taken from a wrapper that plants
#     the link and then execs the tool).
#
# Truth: the victims' checksums, the counters' presence in FILE, and
# no temporary file left beside it.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires nbdkit --filter="$FILTER" null --dump-plugin
requires test -x "$TOOL"
requires mkfifo --version
requires timeout --version

make_random "$TMP/up.img" $((1024 * 1024))
printf 'precious\n' > "$TMP/victim"
sum0="$(sha256sum < "$TMP/victim")"
mkdir "$TMP/st"

# ---- 1. FILE itself is a symlink: refused ------------------------------
ln -s "$TMP/victim" "$TMP/st/stats"
rc=0
nbdkit -P "$TMP/r.pid" -U "$TMP/r.sock" --filter="$FILTER" \
  file "$TMP/up.img" fscache-dir="$TMP/cache" fscache-key=k \
  fscache-stats="$TMP/st/stats" 2>"$TMP/r.err" || rc=$?
if [ $rc -eq 0 ]; then
  wait_until test -s "$TMP/r.pid" || true
  kill "$(cat "$TMP/r.pid")" 2>/dev/null || true
  fail "nbdkit started with a symlink as fscache-stats"
fi
grep -q "fscache-stats=.*not a regular file" "$TMP/r.err" ||
  { cat "$TMP/r.err" >&2; fail "the refusal does not say why"; }
[ "$(sha256sum < "$TMP/victim")" = "$sum0" ] || fail "1: victim changed"
[ -L "$TMP/st/stats" ] || fail "1: the symlink was replaced"
echo "1: a symlink as FILE refused"

# ---- 2. a link planted at the old predictable temporary name -----------
rm "$TMP/st/stats"
start_nbdkit -P "$TMP/s.pid" -U "$TMP/s.sock" --filter="$FILTER" \
  file "$TMP/up.img" fscache-dir="$TMP/cache" fscache-key=k \
  fscache-stats="$TMP/st/stats"
pid="$(cat "$TMP/s.pid")"
ln -s "$TMP/victim" "$TMP/st/stats.$pid.tmp"
# One connection that reads: its close writes the stats.
nbdinfo --map "nbd+unix:///?socket=$TMP/s.sock" >/dev/null
wait_until test -f "$TMP/st/stats"
stop_nbdkit "$TMP/s.pid"
[ "$(sha256sum < "$TMP/victim")" = "$sum0" ] ||
  fail "2: the victim behind $TMP/st/stats.$pid.tmp was written: $(head -c 200 "$TMP/victim")"
[ -f "$TMP/st/stats" ] && [ ! -L "$TMP/st/stats" ] ||
  fail "2: FILE is not a regular file"
grep -q '^read_requests ' "$TMP/st/stats" || fail "2: no counters in FILE"
[ "$(stat -c %a "$TMP/st/stats")" = 644 ] ||
  fail "2: FILE has mode $(stat -c %a "$TMP/st/stats"), not 644"
left="$(cd "$TMP/st" && ls -A | grep -v -x -e stats -e "stats.$pid.tmp" || true)"
[ -z "$left" ] || fail "2: temporary files left: $left"
echo "2: a link at the old temporary name not followed"

# ---- 3. fscache-trace=FILE -------------------------------------------
for shape in link fifo; do
  rm -f "$TMP/st/trace"
  case $shape in
    link) ln -s "$TMP/victim" "$TMP/st/trace" ;;
    fifo) mkfifo "$TMP/st/trace" ;;
  esac
  rc=0
  timeout -k 5 20 nbdkit -P "$TMP/t.pid" -U "$TMP/t.sock" --filter="$FILTER" \
    file "$TMP/up.img" fscache-dir="$TMP/cache" fscache-key=k \
    fscache-trace="$TMP/st/trace" 2>"$TMP/t.err" || rc=$?
  if [ $rc -eq 0 ]; then
    wait_until test -s "$TMP/t.pid" || true
    kill "$(cat "$TMP/t.pid")" 2>/dev/null || true
    fail "3: nbdkit started with a $shape as fscache-trace"
  fi
  [ $rc -ne 124 ] || fail "3: nbdkit hung on a $shape as fscache-trace"
  grep -q "fscache-trace=$TMP/st/trace: " "$TMP/t.err" ||
    { cat "$TMP/t.err" >&2; fail "3: the refusal does not name the file"; }
  [ "$(sha256sum < "$TMP/victim")" = "$sum0" ] || fail "3: victim changed"
done
echo "3: fscache-trace=FILE: a symlink or a FIFO refused"

# ---- 4. nbd-fscache stat --output FILE --------------------------------
rm -f "$TMP/st/"*
ln -s "$TMP/victim" "$TMP/st/out.prom"
rc=0
"$TOOL" --dir "$TMP/cache" stat --prometheus --output "$TMP/st/out.prom" \
  2>"$TMP/s.err" || rc=$?
[ $rc -ne 0 ] && grep -q "not a regular file" "$TMP/s.err" ||
  { cat "$TMP/s.err" >&2; fail "4: a symlink as --output FILE: status $rc"; }
rm -f "$TMP/st/out.prom"
# The tool's pid is the wrapper's own: bash execs it.
bash -c 'ln -s "$1" "$2.tmp.$$" && exec "$3" --dir "$4" stat --prometheus --output "$2"' \
  _ "$TMP/victim" "$TMP/st/out.prom" "$TOOL" "$TMP/cache" ||
  fail "4: stat --output failed"
[ "$(sha256sum < "$TMP/victim")" = "$sum0" ] ||
  fail "4: the victim behind FILE.tmp.PID was written"
[ -f "$TMP/st/out.prom" ] && [ ! -L "$TMP/st/out.prom" ] &&
  grep -q '^nbd_fscache_' "$TMP/st/out.prom" ||
  fail "4: FILE does not hold the metrics"
[ "$(stat -c %a "$TMP/st/out.prom")" = 644 ] || fail "4: FILE not mode 644"
echo "4: stat --output FILE: a symlink refused, no link followed"
