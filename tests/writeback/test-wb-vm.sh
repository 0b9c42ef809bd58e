#!/usr/bin/env bash
# nbd-fscache: fscache-mode=writeback under a real Linux kernel's nbd
# client (a qemu TCG guest, as tests/filter/test-fscache-vm.sh), killed hard
# right after the guest's sync returned, with the dirty data still in
# the write log.
#
#   guest nbd0 -> TCP 10.0.2.100:10809 -> qemu user net (restrict=on,
#   guestfwd) -> socat -> $TMP/px.sock: nbdkit --filter=fscache nbd
#   fscache-mode=writeback -> $TMP/up.sock: nbdkit --filter=log
#   --filter=error --filter=blocksize --filter=rate file
#   $TMP/upstream.img
#
# The upstream is slow: the rate filter holds it to 2 Mbit/s (each
# way), so the writer lags the guest and what the guest wrote stays
# dirty in the write log.  The rate is read from a file (rate-file=)
# and the blocksize filter cuts requests into 32 KiB pieces, so that a
# new rate takes effect within a piece.  While $TMP/stall exists the
# error filter fails the upstream's writes, zeroes and trims (EIO):
# the writer retries and drains nothing.
#
# Boot 1 (fscache_vm=wbfs, tests/vm/init): mke2fs an ext2 on the 64 MiB
# device, mount it, copy ~4 MiB of files (summed in tmpfs first), sync,
# each step timed in the guest; the guest says "synced" on its console
# and waits, still attached, the filesystem still mounted.  The host,
# reading the console as qemu writes it, kills the proxy with SIGKILL
# as soon as that line appears; the guest sees its TCP connection close
# and powers off without touching the filesystem again.
# The proxy is restarted on the same cache directory (writeback), the
# upstream's writes failing and its rate raised to 10 Gbit/s: nothing
# drains during boot 2, and the restarted proxy must say it found dirty
# data (else the kill tested nothing).
# Boot 2 (fscache_vm=wbcheck): e2fsck -fn of the device (must pass),
# a read-only mount, the sha256 of every file on it: what the guest
# wrote after the upstream's last flush comes from the recovered log.
# (e2fsck's summary line shows the superblock's counts of mkfs time:
# the ext4 driver, which mounts the ext2, does not rewrite them at
# sync, and e2fsck, which recounts, does not hold that against it.)
# The dirty data must still be there after boot 2.  Then the upstream's
# writes work again and the proxy is stopped with SIGTERM: it drains
# (fscache-writeback-drain=120; nothing may be left), and the upstream
# image alone is checked on the host.
#
# Truth, independent of the filter:
#   - the sums the guest computed in tmpfs in boot 1, before the bytes
#     touched the device: boot 2's listing of the files on the device
#     must equal them (same files, same sums);
#   - e2fsck -fn in the guest (boot 2, through the restarted proxy's
#     log overlay) and on the host (the upstream image after the
#     drain);
#   - the files extracted from the upstream image by debugfs on the
#     host match boot 1's sums.
#
# Then the journal part (boots 4 and 5, described where it runs): an
# ext4 made through a writeback proxy, journal commits (fsync: a flush,
# then the commit block with FUA), kill -9 and the cache deleted while
# the writer lags; the upstream's journal replayed on a copy, e2fsck
# -fn must pass (rule 6, flush and FUA order, atop core/wlog/writeback.c).
#
# Times: the guest's mkfs, file writes and sync, and the same boot-1
# workload against a writethrough proxy on the same slow upstream (a
# fresh copy of the same initial image), are printed for comparison,
# never asserted.  WB_VM_WRITETHROUGH=0 skips the writethrough run.
#
# Skips (77) only where tests/filter/test-fscache-vm.sh does (no
# qemu-system-x86_64, no bootable kernel with its nbd module); anything
# else missing is a FAIL.  FSCACHE_VM_TIMEOUT (default 240 s) bounds
# each boot.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires qemu-system-x86_64 --version

