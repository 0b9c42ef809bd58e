#!/usr/bin/env python3
# A strict reader of the Prometheus text exposition format (0.0.4), for
# tests/tools/test-tool-ls-stat.sh where promtool is missing (and beside it
# where it is not): fails on anything the format does not allow, and
# on what nbd-fscache promises beyond it (the nbd_fscache_ prefix,
# _total on counters, HELP and TYPE before each family's samples, one
# group of samples per family).  Prints "NAME{LABELS} VALUE" for each
# sample, labels sorted, so that the test can look values up.
#
# usage: prom-check.py FILE
import re
import sys

NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*$')
LABEL = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*$')
TYPES = {'counter', 'gauge', 'histogram', 'summary', 'untyped'}


def fail(lineno, msg):
    sys.exit('%s:%d: %s' % (sys.argv[1], lineno, msg))


def parse_labels(s, lineno):
    """S starts after '{'; returns (labels dict, rest after '}')."""
    labels = {}
    i = 0
    while True:
        if s[i:i + 1] == '}':
            return labels, s[i + 1:]
        m = re.match(r'([a-zA-Z_][a-zA-Z0-9_]*)="', s[i:])
        if not m:
            fail(lineno, 'bad label at: %r' % s[i:])
        name = m.group(1)
        i += m.end()
        val = ''
        while True:
            if i >= len(s):
                fail(lineno, 'unterminated label value')
            c = s[i]
            if c == '\\':
                e = s[i + 1:i + 2]
                if e not in ('\\', '"', 'n'):
                    fail(lineno, 'bad escape \\%s' % e)
                val += {'\\': '\\', '"': '"', 'n': '\n'}[e]
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == '\n':
                fail(lineno, 'newline in a label value')
            else:
                val += c
                i += 1
        if name in labels:
            fail(lineno, 'label %s repeated' % name)
        labels[name] = val
        if s[i:i + 1] == ',':
            i += 1
        elif s[i:i + 1] != '}':
            fail(lineno, 'expected , or } at: %r' % s[i:])


def main():
    text = open(sys.argv[1], encoding='utf-8').read()
    if not text.endswith('\n'):
        fail(0, 'no newline at the end')
    helps, types, done, series = {}, {}, set(), set()
    current = None
    out = []
    for lineno, line in enumerate(text[:-1].split('\n'), 1):
        if line.startswith('#'):
            parts = line.split(' ', 3)
            if len(parts) >= 3 and parts[1] in ('HELP', 'TYPE'):
                name = parts[2]
                if not NAME.match(name):
                    fail(lineno, 'bad metric name %r' % name)
                if name in done:
                    fail(lineno, '%s: HELP/TYPE after its samples' % name)
                table = helps if parts[1] == 'HELP' else types
                if name in table:
                    fail(lineno, '%s: second %s' % (name, parts[1]))
                if len(parts) < 4 or not parts[3]:
                    fail(lineno, '%s: empty %s' % (name, parts[1]))
                if parts[1] == 'TYPE' and parts[3] not in TYPES:
                    fail(lineno, '%s: bad type %r' % (name, parts[3]))
                table[name] = parts[3]
            continue
        if not line.strip():
            fail(lineno, 'blank line')
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(.*)$', line)
        if not m:
            fail(lineno, 'bad sample line %r' % line)
        name, rest = m.group(1), m.group(2)
        labels = {}
        if rest.startswith('{'):
            labels, rest = parse_labels(rest[1:], lineno)
        fields = rest.split()
        if not rest.startswith(' ') or len(fields) not in (1, 2):
            fail(lineno, 'bad value part %r' % rest)
        try:
            float(fields[0])
            if len(fields) == 2:
                int(fields[1])
        except ValueError:
            fail(lineno, 'bad number in %r' % rest)
        if not name.startswith('nbd_fscache_'):
            fail(lineno, '%s: not prefixed nbd_fscache_' % name)
        if name not in types or name not in helps:
            fail(lineno, '%s: sample before its HELP and TYPE' % name)
        if types[name] == 'counter' and not name.endswith('_total'):
            fail(lineno, '%s: a counter without _total' % name)
        if name != current:
            if name in done:
                fail(lineno, '%s: samples not together' % name)
            if current:
                done.add(current)
            current = name
        key = name + '{' + ','.join('%s="%s"' % kv
                                    for kv in sorted(labels.items())) + '}'
        if key in series:
            fail(lineno, 'series repeated: %s' % key)
        series.add(key)
        out.append('%s %s' % (key, fields[0]))
    print('\n'.join(out))


main()
