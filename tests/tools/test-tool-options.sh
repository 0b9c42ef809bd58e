#!/usr/bin/env bash
# nbd-fscache: the command line.
#
#  - --help (every subcommand named), --version (PACKAGE_VERSION), and
#    each subcommand's --help;
#  - usage errors exit 2 with "nbd-fscache: what: why": unknown option
#    (global and a subcommand's), unknown or missing subcommand, --dir
#    without its argument, unexpected arguments;
#  - a --dir that does not exist, is not a directory, is an empty
#    directory or has a garbage fscache.hdr: a clear message, exit 2;
#  - without --dir the tool finds the cache where the filter puts it by
#    default (NBD_FSCACHE_DIR here).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires test -x "$TOOL"
requires nbdkit --version
requires nbdcopy --version
requires nbdkit --filter="$FILTER" null --dump-plugin

version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' \
            "$top_builddir/config.h")

tool --help > "$TMP/help" || fail "--help exited $?"
grep -q '^usage: nbd-fscache ' "$TMP/help" || fail "--help: no usage line"
for sub in ls stat check invalidate warm --dir; do
  grep -q -- "$sub" "$TMP/help" || fail "--help does not mention $sub"
done
out=$(tool --version) || fail "--version exited $?"
[ "$out" = "nbd-fscache $version" ] ||
  fail "--version printed '$out', expected 'nbd-fscache $version'"
for sub in ls stat check invalidate; do
  out=$(tool $sub --help) || fail "$sub --help exited $?"
  case "$out" in
    "usage: nbd-fscache $sub "*) ;;
    *) fail "$sub --help printed: $out" ;;
  esac
done

expect_error ()          # STATUS EXPECTED-MESSAGE ARGS...
{
  local want_st="$1" want="$2" st=0
  shift 2
  tool "$@" >"$TMP/out" 2>"$TMP/err" || st=$?
  [ "$st" -eq "$want_st" ] ||
    { cat "$TMP/err" >&2; fail "$*: exit status $st, expected $want_st"; }
  grep -qF -- "nbd-fscache: $want" "$TMP/err" ||
    { cat "$TMP/err" >&2; fail "$*: no 'nbd-fscache: $want' message"; }
}
expect_error 2 "--bogus: unknown option" --bogus
expect_error 2 "-x: unknown option" -x
expect_error 2 "no subcommand given"
expect_error 2 "frob: unknown subcommand" frob
expect_error 2 "--dir: needs an argument" --dir
expect_error 2 "ls: --bogus: unknown option" ls --bogus
expect_error 2 "ls: --dir: needs an argument" ls --dir
expect_error 2 "ls: extra: unexpected argument" ls --dir "$TMP" extra
expect_error 2 "stat: --output goes with --prometheus" stat --output x
expect_error 2 "invalidate: no OBJECT (or --all) given" invalidate

# ---- directories that are not caches ------------------------------------
expect_error 2 "ls: $TMP/nowhere: No such file or directory" \
  ls --dir "$TMP/nowhere"
touch "$TMP/afile"
expect_error 2 "stat: $TMP/afile: not a directory" stat --dir "$TMP/afile"
mkdir "$TMP/empty"
expect_error 2 "check: $TMP/empty: not a cache directory" \
  check --dir "$TMP/empty"
mkdir -p "$TMP/garbage/objects"
head -c 512 /dev/urandom > "$TMP/garbage/fscache.hdr"
expect_error 2 "ls: $TMP/garbage: not a cache directory (fscache.hdr is damaged" \
  --dir "$TMP/garbage" ls
# Looking changed nothing: the garbage header is still there.
[ "$(stat -c %s "$TMP/garbage/fscache.hdr")" -eq 512 ] &&
  [ ! -e "$TMP/empty/fscache.hdr" ] || fail "a failed open wrote a header"

# ---- the default directory is the filter's ------------------------------
export NBD_FSCACHE_DIR="$TMP/default-cache"
nbdkit -U - --filter="$FILTER" null size=1M fscache-key=opts \
  --run 'nbdcopy "$uri" null:'
[ -s "$NBD_FSCACHE_DIR/fscache.hdr" ] || fail "the filter made no cache"
tool ls > "$TMP/ls" || fail "ls in the default directory exited $?"
grep -q '^opts ' "$TMP/ls" || { cat "$TMP/ls" >&2; fail "ls: no opts object"; }

echo "$0: PASS"
