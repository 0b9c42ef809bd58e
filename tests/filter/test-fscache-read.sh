#!/usr/bin/env bash
# nbd-fscache: a cold read through the filter returns the upstream's
# bytes and fetches each byte once; a warm read returns the same bytes
# and reads nothing upstream (fscache-validate=size), or only the
# coherency sample, at most 8 x 4 KiB per connection
# (fscache-validate=sample, the default).
#
# Truth: cmp (and qemu-img compare) against the upstream image file,
# and the upstream's own request log (nbdkit --filter=log).

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version
requires nbdkit --filter=log null --dump-plugin
requires nbdkit nbd --dump-plugin
requires nbdkit --filter="$FILTER" null --dump-plugin

SAMPLE_MAX=32768                # 8 x 4 KiB per connection
size=$((64 * 1024 * 1024 + 12345))
make_random "$TMP/upstream.img" "$size"

start_nbdkit -P "$TMP/up.pid" -U "$TMP/up.sock" \
  --filter=log file "$TMP/upstream.img" logfile="$TMP/up.log"
log="$TMP/up.log"

up_bytes () { log_read_bytes "$log"; }
up_conns () { grep -c ' Connect export=' "$log" || true; }

have_qemu_img=false
if qemu-img --version >/dev/null 2>&1; then have_qemu_img=true; fi

# check_copy URI OUT WHAT: copy the whole export and cmp it.
check_copy ()
{
  rm -f "$2"
  nbdcopy "$1" "$2"
  if ! cmp "$TMP/upstream.img" "$2"; then
    echo "$0: FAIL: $3: data differs from the upstream image" >&2
    exit 1
  fi
  rm -f "$2"
}

# ---- fscache-validate=size: exact counts --------------------------------
start_nbdkit -P "$TMP/px.pid" -U "$TMP/px.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache" fscache-validate=size \
  fscache-stats="$TMP/px.stats"
uri="nbd+unix:///?socket=$TMP/px.sock"

b0=$(up_bytes)
check_copy "$uri" "$TMP/cold.img" "cold read"
b1=$(up_bytes)
cold=$((b1 - b0))
echo "cold read: $cold bytes upstream (export size $size)"
if [ "$cold" -ne "$size" ]; then
  echo "$0: FAIL: cold read fetched $cold bytes upstream," \
       "expected exactly the export size $size" >&2
  exit 1
fi

check_copy "$uri" "$TMP/warm.img" "warm read"
b2=$(up_bytes)
echo "warm read: $((b2 - b1)) bytes upstream"
if [ "$b2" -ne "$b1" ]; then
  echo "$0: FAIL: warm read fetched $((b2 - b1)) bytes upstream, expected 0" >&2
  exit 1
fi

if $have_qemu_img; then
  qemu-img compare -f raw -F raw "$TMP/upstream.img" "$uri"
  b3=$(up_bytes)
  if [ "$b3" -ne "$b2" ]; then
    echo "$0: FAIL: qemu-img compare (warm) fetched $((b3 - b2))" \
         "bytes upstream, expected 0" >&2
    exit 1
  fi
fi

# The filter's own counters agree with the upstream's log.
stop_nbdkit "$TMP/px.pid"
total=$(up_bytes)
urb=$(stat_value "$TMP/px.stats" upstream_read_bytes)
hit=$(stat_value "$TMP/px.stats" hit_bytes)
echo "stats: upstream_read_bytes=$urb hit_bytes=$hit"
if [ "$urb" -ne "$total" ]; then
  echo "$0: FAIL: stats upstream_read_bytes=$urb but the upstream" \
       "log shows $total bytes read" >&2
  exit 1
fi
if [ "$hit" -lt "$size" ]; then
  echo "$0: FAIL: stats hit_bytes=$hit, expected >= $size (a warm read)" >&2
  exit 1
fi

# ---- fscache-validate=sample (the default): only the sample -------------
start_nbdkit -P "$TMP/px2.pid" -U "$TMP/px2.sock" \
  --filter="$FILTER" nbd socket="$TMP/up.sock" \
  fscache-dir="$TMP/cache2"
uri2="nbd+unix:///?socket=$TMP/px2.sock"

b0=$(up_bytes); c0=$(up_conns)
check_copy "$uri2" "$TMP/cold2.img" "cold read (validate=sample)"
b1=$(up_bytes); c1=$(up_conns)
cold=$((b1 - b0)); conns=$((c1 - c0))
echo "cold read (sample): $cold bytes upstream over $conns connection(s)"
if [ "$cold" -lt "$size" ] || \
   [ "$cold" -gt $((size + SAMPLE_MAX * conns)) ]; then
  echo "$0: FAIL: cold read (sample) fetched $cold bytes upstream," \
       "expected $size plus at most $SAMPLE_MAX per connection" >&2
  exit 1
fi

check_copy "$uri2" "$TMP/warm2.img" "warm read (validate=sample)"
if $have_qemu_img; then
  qemu-img compare -f raw -F raw "$TMP/upstream.img" "$uri2"
fi
b2=$(up_bytes); c2=$(up_conns)
warm=$((b2 - b1)); conns=$((c2 - c1))
echo "warm read (sample): $warm bytes upstream over $conns connection(s)"
if [ "$conns" -lt 1 ] || [ "$warm" -gt $((SAMPLE_MAX * conns)) ]; then
  echo "$0: FAIL: warm read (sample) fetched $warm bytes upstream over" \
       "$conns connection(s), expected at most $SAMPLE_MAX each" >&2
  exit 1
fi

echo "$0: OK"