# The newest /boot/vmlinuz-* with a matching /lib/modules holding nbd.
kernel="" kver=""
for k in $(printf '%s\n' /boot/vmlinuz-* | sort -V -r); do
  v="${k#/boot/vmlinuz-}"
  if [ -r "$k" ] && [ -d "/lib/modules/$v" ] &&
     [ -n "$(find "/lib/modules/$v" -name 'nbd.ko*' -print -quit)" ]; then
    kernel="$k" kver="$v"
    break
  fi
done
kernel_with_nbd_module_in_boot () { [ -n "$kernel" ]; }
requires kernel_with_nbd_module_in_boot

for t in nbdkit nbdinfo socat cpio gzip debugfs e2fsck modinfo sha256sum timeout; do
  command -v "$t" >/dev/null ||
    fail "needs $t (packages: nbdkit libnbd-bin socat cpio e2fsprogs kmod coreutils)"
done
for f in log error blocksize rate; do
  command nbdkit --filter=$f null --dump-plugin >/dev/null 2>&1 ||
    fail "nbdkit has no $f filter"
done
command nbdkit nbd --dump-plugin >/dev/null 2>&1 || fail "nbdkit has no nbd plugin"
command nbdkit --filter="$FILTER" null --dump-plugin >/dev/null 2>&1 ||
  fail "cannot load the filter $FILTER"

vmdir="$top_srcdir/tests/vm"
timeout_s="${FSCACHE_VM_TIMEOUT:-240}"
compare="${WB_VM_WRITETHROUGH:-1}"
guest_addr=10.0.2.100           # inside slirp's 10.0.2.0/24 only
t_start=$(date +%s.%N)

TMPDIR="$TMP" bash "$vmdir/mkinitramfs.sh" "$kver" "$vmdir/init" "$TMP/initramfs.gz" ||
  fail "building the initramfs"
echo "kernel: $kernel; initramfs: $(stat -c %s "$TMP/initramfs.gz") bytes"

# The proxies' messages are wanted: while NBDKIT_STDERR names a file,
# nbdkit runs in the foreground (-f) as a background job, stderr there.
NBDKIT_STDERR=
nbdkit ()
{
  if [ -n "$NBDKIT_STDERR" ]; then
    command nbdkit -f "$@" 2>"$NBDKIT_STDERR" &
    disown $!                   # no "Killed" notices from kill -9
  else
    command nbdkit "$@"
  fi
}

size=$((64 * 1024 * 1024))
make_random "$TMP/upstream.img" "$size"
[ "$compare" = 0 ] || cp "$TMP/upstream.img" "$TMP/upstream-wt.img"

# set_rate BITS: the upstream's rate from now on (rate-file=).
set_rate ()
{
  echo "$1" > "$TMP/rate.new"
  mv "$TMP/rate.new" "$TMP/rate"
}
# start_upstream IMAGE: while $TMP/stall exists, its writes, zeroes
# and trims fail (EIO).
start_upstream ()
{
  start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
    --filter=log --filter=error --filter=blocksize --filter=rate \
    file "$1" logfile="$TMP/up.log" logappend=true \
    error-pwrite=EIO error-pwrite-rate=1 error-pwrite-file="$TMP/stall" \
    error-zero=EIO error-zero-rate=1 error-zero-file="$TMP/stall" \
    error-trim=EIO error-trim-rate=1 error-trim-file="$TMP/stall" \
    maxdata=32K rate=2M rate-file="$TMP/rate"
}
up_count () { grep -c " $1 " "$TMP/up.log" || true; }
# The upstream has finished every request of the connections it had
# (or has exited: nothing more will reach the file).
up_idle ()
{
  [ "$(up_count Connect)" -eq "$(up_count Disconnect)" ] ||
    ! kill -0 "$(cat "$TMP/up.pid")" 2>/dev/null
}
# up_written: bytes written to the upstream so far (its log).
up_written ()
{
  awk 'function hex(s,   i, v) {
         v = 0; s = tolower (substr (s, 3))
         for (i = 1; i <= length (s); i++)
           v = v * 16 + index ("0123456789abcdef", substr (s, i, 1)) - 1
         return v
       }
       / Write id=/ && !/\.\.\.Write/ {
         for (i = 1; i <= NF; i++)
           if ($i ~ /^count=/) { sub ("count=", "", $i); s += hex($i) }
       } END { printf "%d\n", s }' "$TMP/up.log"
}
# start_proxy MODE CACHEDIR STDERR-FILE
start_proxy ()
{
  local extra=()
  [ "$1" = writeback ] && extra=(fscache-writeback-drain=120)
  NBDKIT_STDERR="$3" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
    --filter="$FILTER" nbd socket="$TMP/up.sock" \
    fscache-dir="$2" fscache-key=wbvm fscache-mode="$1" "${extra[@]}" ||
    { cat "$3" >&2; fail "the $1 proxy did not start"; }
}

