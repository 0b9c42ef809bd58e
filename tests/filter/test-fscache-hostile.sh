#!/usr/bin/env bash
# nbd-fscache: hostile export names, an unsafe cache directory, and
# files planted in the cache.
#
#  1. Clients ask for export names like "../x", "../../etc", a 4096-byte
#     name, names with newlines, "/", "%2e%2e", the empty name (the file
#     plugin serves any name).  Each read returns the upstream's bytes;
#     each name makes its own object whose file name is the reversible
#     escape of the key (checked byte for byte) or a hash for long
#     keys; nothing is created or changed anywhere outside the cache
#     directory ($TMP listed before and after, and a search for newer
#     files named like the targets); inside it there is only
#     fscache.hdr, objects/, objects/@xx/ and files named
#     ^[kh][A-Za-z0-9_=-]*\.(idx|data|sums|stats)$.
#  2. A world-writable cache directory (or objects/ subdirectory), or
#     one owned by another user, is refused with a clear message.
#  3. Planted links: an object's .data, .idx or .sums replaced by a
#     symlink to a file, .data hard-linked to one, or its @xx
#     directory replaced by a symlink.  The proxy still serves the
#     right data (uncached, with a warning) and the link's target is
#     untouched.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires od --version
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"

SIZE=$((1024 * 1024))
KEY=hostile

work="$TMP/work"               # our own scratch files
mkdir "$work"
up="$TMP/up.img"
make_random "$up" $SIZE
# The cache sits three levels down, so that "..", "../..", "../../.."
# from anywhere inside it lands somewhere we watch.
cache="$TMP/a/b/cache"
mkdir -p "$TMP/a/b"
sock="$work/sock"
pid="$work/nbdkit.pid"


run=""
start_proxy ()           # NAME [PARAMS...]
{
  run="$1"; shift
  # -v keeps nbdkit's stderr (warnings) once it is in the background.
  start_nbdkit -P "$pid" -U "$sock" -v --log=stderr \
    --filter="$FILTER" --filter=log \
    file "$up" fscache-dir="$cache" fscache-key=$KEY \
    logfile="$work/$run.log" fscache-stats="$work/$run.stats" "$@" \
    2>"$work/$run.err"
}

expect_stat ()           # NAME OP VALUE (for the last run)
{
  local v
  v="$(stat_value "$work/$run.stats" "$1")"
  if ! test "$v" "$2" "$3"; then
    cat "$work/$run.stats" >&2
    fail "$run: $1 = $v, expected $2 $3"
  fi
}

# Percent-encode every byte of file $1 (for an nbd+unix:// URI path).
pct_file ()
{
  od -An -v -tx1 "$1" | tr -d ' \n' | sed 's/../%&/g'
}

# The object file name (without suffix) keyenc.h promises for the key
# fscache-key NUL "export=" NAME, NAME in file $1: "k" and the escaped
# key, or "h" for a hash when the escape is longer than 200 bytes.
expected_name ()
{
  { printf '%s\0export=' "$KEY"; cat "$1"; } | od -An -v -tu1 |
    awk '{ for (i = 1; i <= NF; i++) {
             c = $i
             if ((c >= 48 && c <= 57) || (c >= 65 && c <= 90) ||
                 (c >= 97 && c <= 122) || c == 95 || c == 45)
               s = s sprintf ("%c", c)
             else
               s = s sprintf ("=%02x", c)
           } }
         END { if (length (s) > 200) print "h"; else print "k" s }'
}

read_export ()           # NAME-FILE: full read of that export
{
  local uri
  uri="nbd+unix:///$(pct_file "$1")?socket=$sock"
  rm -f "$work/out.img"
  nbdcopy "$uri" "$work/out.img" 2>"$work/nbdcopy.err" ||
    { cat "$work/nbdcopy.err" >&2;
      fail "export $(od -c "$1" | head -2): client error"; }
  cmp "$work/out.img" "$up" ||
    fail "export $(od -c "$1" | head -2): wrong data"
  rm -f "$work/out.img"
}

object_names ()          # the object names (sorted) in the cache
{
  find "$cache/objects" -name '*.idx' -printf '%f\n' 2>/dev/null |
    sed 's/\.idx$//' | sort
}

# ---- 1. hostile export names -------------------------------------------
specs=(
  '../x'
  '../../etc'
  '../../../../../../../../tmp/fscache-pwned'
  '/'
  '/etc/passwd'
  '%2e%2e'
  '%2e%2e%2fx'
  ''
  '.'
  '..'
  'a\nb'
  '\n'
  'x\n../../y'
  '-rf'
  '..\\..\\x'
  'name with spaces $(touch pwned) `id` "q" '"'"'q'"'"
  'caf\xc3\xa9/\xe6\x97\xa5'
  '\x01\x7f\xff'
)
n=0
for s in "${specs[@]}"; do
  printf '%b' "$s" > "$work/name.$n"
  n=$((n + 1))
