#!/usr/bin/env bash
# nbd-fscache: in front of any plugin, the filter behaves as the plugin
# alone (issue 29).  Each case runs the plugin alone, then the filter in
# front of it in every mode, and compares what a client sees.
#
#  1. An upstream that cannot write (the pattern plugin; an nbd plugin
#     in front of a read-only server): the plugin alone serves it
#     read-only, and so does the filter in every mode, writeback
#     included, with the same bytes (md5 of a full copy).  Writeback
#     used to refuse every connection ("opening the writer's connection
#     to the upstream: Read-only file system").
#  7. A plugin whose can_flush fails (an sh plugin): the plugin alone
#     refuses the connection, and so does the filter in every mode.
#     Writeback used to serve it with can_flush: true.
#
# Truth: the plugin alone, run side by side (nbdinfo's flags, md5sum of
# an nbdcopy of the export, whether the connection opens).

source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires nbdcopy --version
requires nbdkit pattern --dump-plugin
requires nbdkit sh --dump-plugin
requires nbdkit nbd --dump-plugin
requires test -r "$FILTER"

modes="writethrough writearound writeback"

# probe LABEL ARGS...: run nbdkit ARGS with a client that prints the
# export's read-only flag, can_flush and the md5 of its bytes, or
# "refused"; on stdout.
probe ()
{
  local label=$1; shift
  local out
  out=$(nbdkit -U - "$@" --run '
      if nbdinfo "$uri" > "$tmpdir/info" 2>/dev/null; then
        ro=$(grep -E "^[[:space:]]*is_read_only:" "$tmpdir/info" | tr -d "[:space:]")
        fl=$(grep -E "^[[:space:]]*can_flush:" "$tmpdir/info" | tr -d "[:space:]")
        sum=$(nbdcopy "$uri" - | md5sum | cut -d" " -f1)
        echo "$ro $fl $sum"
      else
        echo refused
      fi' 2>>"$TMP/nbdkit.err") || true
  echo "$label: ${out:-nbdkit failed}" >&2
  echo "$out"
}

# same WHAT ARGS...: the plugin alone, then the filter in every mode,
# must print the same.
same ()
{
  local what=$1; shift
  local alone got m
  alone=$(probe "$what, alone" "$@")
  for m in $modes; do
    got=$(probe "$what, $m" --filter="$FILTER" "$@" \
                fscache-dir="$TMP/cache-$m" fscache-mode="$m")
    [ "$got" = "$alone" ] ||
      fail "$what, $m: '$got' where the plugin alone gives '$alone'"
  done
}

# tmpdir for the --run scripts (nbdkit's own $tmpdir is its socket's).
export tmpdir="$TMP"

# ---- 1. an upstream that cannot write -----------------------------------
same "pattern 1M" pattern 1M
[ "$(probe check pattern 1M | cut -d' ' -f1)" = "is_read_only:true" ] ||
  fail "test bug: the pattern plugin is not read-only here"
grep -q "fscache-mode=writeback, but the upstream cannot write" \
  "$TMP/nbdkit.err" || fail "writeback over pattern: no log line"

make_random "$TMP/ro.img" $((4 * 1024 * 1024))
start_nbdkit -P "$TMP/ro.pid" -U "$TMP/ro.sock" -r file "$TMP/ro.img"
same "nbd to a read-only server" nbd socket="$TMP/ro.sock"

# ---- 7. a plugin whose can_flush fails ----------------------------------
cat > "$TMP/badflush.sh" <<'EOF'
#!/usr/bin/env bash
case "$1" in
  get_size) echo 1M ;;
  pread) dd if=/dev/zero count="$3" iflag=count_bytes status=none ;;
  pwrite) cat > /dev/null ;;
  can_write) exit 0 ;;
  can_flush) echo "can_flush broken" >&2; exit 1 ;;
  flush) exit 0 ;;
  *) exit 2 ;;
esac
EOF
chmod +x "$TMP/badflush.sh"
same "sh plugin with a failing can_flush" sh "$TMP/badflush.sh"
[ "$(probe check sh "$TMP/badflush.sh")" = refused ] ||
  fail "test bug: the plugin alone serves a failing can_flush here"

echo "$0: OK"
