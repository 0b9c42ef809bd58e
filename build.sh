#!/usr/bin/env bash
# nbd-fscache: the two commands of README.md.
#
#   ./build.sh demo    install what the demo needs, build, run the demo
#   ./build.sh check   install what the tests need, build, run every test
#   ./build.sh build   install what building needs, build
#
# On Debian 12 as root it installs the Debian packages that are
# missing; elsewhere it only checks for them.  Each command installs
# only its own: the demo, on a fresh machine, should not wait for the
# kernel, qemu and servers that only the tests use.  Builds happen in
# place and only redo what is out of date.
set -euo pipefail
cd "$(dirname "$0")"

# Building: the compiler and autotools, nbdkit's headers (which bring
# nbdkit), libnbd, libev, libuuid, libxxhash; pod2man comes with perl.
build_packages=(
  build-essential autoconf automake libtool pkg-config
  nbdkit nbdkit-plugin-dev libnbd-dev libev-dev uuid-dev libxxhash-dev
  nettle-dev
)
# tools/demo.sh: nbdkit with its file plugin and log, rate and delay
# filters (all in nbdkit), and nbdcopy.
demo_packages=(
  libnbd-bin
)
# The tests, on top of both.
check_packages=(
  fio qemu-utils python3-libnbd
  # The real upstreams and clients of the integration tests.
  nginx-light openssh-server openssh-client nbd-server socat
  # The kernel nbd-client test: a guest kernel under qemu TCG.
  qemu-system-x86 linux-image-amd64 busybox-static nbd-client cpio
  e2fsprogs kmod
  # promtool, which checks nbd-fscache stat --prometheus.
  prometheus
  # test-units.sh: systemd-analyze, systemd-socket-activate, man for
  # the units' Documentation=; test-package.sh: the Debian package
  # built from git's files, checked by lintian.
  systemd man-db git debhelper lintian
  # test-fscache-peers-mtls.sh: a fleet CA, certificates and a CRL.
  openssl
  # test-fscache-peers-dns.sh: a DNS server with the fleet's SRV records.
  dnsmasq-base
)
packages=("${build_packages[@]}")

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
    packages+=("${demo_packages[@]}")
    build
    exec tools/demo.sh ;;
  check)
    packages+=("${demo_packages[@]}" "${check_packages[@]}")
    build
    status=0
    rm -f test-suite.log
    touch .check-started
    make -j"$(nproc)" check || status=$?
    # A failing test's parts and failure lines, then its last lines, so
    # that a run seen only from its output (CI) says why, not only
    # which (the tests' own dumps of server logs fill their ends).
    for trs in $(find tests -name '*.trs' -newer .check-started \
                   -exec grep -l '^:test-result: \(FAIL\|ERROR\|XPASS\)' {} +); do
      echo "==== ${trs%.trs}.log: its parts and failures, then its end ===="
      grep -a -E '^part |FAIL|check failed|Assertion' "${trs%.trs}.log" | head -n 40
      echo "----"
      tail -n 25 "${trs%.trs}.log"
    done
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
