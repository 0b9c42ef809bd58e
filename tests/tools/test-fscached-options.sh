#!/usr/bin/env bash
# nbd-fscached: command line and configuration file.
#
#  - --help, --version (PACKAGE_VERSION), and usage errors (exit 2,
#    "nbd-fscached: what: why");
#  - every bad configuration gives "FILE:LINE: message" and exit 1:
#    cull >= run, stop >= cull (both triples), unknown command, bad
#    numbers, missing or repeated dir, a missing directory, directories
#    that are not caches (empty, garbage fscache.hdr, world-writable);
#  - a good one (comments, blank lines, every command) starts: the
#    pid file appears, SIGUSR1 logs the counters and writes the stats
#    file, SIGHUP with a broken file keeps the old configuration and
#    with a good one takes the new one, a second daemon on the same
#    cache is refused, SIGHUP with another dir moves to it and
#    releases the first, SIGTERM stops it (exit 0, pid file removed);
#  - without -n it daemonises: the parent exits 0 once the pid file
#    is written.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$DAEMON"
requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter="$FILTER" null --dump-plugin

version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' \
            "$top_builddir/config.h")

# ---- --help, --version, usage errors ---------------------------------
"$DAEMON" --help > "$TMP/help" || fail "--help exited $?"
grep -q '^Usage: nbd-fscached ' "$TMP/help" || fail "--help: no Usage line"
for opt in -d -s -n -f -p --help --version; do
  grep -q -- "$opt" "$TMP/help" || fail "--help does not mention $opt"
done
out=$("$DAEMON" --version) || fail "--version exited $?"
[ "$out" = "nbd-fscached $version" ] ||
  fail "--version printed '$out', expected 'nbd-fscached $version'"

usage_error ()           # EXPECTED-MESSAGE ARGS...
{
  local want="$1" st=0
  shift
  "$DAEMON" "$@" >"$TMP/out" 2>"$TMP/err" || st=$?
  [ "$st" -eq 2 ] || fail "$*: exit status $st, expected 2"
  grep -qF -- "nbd-fscached: $want" "$TMP/err" ||
    { cat "$TMP/err" >&2; fail "$*: no 'nbd-fscached: $want' message"; }
}
usage_error "-x: unknown option" -x
usage_error "--bogus: unknown option" --bogus
usage_error "-f: option requires an argument" -f
usage_error "extra: unexpected argument" -n extra

# ---- a cache to point at ---------------------------------------------
cache="$TMP/cache"
nbdkit -U - --filter="$FILTER" null size=1M fscache-dir="$cache" \
  fscache-key=opts --run 'nbdcopy "$uri" null:'
[ -s "$cache/fscache.hdr" ] || fail "nbdkit did not create the cache"

# ---- bad configurations ------------------------------------------------
n=0
bad_config ()            # LINE MESSAGE-PART (config on stdin)
{
  local line="$1" want="$2" st=0 conf
  n=$((n + 1))
  conf="$TMP/bad$n.conf"
  cat > "$conf"
  "$DAEMON" -n -s -f "$conf" >"$TMP/out" 2>"$TMP/err" || st=$?
  [ "$st" -eq 1 ] ||
    { cat "$TMP/err" >&2; fail "bad config $n ($want): exit status $st, expected 1"; }
  grep -qF -- "nbd-fscached: $conf:$line: " "$TMP/err" ||
    { cat "$conf" "$TMP/err" >&2; fail "bad config $n: no '$conf:$line:' prefix"; }
  grep -qF -- "$want" "$TMP/err" ||
    { cat "$TMP/err" >&2; fail "bad config $n: no '$want' in the message"; }
  echo "bad config $n: $(cat "$TMP/err")"
}

bad_config 3 "bcull 10% must be below brun 10%" <<EOF
dir $cache
brun 10%
bcull 10%
EOF
bad_config 3 "bcull 12% must be below brun 10%" <<EOF
dir $cache
# brun stays at its default, 10%
bcull 12%
EOF
bad_config 2 "bstop 7% must be below bcull 7%" <<EOF
dir $cache
bstop 7%
EOF
bad_config 4 "fcull 20% must be below frun 15%" <<EOF
dir $cache
fcull 20%

