#!/usr/bin/env bash
# Fuzz the index parser and object loading, then the write log's
# recovery: every seed corpus file and a fixed set of mutations of them
# (deterministic: --seed 1) through tests/fuzz-index (inputs: index
# files, tests/fuzz-corpus/*.idx) and tests/fuzz-wlog (inputs: write
# logs, tests/fuzz-corpus/wlog/*.wlog), both built with ASan and UBSan.
# Any sanitizer report, wrong data or view, unexpected error or crash
# fails the test; the input that crashed is kept as
# tests/fuzz-index-crash.bin or tests/fuzz-wlog-crash.bin in the build
# tree.  See tests/README.md.

source "${top_srcdir:-.}/tests/functions.sh"

corpus="$top_srcdir/tests/fuzz-corpus"
requires test -x "$top_builddir/tests/fuzz-index"
requires test -x "$top_builddir/tests/fuzz-wlog"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# abort_on_error too, so that a UBSan report (which otherwise exits)
# also goes through the handler that saves the crashing input.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1
# The fuzzers' private cache directories: in memory if possible (the
# core fsyncs a lot; on a disk the run takes about 2.5 times as long).
cachedir="$TMP"
if [ -d /dev/shm ] && [ -w /dev/shm ] &&
   shm="$(mktemp -d /dev/shm/fscache-fuzz.XXXXXX 2>/dev/null)"; then
  cleanup_fn "rm -rf '$shm'"
  cachedir="$shm"
fi
export TMPDIR="$cachedir"

# run_fuzzer NAME MUTATIONS CORPUS [SEED]
run_fuzzer ()
{
  local name="$1" mutations="$2" dir="$3" seed="${4:-${FUZZ_SEED:-1}}"
  local fuzz="$top_builddir/tests/$name" crash="$TMP/$name-crash.bin"
  local status=0
  "$fuzz" --mutations "$mutations" --seed "$seed" \
          --crash-file "$crash" "$dir" >"$TMP/$name.out" \
          2>"$TMP/$name.err" || status=$?
  cat "$TMP/$name.out"
  cat "$TMP/$name.err" >&2
  if [ "$status" -ne 0 ] ||
     grep -q -E 'ERROR: (Address|Leak)Sanitizer|runtime error:|WRONG DATA' \
          "$TMP/$name.err"; then
    echo "$0: FAIL: $name exited with status $status" >&2
    if [ -s "$crash" ]; then
      cp "$crash" "$top_builddir/tests/$name-crash.bin"
      echo "$0: reproduce with: $fuzz $top_builddir/tests/$name-crash.bin" >&2
    fi
    exit 1
  fi
  if ! grep -q "no errors" "$TMP/$name.out"; then
    echo "$0: FAIL: $name did not report \"no errors\"" >&2
    exit 1
  fi
}

run_fuzzer fuzz-index "${FUZZ_MUTATIONS:-3000}" "$corpus"
# Seed 3 made a superblock whose checksum holds carry more present
# blocks than the object has (within its first 1000 mutations), which
# a clean open trusted as its gauge.
[ -n "${FUZZ_SEED:-}" ] || run_fuzzer fuzz-index 1000 "$corpus" 3
run_fuzzer fuzz-wlog "${FUZZ_WLOG_MUTATIONS:-3000}" "$corpus/wlog"
