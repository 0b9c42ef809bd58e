#!/usr/bin/env bash
# The Debian package (debian/), built, installed, used and removed:
#
#  - dpkg-buildpackage -us -uc -b builds it from a copy of the source
#    tree's files (those git tracks, or would: the tree itself is
#    configured and built in place);
#  - the .deb holds the filter in nbdkit's filter directory, the three
#    programs, the five man pages, the three units and
#    /etc/nbd-fscached.conf (a conffile), no libtool .la; it depends
#    on the nbdkit it was built for, libev, libxxhash and libnbd; its
#    version is configure.ac's;
#  - lintian finds no error (its output is printed);
#  - installed with dpkg -i on this machine: "nbdkit --filter=fscache"
#    (by name, so from nbdkit's filter directory) in front of a file
#    serves the file's data and caches it; the installed nbd-fscache
#    lists the object; nbd-fscached and nbd-fscache-proxy answer
#    --help and --version; the installed proxy serves an image by
#    name from a configuration; systemd-analyze verify accepts the
#    installed units as they are;
#  - the install creates the system user nbd-fscache and
#    /var/cache/nbd-fscache, its own, mode 0700 (sysusers.d,
#    tmpfiles.d); the installed proxy, run as its unit runs it (as
#    nbd-fscache, umask 0077, NBD_FSCACHE_DIR), serves the image and
#    caches it there, and nbd-fscache ls run as that user lists it;
#    the user and directory are removed afterwards if they are new;
#  - dpkg --purge removes it: not installed any more, none of its files
#    left.  Files of the package that were already on the machine
#    (from a "make install" with prefix /usr, say) are saved first and
#    put back, so the machine is left as it was found.
#
# It needs root, and skips if nbd-fscache is installed already.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

[ "$(id -u)" -eq 0 ] || { echo "$0: SKIP: installing a package needs root"; exit 77; }
requires dpkg-buildpackage --version
requires command -v dh
requires lintian --version
requires git --version
requires git -C "$top_srcdir" rev-parse --git-dir
requires nbdkit --version
requires nbdcopy --version
requires pkg-config --exists nbdkit
requires dpkg-checkbuilddeps "$top_srcdir/debian/control"
requires flock --version
if dpkg-query -W -f='${Status}' nbd-fscache 2>/dev/null | grep -q 'ok installed'; then
  echo "$0: SKIP: nbd-fscache is installed on this machine; this test would remove it"
  exit 77
fi

t0="$(date +%s.%N)"
version=$(sed -n 's/^AC_INIT(\[nbd-fscache\], \[\([^]]*\)\].*/\1/p' "$top_srcdir/configure.ac")
[ -n "$version" ] || fail "no version in configure.ac"

# ---- Build, from the files git knows of. ----
src="$TMP/build/nbd-fscache-$version"
mkdir -p "$src"
(cd "$top_srcdir" &&
   git ls-files -z --cached --others --exclude-standard |
   while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
   tar --null -T - -cf -) | tar -C "$src" -xf - ||
  fail "cannot copy the source tree"
(cd "$src" && DEB_BUILD_OPTIONS="parallel=2" dpkg-buildpackage -us -uc -b) \
  > "$TMP/build.log" 2>&1 ||
  { tail -40 "$TMP/build.log" >&2; fail "dpkg-buildpackage failed"; }
arch="$(dpkg --print-architecture)"
deb="$TMP/build/nbd-fscache_${version}_$arch.deb"
changes="$TMP/build/nbd-fscache_${version}_$arch.changes"
[ -f "$deb" ] && [ -f "$changes" ] || fail "no $deb or $changes"
echo "built $(basename "$deb") in $(seconds_since "$t0") s"

# ---- What it holds. ----
filterdir="$(pkg-config --variable=filterdir nbdkit)"
dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./|/|' > "$TMP/contents"
for f in "$filterdir/nbdkit-fscache-filter.so" \
         /usr/bin/nbd-fscache /usr/sbin/nbd-fscached /usr/sbin/nbd-fscache-proxy \
         /usr/share/man/man1/nbdkit-fscache-filter.1.gz \
         /usr/share/man/man1/nbd-fscache.1.gz \
         /usr/share/man/man5/nbd-fscached.conf.5.gz \
         /usr/share/man/man8/nbd-fscached.8.gz \
         /usr/share/man/man8/nbd-fscache-proxy.8.gz \
         /lib/systemd/system/nbd-fscached.service \
         /lib/systemd/system/nbd-fscache-proxy@.service \
         /lib/systemd/system/nbd-fscache-proxy@.socket \
         /lib/systemd/system/nbd-fscache-proxy-back@.service \
         /lib/systemd/system/nbd-fscache-proxy-back@.socket \
         /etc/nbd-fscached.conf /etc/nbd-fscache/ \
         /usr/lib/sysusers.d/nbd-fscache.conf \
         /usr/lib/tmpfiles.d/nbd-fscache.conf; do
  grep -qxF "$f" "$TMP/contents" || fail "the package does not hold $f"