# boot_start N MODE: start the VM in the background ($qpid); its console
# in $TMP/console-N.log.raw as the guest writes it.  socat logs to a
# file (-lf): slirp gives the command the connection as stdin, stdout
# and stderr, and socat's complaint when the proxy dies would reach
# the guest's nbd socket ("Wrong magic").
boot_start ()
{
  local n="$1" mode="$2"
  boot_t0=$(date +%s.%N)
  timeout --kill-after=10 "$timeout_s" \
    qemu-system-x86_64 -accel tcg -m 256M -smp 1 \
      -nodefaults -no-user-config -display none -no-reboot \
      -serial "file:$TMP/console-$n.log.raw" \
      -kernel "$kernel" -initrd "$TMP/initramfs.gz" \
      -append "console=ttyS0 panic=-1 quiet fscache_vm=$mode fscache_vm_server=$guest_addr" \
      -netdev "user,id=n0,restrict=on,guestfwd=tcp:$guest_addr:10809-cmd:socat -lf $TMP/socat-$n.log - UNIX-CONNECT:$TMP/px.sock" \
      -device e1000,netdev=n0,romfile= \
      </dev/null > "$TMP/qemu-$n.out" 2>&1 &
  qpid=$!
  cleanup_fn "kill $qpid 2>/dev/null"
}
# console_says N WORD: the guest printed "FSCACHE-VM: WORD" (or FAIL).
console_says ()
{
  grep -aq -e "^FSCACHE-VM: $2" -e '^FSCACHE-VM: FAIL' "$TMP/console-$1.log.raw" 2>/dev/null
}
# wait_console N WORD: until the guest says WORD, fails, or its VM ends
# (polls every 20 ms; the VM's own timeout bounds it).
wait_console ()
{
  while ! console_says "$1" "$2"; do
    kill -0 "$qpid" 2>/dev/null || break
    sleep 0.02
  done
  grep -aq "^FSCACHE-VM: $2" "$TMP/console-$1.log.raw" 2>/dev/null
}
# boot_wait N MODE: wait for the VM to end, check it succeeded.
boot_wait ()
{
  local n="$1" mode="$2" log="$TMP/console-$1.log" rc=0
  wait "$qpid" || rc=$?
  boot_time=$(seconds_since "$boot_t0" 1)
  tr -d '\r' < "$log.raw" > "$log"
  if [ "$rc" -ne 0 ]; then
    cat "$TMP/qemu-$n.out" "$log" "$TMP"/px-*.err >&2
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      fail "boot $n ($mode): the VM did not finish within ${timeout_s}s"
    fi
    fail "boot $n ($mode): qemu exited with status $rc"
  fi
  if grep -q '^FSCACHE-VM: FAIL' "$log" || ! grep -q '^FSCACHE-VM: DONE' "$log"; then
    cat "$TMP/qemu-$n.out" "$log" "$TMP"/px-*.err >&2
    fail "boot $n ($mode): the guest failed (console above)"
  fi
  echo "boot $n ($mode): ${boot_time}s"
  grep '^FSCACHE-VM: ' "$log" | grep -v '^FSCACHE-VM: file ' | sed 's/^/  /'
}
# sums N: the "file SUM NAME" lines of boot N, as sha256sum -c reads them.
sums ()
{
  awk '$1 == "FSCACHE-VM:" && $2 == "file" { print $3 "  " $4 }' \
    "$TMP/console-$1.log"
}
# timing N: boot N's "timing ..." line, without the marker.
timing ()
{
  sed -n 's/^FSCACHE-VM: timing //p' "$TMP/console-$1.log"
}
# check_image IMAGE SUMS TAG WHAT: e2fsck -fn of IMAGE, and the files
# debugfs extracts from it against SUMS (TAG, one word, names the
# files in $TMP; WHAT the messages).
check_image ()
{
  local img="$1" sums="$2" tag="$3" what="$4" rc=0 n
  e2fsck -fn "$img" > "$TMP/e2fsck-$tag.out" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$TMP/e2fsck-$tag.out" >&2
                     fail "$what: e2fsck -fn found errors (status $rc)"; }
  mkdir "$TMP/extract-$tag"
  debugfs -R "rdump / $TMP/extract-$tag" "$img" > "$TMP/debugfs-$tag.out" 2>&1 ||
    { cat "$TMP/debugfs-$tag.out" >&2; fail "$what: debugfs could not read $img"; }
  (cd "$TMP/extract-$tag" && sha256sum --quiet -c "$sums") ||
    fail "$what: the files (debugfs) differ from what the guest wrote"
  n=$(wc -l < "$sums")
  echo "$what: e2fsck -fn passes ($(tail -n 1 "$TMP/e2fsck-$tag.out" | sed 's/^[^:]*: //'));" \
       "all $n files match (debugfs)"
}

