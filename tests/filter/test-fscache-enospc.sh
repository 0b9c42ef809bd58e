#!/usr/bin/env bash
# nbd-fscache: a cache directory far smaller than the export.
#
# The cache lives on a 16 MiB tmpfs, the upstream image is 200 MiB.
# Sequential (nbdcopy) and random (fio, verifying the crc32c headers
# it wrote into the upstream image) reads through the proxy must see
# no error and the upstream's exact bytes while the cache runs out of
# space: ENOSPC only pauses fills (nofill_events, fill_errors), it
# never withdraws the object or reaches the client; a second export
# opened on the full disk is served too (uncached).  A restart then
# reuses what did fit.

source "${top_srcdir:-.}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires fio --version
requires cmp --version
requires mount --version
requires nbdkit --filter=log null --dump-plugin
requires test -r "$FILTER"
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: SKIP: mounting a tmpfs needs root"
  exit 77
fi

SIZE=$((200 * 1024 * 1024))
CACHE_FS=$((16 * 1024 * 1024))

up="$TMP/up.img"
mnt="$TMP/mnt"
cache="$mnt/cache"
sock="$TMP/sock"
pid="$TMP/nbdkit.pid"
uri="nbd+unix:///?socket=$sock"

mount_tmpfs "$mnt" 16m

fio --name=mkimage --filename="$up" --size=$SIZE --bs=4k --rw=write \
    --verify=crc32c --do_verify=0 --ioengine=psync \
    --verify_state_save=0 >/dev/null

run=""
start_proxy ()           # NAME
{
  run="$1"
  # -v keeps nbdkit's stderr (warnings) once it is in the background.
  start_nbdkit -P "$pid" -U "$sock" -v --log=stderr \
    --filter="$FILTER" --filter=log \
    file "$up" fscache-dir="$cache" fscache-key=enospc \
    logfile="$TMP/$run.log" fscache-stats="$TMP/$run.stats" \
    2>"$TMP/$run.err"
}

expect_stat ()           # NAME OP VALUE (for the last run)
{
  local v
  v="$(stat_value "$TMP/$run.stats" "$1")"
  if ! test "$v" "$2" "$3"; then
    cat "$TMP/$run.stats" >&2
    grep ' error: ' "$TMP/$run.err" | tail -20 >&2
    fail "$run: $1 = $v, expected $2 $3"
  fi
}

seq_read ()              # [EXPORT-NAME]
{
  rm -f "$TMP/out.img"
  nbdcopy "nbd+unix:///${1:-}?socket=$sock" "$TMP/out.img" ||
    fail "$run: nbdcopy: client error"
  cmp "$TMP/out.img" "$up" || fail "$run: sequential read differs"
  rm -f "$TMP/out.img"
}

rand_read ()
{
  ( cd "$TMP" &&
    fio --name=rand --ioengine=nbd --uri="$uri" --size=$SIZE \
      --bsrange=4k-256k --verify_interval=4k --verify=crc32c \
      --rw=randread --iodepth=8 --numjobs=2 --io_size=64M \
      --verify_state_save=0 ) > "$TMP/$run.fio" 2>&1 ||
    { tail -20 "$TMP/$run.fio" >&2; fail "$run: fio: client or verify error"; }
  if grep -Eqi 'verify failed|bad header|bad magic|err=[^ ]*[1-9]' \
       "$TMP/$run.fio"; then
    grep -Ei 'verify|bad|err=' "$TMP/$run.fio" | head >&2
    fail "$run: fio reported errors"
  fi
}

# ---- fill more than fits: sequential, random, sequential ------------
start_proxy fill
seq_read
rand_read
seq_read
# Another export (another object) once the disk is full.
seq_read other
stop_nbdkit "$pid"

expect_stat nofill_events -gt 0
expect_stat fill_errors -gt 0
expect_stat withdrawals -eq 0
expect_stat read_errors -eq 0
expect_stat verify_failures -eq 0
expect_stat commit_errors -eq 0
expect_stat fill_bytes -le $CACHE_FS
grep -q 'cache directory full' "$TMP/$run.err" ||
  { grep ' error: ' "$TMP/$run.err" | tail >&2;
    fail "$run: no 'cache directory full' warning"; }
notices="$(grep -c 'cache directory full' "$TMP/$run.err" || true)"
[ "$notices" -le "$(stat_value "$TMP/$run.stats" nofill_events)" ] ||
  fail "$run: $notices warnings for fewer pauses"
cached="$(du -k "$cache" | tail -1 | cut -f1)"
echo "filled: $(stat_value "$TMP/$run.stats" fill_bytes) bytes," \
     "$(stat_value "$TMP/$run.stats" nofill_events) pauses," \
     "${cached}K used of the 16M tmpfs"

# ---- restart on the full disk: what fit is reused -------------------
start_proxy reuse
seq_read
rand_read
seq_read other
stop_nbdkit "$pid"

expect_stat objects_reused -ge 1
expect_stat objects_discarded -eq 0
expect_stat withdrawals -eq 0
expect_stat verify_failures -eq 0
expect_stat read_errors -eq 0
expect_stat hit_bytes -gt 0
expect_stat commit_errors -eq 0

echo "$0: PASS"