done
grep -q '\.la$' "$TMP/contents" && fail "the package holds a libtool .la"
dpkg-deb -f "$deb" Depends > "$TMP/depends"
echo "Depends: $(cat "$TMP/depends")"
for d in nbdkit libev4 libxxhash0 libnbd0; do
  grep -qE "(^|, )$d( |,|$)" "$TMP/depends" || fail "the package does not depend on $d"
done
nbdkit_version="$(pkg-config --modversion nbdkit)"
grep -qF "nbdkit (<< $nbdkit_version.~)" "$TMP/depends" ||
  fail "the package does not depend on nbdkit $nbdkit_version itself"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] ||
  fail "package version $(dpkg-deb -f "$deb" Version), configure.ac $version (debian/changelog)"
dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./conffiles > "$TMP/conffiles"
grep -qx /etc/nbd-fscached.conf "$TMP/conffiles" ||
  fail "/etc/nbd-fscached.conf is not a conffile"

# ---- lintian. ----
t1="$(date +%s.%N)"
lintian --fail-on none "$changes" > "$TMP/lintian.out" 2>&1 ||
  { cat "$TMP/lintian.out" >&2; fail "lintian failed to run"; }
echo "lintian ($(seconds_since "$t1") s):"
sed 's/^/  /' "$TMP/lintian.out"
grep -q '^E:' "$TMP/lintian.out" && fail "lintian found errors"

# ---- Install, on this machine. ----
# One install at a time: two runs of this test (two trees, two CI
# runs) would remove each other's package.
exec 9> /run/lock/nbd-fscache-test-package.lock
flock -w 600 9 || fail "another test-package.sh holds the lock for 10 minutes"
if dpkg-query -W -f='${Status}' nbd-fscache 2>/dev/null | grep -q 'ok installed'; then
  echo "$0: SKIP: nbd-fscache was installed on this machine meanwhile"
  exit 77
fi
# The install adds a user: test-fscache-hostile.sh, which watches
# /etc/passwd, must not run meanwhile (the lock is ours until exit).
exec 8> /run/lock/nbd-fscache-test-users.lock
flock -w 600 8 || fail "the users lock was held for 10 minutes"
# Files of the package already here are saved, and put back after the
# purge.  A file another package owns would make dpkg -i fail.
backup="$TMP/backup"
mkdir -p "$backup"
: > "$TMP/saved"
while IFS= read -r f; do
  case "$f" in */) continue ;; esac
  if [ -e "$f" ] || [ -L "$f" ]; then
    if owner="$(dpkg-query -S "$f" 2>/dev/null)"; then
      fail "$f belongs to ${owner%%:*}: not installing over it"
    fi
    mkdir -p "$backup$(dirname "$f")" && cp -a "$f" "$backup$f" ||
      fail "cannot save $f"
    echo "$f" >> "$TMP/saved"
  fi
done < "$TMP/contents"
[ -s "$TMP/saved" ] && echo "saved, to put back: $(tr '\n' ' ' < "$TMP/saved")"
# Directories the package would leave behind if they are new now.
dirs_before="$TMP/dirs-before"
while IFS= read -r f; do
  case "$f" in */) [ -d "$f" ] && echo "$f" ;; esac
done < "$TMP/contents" > "$dirs_before"

restore ()
{
  local f
  [ -s "$TMP/saved" ] || return 0
  while IFS= read -r f; do
    cp -a "$backup$f" "$f"
  done < "$TMP/saved"
  : > "$TMP/saved"
}

# dpkg takes a lock: another dpkg or apt may hold it for a while.
dpkg_locked ()           # ARGS...: dpkg ARGS, waiting up to 120 s for its lock
{
  local i st
  for (( i=0; i<240; i++ )); do
    st=0
    dpkg "$@" > "$TMP/dpkg.out" 2>&1 || st=$?
    if [ "$st" -ne 0 ] && grep -q 'lock' "$TMP/dpkg.out"; then
      sleep 0.5
      continue
    fi
    cat "$TMP/dpkg.out"
    return "$st"
  done
  cat "$TMP/dpkg.out" >&2
  return 1
}
installed=false
purge ()
{
  $installed || return 0
  dpkg_locked --purge nbd-fscache
  installed=false
}
# The user and the cache directory the package makes are removed
# after the purge (which keeps them, as Debian does) if they are new.
user_before=false
getent passwd nbd-fscache >/dev/null && user_before=true
cachedir_before=false
[ -e /var/cache/nbd-fscache ] && cachedir_before=true
unmake ()
{
  $cachedir_before || rm -rf /var/cache/nbd-fscache
  $user_before || ! getent passwd nbd-fscache >/dev/null ||
    userdel nbd-fscache
  $user_before || ! getent group nbd-fscache >/dev/null ||
    groupdel nbd-fscache
}
cleanup_fn unmake
cleanup_fn restore
cleanup_fn purge

