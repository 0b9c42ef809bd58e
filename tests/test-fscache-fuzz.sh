#!/usr/bin/env bash
# Fuzz the index parser and object loading: every seed corpus file and
# a fixed set of mutations of them (deterministic: --seed 1) through
# tests/fuzz-index, built with ASan and UBSan.  Any sanitizer report,
# wrong data or crash fails the test; the input that crashed is kept as
# tests/fuzz-index-crash.bin in the build tree.  See tests/README.md.

source "${top_srcdir:-.}/tests/functions.sh"

fuzz="$top_builddir/tests/fuzz-index"
corpus="$top_srcdir/tests/fuzz-corpus"
requires test -x "$fuzz"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# abort_on_error too, so that a UBSan report (which otherwise exits)
# also goes through the handler that saves the crashing input.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1
# The fuzzer's private cache directory: in memory if possible (the core
# fsyncs a lot; on a disk the run takes about 2.5 times as long).
cachedir="$TMP"
if [ -d /dev/shm ] && [ -w /dev/shm ] &&
   shm="$(mktemp -d /dev/shm/fscache-fuzz.XXXXXX 2>/dev/null)"; then
  cleanup_fn "rm -rf '$shm'"
  cachedir="$shm"
fi
export TMPDIR="$cachedir"

crash="$TMP/crash.bin"
status=0
"$fuzz" --mutations "${FUZZ_MUTATIONS:-3000}" --seed "${FUZZ_SEED:-1}" \
        --crash-file "$crash" "$corpus" >"$TMP/out" 2>"$TMP/err" ||
  status=$?
cat "$TMP/out"
cat "$TMP/err" >&2

if [ "$status" -ne 0 ] ||
   grep -q -E 'ERROR: (Address|Leak)Sanitizer|runtime error:|WRONG DATA' \
        "$TMP/err"; then
  echo "$0: FAIL: fuzz-index exited with status $status" >&2
  if [ -s "$crash" ]; then
    cp "$crash" "$top_builddir/tests/fuzz-index-crash.bin"
    echo "$0: reproduce with: $fuzz $top_builddir/tests/fuzz-index-crash.bin" >&2
  fi
  exit 1
fi
grep -q "no errors" "$TMP/out"