done
# Long ones: 4096 bytes (the NBD maximum) of "../", 70 slashes (an
# escape of 210 bytes: hashed), 150 plain bytes (kept as is).
{ for (( i=0; i<1366; i++ )); do printf '../'; done; } |
  head -c 4096 > "$work/name.$n"; n=$((n + 1))
head -c 70 /dev/zero | tr '\0' '/' > "$work/name.$n"; n=$((n + 1))
head -c 150 /dev/zero | tr '\0' 'A' > "$work/name.$n"; n=$((n + 1))
# At the 200-byte limit of an escaped name (the key's prefix
# "hostile=00export=3d" takes 19): 181 plain bytes still fit, 182 do
# not, nor do 180 and one escaped byte.
head -c 181 /dev/zero | tr '\0' 'B' > "$work/name.$n"; n=$((n + 1))
head -c 182 /dev/zero | tr '\0' 'C' > "$work/name.$n"; n=$((n + 1))
{ head -c 180 /dev/zero | tr '\0' 'D'; printf /; } > "$work/name.$n"
n=$((n + 1))
[ "$(stat -c %s "$work/name.$((n - 6))")" -eq 4096 ] || fail "bad long name"

# Tests that add users (test-fscache-perms.sh, test-package.sh) change
# /etc/passwd, which this part watches: not at the same time.
exec 8> /run/lock/nbd-fscache-test-users.lock
flock -s -w 600 8 || fail "the users lock was held for 10 minutes"
marker="$work/marker"
touch "$marker"
sha_passwd="$(sha256sum < /etc/passwd)"
listing ()
{
  find "$TMP" \( -path "$cache" -o -path "$work" \) -prune -o \
    -printf '%y %m %s %T@ %p\n' | sort
}
start_proxy names               # creates the cache directory
listing > "$work/before"
for (( i=0; i<n; i++ )); do
  before="$(object_names)"
  read_export "$work/name.$i"
  new="$(comm -13 <(echo "$before") <(object_names))"
  want="$(expected_name "$work/name.$i")"
  if [ "$want" = h ]; then
    [[ "$new" =~ ^h[0-9a-f]{32}$ ]] ||
      fail "name $i: expected one new hashed object, got: $new"
  else
    [ "$new" = "$want" ] ||
      fail "name $i: expected object '$want', got: '$new'"
  fi
done
stop_nbdkit "$pid"
expect_stat objects_created -eq $n
expect_stat withdrawals -eq 0

listing > "$work/after"
diff "$work/before" "$work/after" ||
  fail "something outside the cache directory changed"
[ "$(sha256sum < /etc/passwd)" = "$sha_passwd" ] || fail "/etc/passwd changed"
escaped="$(find "$TMP" / /tmp /etc -maxdepth 1 -newer "$marker" \
             \( -name x -o -name y -o -name etc -o -name 'fscache-pwned' \
                -o -name pwned -o -name passwd -o -name '*.idx' \
                -o -name '*.data' -o -name '*.sums' -o -name '*export*' \) \
             -print 2>/dev/null || true)"
[ -z "$escaped" ] || fail "files created outside the cache: $escaped"

# Only the expected shapes inside the cache directory.
bad="$(cd "$cache" && find . -mindepth 1 |
       grep -Ev '^\./fscache\.hdr$|^\./objects$|^\./objects/@[0-9a-f]{2}$|^\./objects/@[0-9a-f]{2}/[kh][A-Za-z0-9_=-]*\.(idx|data|sums|stats)$' || true)"
[ -z "$bad" ] || fail "unexpected entries in the cache directory: $bad"
[ -z "$(find "$cache" -type l)" ] || fail "symlinks in the cache"
[ -z "$(find "$cache" -type d ! -perm 0700)" ] ||
  fail "cache directories not mode 0700: $(find "$cache" -type d ! -perm 0700)"
[ -z "$(find "$cache" -type f -perm /0077)" ] ||
  fail "cache files readable by others: $(find "$cache" -type f -perm /0077)"
echo "1: $n hostile export names served, all contained"