installed=true
DEBIAN_FRONTEND=noninteractive dpkg_locked -i --force-confdef --force-confold "$deb" \
  > "$TMP/install.log" 2>&1 ||
  { cat "$TMP/install.log" >&2; fail "dpkg -i failed"; }
dpkg-query -W -f='${Status}' nbd-fscache | grep -q 'ok installed' ||
  fail "dpkg -i did not install nbd-fscache"
[ "$(dpkg-query -S "$filterdir/nbdkit-fscache-filter.so")" = "nbd-fscache: $filterdir/nbdkit-fscache-filter.so" ] ||
  fail "the filter in $filterdir is not the package's"

# The filter, by name, in front of a file.
size=$((4 * 1024 * 1024))
make_random "$TMP/img" "$size"
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" --filter=fscache \
  file "$TMP/img" fscache-dir="$TMP/cache" fscache-key=pkg
timeout 60 nbdcopy "nbd+unix:///?socket=$TMP/px.sock" "$TMP/out" ||
  fail "nbdcopy through the installed filter failed"
cmp "$TMP/img" "$TMP/out" || fail "read through the installed filter differs"
stop_nbdkit "$TMP/px.pid"
/usr/bin/nbd-fscache --dir "$TMP/cache" ls > "$TMP/ls" ||
  fail "the installed nbd-fscache ls failed"
cat "$TMP/ls"
awk '$1 == "pkg" && $4 == "100.0" { f = 1 } END { exit !f }' "$TMP/ls" ||
  fail "the installed nbd-fscache does not list the whole object"
for p in /usr/bin/nbd-fscache /usr/sbin/nbd-fscached /usr/sbin/nbd-fscache-proxy; do
  n="$(basename "$p")"
  out="$("$p" --version)" || fail "$p --version failed"
  [ "$out" = "$n $version" ] || fail "$p --version printed '$out'"
  "$p" --help > "$TMP/help" || fail "$p --help failed"
  grep -qi "^usage: $n " "$TMP/help" || fail "$p --help: no usage line"
done

# The installed proxy, by name, with the installed filter.
mkdir -p "$TMP/conf"
cat > "$TMP/conf/pkg2.conf" <<EOF
plugin=file
upstream=file=$TMP/img
fscache-key=pkg2
fscache-dir=$TMP/cache
socket=$TMP/px2.sock
readonly=true
EOF
/usr/sbin/nbd-fscache-proxy --confdir "$TMP/conf" pkg2 2> "$TMP/px2.err" &
pid2=$!
cleanup_fn "kill -9 $pid2 2>/dev/null"
wait_until timeout 10 nbdinfo --size "nbd+unix:///?socket=$TMP/px2.sock" >/dev/null 2>&1 ||
  { cat "$TMP/px2.err" >&2; fail "the installed nbd-fscache-proxy does not serve"; }
timeout 60 nbdcopy "nbd+unix:///?socket=$TMP/px2.sock" "$TMP/out2" ||
  fail "nbdcopy through the installed proxy failed"
cmp "$TMP/img" "$TMP/out2" || fail "read through the installed proxy differs"
kill -TERM "$pid2"
st=0; wait "$pid2" || st=$?
[ "$st" -eq 0 ] || fail "installed proxy: exit status $st after SIGTERM"

# The units' user and cache directory, made at install.
getent passwd nbd-fscache > "$TMP/passwd" ||
  fail "dpkg -i did not create the user nbd-fscache"
IFS=: read -r _ _ uid gid _ home shell < "$TMP/passwd"
[ "$uid" -lt 1000 ] && [ "$uid" -ne 0 ] ||
  fail "nbd-fscache is not a system user (uid $uid)"
[ "$shell" = /usr/sbin/nologin ] || fail "nbd-fscache has the shell $shell"
[ "$(stat -c '%U %G %a' /var/cache/nbd-fscache)" = "nbd-fscache nbd-fscache 700" ] ||
  fail "/var/cache/nbd-fscache: $(stat -c '%U %G %a' /var/cache/nbd-fscache), expected nbd-fscache nbd-fscache 700"