# ---- writeback, boot 1: mkfs, files, sync; kill -9 once synced ---------
set_rate 2M
start_upstream "$TMP/upstream.img"
start_proxy writeback "$TMP/cache" "$TMP/px-1.err"
boot_start 1 wbfs
wait_console 1 synced || {
  boot_wait 1 wbfs
  fail "boot 1: the guest never said synced"
}
kill9_nbdkit "$TMP/px.pid"
t_synced=$(seconds_since "$boot_t0" 1)
boot_wait 1 wbfs
echo "boot 1: proxy killed (SIGKILL) ${t_synced}s after the VM started, on \"synced\""
sums 1 > "$TMP/SUMS"
nfiles=$(wc -l < "$TMP/SUMS")
[ "$nfiles" -ge 60 ] || fail "boot 1: only $nfiles file sums on the console"
grep -q '^FSCACHE-VM: disconnected' "$TMP/console-1.log" ||
  fail "boot 1: the guest did not see its connection close"
wb_timing=$(timing 1)

# nbdkit 1.32 serving the upstream has been seen to exit a few
# milliseconds after its client vanished mid-request (see
# test-fscache-write-crash.sh); the data is in the file: once it has
# finished or exited, check that it still answers, else start it
# again, and say so.
wait_until up_idle || fail "the upstream did not go idle after the kill"
if ! kill -0 "$(cat "$TMP/up.pid")" 2>/dev/null ||
   ! nbdinfo --size "nbd+unix:///?socket=$TMP/up.sock" >/dev/null 2>&1; then
  echo "  note: the upstream nbdkit exited with the proxy; restarted"
  kill -9 "$(cat "$TMP/up.pid")" 2>/dev/null || true
  : > "$TMP/up.log"
  start_upstream "$TMP/upstream.img"
fi
rc=0; e2fsck -fn "$TMP/upstream.img" > "$TMP/e2fsck-at-kill.out" 2>&1 || rc=$?
echo "upstream at the kill: $(up_written) bytes written to it," \
     "$(log_count "$TMP/up.log" Flush) flushes; e2fsck -fn of it alone: status $rc"

# ---- writeback, boot 2: restarted proxy, same cache: fsck, files --------
# The upstream's writes fail for the whole boot (the writer retries,
# nothing drains): what the guest reads of its boot-1 writes comes from
# the recovered write log.  Its reads are not held back (the cache was
# discarded at the kill: the rest comes from the upstream).
touch "$TMP/stall"
set_rate 10G
start_proxy writeback "$TMP/cache" "$TMP/px-2.err"
boot_start 2 wbcheck
boot_wait 2 wbcheck
found=$(grep -o "[0-9]* bytes of dirty data in [0-9]* epochs found" \
          "$TMP/px-2.err") || {
  cat "$TMP/px-1.err" "$TMP/px-2.err" >&2
  fail "the restarted proxy found no dirty data: the kill left nothing to recover"
}
echo "restarted proxy: $found"
grep -q '^FSCACHE-VM: fsck clean' "$TMP/console-2.log" ||
  fail "boot 2: no fsck result"
