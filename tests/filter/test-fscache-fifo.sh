#!/usr/bin/env bash
# nbd-fscache: FIFOs and symlinks planted in the cache are never waited
# on and never followed (issue 26, items 2/7; rule 3 atop
# core/base/safeopen.c).
#
# A warm cache holds one object NAME.  For each kind of file an object
# may have (idx, data, sums, stats, wlog, quota, stale, epochs, and the
# share socket HASH.sock), in a fresh copy of that cache, a FIFO and then a
# symlink to a victim file are planted as NAME.KIND (replacing the real
# file if there is one).  Then, each under `timeout` as a hang guard:
#   - the filter serves the export: nbdcopy succeeds, cmp equals the
#     upstream image, and nbdkit stops on SIGTERM; with a .quota, its
#     committer (which reads it every round) finishes a round while a
#     client holds the export; with .epochs and the socket, a second
#     process joining while the first holds the object serves right
#     data too;
#   - nbd-fscache ls, stat, check and invalidate finish (no timeout, no
#     signal) and ls lists the object unless its index was replaced;
#   - nbd-fscached, told to cull everything, culls the object (or, when
#     the index is what was replaced, makes a pass) and stops on
#     SIGTERM with status 0.
# After each: the victim is unchanged and the planted FIFO or link, if
# still there, is still what was planted (nobody wrote through it).
#
# Truth: cmp against the upstream image; the victim's checksum; exit
# statuses (124 from timeout is a hang).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires timeout --version
requires mkfifo --version
requires test -x "$TOOL"
requires test -x "$DAEMON"
requires nbdkit --filter="$FILTER" null --dump-plugin

make_random "$TMP/up.img" $((1024 * 1024))
printf 'victim\n' > "$TMP/victim"
vsum="$(sha256sum < "$TMP/victim")"
G=20                            # seconds: the hang guard

# The warm cache, and the name of the share socket its owner listens
# on (HASH.sock beside the object's files) while it is open.
start_nbdkit -P "$TMP/w.pid" -U "$TMP/w.sock" --filter="$FILTER" \
  file "$TMP/up.img" fscache-dir="$TMP/warm" fscache-key=k
nbdcopy "nbd+unix:///?socket=$TMP/w.sock" "$TMP/w.out"
has_sock () { [ -n "$(find "$TMP/warm/objects" -name '*.sock')" ]; }
hold_export "nbd+unix:///?socket=$TMP/w.sock" "$TMP/w.stop" "$TMP/w.ready"
wait_until has_sock || fail "no share socket in the warm cache"
sockname="$(basename "$(find "$TMP/warm/objects" -name '*.sock')")"
touch "$TMP/w.stop"
stop_nbdkit "$TMP/w.pid"
idx="$(find "$TMP/warm/objects" -name '*.idx')"
[ -f "$idx" ] || fail "no object in the warm cache"
rel="${idx#$TMP/warm/}"
rel="${rel%.idx}"                # objects/@xx/NAME

# guard WHAT CMD...: run CMD under timeout; fail on a hang or a signal.
# Its status is left in $rc.
guard ()
{
  local what="$1"; shift
  rc=0
  timeout -k 5 $G "$@" >"$TMP/g.out" 2>&1 </dev/null || rc=$?
  if [ $rc -eq 124 ] || [ $rc -ge 128 ]; then
    cat "$TMP/g.out" >&2
    fail "$what: hung or killed (status $rc)"
  fi
}

# plant SHAPE PATH: a FIFO or a link to the victim at PATH.
plant ()
{
  rm -f "$2"
  case "$1" in
    fifo) mkfifo -m 0600 "$2" ;;
    link) ln -s "$TMP/victim" "$2" ;;
  esac
}

# intact SHAPE PATH: what was planted, if still there, is unchanged.
intact ()
{
  [ -e "$2" ] || [ -L "$2" ] || return 0
  case "$1" in
    fifo) [ -p "$2" ] ;;
    link) [ -L "$2" ] && [ "$(readlink "$2")" = "$TMP/victim" ] ;;
  esac
}