# ---- 2. unsafe cache directories are refused --------------------------
refuse ()                # DIR EXPECTED-MESSAGE WHAT
{
  local rc=0 i
  rm -f "$work/r.pid"
  nbdkit -P "$work/r.pid" -U "$work/r.sock" --filter="$FILTER" \
    file "$up" fscache-dir="$1" fscache-key=$KEY 2>"$work/r.err" || rc=$?
  if [ $rc -eq 0 ]; then
    for (( i=0; i<100; i++ )); do [ -s "$work/r.pid" ] && break; sleep 0.05; done
    kill "$(cat "$work/r.pid")" 2>/dev/null || true
    fail "$3: nbdkit started"
  fi
  grep -q "$2" "$work/r.err" ||
    { cat "$work/r.err" >&2; fail "$3: message does not say '$2'"; }
}
mkdir -m 0777 "$TMP/ww"
chmod 0777 "$TMP/ww"
refuse "$TMP/ww" 'writable by others' 'world-writable cache directory'
chmod 1777 "$TMP/ww"
refuse "$TMP/ww" 'writable by others' 'sticky world-writable directory'
[ -z "$(ls -A "$TMP/ww")" ] || fail "something was created in $TMP/ww"
mkdir -m 0700 "$TMP/ww2" "$TMP/ww2/objects"
chmod 0777 "$TMP/ww2/objects"
refuse "$TMP/ww2" 'writable by others' 'world-writable objects/'
if id nobody >/dev/null 2>&1; then
  mkdir -m 0700 "$TMP/other"
  chown nobody "$TMP/other"
  refuse "$TMP/other" 'owned by another user' 'directory owned by nobody'
fi
echo "2: unsafe cache directories refused"

# ---- 3. planted links ---------------------------------------------------
printf 'victim' > "$work/victim"
vname="$(expected_name "$work/victim")"
start_proxy victim-fill
read_export "$work/victim"
stop_nbdkit "$pid"
obj="$(find "$cache/objects" -name "$vname.idx")"
[ -n "$obj" ] || fail "no object $vname"
fan="$(dirname "$obj")"
base="$fan/$vname"
for f in idx data sums; do
  [ -f "$base.$f" ] || fail "no $base.$f"
  cp -p "$base.$f" "$work/pristine.$f"
done

target="$TMP/target"
make_random "$target" 100000
target_sum="$(sha256sum < "$target")"
target_stat="$(stat -c '%s %Y %i %h' "$target")"
mkdir "$TMP/elsewhere"

restore ()
{
  rm -rf "$fan"
  mkdir -m 0700 "$fan"
  for f in idx data sums; do cp -p "$work/pristine.$f" "$base.$f"; done
}

plant ()                 # CASE
{
  restore
  case "$1" in
    symlink-data) ln -sf "$target" "$base.data" ;;
    symlink-idx)  ln -sf "$target" "$base.idx" ;;
    symlink-sums) ln -sf "$target" "$base.sums" ;;
    hardlink-data) rm -f "$base.data"; ln "$target" "$base.data" ;;
    symlink-fan)
      rm -rf "$TMP/elsewhere"; mkdir -m 0700 "$TMP/elsewhere"
      cp -p "$base".* "$TMP/elsewhere/"
      rm -rf "$fan"; ln -s "$TMP/elsewhere" "$fan" ;;
  esac
}

for c in symlink-data symlink-idx symlink-sums hardlink-data symlink-fan; do
  plant $c
  if [ $c = symlink-fan ]; then
    before_else="$(cd "$TMP/elsewhere" && sha256sum * && stat -c '%n %s %Y' *)"
  fi
  start_proxy "$c"
  read_export "$work/victim"
  stop_nbdkit "$pid"
  [ "$(sha256sum < "$target")" = "$target_sum" ] ||
    fail "$c: the link's target was modified"
  [ "$(stat -c '%s %Y %i %h' "$target")" = "$target_stat" ] ||
    [ $c = hardlink-data ] ||
    fail "$c: the link's target changed size or time"
  if [ $c = symlink-fan ]; then
    [ "$(cd "$TMP/elsewhere" && sha256sum * && stat -c '%n %s %Y' *)" = \
      "$before_else" ] || fail "$c: files behind the link changed"
  fi
  grep -q 'uncached' "$work/$run.err" ||
    { grep ' error: ' "$work/$run.err" >&2;
      fail "$c: no warning that the export is served uncached"; }
  expect_stat objects_reused -eq 0
  expect_stat hit_bytes -eq 0
done
[ "$(stat -c '%s %i' "$target")" = "$(echo "$target_stat" | cut -d' ' -f1,3)" ] ||
  fail "the target was replaced"
echo "3: planted links refused, targets untouched"

echo "$0: PASS"
