#!/usr/bin/env bash
# nbd-fscache: a real Linux kernel's nbd driver (nbd-client) on the
# filter, in a qemu TCG virtual machine.
#
# The other tests drive the filter with libnbd tools on the host.  The
# kernel's nbd client asks differently: a partition scan at attach,
# page-cache readahead, a filesystem's 1 KiB metadata writes, flushes
# and mke2fs's discards, all on one connection, with the kernel's own
# timeouts.  The host has no nbd module, so a guest kernel (the
# distribution's, booted with a tiny busybox initramfs from
# tests/vm/mkinitramfs.sh and tests/vm/init) does it:
#
#   guest nbd0 -> TCP 10.0.2.100:10809 -> qemu user net (restrict=on,
#   guestfwd) -> socat -> $TMP/px.sock: nbdkit --filter=fscache nbd
#   -> $TMP/up.sock: nbdkit --filter=log file $TMP/upstream.img
#
# Nothing leaves the VM except to the proxy's Unix socket.  The NIC has
# no option ROM (romfile=): the kernel is booted directly, no PXE.
#
# Boot 1 (fscache_vm=fs): the guest reads the whole device (sha256),
# makes an ext2 on it, writes files, remounts and checks them, reads the
# whole device again (sha256) and detaches.
# Boot 2, after restarting the proxy on the same cache directory
# (fscache_vm=read): the whole device again (sha256), then the files
# through a read-only mount.  Both proxies use fscache-validate=size.
#
# Truth, independent of the filter and of the guest's view:
#   - sha256sum of $TMP/upstream.img on the host: before boot 1 it
#     equals the guest's first device sum; after boot 1 the guest's
#     final device sum (what the guest wrote reached the upstream,
#     byte for byte); after boot 2 it is unchanged and equals boot 2's
#     device sum;
#   - the files, extracted from $TMP/upstream.img on the host with
#     debugfs (e2fsprogs), match the sums the guest computed in tmpfs
#     before writing them;
#   - the upstream's log (nbdkit --filter=log): 0 bytes read during
#     boot 2, everything came from the persistent cache.
#
# Skips (77) only if qemu-system-x86_64 or a bootable kernel with its
# modules is missing; anything else missing is a FAIL.
# FSCACHE_VM_TIMEOUT (default 240 s) bounds each boot.

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

for t in nbdkit socat cpio gzip debugfs modinfo sha256sum timeout; do
  command -v "$t" >/dev/null ||
    fail "needs $t (packages: nbdkit socat cpio e2fsprogs kmod coreutils)"
done
nbdkit --filter=log null --dump-plugin >/dev/null 2>&1 ||
  fail "nbdkit has no log filter"
nbdkit nbd --dump-plugin >/dev/null 2>&1 || fail "nbdkit has no nbd plugin"
nbdkit --filter="$FILTER" null --dump-plugin >/dev/null 2>&1 ||
  fail "cannot load the filter $FILTER"

vmdir="$top_srcdir/tests/vm"
timeout_s="${FSCACHE_VM_TIMEOUT:-240}"
guest_addr=10.0.2.100           # inside slirp's 10.0.2.0/24 only

TMPDIR="$TMP" bash "$vmdir/mkinitramfs.sh" "$kver" "$vmdir/init" "$TMP/initramfs.gz" ||
  fail "building the initramfs"
echo "kernel: $kernel; initramfs: $(stat -c %s "$TMP/initramfs.gz") bytes"

size=$((32 * 1024 * 1024))
make_random "$TMP/upstream.img" "$size"
sha_up () { sha256sum "$TMP/upstream.img" | cut -d' ' -f1; }
sha0=$(sha_up)

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/upstream.img" logfile="$TMP/up.log"
up_bytes () { log_read_bytes "$TMP/up.log"; }

# boot N MODE: run the VM once, to completion; its console in
# $TMP/console-N.log (carriage returns removed), its time in $boot_time.
boot ()
{
  local n="$1" mode="$2" log="$TMP/console-$1.log" t0 rc=0
  local extra="${3:-}"
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$timeout_s" \
    qemu-system-x86_64 -accel tcg -m 256M -smp 1 \
      -nodefaults -no-user-config -display none -no-reboot \
      -serial "file:$log.raw" \
      -kernel "$kernel" -initrd "$TMP/initramfs.gz" \
      -append "console=ttyS0 panic=-1 quiet fscache_vm=$mode fscache_vm_server=$guest_addr $extra" \
      -netdev "user,id=n0,restrict=on,guestfwd=tcp:$guest_addr:10809-cmd:socat - UNIX-CONNECT:$TMP/px.sock" \
      -device e1000,netdev=n0,romfile= \
      </dev/null > "$TMP/qemu-$n.out" 2>&1 || rc=$?
  boot_time=$(seconds_since "$t0" 1)
  tr -d '\r' < "$log.raw" > "$log"
  if [ "$rc" -ne 0 ]; then
    cat "$TMP/qemu-$n.out" "$log" >&2
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      fail "boot $n ($mode): the VM did not finish within ${timeout_s}s"
    fi
    fail "boot $n ($mode): qemu exited with status $rc"
  fi
  if grep -q '^FSCACHE-VM: FAIL' "$log" || ! grep -q '^FSCACHE-VM: DONE' "$log"; then
    cat "$TMP/qemu-$n.out" "$log" >&2
    fail "boot $n ($mode): the guest failed (console above)"
  fi
  echo "boot $n ($mode): ${boot_time}s"
  grep '^FSCACHE-VM: ' "$log" | grep -v '^FSCACHE-VM: file ' | sed 's/^/  /'
}

