#!/usr/bin/env bash
# nbd-fscache: never down, whatever the plugin (issue 40).
#
# The filter opens upstream contexts of its own outside any client's
# connection (the pool, the catch-up worker, the shared view, the
# writeback writer), where nbdkit 1.32 gives the plugin no export name:
# the file plugin with dir= dereferenced the NULL (SIGSEGV: the whole
# server), ondemand refused (every read failed in writeback mode), the
# sh plugin read its default export instead.  plugin/ownctx.c decides
# per plugin whether such contexts are the client's export.
#
# Every plugin of Debian 12's nbdkit that needs no outside service:
# file, file dir= (two exports), memory, data, pattern, random,
# sparse-random, null, full, split, partitioning, floppy, info
# (mode=exportname, two exports), an sh plugin with two exports,
# ondemand with two exports.  Each runs
#   - alone, for the truth: the md5 of every export (nbdcopy);
#   - behind the filter in writethrough, writearound, writeback, under
#     -r (in writeback mode, so that the writer's context too must be
#     read-only), and in writethrough with the fill budget forced on
#     (NBD_FSCACHE_TEST_BUDGET=1, a 1 MiB burst) so that fills are
#     skipped and the catch-up worker runs;
#   and a client reads every export, waits until the filter's
#   background work is over (the catch-up: every byte noted made up or
#   dropped, from the stats file, a state), and reads every export
#   again.  Both reads equal the plugin alone, the server is alive to
#   the end and exits 0, and its log has no "error" line: what is not
#   an error (the note saying why a plugin gets no contexts of the
#   filter's own) says "note".
# With the budget on, the catch-up must have made up something for a
# plugin that allows contexts of the filter's own (file), and nothing
# for one that does not (file dir=).
#
# Truth: each plugin alone (md5 of every export), nbdkit's exit
# status and log, the filter's stats file.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires nbdinfo --version
requires md5sum --version
requires test -r "$FILTER"
for p in file memory data pattern random sparse-random null full split \
         partitioning floppy info sh ondemand; do
  requires nbdkit "$p" --dump-plugin
done
requires mkfs.ext4 -V            # ondemand's default file system

M=$((1024 * 1024))
make_random "$TMP/f1" $((4 * M))
make_random "$TMP/f2" $((3 * M + 4096))
mkdir "$TMP/dir" "$TMP/floppy" "$TMP/od" "$TMP/shdata"
make_random "$TMP/dir/a" $((4 * M))
make_random "$TMP/dir/b" $((2 * M + 512))
make_random "$TMP/floppy/one.bin" $((1 * M))
echo "a text file" > "$TMP/floppy/two.txt"
make_random "$TMP/shdata/a" $((2 * M))
make_random "$TMP/shdata/b" $((2 * M))

# An sh plugin serving one file of $TMP/shdata per export: its open is
# told the export name (so that a context opened without one would
# read another export, or none).
cat > "$TMP/two.sh" <<EOF
#!/usr/bin/env bash
d="$TMP/shdata"
case "\$1" in
  list_exports) echo a; echo b ;;
  default_export) echo a ;;
  open) [ -f "\$d/\$3" ] || { echo "no export \$3" >&2; exit 1; }
        echo "\$3" ;;
  get_size) stat -c %s "\$d/\$2" ;;
  pread) dd if="\$d/\$2" iflag=skip_bytes,count_bytes skip="\$4" \\
           count="\$3" status=none ;;
  thread_model) echo parallel ;;
  *) exit 2 ;;
esac
EOF
chmod +x "$TMP/two.sh"

# The cases: NAME, exports (space-separated; "-" for ""), the plugin
# and its parameters (split into words as the shell would).  nbdkit
# 1.32's split plugin dies (SIGSEGV) on a block-status request, alone
# as behind the filter: it is read without (nbdcopy --no-extents).
cases=(
  "file|-|file $TMP/f1"
  "file-dir|a b|file dir=$TMP/dir"
  "memory|-|memory size=4M"
  "data|-|data '@0x1000 1 2 3 @0x200000 0x55 @0x3ff000 9' size=4M"
  "pattern|-|pattern size=4M"
  "random|-|random size=4M seed=7"
  "sparse-random|-|sparse-random size=16M seed=7"
  "null|-|null size=4M"
  "full|-|full size=4M"
  "split|-|split $TMP/f1 $TMP/f2"
  "partitioning|-|partitioning $TMP/f1 $TMP/f2"
  "floppy|-|floppy $TMP/floppy"
  "info|abc de|info mode=exportname"
  "sh|a b|sh $TMP/two.sh"
  "ondemand|a b|ondemand dir=$TMP/od size=4M"
)

variants="writethrough writearound writeback readonly budget"

