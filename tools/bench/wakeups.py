#!/usr/bin/env python3
"""tools/bench/wakeups.py: where a client's requests wait for a CPU.

A hit's latency at iodepth 1 is two wakeups: the client wakes the
server's worker with its request, the worker wakes the client with the
reply.  On a busy host either may wait for a CPU after its wakeup, and
that wait, not the cache's work, is most of a hit's tail (issue 44).
This reads a system-wide record of the scheduler's events:

    perf record -e sched:sched_switch -e sched:sched_waking -a -m 16M \\
        -o FILE -- fio ... (or any client)

and reports, for the wakeups of the threads that serve CLIENT (those
CLIENT wakes at least MIN times) and of CLIENT by them:

  - the delay from each wakeup to the thread's first run (p50 ... p99.9),
    on the waker's CPU and on the other;
  - for the delays of at least --slow µs, what ran meanwhile on the CPU
    the thread ran on at last, by thread name (fsc-fill, fsc-commit,
    nbdkit's workers of other connections, the client of the other
    load...), and how long the other CPUs sat idle meanwhile.

Threads are told apart by name (the filter names its own: core/utils.h,
fsc_thread_name) and the serving threads by the wakeups themselves.
Usage: wakeups.py [--client=fio] [--min=1000] [--slow=50] FILE
(FILE: a perf.data, read with perf script; or, named *.txt, the output
of perf script -F comm,pid,tid,cpu,time,event,trace).
"""
import argparse
import bisect
import collections
import re
import subprocess
import sys

EV = re.compile(r'^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+'
                r'sched:(\w+):\s+(.*)$')
SW = re.compile(r'prev_comm=(.*?) prev_pid=(\d+) .*==> '
                r'next_comm=(.*?) next_pid=(\d+)')


def events(path):
    if path.endswith('.txt'):
        with open(path) as f:
            src = f.read().splitlines()
    else:
        src = subprocess.run(
            ['perf', 'script', '-i', path, '-F',
             'comm,pid,tid,cpu,time,event,trace'],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, check=True).stdout.splitlines()
    for line in src:
        m = EV.match(line)
        if m:
            comm, pid, tid, cpu, t, name, rest = m.groups()
            yield (float(t), int(cpu), comm, int(pid), int(tid), name, rest)


def pct(v, q):
    return v[min(len(v) - 1, int(len(v) * q))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--client', default='fio')
    ap.add_argument('--min', type=int, default=1000)
    ap.add_argument('--slow', type=float, default=50.0)
    ap.add_argument('file')
    a = ap.parse_args()
    ev = list(events(a.file))
    if not ev:
        sys.exit('wakeups.py: no scheduler events in ' + a.file)
    # The client: its busiest thread by switches.
    sw = collections.Counter(e[4] for e in ev
                             if e[2] == a.client and e[5] == 'sched_switch')
    if not sw:
        sys.exit('wakeups.py: no thread named %s' % a.client)
    client = sw.most_common(1)[0][0]
    woken = collections.Counter()
    for t, cpu, comm, pid, tid, name, rest in ev:
        if tid == client and name == 'sched_waking':
            woken[int(re.search(r' pid=(\d+)', rest).group(1))] += 1
    servers = {p for p, k in woken.items() if k >= a.min}
    if not servers:
        sys.exit('wakeups.py: %s woke no thread %d times' % (a.client, a.min))
    pending, waits = {}, []
    timeline = collections.defaultdict(list)   # cpu -> [(t, name, tid)]
    tname = {}
    for t, cpu, comm, pid, tid, name, rest in ev:
        if name == 'sched_waking':
            p = int(re.search(r' pid=(\d+)', rest).group(1))
            if (tid == client and p in servers) or \
               (tid in servers and p == client):
                pending[p] = (t, cpu)
        elif name == 'sched_switch':
            m = SW.search(rest)
            nxt, nt = m.group(3), int(m.group(4))
            tname[nt] = nxt
            timeline[cpu].append((t, nxt, nt))
            if nt in pending:
                t0, wcpu = pending.pop(nt)
                waits.append((nt == client, t0, t, cpu, wcpu))
    times = {c: [x[0] for x in tl] for c, tl in timeline.items()}

    def label(name, tid):
        if tid == 0:
            return '(idle)'
        if tid in servers:
            return '(the serving threads)'
        if tid == client:
            return '(the client)'
        return name

    def ran(cpu, t0, t1):
        """What ran on CPU between T0 and T1: {label: µs}."""
        out = collections.Counter()
        tl, ts = timeline[cpu], times[cpu]
        i = max(0, bisect.bisect_right(ts, t0) - 1)
        while i < len(tl) and tl[i][0] < t1:
            s = max(tl[i][0], t0)
            e = min(tl[i + 1][0] if i + 1 < len(tl) else t1, t1)
            if e > s:
                out[label(tl[i][1], tl[i][2])] += (e - s) * 1e6
            i += 1
        return out

    span = ev[-1][0] - ev[0][0]
    print("%s (thread %d), %d serving threads, %.2f s recorded"
          % (a.client, client, len(servers), span))
    for is_client, who in ((False, 'serving thread woken by %s' % a.client),
                           (True, '%s woken by a serving thread'
                            % a.client)):
        sel = [w for w in waits if w[0] == is_client]
        if not sel:
            continue
        print('\n%s: %d wakeups, delay to run (µs)' % (who, len(sel)))
        for lab, f in (('all', lambda w: True),
                       ('on the waker\'s CPU', lambda w: w[3] == w[4]),
                       ('on another CPU', lambda w: w[3] != w[4])):
            v = sorted((w[2] - w[1]) * 1e6 for w in sel if f(w))
            if v:
                print('  %-20s %7d  p50 %6.0f  p90 %6.0f  p99 %6.0f  '
                      'p99.9 %6.0f' % (lab, len(v), pct(v, .5), pct(v, .9),
                                       pct(v, .99), pct(v, .999)))
        blame, idle, n = collections.Counter(), 0.0, 0
        for w in sel:
            d = (w[2] - w[1]) * 1e6
            if d < a.slow:
                continue
            n += 1
            blame.update(ran(w[3], w[1], w[2]))
            for c in timeline:
                if c != w[3]:
                    idle += ran(c, w[1], w[2]).get('(idle)', 0)
        tot = sum(blame.values())
        if n:
            print('  %d waits of %g µs or more, %.0f ms in all; meanwhile on '
                  'the CPU it ran on:' % (n, a.slow, tot / 1e3))
            for k, v in blame.most_common(12):
                print('    %-24s %8.1f ms  %3.0f%%' % (k, v / 1e3,
                                                      100 * v / tot))
            print('  the other CPUs idle meanwhile: %.1f ms' % (idle / 1e3))


if __name__ == '__main__':
    main()
