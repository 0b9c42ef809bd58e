#!/usr/bin/env bash
# nbd-fscache: bad fscache-* parameters stop nbdkit at startup with a
# message naming the parameter, and create nothing on disk; a good
# parameter set starts and serves.
#
# Truth: nbdkit's exit status, its stderr, and the file system (the
# fscache-dir given must not exist after a refused start).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires timeout --version
requires "$PYTHON" -c "import nbd"
requires nbdkit --filter="$FILTER" null --dump-plugin

failures=0
fail ()
{
  echo "$0: FAIL: $*" >&2
  failures=$((failures + 1))
}

# run_nbdkit ERRFILE ARGS...: nbdkit with the filter over a 1M memory
# disk on a private Unix socket, running --run true.  Sets $rc.
run_nbdkit ()
{
  local errfile="$1"; shift
  rc=0
  timeout 20 nbdkit -U - --filter="$FILTER" memory 1M "$@" --run true \
    >/dev/null 2>"$errfile" || rc=$?
}

# expect_refused NAME PARAM=VALUE...: nbdkit must exit non-zero, name
# NAME on stderr, and not create its fscache-dir.
n=0
expect_refused ()
{
  local name="$1"; shift
  n=$((n + 1))
  local dir="$TMP/cache-$n" err="$TMP/err-$n"
  run_nbdkit "$err" fscache-dir="$dir" "$@"
  if [ "$rc" -eq 0 ]; then
    fail "$*: nbdkit started (exit 0), expected a refusal"
  elif [ "$rc" -eq 124 ]; then
    fail "$*: nbdkit did not exit within 20 s"
  fi
  if ! grep -q -- "$name" "$err"; then
    fail "$*: stderr does not name '$name':"
    sed 's/^/    /' "$err" >&2
  fi
  if [ -e "$dir" ]; then
    fail "$*: the cache directory $dir was created"
  fi
}

# Invalid values: refused while parsing, before anything is created.
expect_refused fscache-block-size fscache-block-size=3000
expect_refused fscache-block-size fscache-block-size=2K
expect_refused fscache-block-size fscache-block-size=2048
expect_refused fscache-block-size fscache-block-size=8M
expect_refused fscache-block-size fscache-block-size=0
expect_refused fscache-block-size fscache-block-size=abc
expect_refused fscache-mode fscache-mode=bogus
expect_refused fscache-mode fscache-mode=
expect_refused fscache-validate fscache-validate=bogus
expect_refused fscache-verify fscache-verify=maybe
expect_refused fscache-foo fscache-foo=1
expect_refused fscache-key fscache-key=
expect_refused fscache-readahead fscache-readahead=2G
expect_refused fscache-trace-max fscache-trace-max=1K
expect_refused fscache-trace-max fscache-trace-max=lots
expect_refused fscache-trace fscache-trace="$TMP/no/such/dir/t.trace"
expect_refused fscache-max-size fscache-max-size=lots
expect_refused fscache-max-size fscache-max-size=100K
expect_refused fscache-min-free fscache-min-free=100%
expect_refused fscache-min-free fscache-min-free=-1%
expect_refused fscache-min-free fscache-min-free=5%x
expect_refused fscache-min-free-inodes fscache-min-free-inodes=many
expect_refused fscache-offline fscache-offline=perhaps
expect_refused fscache-generation \
  fscache-generation="$(printf '%0300d' 0)"
# A good parameter before the bad one changes nothing.
expect_refused fscache-mode fscache-block-size=4K fscache-mode=writebehind
expect_refused fscache-dirty-max fscache-dirty-max=100K
expect_refused fscache-dirty-max fscache-dirty-max=lots
expect_refused fscache-writeback-drain fscache-writeback-drain=-1
expect_refused fscache-writeback-drain fscache-writeback-drain=10s
expect_refused fscache-writeback-drain fscache-writeback-drain=100000
expect_refused fscache-upstream-connections fscache-upstream-connections=abc
expect_refused fscache-upstream-connections fscache-upstream-connections=65
expect_refused fscache-upstream-connections fscache-upstream-connections=-1
expect_refused fscache-catchup fscache-catchup=maybe
# The peer tier: a fleet needs this node's line; the others need a fleet;
# a file that cannot be read, or a PSK file without a user name.
echo "nbd+unix:///?socket=$TMP/p.sock" > "$TMP/peers"
: > "$TMP/empty-psk"
expect_refused fscache-peer-self fscache-peers="$TMP/peers"
expect_refused fscache-peers fscache-peer-self=nbd://x
expect_refused fscache-peers fscache-peer-tls-psk="$TMP/peers"
expect_refused fscache-peers fscache-peers="$TMP/none" fscache-peer-self=nbd://x \
  fscache-generation=1
