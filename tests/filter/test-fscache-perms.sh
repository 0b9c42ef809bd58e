#!/usr/bin/env bash
# nbd-fscache: nobody but the user running nbdkit may write the cache,
# or redirect the path to it (issue 26, items 3 and 9; the rules atop
# core/base/safeopen.c).
#
# A second user, created here and removed at exit, owns or may write
# parts of the cache or of the path to it:
#  1. objects/ writable by its group (hers), or owned by her: refused,
#     and the message says why.
#  2. an @xx fan-out directory owned by her, or writable by its group:
#     the object in it is refused with a loud warning and the export is
#     served uncached (correct data: cmp), nothing written in her
#     directory; nbd-fscache ls skips it, and says so.
#  3. the path: a symlink she planted in a sticky world-writable
#     directory, a directory of hers, a non-sticky directory others may
#     write: refused, nothing created behind them.  A root-owned symlink
#     and a root-owned directory inside a sticky one are fine.
#  4. under umask 000 and 077: every directory of a new cache is 0700,
#     every file 0600, and the data are right.
#
# Truth: cmp against the upstream image; the modes and owners of what
# was created (find/stat); the refusals' messages.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter="$FILTER" null --dump-plugin
requires useradd --help
requires flock --version
requires test -x "$TOOL"
requires test "$(id -u)" = 0

size=$((2 * 1024 * 1024))
make_random "$TMP/up.img" "$size"
other="fsct$$"
# test-fscache-hostile.sh watches /etc/passwd: not while users change.
exec 8> /run/lock/nbd-fscache-test-users.lock
flock -w 600 8 || fail "the users lock was held for 10 minutes"
useradd --system --no-create-home --user-group --shell /usr/sbin/nologin \
  "$other"
cleanup_fn userdel "$other"
chmod 0755 "$TMP"

# refuse DIR EXPECTED WHAT: nbdkit does not start, and says EXPECTED.
refuse ()
{
  local rc=0
  rm -f "$TMP/r.pid"
  nbdkit -P "$TMP/r.pid" -U "$TMP/r.sock" --filter="$FILTER" \
    file "$TMP/up.img" fscache-dir="$1" fscache-key=k 2>"$TMP/r.err" || rc=$?
  if [ $rc -eq 0 ]; then
    wait_until test -s "$TMP/r.pid" || true
    kill "$(cat "$TMP/r.pid")" 2>/dev/null || true
    fail "$3: nbdkit started"
  fi
  grep -q -- "$2" "$TMP/r.err" ||
    { cat "$TMP/r.err" >&2; fail "$3: message does not say '$2'"; }
  echo "  $3: $(grep -o 'fscache-dir: .*' "$TMP/r.err" | head -1)"
}

# serve DIR NAME [ENV...]: start a proxy on DIR, copy the export, cmp.
serve ()
{
  local dir="$1" name="$2"
  start_nbdkit -P "$TMP/$name.pid" -U "$TMP/$name.sock" -v --log=stderr \
    --filter="$FILTER" \
    file "$TMP/up.img" fscache-dir="$dir" fscache-key=k 2>"$TMP/$name.err"
  nbdcopy "nbd+unix:///?socket=$TMP/$name.sock" "$TMP/$name.out"
  cmp "$TMP/up.img" "$TMP/$name.out" || fail "$name: wrong data"
  stop_nbdkit "$TMP/$name.pid"
}

# ---- 1. objects/ ----------------------------------------------------
mkdir -m 0700 "$TMP/c1" "$TMP/c1/objects"
chgrp "$other" "$TMP/c1/objects"
chmod 0770 "$TMP/c1/objects"
refuse "$TMP/c1" 'objects: refused: writable by others' \
  'objects/ writable by her group'
chmod 0700 "$TMP/c1/objects"
chown "$other" "$TMP/c1/objects"
refuse "$TMP/c1" 'objects: refused: owned by another user' \
  'objects/ owned by her'
[ -z "$(ls -A "$TMP/c1/objects")" ] || fail "1: something created in objects/"
echo "1: objects/ not ours alone: refused"

# ---- 2. @xx ---------------------------------------------------------
serve "$TMP/c2" first
fan="$(dirname "$(find "$TMP/c2/objects" -name '*.idx')")"
[ -d "$fan" ] || fail "2: no fan-out directory"
for how in owner group; do
  if [ $how = owner ]; then
    chown "$other" "$fan"
  else
    chown root:"$other" "$fan"; chmod 0770 "$fan"
  fi
  before="$(ls -l --time-style=full-iso "$fan")"
  serve "$TMP/c2" "fan-$how"
  grep -q "not this user's alone" "$TMP/fan-$how.err" ||
    { cat "$TMP/fan-$how.err" >&2; fail "2: no warning for @xx ($how)"; }
  [ "$(ls -l --time-style=full-iso "$fan")" = "$before" ] ||
    fail "2: her directory changed"
  # The tools skip it too, and say so.
  "$TOOL" --dir "$TMP/c2" ls > "$TMP/ls.out" 2> "$TMP/ls.err" ||
    fail "2: ls failed ($how)"
  ! grep -q '^k ' "$TMP/ls.out" || fail "2: ls lists the object in her @xx"
  grep -q "objects/$(basename "$fan"): skipped" "$TMP/ls.err" ||
    { cat "$TMP/ls.err" >&2; fail "2: ls does not say it skipped her @xx"; }
  chown root:root "$fan"; chmod 0700 "$fan"
done
echo "2: @xx not ours alone: refused, served uncached"

# ---- 3. the path ------------------------------------------------------
mkdir -m 1777 "$TMP/pub"
mkdir -m 0700 "$TMP/mine"
ln -s "$TMP/mine" "$TMP/pub/x"
chown -h "$other" "$TMP/pub/x"
refuse "$TMP/pub/x/cache" 'is a symlink owned by another user' \
  'her symlink in a sticky directory'
mkdir -m 0755 "$TMP/pub/y"
chown "$other" "$TMP/pub/y"
refuse "$TMP/pub/y/cache" 'a directory owned by another user' \
  'a directory of hers'
mkdir -m 0777 "$TMP/gw"
chmod 0777 "$TMP/gw"
refuse "$TMP/gw/cache" 'others may write' 'a non-sticky directory others may write'
left="$(find "$TMP/mine" "$TMP/pub/y" "$TMP/gw" -mindepth 1)"
[ -z "$left" ] || fail "3: created behind a refused path: $left"
# Legitimate: root's link, root's directory in a sticky one.
mkdir -m 0700 "$TMP/real"
ln -s "$TMP/real" "$TMP/link"
serve "$TMP/link/cache" via-link
[ -f "$TMP/real/cache/fscache.hdr" ] || fail "3: the link was not followed"
mkdir -m 0700 "$TMP/pub/z"
serve "$TMP/pub/z/cache" via-sticky
echo "3: untrusted paths refused, trusted ones work"

# ---- 4. umask -----------------------------------------------------------
for u in 000 077; do
  (umask $u; serve "$TMP/u$u/cache" "umask$u")
  bad="$(find "$TMP/u$u" -mindepth 1 -type d ! -perm 0700)"
  [ -z "$bad" ] || fail "umask $u: directories not 0700: $bad"
  bad="$(find "$TMP/u$u/cache" -type f ! -perm 0600)"
  [ -z "$bad" ] || fail "umask $u: files not 0600: $(ls -l $bad)"
  [ -n "$(find "$TMP/u$u/cache/objects" -name '*.data')" ] ||
    fail "umask $u: nothing cached"
done
echo "4: modes right under umask 000 and 077"
