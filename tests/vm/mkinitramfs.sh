#!/usr/bin/env bash
# nbd-fscache: build the initramfs of the kernel nbd-client test VMs
# (tests/filter/test-fscache-vm.sh, tests/writeback/test-wb-vm.sh).
#
#   tests/vm/mkinitramfs.sh KVER INIT OUT
#
# writes OUT, a gzipped newc cpio archive, holding:
#   /init                 INIT (a busybox sh script: tests/vm/init)
#   /bin/busybox + links  busybox-static and one symlink per applet
#   /sbin/nbd-client      nbd-client (package nbd-client)
#   /sbin/mke2fs          mke2fs (e2fsprogs): busybox's applet cannot
#                         make the ext2 we want (-t ext2 -q), and may be
#                         missing from a busybox build
#   /sbin/e2fsck          e2fsck (e2fsprogs), for tests/writeback/test-wb-vm.sh's
#                         fsck -n in the guest (busybox has none)
#   their shared libraries and the dynamic loader, at the paths ldd
#   names (so the loader finds them without an ld.so.cache)
#   /lib/modules/*.ko     nbd, e1000, ext4 (which serves ext2) and
#                         crc32c_generic of kernel KVER, with their
#                         dependencies, and
#   /lib/modules/order    the order to insmod them in (dependencies
#                         first, computed with modinfo -F depends: the
#                         guest has no modprobe database)
#
# Why not the distribution's initrd: it is large (slow to unpack under
# TCG), has neither nbd-client nor the test's init, and depends on
# initramfs-tools.  This one is a few MiB and builds in a second or two.
#
# Errors (a missing binary, module or tool) exit non-zero with a
# message: the caller turns them into a FAIL, not a SKIP.

set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 KVER INIT OUT" >&2
  exit 2
fi
kver="$1" init="$2" out="$3"

die () { echo "$0: $*" >&2; exit 1; }

for t in cpio gzip modinfo ldd; do
  command -v "$t" >/dev/null || die "needs $t"
done
[ -d "/lib/modules/$kver" ] || die "no /lib/modules/$kver"
[ -r "$init" ] || die "no init script $init"

root="$(mktemp -d "${TMPDIR:-/tmp}/fscache-initramfs.XXXXXX")"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,mnt,etc,lib/modules,run}

# copy_file SRC [DEST]: SRC (following symlinks) to the same path, or
# DEST, inside the image.
copy_file ()
{
  local dest="$root${2:-$1}"
  mkdir -p "$(dirname "$dest")"
  cp -L "$1" "$dest"
}

# copy_bin SRC DEST: an executable and everything ldd says it loads.
copy_bin ()
{
  local src="$1" dest="$2" lib
  [ -x "$src" ] || die "missing $src"
  copy_file "$src" "$dest"
  # ldd of a static binary fails: it loads nothing.
  if ldd "$src" >/dev/null 2>&1; then
    for lib in $(ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }
                                   $1 ~ /^\// { print $1 }'); do
      [ -e "$root$lib" ] || copy_file "$lib"
    done
  fi
}

# busybox: prefer the static one (busybox-static puts it at /bin/busybox).
bb=""
for c in /bin/busybox /usr/bin/busybox; do
  if [ -x "$c" ]; then bb="$c"; break; fi
done
[ -n "$bb" ] || die "needs busybox (package busybox-static)"
copy_bin "$bb" /bin/busybox
for a in $("$bb" --list); do
  [ "$a" = busybox ] && continue
  [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
done
for a in sh mount insmod ip sha256sum poweroff; do
  [ -e "$root/bin/$a" ] || die "busybox $bb lacks the $a applet"
done

nbdc="$(command -v nbd-client || true)"
[ -n "$nbdc" ] || nbdc=/usr/sbin/nbd-client
[ -x "$nbdc" ] || die "needs nbd-client (package nbd-client)"
copy_bin "$nbdc" /sbin/nbd-client

mkfs="$(command -v mke2fs || true)"
[ -n "$mkfs" ] || mkfs=/sbin/mke2fs
[ -x "$mkfs" ] || die "needs mke2fs (package e2fsprogs)"
rm -f "$root/bin/mke2fs"        # the real one, not the applet
copy_bin "$mkfs" /sbin/mke2fs
[ -r /etc/mke2fs.conf ] && copy_file /etc/mke2fs.conf

fsck="$(command -v e2fsck || true)"
[ -n "$fsck" ] || fsck=/sbin/e2fsck
[ -x "$fsck" ] || die "needs e2fsck (package e2fsprogs)"
rm -f "$root/bin/e2fsck"
copy_bin "$fsck" /sbin/e2fsck

# Modules, dependencies first.
order=()
declare -A seen=()
add_module ()
{
  local name="$1" path dep base
  [ -n "${seen[$name]:-}" ] && return 0
  seen[$name]=1
  path="$(modinfo -k "$kver" -n "$name" 2>/dev/null)" ||
    die "kernel $kver has no module $name"
  case "$path" in
    (builtin*|"") return 0 ;;     # built into this kernel
  esac
  for dep in $(modinfo -k "$kver" -F depends "$name" | tr ',' ' '); do
    add_module "$dep"
  done
  base="$(basename "$path")"
  # busybox insmod takes plain .ko files only.
  case "$base" in
    (*.ko)     cp "$path" "$root/lib/modules/$base" ;;
    (*.ko.xz)  base="${base%.xz}";  xz -dc "$path" > "$root/lib/modules/$base" ;;
    (*.ko.zst) base="${base%.zst}"; zstd -qdc "$path" > "$root/lib/modules/$base" ;;
    (*.ko.gz)  base="${base%.gz}";  gzip -dc "$path" > "$root/lib/modules/$base" ;;
    (*) die "module $name: unknown file type $path" ;;
  esac
  order+=("$base")
}
# ext4 (which also mounts ext2) asks the crypto API for "crc32c" at
# every mount, checksums or not, and the guest has no modprobe to load
# it on demand: crc32c_generic (crc32c-intel needs SSE4.2, which TCG's
# default CPU lacks).
for m in nbd e1000 ext4 crc32c_generic; do
  add_module "$m"
done
printf '%s\n' "${order[@]}" > "$root/lib/modules/order"

ln -s /proc/mounts "$root/etc/mtab"
# The kernel opens /dev/console for init before init mounts devtmpfs.
# mknod needs root; without it init reopens the console itself.
mknod "$root/dev/console" c 5 1 2>/dev/null || true

cp "$init" "$root/init"
chmod 755 "$root/init"

(cd "$root" && find . -print0 | LC_ALL=C sort -z |
   cpio --null -o -H newc --quiet -R 0:0) | gzip -1 > "$out"