n=0
for shape in fifo link; do
  for kind in idx data sums stats wlog quota stale epochs sock; do
    what="$shape as .$kind"
    c="$TMP/c-$shape-$kind"
    rm -rf "$c"
    cp -a "$TMP/warm" "$c"
    f="$c/$rel.$kind"
    [ $kind != sock ] || f="$c/$(dirname "$rel")/$sockname"

    # The filter.
    plant $shape "$f"
    start_nbdkit -P "$TMP/p.pid" -U "$TMP/p.sock" --filter="$FILTER" \
      file "$TMP/up.img" fscache-dir="$c" fscache-key=k
    guard "$what: nbdcopy" nbdcopy "nbd+unix:///?socket=$TMP/p.sock" \
      "$TMP/p.out"
    [ $rc -eq 0 ] || { cat "$TMP/g.out" >&2; fail "$what: nbdcopy failed"; }
    cmp "$TMP/up.img" "$TMP/p.out" || fail "$what: wrong data"
    if [ $kind = quota ]; then
      # The committer reads NAME.quota every round while the object is
      # open, then rewrites NAME.stats: a new NAME.stats (a new inode,
      # it is renamed into place) means a round got past the quota.
      rm -f "$TMP/hold.stop" "$TMP/hold.ready"
      hold_export "nbd+unix:///?socket=$TMP/p.sock" "$TMP/hold.stop" \
        "$TMP/hold.ready"
      ino0="$(stat -c %i "$c/$rel.stats")"
      round () { [ "$(stat -c %i "$c/$rel.stats")" != "$ino0" ]; }
      wait_until round || fail "$what: the committer never finished a round"
      touch "$TMP/hold.stop"
    fi
    if [ $kind = epochs ] || [ $kind = sock ]; then
      # A second process joins (or tries to) while the first holds the
      # object: the joiner maps NAME.epochs and connects to the socket.
      rm -f "$TMP/hold.stop" "$TMP/hold.ready"
      hold_export "nbd+unix:///?socket=$TMP/p.sock" "$TMP/hold.stop" \
        "$TMP/hold.ready"
      start_nbdkit -P "$TMP/j.pid" -U "$TMP/j.sock" --filter="$FILTER" \
        file "$TMP/up.img" fscache-dir="$c" fscache-key=k
      guard "$what: nbdcopy through a joiner" \
        nbdcopy "nbd+unix:///?socket=$TMP/j.sock" "$TMP/j.out"
      [ $rc -eq 0 ] ||
        { cat "$TMP/g.out" >&2; fail "$what: nbdcopy through a joiner failed"; }
      cmp "$TMP/up.img" "$TMP/j.out" || fail "$what: wrong data from a joiner"
      kill -TERM "$(cat "$TMP/j.pid")"
      _wait_gone "$(cat "$TMP/j.pid")" || fail "$what: the joiner did not stop"
      touch "$TMP/hold.stop"
    fi
    kill -TERM "$(cat "$TMP/p.pid")"
    _wait_gone "$(cat "$TMP/p.pid")" || fail "$what: nbdkit did not stop"

    # The tool.  The filter may have replaced the plant (a .stats file
    # is rewritten, a .sock rebound): plant it again.
    plant $shape "$f"
    guard "$what: ls" "$TOOL" --dir "$c" ls
    [ $rc -eq 0 ] || { cat "$TMP/g.out" >&2; fail "$what: ls status $rc"; }
    if [ $kind != idx ]; then
      grep -q "^k " "$TMP/g.out" ||
        { cat "$TMP/g.out" >&2; fail "$what: ls does not list the object"; }
    fi
    guard "$what: stat" "$TOOL" --dir "$c" stat
    guard "$what: check" "$TOOL" --dir "$c" check
    intact $shape "$f" || fail "$what: the plant was replaced by the tools"
    guard "$what: invalidate" "$TOOL" --dir "$c" invalidate --all

    # The daemon: cull everything.
    rm -rf "$c"
    cp -a "$TMP/warm" "$c"
    plant $shape "$f"
    cat > "$TMP/d.conf" <<EOC
dir $c
max-size 4k
brun 2%
bcull 1%
bstop 0%
frun 2%
fcull 1%
fstop 0%
EOC
    dlog="$TMP/d.log"
    start_daemon "$TMP/d.conf"
    # Without an index there is no object to cull (the scan skips what
    # is not a regular file): then a whole pass is what we wait for.
    culled () { [ ! -e "$c/$rel.data" ]; }
    passed () { [ -f "$c/nbd-fscached.stats" ]; }   # after its 1st pass
    if [ $kind = idx ]; then
      wait_until passed || { cat "$dlog" >&2; fail "$what: no daemon pass"; }
    else
      wait_until culled ||
        { cat "$dlog" >&2; fail "$what: daemon culled nothing"; }
    fi
    kill -TERM "$dpid"
    st=0
    timeout -k 5 $G tail --pid="$dpid" -f /dev/null || st=$?
    [ $st -eq 0 ] || { cat "$dlog" >&2; fail "$what: daemon did not stop"; }
    wait "$dpid" || { cat "$dlog" >&2; fail "$what: daemon exit status $?"; }

    [ "$(sha256sum < "$TMP/victim")" = "$vsum" ] ||
      fail "$what: the victim was written"
    n=$((n + 1))
    rm -rf "$c"
  done
  echo "$shape: planted as each kind of file: no hang, nothing followed"
done
echo "$n cases"