echo "the user nbd-fscache (uid $uid) and its /var/cache/nbd-fscache exist"

# The proxy as its unit runs it: as nbd-fscache, umask 0077, the cache
# directory from NBD_FSCACHE_DIR (no fscache-dir= in the configuration).
chmod 0755 "$TMP"
chmod 0644 "$TMP/img"
mkdir -m 0700 "$TMP/run"
chown nbd-fscache: "$TMP/run"
sed -e 's/pkg2/pkg3/' -e '/^fscache-dir=/d' \
  -e "s|^socket=.*|socket=$TMP/run/px3.sock|" "$TMP/conf/pkg2.conf" \
  > "$TMP/conf/pkg3.conf"
chmod 0755 "$TMP/conf"
chmod 0644 "$TMP/conf/pkg3.conf"
( umask 0077
  exec env NBD_FSCACHE_DIR=/var/cache/nbd-fscache \
    setpriv --reuid nbd-fscache --regid nbd-fscache --clear-groups \
    /usr/sbin/nbd-fscache-proxy --confdir "$TMP/conf" pkg3 ) 2> "$TMP/px3.err" &
pid3=$!
cleanup_fn "kill -9 $pid3 2>/dev/null"
wait_until timeout 10 nbdinfo --size "nbd+unix:///?socket=$TMP/run/px3.sock" >/dev/null 2>&1 ||
  { cat "$TMP/px3.err" >&2; fail "the proxy does not serve as nbd-fscache"; }
timeout 60 nbdcopy "nbd+unix:///?socket=$TMP/run/px3.sock" "$TMP/out3" ||
  fail "nbdcopy through the proxy run as nbd-fscache failed"
cmp "$TMP/img" "$TMP/out3" || fail "read through the proxy run as nbd-fscache differs"
kill -TERM "$pid3"
st=0; wait "$pid3" || st=$?
[ "$st" -eq 0 ] || { cat "$TMP/px3.err" >&2; fail "proxy as nbd-fscache: exit status $st"; }
setpriv --reuid nbd-fscache --regid nbd-fscache --clear-groups \
  /usr/bin/nbd-fscache --dir /var/cache/nbd-fscache ls > "$TMP/ls3" ||
  fail "nbd-fscache ls as nbd-fscache failed"
awk '$1 == "pkg3" && $4 == "100.0" { f = 1 } END { exit !f }' "$TMP/ls3" ||
  { cat "$TMP/ls3" >&2; fail "/var/cache/nbd-fscache does not hold all of pkg3"; }
bad="$(find /var/cache/nbd-fscache ! -user nbd-fscache)"
[ -z "$bad" ] || fail "not nbd-fscache's in its cache: $bad"
echo "the installed proxy serves and caches as nbd-fscache"

# The installed units, as they are: their programs and man pages exist.
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$TMP/units"
  for s in service socket; do
    cp "/lib/systemd/system/nbd-fscache-proxy@.$s" "$TMP/units/nbd-fscache-proxy@pkg2.$s"
  done
  manopt=--man=yes
  command -v man >/dev/null || manopt=--man=no
  st=0
  systemd-analyze verify "$manopt" /lib/systemd/system/nbd-fscached.service \
    "$TMP/units/nbd-fscache-proxy@pkg2.socket" \
    "$TMP/units/nbd-fscache-proxy@pkg2.service" > "$TMP/verify.out" 2>&1 || st=$?
  if [ "$st" -ne 0 ] || grep -q nbd-fscache "$TMP/verify.out"; then
    cat "$TMP/verify.out" >&2
    fail "systemd-analyze verify rejects the installed units"
  fi
  echo "systemd-analyze verify: the installed units pass ($manopt)"
fi

# ---- Purge: nothing of it left. ----
dpkg_locked --purge nbd-fscache > "$TMP/purge.log" 2>&1 ||
  { cat "$TMP/purge.log" >&2; fail "dpkg --purge failed"; }
installed=false
if dpkg-query -W -f='${Status}' nbd-fscache 2>/dev/null | grep -q 'installed'; then
  fail "nbd-fscache is still installed after dpkg --purge"
fi
while IFS= read -r f; do
  case "$f" in
    */) grep -qxF "$f" "$dirs_before" || [ ! -d "$f" ] ||
          fail "dpkg --purge left the directory $f" ;;
    *) [ ! -e "$f" ] && [ ! -L "$f" ] || fail "dpkg --purge left $f" ;;
  esac
done < "$TMP/contents"
restore
echo "installed, used and purged in $(seconds_since "$t0") s in all"