expect_refused fscache-peer-self fscache-peers="$TMP/peers" fscache-peer-self=
expect_refused fscache-peer-tls-psk fscache-peers="$TMP/peers" \
  fscache-peer-self=nbd://x fscache-peer-tls-psk="$TMP/empty-psk" \
  fscache-generation=1
# Certificates: not with a PSK too; a directory without them.
mkdir -p "$TMP/no-certs"
expect_refused fscache-peer-tls-certificates fscache-peers="$TMP/peers" \
  fscache-peer-self=nbd://x fscache-generation=1 \
  fscache-peer-tls-certificates="$TMP/no-certs"
expect_refused fscache-peer-tls-certificates fscache-peers="$TMP/peers" \
  fscache-peer-self=nbd://x fscache-generation=1 \
  fscache-peer-tls-psk="$TMP/peers" fscache-peer-tls-certificates="$TMP/no-certs"
# A fleet trusts its peers' data only with a manifest to check it
# against, or at least a generation (issue 43); a manifest must be one,
# whole, and of the generation given.
expect_refused fscache-manifest fscache-peers="$TMP/peers" \
  fscache-peer-self=nbd://x
expect_refused fscache-manifest fscache-manifest="$TMP/none"
expect_refused fscache-manifest fscache-manifest="$TMP/peers"
nbdkit -U - memory 1M --run "$TOOL manifest --generation a -o $TMP/m-a \"\$uri\"" ||
  fail "nbd-fscache manifest of a 1 MiB memory disk"
expect_refused fscache-manifest fscache-manifest="$TMP/m-a" \
  fscache-generation=b
cp "$TMP/m-a" "$TMP/m-cut"
truncate -s -1 "$TMP/m-cut"
expect_refused fscache-manifest fscache-manifest="$TMP/m-cut"
cp "$TMP/m-a" "$TMP/m-edit"
printf 'X' | dd of="$TMP/m-edit" bs=1 seek=600 conv=notrunc 2>/dev/null
expect_refused fscache-manifest fscache-manifest="$TMP/m-edit"
# Writeback cannot follow the client's export name (the nbd plugin's
# dynamic-export: its writer would have no client's connection to take
# the name from, plugin/ownctx.c): the export is written through, said
# once as a note (not an error), and a client's write reaches the
# upstream at once (issue 40; it used to refuse to start).
head -c 1048576 /dev/zero > "$TMP/dyn-img"
start_nbdkit -P "$TMP/dyn-up.pid" -U "$TMP/dyn-up.sock" file "$TMP/dyn-img"
cat > "$TMP/dyn-write.py" <<'EOF'
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"dyn!" * 1024, 8192)
h.shutdown()
EOF
rc=0
timeout 60 nbdkit -U - --filter="$FILTER" nbd socket="$TMP/dyn-up.sock" \
  dynamic-export=true fscache-mode=writeback fscache-dir="$TMP/cache-dyn" \
  --run "$PYTHON $TMP/dyn-write.py \"\$uri\"" >/dev/null 2>"$TMP/err-dyn" || rc=$?
[ "$rc" -eq 0 ] || fail "writeback with dynamic-export=true: exit $rc"
grep -q 'fscache: note: .*dynamic-export=true.*writes through' "$TMP/err-dyn" ||
  fail "writeback with dynamic-export=true: no note saying why it writes through"
! grep -q 'error' "$TMP/err-dyn" ||
  fail "writeback with dynamic-export=true: an error line"
$PYTHON -c 'import sys; sys.stdout.buffer.write(b"dyn!" * 1024)' > "$TMP/dyn-want"
cmp -s <(dd if="$TMP/dyn-img" bs=4096 skip=2 count=1 2>/dev/null) "$TMP/dyn-want" ||
  fail "writeback with dynamic-export=true: the write is not in the upstream"