frun 15%
EOF
bad_config 3 "fstop 5% must be below fcull 5%" <<EOF
dir $cache
fcull 5%
fstop 5%
frun 6%
EOF
bad_config 2 "unknown command 'frobnicate'" <<EOF
dir $cache
frobnicate 1
EOF
bad_config 1 "No such file or directory" <<EOF
dir $TMP/no-such-dir
EOF
bad_config 2 "brun: bad percentage 'ten%'" <<EOF
dir $cache
brun ten%
EOF
bad_config 2 "brun: bad percentage '10'" <<EOF
dir $cache
brun 10
EOF
bad_config 2 "bcull: bad percentage '100%'" <<EOF
dir $cache
bcull 100%
EOF
bad_config 2 "max-size: bad size '12Q'" <<EOF
dir $cache
max-size 12Q
EOF
bad_config 2 "max-size: bad size '99999999999999999999'" <<EOF
dir $cache
max-size 99999999999999999999
EOF
bad_config 2 "culltable: log2 of the cull table size must be 12 <= N <= 20" <<EOF
dir $cache
culltable 11
EOF
bad_config 2 "debug: bad number 'x'" <<EOF
dir $cache
debug x
EOF
bad_config 2 "dir: given twice" <<EOF
dir $cache
dir $cache
EOF
bad_config 2 "no 'dir' command" <<EOF
# nothing but
brun 20%
EOF

mkdir "$TMP/empty"
bad_config 1 "not a cache directory" <<EOF
dir $TMP/empty
EOF
mkdir -p "$TMP/garbage/objects"
chmod 0700 "$TMP/garbage" "$TMP/garbage/objects"
head -c 512 /dev/urandom > "$TMP/garbage.hdr"
cp "$TMP/garbage.hdr" "$TMP/garbage/fscache.hdr"
bad_config 2 "not a cache directory" <<EOF
# a header that is not one
dir $TMP/garbage
EOF
cmp -s "$TMP/garbage.hdr" "$TMP/garbage/fscache.hdr" ||
  fail "the garbage header was rewritten"
mkdir -p "$TMP/open/objects"
cp "$cache/fscache.hdr" "$TMP/open/"
chmod 0777 "$TMP/open"
bad_config 1 "writable by others" <<EOF
dir $TMP/open
EOF
touch "$TMP/plainfile"
bad_config 1 "not a directory" <<EOF
dir $TMP/plainfile
EOF
# None of these may have created anything.
[ ! -e "$TMP/empty/fscache.hdr" ] && [ ! -e "$TMP/empty/graveyard" ] ||
  fail "checking a non-cache created files in it"

# ---- a good configuration -----------------------------------------------
conf="$TMP/good.conf"
cat > "$conf" <<EOF
# nbd-fscached test configuration

   # an indented comment
dir $cache
tag optstest
brun 10%
bcull 7%
bstop 3%
frun 10%
fcull 7%
fstop 3%
max-size 1G
culltable 13
debug 1
secctx system_u:system_r:cachefilesd_t:s0
EOF
pidfile="$TMP/d.pid"
log="$TMP/d.log"
"$DAEMON" -n -s -f "$conf" -p "$pidfile" 2>"$log" &
dpid=$!
cleanup_fn "kill -9 $dpid 2>/dev/null"
wait_until test -s "$pidfile" || { cat "$log" >&2; fail "no pid file"; }
[ "$(cat "$pidfile")" = "$dpid" ] || fail "pid file holds $(cat "$pidfile"), not $dpid"
grep -q 'optstest: .*max-size 1073741824 culltable 13' "$log" ||
  { cat "$log" >&2; fail "the configuration is not logged with its tag"; }
[ -d "$cache/graveyard" ] || fail "no graveyard directory"
[ "$(stat -c %a "$cache/graveyard")" = 700 ] || fail "graveyard not mode 0700"