sums 2 > "$TMP/SUMS-2"
diff "$TMP/SUMS" "$TMP/SUMS-2" ||
  fail "boot 2: the files on the device (above: < boot 1's sums, > boot 2's)" \
       "differ from what the guest wrote"
echo "boot 2: all $nfiles files on the device match boot 1's sums"
dirty=$(tool --dir "$TMP/cache" ls --json |
        sed -n 's/.*"dirty_bytes": \([0-9]*\).*/\1/p')
echo "dirty after boot 2 (upstream writes failing): ${dirty:-none} bytes"
[ "${dirty:-0}" -gt 0 ] ||
  fail "boot 2: no dirty data left while the upstream's writes failed"

# ---- drain (SIGTERM), then the upstream alone --------------------------
rm "$TMP/stall"
t0=$(date +%s.%N)
stop_nbdkit "$TMP/px.pid"
echo "drain at SIGTERM: $(seconds_since "$t0")s"
if grep "left in the cache" "$TMP/px-2.err"; then
  fail "the clean stop did not drain"
fi
wait_until up_idle || fail "the upstream did not go idle after the drain"
check_image "$TMP/upstream.img" "$TMP/SUMS" wb "upstream.img after the drain"
dirty=$(tool --dir "$TMP/cache" ls --json |
        sed -n 's/.*"dirty_bytes": \([0-9]*\).*/\1/p')
[ "${dirty:-0}" -eq 0 ] || fail "$dirty bytes still dirty after the drain"
# Expected messages: the dirty data found, the crashed index discarded,
# and the writer's failed writes of boot 2.
grep -i "error" "$TMP/px-1.err" "$TMP/px-2.err" |
  grep -v "found in the cache; writing them back" |
  grep -v "discarding cached data (unclean-after-writes), starting cold" |
  sed 's/^/  proxy: /' | sort | uniq -c | head -20
stop_nbdkit "$TMP/up.pid"

# ---- journal: ext4 commits, then kill -9 and the cache lost ------------
# Boot 4 (wbmkfs) makes an ext4 through a writeback proxy on a fast
# upstream; SIGTERM drains it.  Boot 5 (wbjournal) commits journal
# transactions (fsync: a flush, then the commit block with FUA; the
# small journal wraps, so the kernel also checkpoints in place) through
# a writeback proxy whose upstream runs at 256 kbit/s (the workload
# writes about 110 KB/s under TCG), so the writer lags; once the guest says "committed", the proxy is killed (SIGKILL)
# with dirty data in its log, and its cache directory deleted.  The
# upstream is then what a power cut of the guest could leave (rule 6,
# atop core/wlog/writeback.c: flush and FUA order): the journal replayed as
# a mount would (e2fsck -E journal_only on a copy), e2fsck -fn must
# find nothing wrong.  A log filter in front of the proxy shows that
# the kernel did send FUA writes and flushes.
truncate -s "$size" "$TMP/journal.img"
: > "$TMP/up.log"
rm -f "$TMP/stall"
set_rate 10G
start_upstream "$TMP/journal.img"
start_proxy writeback "$TMP/cache-j" "$TMP/px-j4.err"
boot_start 4 wbmkfs
boot_wait 4 wbmkfs
stop_nbdkit "$TMP/px.pid"
if grep "left in the cache" "$TMP/px-j4.err"; then
  fail "boot 4: the clean stop did not drain"
fi
wait_until up_idle || fail "the upstream did not go idle after boot 4"
rc=0; e2fsck -fn "$TMP/journal.img" > "$TMP/e2fsck-mkfs.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$TMP/e2fsck-mkfs.out" >&2
                   fail "the ext4 made through the proxy: e2fsck -fn status $rc"; }