# An empty fscache-dir.
run_nbdkit "$TMP/err-empty" fscache-dir=
[ "$rc" -ne 0 ] || fail "fscache-dir= (empty): nbdkit started"
grep -q fscache-dir "$TMP/err-empty" ||
  fail "fscache-dir= (empty): stderr does not name fscache-dir"

# A cache directory that cannot be created: its parent is a file.
echo not a directory > "$TMP/regular"
run_nbdkit "$TMP/err-notdir" fscache-dir="$TMP/regular/cache"
[ "$rc" -ne 0 ] || fail "fscache-dir under a regular file: nbdkit started"
grep -q fscache-dir "$TMP/err-notdir" ||
  fail "fscache-dir under a regular file: stderr does not name fscache-dir"
[ "$(cat "$TMP/regular")" = "not a directory" ] ||
  fail "fscache-dir under a regular file: the file was changed"

# A world-writable existing cache directory: refused, untouched.
mkdir "$TMP/ww"
chmod 0777 "$TMP/ww"
run_nbdkit "$TMP/err-ww" fscache-dir="$TMP/ww"
[ "$rc" -ne 0 ] || fail "world-writable fscache-dir: nbdkit started"
grep -q fscache-dir "$TMP/err-ww" ||
  fail "world-writable fscache-dir: stderr does not name fscache-dir"
grep -qi -e "writable" -e "permission" "$TMP/err-ww" ||
  fail "world-writable fscache-dir: the message does not say why:" \
       "$(cat "$TMP/err-ww")"
[ -z "$(ls -A "$TMP/ww")" ] ||
  fail "world-writable fscache-dir: files were created in it:" \
       "$(ls -A "$TMP/ww")"
[ "$(stat -c %a "$TMP/ww")" = 777 ] ||
  fail "world-writable fscache-dir: its mode was changed"

# A good parameter set starts, serves the right size, creates the
# cache directory mode 0700 and writes the stats file at exit.
good="$TMP/good/nested/cache"
rc=0
# shellcheck disable=SC2016   # $uri is for nbdkit --run to expand
timeout 20 nbdkit -U - --filter="$FILTER" memory 1M \
  fscache-dir="$good" fscache-block-size=4K fscache-mode=writearound \
  fscache-validate=size fscache-verify=false fscache-generation=v1 \
  fscache-key=params-test fscache-stats="$TMP/good.stats" \
  --run 'nbdinfo --size "$uri"' >"$TMP/good.out" 2>"$TMP/good.err" || rc=$?
if [ "$rc" -ne 0 ]; then
  fail "good parameters: nbdkit exited $rc:"
  sed 's/^/    /' "$TMP/good.err" >&2
else
  [ "$(cat "$TMP/good.out")" = 1048576 ] ||
    fail "good parameters: nbdinfo --size said '$(cat "$TMP/good.out")'"
  [ -d "$good" ] || fail "good parameters: $good was not created"
  [ "$(stat -c %a "$good" 2>/dev/null)" = 700 ] ||
    fail "good parameters: $good has mode $(stat -c %a "$good"), not 700"
  if ! grep -q '^objects_opened [1-9]' "$TMP/good.stats" 2>/dev/null; then
    fail "good parameters: no stats file with objects_opened >= 1"
  fi
fi

# Every accepted spelling of each parameter starts.
for p in fscache-block-size=4096 fscache-block-size=64K \
         fscache-block-size=1M fscache-block-size=4M \
         fscache-mode=writethrough fscache-mode=writearound \
         fscache-validate=sample fscache-validate=size fscache-validate=none \
         fscache-verify=true fscache-verify=false fscache-verify=on \
         fscache-verify=0 fscache-readahead=0 fscache-readahead=8M \
         fscache-max-size=0 fscache-max-size=8M fscache-max-size=2G \
         fscache-min-free=0% fscache-min-free=5% fscache-min-free=5 \
         fscache-min-free-inodes=10% fscache-offline=true; do
  run_nbdkit "$TMP/err-ok" fscache-dir="$TMP/ok-cache" "$p"
  if [ "$rc" -ne 0 ]; then
    fail "$p: refused (exit $rc): $(cat "$TMP/err-ok")"
  fi
done

if [ "$failures" -ne 0 ]; then
  echo "$0: $failures failure(s)" >&2
  exit 1
fi
echo "$0: OK"
