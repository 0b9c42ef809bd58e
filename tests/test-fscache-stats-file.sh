#!/usr/bin/env bash
# nbd-fscache: fscache-stats=FILE never writes through a link planted by
# someone else (issue 26, item 8).
#
#  1. FILE is a symlink to a victim file: nbdkit refuses to start, says
#     why, and the victim is untouched.
#  2. A symlink planted at the temporary name the filter used to write
#     through (FILE.PID.tmp, predictable once the server's pid is known)
#     pointing at a victim: after a client has connected and closed
#     (the stats are written), the victim is untouched and FILE is a
#     regular file holding the counters, readable as documented.
#
# Truth: the victims' checksums, the counters' presence in FILE, and
# no temporary file left beside it.

source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires nbdkit --filter="$FILTER" null --dump-plugin

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
