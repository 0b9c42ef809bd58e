#!/usr/bin/env bash
# tools/bench/wakeups.py (where a client's requests wait for a CPU)
# reads a made-up record whose answer is known by construction.
#
# Ten requests, each: fio (CPU 0) wakes a serving thread "nbdkit"
# whose CPU 1 runs a fill thread "fsc-fill" for 100 µs more; fio's CPU
# goes idle 10 µs after the wakeup; the served thread runs, and 50 µs
# later wakes fio, which runs 20 µs after that on CPU 0 (idle till
# then).  So: 10 wakeups of the serving thread, each 100 µs, on
# another CPU than the waker's, all of their waiting behind fsc-fill
# (1.0 ms), and the other CPU idle 90 µs of each (0.9 ms); fio's 10
# wakeups 20 µs each, none of 50 µs or more.  A record with no such
# client is refused with a message naming it.
#
# Truth: the record's own construction.

source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"

requires "$PYTHON" --version

tool="$top_srcdir/tools/bench/wakeups.py"
"$PYTHON" - > "$TMP/rec.txt" <<'PY'
def ev(comm, pid, tid, cpu, t, name, rest):
    print("%16s %d/%d [%03d] %.6f: sched:%s: %s"
          % (comm, pid, tid, cpu, t, name, rest))
def switch(comm, pid, tid, cpu, t, ncomm, ntid):
    ev(comm, pid, tid, cpu, t, "sched_switch",
       "prev_comm=%s prev_pid=%d prev_prio=120 prev_state=S ==> "
       "next_comm=%s next_pid=%d next_prio=120" % (comm, tid, ncomm, ntid))
def waking(comm, pid, tid, cpu, t, wcomm, wtid, target):
    ev(comm, pid, tid, cpu, t, "sched_waking",
       "comm=%s pid=%d prio=120 target_cpu=%03d" % (wcomm, wtid, target))
t = 1.0
for i in range(10):
    switch("swapper/0", 0, 0, 0, t - 0.0005, "fio", 101)
    switch("swapper/1", 0, 0, 1, t - 0.0005, "fsc-fill", 210)
    waking("fio", 100, 101, 0, t, "nbdkit", 201, 1)
    switch("fio", 100, 101, 0, t + 0.000010, "swapper/0", 0)
    switch("fsc-fill", 200, 210, 1, t + 0.000100, "nbdkit", 201)
    waking("nbdkit", 200, 201, 1, t + 0.000150, "fio", 101, 0)
    switch("swapper/0", 0, 0, 0, t + 0.000170, "fio", 101)
    switch("nbdkit", 200, 201, 1, t + 0.000180, "swapper/1", 0)
    t += 0.001
PY
"$PYTHON" "$tool" --min=1 "$TMP/rec.txt" > "$TMP/out" ||
  fail "wakeups.py failed: $(cat "$TMP/out")"
cat "$TMP/out"
want ()
{
  grep -qE "$1" "$TMP/out" || fail "no line matching '$1'"
}
want '^fio \(thread 101\), 1 serving threads'
want '^serving thread woken by fio: 10 wakeups'
want '^  all +10  p50 +100  p90 +100  p99 +100  p99\.9 +100$'
want '^  on another CPU +10  p50 +100 '
! grep -q "on the waker's CPU" <(sed -n '/^serving/,/^$/p' "$TMP/out") ||
  fail "a wakeup counted on the waker's CPU"
want '^  10 waits of 50 µs or more, 1 ms in all'
want '^    fsc-fill +1\.0 ms  100%$'
want '^  the other CPUs idle meanwhile: 0\.9 ms$'
want '^fio woken by a serving thread: 10 wakeups'
want '^  all +10  p50 +20 '
[ "$(grep -c 'waits of 50' "$TMP/out")" -eq 1 ] ||
  fail "fio's 20 µs wakeups counted as waits of 50 µs or more"

rc=0
"$PYTHON" "$tool" --client=qemu "$TMP/rec.txt" > /dev/null 2> "$TMP/err" ||
  rc=$?
[ "$rc" -ne 0 ] || fail "a record without the client accepted"
grep -q "no thread named qemu" "$TMP/err" || fail "$(cat "$TMP/err")"
echo "test-fscache-bench-wakeups: OK"