# marker N NAME: the first word after "FSCACHE-VM: NAME" in boot N's log.
marker ()
{
  awk -v k="$2" '$1 == "FSCACHE-VM:" && $2 == k { print $3; exit }' \
    "$TMP/console-$1.log"
}

# ---- boot 1: read everything, mkfs, files, read everything --------------
# fscache-validate=size in both boots: a change of validate mode
# discards the cache (validate-mode-changed), and "size" makes boot 2's
# expected upstream figure exactly 0 (no sample reads at open).
# mke2fs discards the whole device, which invalidates every cached
# block, so boot 1's final read fetches most of the device again: boot
# 1 reads about twice the export upstream.
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache" fscache-key=vm fscache-validate=size \
  fscache-stats="$TMP/px1.stats"

b0=$(up_bytes)
boot 1 fs
b1=$(up_bytes)
sha1=$(sha_up)
g_init=$(marker 1 sha256-initial)
g_final=$(marker 1 sha256-final)
g_size=$(awk '$2 == "connected" { sub("size=", "", $3); print $3; exit }' \
          "$TMP/console-1.log")

echo "upstream.img sha256 before boot 1: $sha0"
echo "guest boot 1 device sha256 first:  $g_init"
echo "guest boot 1 device sha256 last:   $g_final"
echo "upstream.img sha256 after boot 1:  $sha1"
echo "boot 1: $((b1 - b0)) bytes read upstream (export size $size)"

[ "$g_size" = "$size" ] ||
  fail "boot 1: the guest saw a $g_size byte device, expected $size"
[ "$g_init" = "$sha0" ] ||
  fail "boot 1: the guest read $g_init, the upstream image is $sha0"
grep -q '^FSCACHE-VM: files-verified OK' "$TMP/console-1.log" ||
  fail "boot 1: the guest did not verify its files"
[ "$sha1" != "$sha0" ] ||
  fail "boot 1: the upstream image did not change: the writes were lost"
[ "$g_final" = "$sha1" ] ||
  fail "boot 1: the guest's device ends as $g_final, the upstream image" \
       "as $sha1: the guest and the upstream disagree"

# The files, read from the upstream image by debugfs, not by the filter.
awk '$1 == "FSCACHE-VM:" && $2 == "file" { print $3 "  " $4 }' \
  "$TMP/console-1.log" > "$TMP/SUMS"
nfiles=$(wc -l < "$TMP/SUMS")
[ "$nfiles" -ge 60 ] || fail "boot 1: only $nfiles file sums on the console"
mkdir "$TMP/extract"
debugfs -R "rdump / $TMP/extract" "$TMP/upstream.img" > "$TMP/debugfs.out" 2>&1 ||
  { cat "$TMP/debugfs.out" >&2; fail "debugfs could not read upstream.img"; }
(cd "$TMP/extract" && sha256sum --quiet -c "$TMP/SUMS") ||
  fail "the files in upstream.img (debugfs) differ from what the guest wrote"
echo "upstream.img (debugfs): all $nfiles files match the guest's sums"

stop_nbdkit "$TMP/px.pid"
echo "proxy stats after boot 1: $(tr '\n' ' ' < "$TMP/px1.stats")"

# ---- boot 2: restarted proxy, same cache: everything from the cache -----
# The guest's nbd-client -C 4 connects four times (issue 42: it refused
# -C 4 when the filter did not advertise multi-conn), counted by a log
# filter in front of the proxy; read-only, as a boot that only reads
# would be served.
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" -r --filter=log \
  --filter="$FILTER" nbd socket="$TMP/up.sock" logfile="$TMP/px2.log" \
  fscache-dir="$TMP/cache" fscache-key=vm fscache-validate=size \
  fscache-stats="$TMP/px2.stats"

b2=$(up_bytes)
boot 2 read fscache_vm_conns=4
conns=$(grep -c ' Connect ' "$TMP/px2.log")
echo "boot 2: the guest's nbd-client -C 4 made $conns connections"
[ "$conns" -ge 4 ] || fail "boot 2: nbd-client -C 4 made $conns connections"
b3=$(up_bytes)
sha2=$(sha_up)
g_read=$(marker 2 sha256-initial)
echo "guest boot 2 device sha256:        $g_read"
echo "upstream.img sha256 after boot 2:  $sha2"
echo "boot 2: $((b3 - b2)) bytes read upstream"

[ "$sha2" = "$sha1" ] || fail "boot 2 changed the upstream image"
[ "$g_read" = "$sha1" ] ||
  fail "boot 2: the guest read $g_read, the upstream image is $sha1"
grep -q '^FSCACHE-VM: files-verified OK' "$TMP/console-2.log" ||
  fail "boot 2: the guest did not verify its files"
[ $((b3 - b2)) -eq 0 ] ||
  fail "boot 2: $((b3 - b2)) bytes read upstream, expected 0 (persistent cache)"

stop_nbdkit "$TMP/px.pid"
echo "proxy stats after boot 2: $(tr '\n' ' ' < "$TMP/px2.stats")"

echo "$0: OK"
