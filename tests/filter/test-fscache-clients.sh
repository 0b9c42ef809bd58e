#!/usr/bin/env bash
# nbd-fscache: the clients a user points at the proxy, on a Unix socket
# and on TCP: fio with the job files shipped in tools/fio/, qemu-img
# (compare, convert) and qemu-io (patterned writes and reads).
#
# Truth: the upstream image file (cmp, qemu-img compare), fio's own
# crc32c verification of what it wrote, qemu-io's pattern checks, and
# the upstream's request log (0 bytes read for the warm fio run).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires fio --version
requires qemu-img --version
requires qemu-io --version
requires nbdkit nbd --dump-plugin
requires nbdkit --filter=log null --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin
requires python3 -c 'import socket'

fio_dir="$top_srcdir/tools/fio"
size=$((16 * 1024 * 1024))
make_random "$TMP/upstream.img" "$size"
log="$TMP/up.log"
start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/upstream.img" logfile="$log"

# A free TCP port on the loopback.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

proxy_args=(--filter="$FILTER" nbd socket="$TMP/up.sock"
            fscache-validate=size)
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" "${proxy_args[@]}" \
  fscache-dir="$TMP/cache-unix"
start_nbdkit -P "$TMP/tcp.pid" -i 127.0.0.1 -p "$port" "${proxy_args[@]}" \
  fscache-dir="$TMP/cache-tcp"
unix_uri="nbd+unix:///?socket=$TMP/px.sock"
tcp_uri="nbd://127.0.0.1:$port/"

# ---- fio, the shipped read-only job files ---------------------------
for net in unix tcp; do
  for pass in cold warm; do
    b0=$(log_read_bytes "$log")
    SOCKET="$TMP/px.sock" HOST=127.0.0.1 PORT="$port" \
      fio --output="$TMP/fio-$net-$pass.out" "$fio_dir/fscache-$net.fio" ||
      fail "fio $net $pass: $(tail -5 "$TMP/fio-$net-$pass.out")"
    got=$(( $(log_read_bytes "$log") - b0 ))
    echo "fio $net $pass: $got bytes upstream"
    case $pass in
      # Each byte at least once; the random 4K pass fetches 4K pieces,
      # but a random read that lands near the last two (plugin: two
      # near reads in a row) takes its whole block, with pieces held
      # already.  Two reads in a row land in one of the 256 blocks by
      # chance once in 256: about 16 times in 4096 reads, 60 KiB each,
      # so up to a sixteenth more (a thirty-second failed about one
      # run in two on a loaded machine, at 4.1% more).
      cold) [ "$got" -ge "$size" ] && [ "$got" -le $((size + size / 16)) ] ||
              fail "fio $net cold read $got bytes upstream, expected" \
                   "$size to $((size + size / 16))" ;;
      warm) [ "$got" -eq 0 ] ||
              fail "fio $net warm read $got bytes upstream, expected 0" ;;
    esac
  done
done

# ---- qemu-img: compare and convert --------------------------------------
qemu-img compare -f raw -F raw "$TMP/upstream.img" "$unix_uri" ||
  fail "qemu-img compare (unix) found a difference"
qemu-img compare -f raw -F raw "$TMP/upstream.img" "$tcp_uri" ||
  fail "qemu-img compare (tcp) found a difference"
qemu-img convert -f raw -O raw "$tcp_uri" "$TMP/converted.img"
cmp "$TMP/upstream.img" "$TMP/converted.img" ||
  fail "qemu-img convert from the proxy differs from the image"
echo "qemu-img: compare and convert identical"

# ---- qemu-io: patterned writes read back, then checked upstream -----------
qemu-io -f raw "$unix_uri" \
  -c 'write -P 0xab 1M 64k' -c 'write -P 0x5c 3146240 10000' \
  -c 'read -P 0xab 1M 64k' -c 'read -P 0xab 1052672 4k' \
  -c 'read -P 0x5c 3146240 10000' > "$TMP/qemu-io.out" 2>&1 ||
  fail "qemu-io failed: $(cat "$TMP/qemu-io.out")"
if grep -q 'Pattern verification failed' "$TMP/qemu-io.out"; then
  fail "qemu-io read back other bytes than it wrote: $(cat "$TMP/qemu-io.out")"
fi
head -c 65536 /dev/zero | tr '\0' '\253' > "$TMP/ab"
cmp -i 0:$((1024 * 1024)) -n 65536 "$TMP/ab" "$TMP/upstream.img" ||
  fail "qemu-io's write did not reach the upstream"
nbdcopy "$unix_uri" "$TMP/after-io.img"
cmp "$TMP/upstream.img" "$TMP/after-io.img" ||
  fail "after qemu-io the proxy and the upstream differ"
echo "qemu-io: patterns written, read back and found upstream"

# ---- fio write + verify through TCP, then proxy = upstream ------------
stop_nbdkit "$TMP/px.pid"        # one writer, so the unix cache stays coherent
URI="$tcp_uri" fio --output="$TMP/fio-verify.out" \
  "$fio_dir/fscache-write-verify.fio" ||
  fail "fio write-verify: $(tail -5 "$TMP/fio-verify.out")"
nbdcopy "$tcp_uri" "$TMP/after-fio.img"
cmp "$TMP/upstream.img" "$TMP/after-fio.img" ||
  fail "after fio's writes the proxy and the upstream differ"
echo "fio write-verify: every block verified, proxy = upstream"

echo "$0: OK"