set_rate 256K
NBDKIT_STDERR="$TMP/px-j5.err" start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter=log --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache-j" fscache-key=wbvm fscache-mode=writeback \
  logfile="$TMP/px-j5.log" ||
  { cat "$TMP/px-j5.err" >&2; fail "the journal proxy did not start"; }
boot_start 5 wbjournal
wait_console 5 committed || {
  boot_wait 5 wbjournal
  fail "boot 5: the guest never said committed"
}
dirty=$(tool --dir "$TMP/cache-j" ls --json |
        sed -n 's/.*"dirty_bytes": \([0-9]*\).*/\1/p')
kill9_nbdkit "$TMP/px.pid"
rm -rf "$TMP/cache-j"
boot_wait 5 wbjournal
[ "${dirty:-0}" -gt 0 ] ||
  fail "boot 5: nothing dirty at the kill: the writeback was not behind"
nfua=$(grep -c ' Write id=.* fua=1' "$TMP/px-j5.log" || true)
nflush=$(log_count "$TMP/px-j5.log" Flush)
[ "$nfua" -gt 0 ] || fail "boot 5: the kernel sent no FUA write"
[ "$nflush" -gt 0 ] || fail "boot 5: the kernel sent no flush"
wait_until up_idle || fail "the upstream did not go idle after the kill"
echo "journal: $nfua FUA writes and $nflush flushes from the guest;" \
     "killed with $dirty bytes dirty, cache deleted; upstream: $(up_written)" \
     "bytes written to it since boot 4"
rc=0; e2fsck -fn "$TMP/journal.img" > "$TMP/e2fsck-j-raw.out" 2>&1 || rc=$?
echo "  e2fsck -fn before the journal replay: status $rc (not judged)"
cp "$TMP/journal.img" "$TMP/journal-check.img"
rc=0
e2fsck -E journal_only -y "$TMP/journal-check.img" > "$TMP/e2fsck-j-replay.out" 2>&1 ||
  rc=$?
[ $rc -le 1 ] || { cat "$TMP/e2fsck-j-replay.out" >&2
                   fail "replaying the upstream's journal: e2fsck status $rc"; }
rc=0
e2fsck -fn "$TMP/journal-check.img" > "$TMP/e2fsck-j.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$TMP/e2fsck-j.out" >&2
                   fail "the upstream after the cache loss: e2fsck -fn found errors (status $rc)"; }
nfiles_up=$(debugfs -R "ls /d" "$TMP/journal-check.img" 2>/dev/null |
            grep -o ' f[0-9]*' | wc -l)
echo "  after the replay: e2fsck -fn passes" \
     "($(tail -n 1 "$TMP/e2fsck-j.out" | sed 's/^[^:]*: //'));" \
     "$nfiles_up of the guest's 120 files on the upstream"
stop_nbdkit "$TMP/up.pid"

# ---- writethrough: the same boot-1 workload, for the times -------------
if [ "$compare" != 0 ]; then
  set_rate 2M
  : > "$TMP/up.log"
  start_upstream "$TMP/upstream-wt.img"
  start_proxy writethrough "$TMP/cache-wt" "$TMP/px-wt.err"
  boot_start 3 wbfs
  wait_console 3 synced || {
    boot_wait 3 wbfs
    fail "boot 3 (writethrough): the guest never said synced"
  }
  # As in boot 1 (nbdkit would not stop on SIGTERM while the guest is
  # connected).
  kill9_nbdkit "$TMP/px.pid"
  boot_wait 3 wbfs
  sums 3 > "$TMP/SUMS-wt"
  wait_until up_idle || fail "the upstream did not go idle (writethrough)"
  check_image "$TMP/upstream-wt.img" "$TMP/SUMS-wt" wt "upstream-wt.img (writethrough)"
  stop_nbdkit "$TMP/up.pid"
  wt_timing=$(timing 3)
fi

echo "guest times (s), upstream at 2 Mbit/s:"
echo "  writeback:    $wb_timing"
[ "$compare" = 0 ] || echo "  writethrough: $wt_timing"
echo "$0: OK ($(seconds_since "$t_start" 0) s)"