# The client, run by nbdkit --run: every export read, the background
# work waited for, every export read again; one line per read, "EXPORT
# MD5".  $STATS: the filter's stats file, rewritten at each
# connection's end, or empty for the plugin alone.
cat > "$TMP/client.sh" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
unixsocket="$1"
read_all () {
  local e sum
  for e in $EXPORTS; do
    [ "$e" = - ] && e=
    sum=$(nbdcopy $NBDCOPY_OPTS "nbd+unix:///$e?socket=$unixsocket" - | md5sum)
    printf '%s %s\n' "${e:--}" "${sum%% *}"
  done
}
stat_of () { awk -v k="$1" '$1 == k { print $2 }' "$STATS"; }
# The catch-up is over once everything noted was made up or dropped.
# Each poll is a connection with no request (nbdinfo --size): its end
# writes the stats file, and it starts no request the catch-up would
# yield to.
settled () {
  nbdinfo --size "nbd+unix:///$FIRST?socket=$unixsocket" >/dev/null
  [ -s "$STATS" ] || return 1
  local n d x
  n=$(stat_of catchup_noted_bytes); d=$(stat_of catchup_done_bytes)
  x=$(stat_of catchup_dropped_bytes)
  [ "$n" -eq $((d + x)) ]
}
read_all
if [ -n "$STATS" ]; then
  i=0
  until settled; do
    i=$((i + 1))
    [ $i -lt 600 ] || { echo "the catch-up never settled" >&2; exit 1; }
    sleep 0.05
  done
  echo "catchup $(stat_of catchup_noted_bytes) $(stat_of catchup_done_bytes)"
  read_all
fi
EOF
chmod +x "$TMP/client.sh"

failures=0
bad () { echo "$0: FAIL: $*" >&2; failures=$((failures + 1)); }

for c in "${cases[@]}"; do
  IFS='|' read -r name exports words <<<"$c"
  eval "plugin=($words)"
  first=${exports%% *}; [ "$first" = - ] && first=
  export EXPORTS="$exports" FIRST="$first" NBDCOPY_OPTS=
  [ "$name" = split ] && NBDCOPY_OPTS=--no-extents
  # The plugin alone.
  STATS= nbdkit -U - "${plugin[@]}" --run "$TMP/client.sh \"\$unixsocket\"" >"$TMP/$name.alone" \
    2>"$TMP/$name.alone.err" ||
    { cat "$TMP/$name.alone.err"; bad "$name: the plugin alone failed"; continue; }
  [ -s "$TMP/$name.alone" ] || { bad "$name: the plugin alone read nothing"; continue; }
  for v in $variants; do
    opts=() env=()
    case $v in
      readonly) opts=(-r fscache-mode=writeback) ;;
      budget) opts=(fscache-mode=writethrough)
              env=(NBD_FSCACHE_TEST_BUDGET=1 NBD_FSCACHE_TEST_BURST=$M) ;;
      *) opts=(fscache-mode=$v) ;;
    esac
    label="$name/$v"
    out="$TMP/$name.$v" err="$TMP/$name.$v.err" stats="$TMP/$name.$v.stats"
    rc=0
    env STATS="$stats" "${env[@]}" timeout 300 nbdkit -U - \
      --filter="$FILTER" "${plugin[@]}" fscache-dir="$TMP/cache-$name-$v" \
      fscache-stats="$stats" fscache-readahead=1M "${opts[@]}" \
      --run "$TMP/client.sh \"\$unixsocket\"" >"$out" 2>"$err" || rc=$?
    if [ "$rc" -ne 0 ]; then
      tail -n 5 "$err" >&2
      bad "$label: nbdkit or its client exited $rc"
      continue
    fi
    # Every read, the first and the second, equals the plugin alone.
    while read -r e sum; do
      [ "$e" = catchup ] && continue
      want=$(awk -v e="$e" '$1 == e { print $2 }' "$TMP/$name.alone")
      [ "$sum" = "$want" ] || bad "$label: export \"$e\" read $sum, the plugin alone $want"
    done <"$out"
    n=$(grep -vc '^catchup' "$out" || true)
    [ "$n" -eq $((2 * $(wc -w <<<"$exports"))) ] ||
      bad "$label: $n reads, expected two of each export"
    if grep -i 'error' "$err" >/dev/null; then
      grep -i error "$err" | head -n 3 >&2
      bad "$label: an error line in the log"
    fi
    cu=$(awk '$1 == "catchup" { print $2 "/" $3 }' "$out")
    echo "$label: ok (catch-up noted/done $cu)"
    if [ "$v" = budget ]; then
      done_=${cu#*/}
      case $name in
        file) [ "$done_" -gt 0 ] || bad "$label: the catch-up made up nothing" ;;
        file-dir) [ "$done_" -eq 0 ] || bad "$label: a catch-up ran without a context of its own" ;;
      esac
    fi
  done
done

[ "$failures" -eq 0 ] || fail "$failures failure(s)"
echo "$0: OK"
