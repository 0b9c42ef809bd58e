#!/usr/bin/env bash
# The systemd units and the proxy wrapper, as "make install" installs
# them (into a DESTDIR):
#
#  - the five units (nbd-fscached.service, nbd-fscache-proxy@.service
#    and .socket, nbd-fscache-proxy-back@.service and .socket) are
#    installed; every absolute path in their Exec*=
#    lines is installed too (or is /bin/kill); with those paths moved
#    under the DESTDIR, "systemd-analyze verify" accepts the units and
#    an instance of the proxy's pair, their man pages (Documentation=)
#    being the installed ones; the same check rejects a unit whose
#    program is missing;
#  - both services are confined: "systemd-analyze security
#    --offline=true" rates each at most 4.0 (and the same check rejects
#    the proxy's unit stripped of its confinement), and they run as the
#    user nbd-fscache with the cache directory theirs (CacheDirectory=,
#    mode 0700);
#  - the socket unit listens where the wrapper puts the socket when it
#    is not socket activated (/run/nbd-fscache/NAME.sock);
#  - socket activation: the service's ExecStart run by
#    systemd-socket-activate starts nbdkit only at the first
#    connection, in the same process (LISTEN_PID), without -U; the
#    whole image read through it is the upstream's, the cache holds
#    the object, a later connection is served too, SIGTERM stops it
#    with status 0;  a socket= that is not the socket systemd passed is
#    refused (status 1, "FILE:LINE: socket=...");
#  - a split proxy under its units (the back's socket held across the
#    back's restarts, as systemd does; the front given the back's
#    socket as its unit gives it): the back killed (-9) under a copy,
#    the copy completes identical, the back started again, and the
#    front started no back of its own;
#  - without activation it listens on socket= itself, creating its
#    directory and replacing a stale socket, and a second proxy on a
#    socket being served is refused;
#  - configuration and usage errors: "nbd-fscache-proxy: what: why",
#    status 1 and 2; a configuration others may write is refused;
#  - the installed nbd-fscached.conf is the one its unit names, names
#    /var/cache/nbd-fscache, and the installed daemon runs with it (on
#    another directory); a second "make install" keeps an edited one,
#    "make uninstall" removes the units and keeps it.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires systemd-analyze --version
requires systemd-socket-activate --version
requires nbdkit --version
requires nbdcopy --version
requires nbdinfo --version
requires make --version
requires "$PYTHON" --version
requires nbdkit --filter="$FILTER" null --dump-plugin

root="$TMP/root"
units="$TMP/units"
mkdir -p "$units" "$TMP/conf"

# make, not our make: this runs under "make check".
submake ()
{
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$top_builddir" "$@"
}
submake install DESTDIR="$root" > "$TMP/install.log" 2>&1 ||
  { cat "$TMP/install.log" >&2; fail "make install DESTDIR=$root failed"; }

# ---- The installed units. ----
find_one ()              # NAME: the one installed file of that name
{
  local found
  found="$(find "$root" -name "$1")"
  [ -n "$found" ] || fail "make install did not install $1"
  [ "$(printf '%s\n' "$found" | wc -l)" -eq 1 ] ||
    fail "make install installed $1 twice: $found"
  printf '%s\n' "$found"
}
svc="$(find_one 'nbd-fscache-proxy@.service')"
sock="$(find_one 'nbd-fscache-proxy@.socket')"
bsvc="$(find_one 'nbd-fscache-proxy-back@.service')"
bsock="$(find_one 'nbd-fscache-proxy-back@.socket')"
dsvc="$(find_one 'nbd-fscached.service')"
unitdir="$(dirname "$svc")"
for u in "$sock" "$bsvc" "$bsock" "$dsvc"; do
  [ "$(dirname "$u")" = "$unitdir" ] ||
    fail "the units are not installed in one directory: $svc $u"
done
mandir="$(dirname "$(dirname "$(find_one nbd-fscache-proxy.8)")")"

