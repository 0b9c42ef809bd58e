#!/usr/bin/env bash
# nbd-fscache: the two commands of README.md.
#
#   ./build.sh demo    install what is missing, build, run the demo
#   ./build.sh check   install what is missing, build, run every test
#   ./build.sh build   install what is missing, build
#
# On Debian 12 as root it installs the Debian packages that are
# missing; elsewhere it only checks for them.  Builds happen in place
# and only redo what is out of date.
set -euo pipefail
cd "$(dirname "$0")"

packages=(
  build-essential autoconf automake libtool pkg-config
  nbdkit nbdkit-plugin-dev libnbd-dev libnbd-bin libev-dev uuid-dev
  libxxhash-dev fio qemu-utils python3-libnbd
  # The real upstreams and clients of the integration tests.
  nginx-light openssh-server openssh-client nbd-server socat
  # The kernel nbd-client test: a guest kernel under qemu TCG.
  qemu-system-x86 linux-image-amd64 busybox-static nbd-client cpio
  e2fsprogs kmod
  # promtool, which checks nbd-fscache stat --prometheus.
  prometheus
)

install_deps () {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "build.sh: missing packages: ${missing[*]} (install them as root)" >&2
    exit 1
  fi
  echo "build.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build () {
  install_deps
  if [ ! -x configure ] || [ configure.ac -nt configure ] ||
     [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi
  fi
  if [ ! -f Makefile ] || [ configure -nt config.status ]; then
    ./configure --enable-werror ${CONFIGURE_ARGS:-}
  fi
  make -j"$(nproc)"
}

case "${1:-}" in
  build)
    build ;;
  demo)
    build
    exec tools/demo.sh ;;
  check)
    build
    status=0
    rm -f test-suite.log
    make -j"$(nproc)" check || status=$?
    # The automake totals, as one line (the last one printed).
    if [ -f test-suite.log ]; then
      total () { awk -v k="$1" '$1 == "#" && $2 == k":" { s += $3 } END { print s + 0 }' test-suite.log; }
      p=$(total PASS)
      f=$(( $(total FAIL) + $(total XPASS) + $(total ERROR) ))
      s=$(( $(total SKIP) + $(total XFAIL) ))
      if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
      echo "$p passed, $f failed, $s skipped"
    else
      echo "0 passed, 1 failed, 0 skipped"
      [ "$status" -ne 0 ] || status=1
    fi
    exit "$status" ;;
  *)
    echo "usage: $0 demo|check|build" >&2
    exit 2 ;;
esac
