#!/usr/bin/env bash
# nbd-fscache tests: an nbdkit sh plugin that can write and offers no
# multi-conn, and uses that freedom as nbdkit's own multi-conn test
# plugin does (tests/test-multi-conn-plugin.sh there, strictfua=1):
# each connection sees the shared 32-byte image ("base") as it was when
# the connection first touched it, plus its own writes; a flush
# publishes the connection's writes to base and drops its view, and a
# FUA write writes its own range through at once.  So a connection sees
# another's flushed writes only once it has flushed itself, and a new
# connection sees everything flushed before it.  Used by
# tests/filter/test-transparent.sh, part 4.  State lives in nbdkit's $tmpdir.
d=$tmpdir
view () { [ -f "$d/v$1" ] || cp "$d/base" "$d/v$1"; }
publish () {                        # CONN
  if [ -f "$d/v$1.log" ]; then
    while read -r n o; do
      dd if="$d/v$1" of="$d/base" bs=1 skip="$o" seek="$o" count="$n" \
         conv=notrunc status=none
    done < "$d/v$1.log"
  fi
  rm -f "$d/v$1" "$d/v$1.log"
}
case "$1" in
  get_ready) printf '%-32s' 'Initial contents' > "$d/base"; echo 0 > "$d/n" ;;
  get_size) echo 32 ;;
  can_write|can_flush|can_zero|can_trim) exit 0 ;;
  can_multi_conn) exit 3 ;;
  can_fua) echo native ;;
  open) read -r i < "$d/n"; echo $((i+1)) | tee "$d/n" ;;
  pread) view "$2"; dd if="$d/v$2" bs=1 skip="$4" count="$3" status=none ;;
  pwrite) view "$2"
          dd of="$d/v$2" bs=1 seek="$4" conv=notrunc status=none
          echo "$3 $4" >> "$d/v$2.log"
          case ",$5," in *,fua,*)
            dd if="$d/v$2" of="$d/base" bs=1 skip="$4" seek="$4" count="$3" \
               conv=notrunc status=none ;; esac ;;
  zero|trim) view "$2"
          dd if=/dev/zero of="$d/v$2" bs=1 seek="$4" count="$3" conv=notrunc status=none
          echo "$3 $4" >> "$d/v$2.log" ;;
  flush) publish "$2" ;;
  *) exit 2 ;;
esac