# relocate UNIT OUT: UNIT with each absolute path of its Exec*= lines
# that make install installed moved under $root.  Any other path is an
# error, except /bin/kill.
relocate ()
{
  local line words w out
  while IFS= read -r line; do
    case "$line" in
      Exec*=*)
        out="${line%%=*}="
        set -f
        words=(${line#*=})
        set +f
        for w in "${words[@]}"; do
          case "$w" in
            /*)
              if [ -e "$root$w" ]; then
                w="$root$w"
              elif [ "$w" != /bin/kill ]; then
                fail "$(basename "$1"): $line: make install did not install $w"
              fi ;;
          esac
          out="$out$w "
        done
        line="${out% }" ;;
    esac
    printf '%s\n' "$line"
  done < "$1" > "$2"
}
for u in "$svc" "$sock" "$bsvc" "$bsock" "$dsvc"; do
  relocate "$u" "$units/$(basename "$u")"
done
for u in nbd-fscache-proxy nbd-fscache-proxy-back; do
  for t in service socket; do
    cp "$units/$u@.$t" "$units/$u@img1.$t"
  done
done

# verify UNIT...: systemd-analyze verify must accept them and say
# nothing about them (it warns about unknown keys and goes on); what
# it said is in $TMP/verify.out.
manopt=--man=yes
if ! command -v man >/dev/null; then
  manopt=--man=no
  echo "$0: no man(1): Documentation= not checked"
fi
verify ()
{
  local st=0
  MANPATH="$mandir" systemd-analyze verify "$manopt" "$@" \
    > "$TMP/verify.out" 2>&1 || st=$?
  [ "$st" -eq 0 ] && ! grep -q 'nbd-fscache' "$TMP/verify.out"
}
verify "$units/nbd-fscached.service" "$units/nbd-fscache-proxy@.service" \
  "$units/nbd-fscache-proxy@.socket" "$units/nbd-fscache-proxy-back@.service" \
  "$units/nbd-fscache-proxy-back@.socket" ||
  { cat "$TMP/verify.out" >&2; fail "systemd-analyze verify rejects the installed units"; }
verify "$units/nbd-fscache-proxy@img1.socket" \
  "$units/nbd-fscache-proxy@img1.service" \
  "$units/nbd-fscache-proxy-back@img1.socket" \
  "$units/nbd-fscache-proxy-back@img1.service" ||
  { cat "$TMP/verify.out" >&2; fail "systemd-analyze verify rejects the instances img1 of the proxy's units"; }
echo "systemd-analyze verify: the units and an instance pass ($manopt)"
# The same check fails on a unit whose program is missing.
mkdir "$TMP/bad"
sed 's|^ExecStart=[^ ]*|ExecStart=/nonexistent/nbd-fscache-proxy|' \
  "$units/nbd-fscache-proxy@img1.service" > "$TMP/bad/nbd-fscache-proxy@img1.service"
! verify "$TMP/bad/nbd-fscache-proxy@img1.service" ||
  fail "systemd-analyze verify accepts a unit whose program is missing"

# ---- Confinement: systemd-analyze security, at most 4.0. ----
# exposure UNIT: its overall exposure level (0.0 to 10.0).
exposure ()
{
  systemd-analyze security --offline=true "$1" 2>&1 |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p'
}
# confined UNIT: 4.0 or less, by our reading and by systemd-analyze's
# own --threshold (on its 0-100 scale).
confined ()
{
  local e
  e="$(exposure "$1")"
  [ -n "$e" ] && awk -v e="$e" 'BEGIN { exit !(e <= 4.0) }' &&
    systemd-analyze security --offline=true --threshold=40 "$1" >/dev/null 2>&1
}
for u in nbd-fscached.service nbd-fscache-proxy@img1.service \
         nbd-fscache-proxy-back@img1.service; do
  confined "$units/$u" ||
    { systemd-analyze security --offline=true "$units/$u" >&2
      fail "$u: exposure '$(exposure "$units/$u")', more than 4.0"; }
  grep -qx 'User=nbd-fscache' "$units/$u" || fail "$u: not run as nbd-fscache"
  case $u in
    nbd-fscache-proxy-back@*) ;;           # the plugin alone: no cache
    *) grep -qx 'CacheDirectory=nbd-fscache' "$units/$u" &&
         grep -qx 'CacheDirectoryMode=0700' "$units/$u" ||
         fail "$u: no CacheDirectory=nbd-fscache of mode 0700" ;;
  esac
  echo "$u: exposure $(exposure "$units/$u") (at most 4.0), user nbd-fscache"
done
# The back's socket: private to the user nbd-fscache, where the front's
# unit tells the front to find it, and held across the back's restarts
# (Restart=always), the back stopped with the front (PartOf=).
blisten="$(sed -n 's/^ListenStream=//p' "$bsock")"
grep -qx "Environment=NBD_FSCACHE_PROXY_BACK=$blisten" "$svc" ||
  fail "nbd-fscache-proxy@.service does not name the back's socket $blisten"
grep -qx 'Wants=nbd-fscache-proxy-back@%i.socket' "$svc" ||
  fail "nbd-fscache-proxy@.service does not want the back's socket"
grep -qx 'SocketMode=0600' "$bsock" && grep -qx 'SocketUser=nbd-fscache' "$bsock" ||
  fail "nbd-fscache-proxy-back@.socket is not private to nbd-fscache"
grep -qx 'Restart=always' "$bsvc" &&
  grep -qx 'PartOf=nbd-fscache-proxy@%i.service' "$bsvc" ||
  fail "nbd-fscache-proxy-back@.service: not Restart=always, PartOf= the front"
# The check can fail: the proxy's unit without its confinement.
sed '/^User=/,/^SystemCallArchitectures=/d' \
  "$units/nbd-fscache-proxy@img1.service" > "$TMP/bad/nbd-fscache-proxy@img1.service"
! confined "$TMP/bad/nbd-fscache-proxy@img1.service" ||
  fail "the exposure check passes a unit without confinement ($(exposure "$TMP/bad/nbd-fscache-proxy@img1.service"))"

# The wrapper, as the proxy's ExecStart runs it, for instance NAME.
read -r -a exec_line <<< "$(sed -n 's/^ExecStart=//p' "$units/nbd-fscache-proxy@.service")"
proxy="${exec_line[0]}"
[ -x "$proxy" ] || fail "ExecStart=$proxy: not executable"
run_args ()              # NAME: the rest of ExecStart for instance NAME
{
  local a
  for a in "${exec_line[@]:1}"; do
    printf '%s\n' "${a//%i/$1}"
  done
}
mapfile -t args1 < <(run_args img1)
[ "${args1[*]}" = img1 ] || fail "ExecStart=${exec_line[*]}: expected PROGRAM %i"

# ---- The socket unit listens where the wrapper's default is. ----
size=$((3 * 1024 * 1024))
make_random "$TMP/img" "$size"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" -r file "$TMP/img"
cat > "$TMP/conf/img0.conf" <<EOF
plugin=nbd
upstream=socket=$TMP/up.sock
fscache-key=img0
EOF
listen="$(sed -n 's/^ListenStream=//p' "$sock")"
dry="$("$proxy" --confdir "$TMP/conf" --dry-run img0)" ||
  fail "--dry-run img0 failed"
want="${listen//%i/img0}"
case " $dry " in
  *" -U $want "*) ;;
  *) fail "ListenStream=$listen, but without activation the proxy listens elsewhere: $dry" ;;
esac
[ "$want" = /run/nbd-fscache/img0.sock ] ||
  fail "ListenStream=$listen: expected /run/nbd-fscache/%i.sock"

# ---- Socket activation. ----
cat > "$TMP/conf/img1.conf" <<EOF
# the first image
plugin = nbd
upstream=socket=$TMP/up.sock
fscache-key=img1
fscache-dir=$TMP/cache
socket=$TMP/px1.sock
readonly=true
EOF
uri1="nbd+unix:///?socket=$TMP/px1.sock"
systemd-socket-activate -l "$TMP/px1.sock" \
  "$proxy" --confdir "$TMP/conf" --filter "$FILTER" "${args1[@]}" \
  2> "$TMP/px1.err" &
pid1=$!
cleanup_fn "pkill -9 -P $pid1; kill -9 $pid1 2>/dev/null"
wait_until test -S "$TMP/px1.sock" || fail "systemd-socket-activate: no socket"
[ "$(cat "/proc/$pid1/comm")" != nbdkit ] ||
  fail "nbdkit started before the first connection"
timeout 60 nbdcopy "$uri1" "$TMP/out1" || { cat "$TMP/px1.err" >&2; fail "nbdcopy through the proxy failed"; }
cmp "$TMP/img" "$TMP/out1" || fail "read through the socket-activated proxy differs"
[ "$(cat "/proc/$pid1/comm")" = nbdkit ] ||
  fail "the process systemd-socket-activate started is not nbdkit (LISTEN_PID would not match)"
tr '\0' '\n' < "/proc/$pid1/cmdline" > "$TMP/px1.cmdline"
grep -qx -- -U "$TMP/px1.cmdline" && fail "nbdkit was given -U under socket activation"
grep -qx -- -r "$TMP/px1.cmdline" || fail "readonly=true did not give -r"
[ "$(timeout 60 nbdinfo --size "$uri1")" = "$size" ] || fail "a second connection was not served"
tool --dir "$TMP/cache" ls > "$TMP/ls" || fail "nbd-fscache ls failed"
cat "$TMP/ls"
awk '$1 == "img1" && $4 == "100.0" { f = 1 } END { exit !f }' "$TMP/ls" ||
  fail "the cache does not hold all of object img1"
kill -TERM "$pid1"
st=0; wait "$pid1" || st=$?
[ "$st" -eq 0 ] || { cat "$TMP/px1.err" >&2; fail "proxy exit status $st after SIGTERM"; }
echo "socket activation: nbdkit started on the first connection, pid $pid1, no -U"

# A socket= that is not what systemd passed.
sed -e 's/img1/img2/' -e "s|^socket=.*|socket=$TMP/elsewhere.sock|" \
  "$TMP/conf/img1.conf" > "$TMP/conf/img2.conf"
line="$(grep -n '^socket=' "$TMP/conf/img2.conf" | cut -d: -f1)"
systemd-socket-activate -l "$TMP/px2.sock" \
  "$proxy" --confdir "$TMP/conf" --filter "$FILTER" img2 2> "$TMP/px2.err" &
pid2=$!
cleanup_fn "pkill -9 -P $pid2; kill -9 $pid2 2>/dev/null"
wait_until test -S "$TMP/px2.sock" || fail "systemd-socket-activate: no socket"
timeout 20 nbdinfo --size "nbd+unix:///?socket=$TMP/px2.sock" >/dev/null 2>&1 &&
  fail "a proxy with the wrong socket= served"
st=0; wait "$pid2" || st=$?
[ "$st" -eq 1 ] || { cat "$TMP/px2.err" >&2; fail "wrong socket=: status $st, expected 1"; }
grep -qF "nbd-fscache-proxy: $TMP/conf/img2.conf:$line: socket=$TMP/elsewhere.sock, but systemd passed the socket $TMP/px2.sock" "$TMP/px2.err" ||
  { cat "$TMP/px2.err" >&2; fail "wrong socket=: no clear message"; }

# ---- A split proxy under its units: the back killed under a copy. ----
# As systemd runs them: the back's ExecStart socket activated on the
# back's socket, which stays while the back is started again after it
# exits (Restart=always), and the front's ExecStart socket activated on
# its own, with the back's socket in NBD_FSCACHE_PROXY_BACK as its unit
# sets it.  The back is killed (-9) once it serves the copy's fills;
# the copy goes on, identical, and the front started no back itself.
read -r -a bexec <<< "$(sed -n 's/^ExecStart=//p' "$units/nbd-fscache-proxy-back@.service")"
[ "${bexec[0]}" = "$proxy" ] && [ "${bexec[*]:1}" = "--back %i" ] ||
  fail "nbd-fscache-proxy-back@.service: ExecStart=${bexec[*]}: expected $proxy --back %i"
cat > "$TMP/conf/img4.conf" <<EOF
plugin=nbd
upstream=socket=$TMP/up.sock
filter=log
upstream=logfile=$TMP/img4-back.log
filter=delay
upstream=rdelay=5ms
split=yes
fscache-key=img4
fscache-dir=$TMP/cache4
fscache-readahead=0
EOF
"$proxy" --confdir "$TMP/conf" --back --dry-run img4 > "$TMP/img4.dry" ||
  fail "--back --dry-run img4 failed"
grep -q -- '--filter=log --filter=delay nbd socket=' "$TMP/img4.dry" ||
  fail "--back --dry-run: $(cat "$TMP/img4.dry")"
bsock4="$TMP/img4.back.sock"
systemd-socket-activate -l "$bsock4" bash -c '
  while :; do
    (export LISTEN_PID=$BASHPID; exec "$@")
    sleep 0.5
  done' back "$proxy" --confdir "$TMP/conf" --back img4 2> "$TMP/back4.err" &
bpid=$!
cleanup_fn "pkill -9 -P $bpid; kill -9 $bpid 2>/dev/null"
systemd-socket-activate -l "$TMP/px4.sock" -E NBD_FSCACHE_PROXY_BACK="$bsock4" \
  "$proxy" --confdir "$TMP/conf" --filter "$FILTER" img4 2> "$TMP/px4.err" &
fpid=$!
cleanup_fn "pkill -9 -P $fpid; kill -9 $fpid 2>/dev/null"
wait_until test -S "$TMP/px4.sock" -a -S "$bsock4" || fail "split units: no sockets"
nbdcopy --requests=4 "nbd+unix:///?socket=$TMP/px4.sock" "$TMP/out4" &
copy=$!
fills4 () { grep -q ' Read id=.* count=0x[0-9a-f]\{5,\} ' "$TMP/img4-back.log" 2>/dev/null; }
wait_until fills4 || fail "split units: the back served no fill"
back4=$(pgrep -f -- "^nbdkit -f --filter=log --filter=delay nbd socket=$TMP/up.sock" | head -n 1 || true)
[ -n "$back4" ] || fail "split units: no back nbdkit"
kill -9 "$back4"
wait $copy ||
  { cat "$TMP/px4.err" "$TMP/back4.err" >&2; fail "split units: the copy failed after the back was killed"; }
cmp "$TMP/img" "$TMP/out4" || fail "split units: the copy differs"
again4 () { local p; p=$(pgrep -f -- "^nbdkit -f --filter=log --filter=delay nbd socket=$TMP/up.sock" | head -n 1); [ -n "$p" ] && [ "$p" != "$back4" ]; }
wait_until again4 || fail "split units: the back was not started again"
[ "$(cat "/proc/$fpid/comm")" = nbdkit ] || fail "split units: the front is not nbdkit"
! pgrep -x -P "$fpid" perl >/dev/null ||
  fail "split units: the front started a back of its own: $(pgrep -a -P "$fpid")"
kill -TERM "$fpid"; wait "$fpid" || true
kill -TERM "$bpid" 2>/dev/null; pkill -9 -P "$bpid" 2>/dev/null || true
wait "$bpid" 2>/dev/null || true
echo "split units: the back killed under a copy, restarted on its socket; the copy identical"

# ---- Without activation: -U socket=, its directory created, a
# stale socket replaced. ----
sock3="$TMP/run/sub/px3.sock"
uri3="nbd+unix:///?socket=$sock3"
sed -e 's/img1/img3/' -e "s|^socket=.*|socket=$sock3|" -e '/^readonly=/d' \
  "$TMP/conf/img1.conf" > "$TMP/conf/img3.conf"
pid3=""
start_px3 ()
{
  env -u LISTEN_FDS -u LISTEN_PID "$proxy" --confdir "$TMP/conf" \
    --filter "$FILTER" img3 2> "$TMP/px3.err" &
  pid3=$!
  cleanup_fn "pkill -9 -P $pid3; kill -9 $pid3 2>/dev/null"
  wait_until timeout 10 nbdinfo --size "$uri3" >/dev/null 2>&1 ||
    { cat "$TMP/px3.err" >&2; fail "the proxy does not serve $sock3"; }
}
stop_px3 ()
{
  local st=0
  kill -TERM "$pid3"
  wait "$pid3" || st=$?
  [ "$st" -eq 0 ] || fail "proxy exit status $st after SIGTERM"
}
[ ! -e "$TMP/run" ] || fail "$TMP/run exists already"
start_px3
timeout 60 nbdcopy "$uri3" "$TMP/out3" || fail "nbdcopy through the proxy failed"
cmp "$TMP/img" "$TMP/out3" || fail "read through the proxy on socket= differs"
tr '\0' '\n' < "/proc/$pid3/cmdline" > "$TMP/px3.cmdline"
grep -qx -- "$sock3" "$TMP/px3.cmdline" || fail "nbdkit not given -U $sock3"
grep -qx -- -r "$TMP/px3.cmdline" && fail "-r without readonly="
st=0
"$proxy" --confdir "$TMP/conf" --filter "$FILTER" img3 2> "$TMP/px3b.err" || st=$?
[ "$st" -eq 1 ] &&
  grep -qF "nbd-fscache-proxy: $sock3: another server is listening on it" "$TMP/px3b.err" ||
  { cat "$TMP/px3b.err" >&2; fail "a second proxy on a served socket: status $st"; }
stop_px3
# A socket left behind (nbdkit leaves its own; else make one).
[ -S "$sock3" ] ||
  "$PYTHON" -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$sock3"
[ -S "$sock3" ] || fail "no stale socket to start with"
start_px3
stop_px3
echo "without activation: -U $sock3, directory created, stale socket replaced"

# ---- Configuration and usage errors. ----
expect ()                # STATUS MESSAGE ARGS...
{
  local want="$1" msg="$2" st=0
  shift 2
  "$proxy" "$@" > "$TMP/out" 2> "$TMP/err" || st=$?
  [ "$st" -eq "$want" ] || { cat "$TMP/err" >&2; fail "$*: status $st, expected $want"; }
  grep -qF -- "nbd-fscache-proxy: $msg" "$TMP/err" ||
    { cat "$TMP/err" >&2; fail "$*: no 'nbd-fscache-proxy: $msg' message"; }
}
bad_conf ()              # MESSAGE CONTENT: a conf that is refused
{
  printf '%s\n' "$2" > "$TMP/conf/bad.conf"
  expect 1 "$TMP/conf/bad.conf$1" --confdir "$TMP/conf" --dry-run bad
}
expect 2 "missing NAME" --confdir "$TMP/conf"
expect 2 "--bogus: unknown option" --bogus img1
expect 2 "../img1: invalid name" --confdir "$TMP/conf" ../img1
expect 2 ".hidden: invalid name" --confdir "$TMP/conf" .hidden
expect 2 "--confdir: option requires an argument" --confdir
expect 2 "--dry-run: unexpected argument" --confdir "$TMP/conf" img1 --dry-run
expect 1 "$TMP/conf/nope.conf: No such file" --confdir "$TMP/conf" nope
base="plugin=nbd
upstream=socket=$TMP/up.sock
fscache-key=k"
bad_conf ":4: 'bogus': unknown key" "$base
bogus=1"
bad_conf ":4: plugin= given twice (first on line 1)" "$base
plugin=curl"
bad_conf ":4: 'just words': expected KEY=VALUE" "$base
just words"
bad_conf ":4: upstream=-v: a plugin parameter cannot start with '-'" "$base
upstream=-v"
bad_conf ":4: readonly=maybe: expected true or false" "$base
readonly=maybe"
bad_conf ":4: socket=run/x.sock: expected an absolute path" "$base
socket=run/x.sock"
bad_conf ": no fscache-key= line" "plugin=nbd"
bad_conf ": no plugin= line" "fscache-key=k"
printf '%s\n' "$base" > "$TMP/conf/bad.conf"
chmod 0666 "$TMP/conf/bad.conf"
expect 1 "$TMP/conf/bad.conf: refused: writable by group or others (mode 666)" \
  --confdir "$TMP/conf" --dry-run bad
chmod 0644 "$TMP/conf/bad.conf"
"$proxy" --confdir "$TMP/conf" --dry-run bad > /dev/null ||
  fail "a valid configuration refused"
out="$("$proxy" --version)" || fail "--version failed"
version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$top_builddir/config.h")
[ "$out" = "nbd-fscache-proxy $version" ] || fail "--version printed '$out'"
"$proxy" --help | grep -q '^usage: nbd-fscache-proxy ' || fail "--help: no usage line"

# ---- The daemon's default configuration. ----
read -r -a dexec <<< "$(sed -n 's/^ExecStart=//p' "$units/nbd-fscached.service")"
dconf=""
for (( i=1; i<${#dexec[@]}; i++ )); do
  [ "${dexec[$i]}" = -f ] && dconf="${dexec[$((i+1))]}"
done
[ -f "$dconf" ] || fail "nbd-fscached.service reads '$dconf', which make install did not install"
grep -qx 'dir /var/cache/nbd-fscache' "$dconf" ||
  fail "$dconf does not name /var/cache/nbd-fscache"
sed "s|^dir .*|dir $TMP/cache|" "$dconf" > "$TMP/fscached.conf"
DAEMON="${dexec[0]}"
start_daemon "$TMP/fscached.conf"
stop_daemon
echo "the installed nbd-fscached runs with the installed configuration"

# make install keeps an edited configuration; make uninstall too.
echo "# edited" >> "$dconf"
submake install DESTDIR="$root" > "$TMP/install2.log" 2>&1 ||
  { cat "$TMP/install2.log" >&2; fail "make install (again) failed"; }
grep -qx '# edited' "$dconf" || fail "a second make install overwrote $dconf"
submake uninstall DESTDIR="$root" > "$TMP/uninstall.log" 2>&1 ||
  { cat "$TMP/uninstall.log" >&2; fail "make uninstall failed"; }
for f in "$svc" "$sock" "$dsvc" "$proxy"; do
  [ ! -e "$f" ] || fail "make uninstall left $f"
done
grep -qx '# edited' "$dconf" || fail "make uninstall removed the edited $dconf"
echo "make install/uninstall keep an edited $(basename "$dconf")"