# SIGUSR1: the counters, in the log and in the stats file.
rm -f "$cache/nbd-fscached.stats"
kill -USR1 "$dpid"
wait_until test -s "$cache/nbd-fscached.stats" || fail "SIGUSR1: no stats file"
wait_until grep -q 'counters: culled_objects=0 ' "$log" ||
  { cat "$log" >&2; fail "SIGUSR1: counters not logged"; }
for k in culled_objects culled_bytes quota_writes below_bcull_ms \
         below_bstop_ms below_fcull_ms below_fstop_ms over_max_size_ms \
         total_bytes objects; do
  grep -q "^$k [0-9]*$" "$cache/nbd-fscached.stats" ||
    fail "stats file has no '$k'"
done

# A second daemon on the same cache is refused.
st=0
"$DAEMON" -n -s -f "$conf" 2>"$TMP/err2" || st=$?
[ "$st" -eq 1 ] && grep -q 'another nbd-fscached manages this cache' "$TMP/err2" ||
  { cat "$TMP/err2" >&2; fail "second daemon: status $st"; }

# SIGHUP with a broken file: logged, old configuration kept.
cp "$conf" "$TMP/good.conf.orig"
echo "bcull 50%" >> "$conf"
kill -HUP "$dpid"
wait_until grep -q "$conf:16: bcull 50% must be below brun 10%; keeping the previous configuration" "$log" ||
  { cat "$log" >&2; fail "SIGHUP: the bad file was not reported"; }
kill -0 "$dpid" || fail "SIGHUP with a bad file stopped the daemon"
# SIGHUP with a good one: taken.
cp "$TMP/good.conf.orig" "$conf"
sed -i 's/^max-size 1G$/max-size 512M/' "$conf"
kill -HUP "$dpid"
wait_until grep -q 'max-size 536870912 culltable 13' "$log" ||
  { cat "$log" >&2; fail "SIGHUP: the new configuration was not taken"; }

# SIGHUP with another directory: taken over, the first one released.
cache2="$TMP/cache2"
nbdkit -U - --filter="$FILTER" null size=1M fscache-dir="$cache2" \
  fscache-key=opts2 --run 'nbdcopy "$uri" null:'
sed -i "s|^dir .*|dir $cache2|" "$conf"
kill -HUP "$dpid"
wait_until grep -q "leaving $cache for $cache2" "$log" ||
  { cat "$log" >&2; fail "SIGHUP: the new directory was not taken"; }
[ -d "$cache2/graveyard" ] || fail "SIGHUP: no graveyard in the new directory"
sed "s|^dir .*|dir $cache|" "$conf" > "$TMP/first.conf"
"$DAEMON" -n -s -f "$TMP/first.conf" -p "$TMP/first.pid" 2>"$TMP/first.log" &
fpid=$!
cleanup_fn "kill -9 $fpid 2>/dev/null"
wait_until test -s "$TMP/first.pid" ||
  { cat "$TMP/first.log" >&2; fail "the first directory was not released"; }
kill -TERM "$fpid"
wait "$fpid" || fail "second daemon on the released directory: exit status $?"

# SIGTERM: clean exit, pid file gone.
kill -TERM "$dpid"
st=0
wait "$dpid" || st=$?
[ "$st" -eq 0 ] || { cat "$log" >&2; fail "SIGTERM: exit status $st"; }
[ ! -e "$pidfile" ] || fail "pid file left after SIGTERM"
grep -q 'stopped$' "$log" || fail "no 'stopped' message"

# ---- daemonised ---------------------------------------------------------
rm -f "$pidfile"
"$DAEMON" -s -f "$conf" -p "$pidfile" 2>"$TMP/bg.log" ||
  fail "daemonising: the parent exited $?"
# The parent exits only once the child has written the pid file.
[ -s "$pidfile" ] || fail "the parent exited before the pid file existed"
bgpid=$(cat "$pidfile")
cleanup_fn "kill -9 $bgpid 2>/dev/null"
kill -0 "$bgpid" || fail "the daemon is not running"
[ "$(awk '{print $6}' "/proc/$bgpid/stat")" = "$bgpid" ] ||
  fail "the daemon is not a session leader"
kill -TERM "$bgpid"
wait_until test ! -e "$pidfile" || fail "daemon: pid file not removed at exit"

echo "$0: PASS"
