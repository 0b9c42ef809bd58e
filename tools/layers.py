#!/usr/bin/env python3
"""tools/layers.py: the measures of core/'s layering (issue 30), for
anyone to run: python3 tools/layers.py [--edges] [DIR...] (default core
plugin).  --edges also lists, for each circle and pair, who calls what
in whom.

Reports, and exits 1 if any is exceeded:
  * files over 800 lines (.c and .h);
  * functions over 120 lines (from the line of the name, in nbdkit's
    style "type\\nname (args)\\n{", to the closing brace in column 0);
  * circles of .c files calling each other: the strongly connected
    components of the graph "A calls a function defined in B", with
    more than 2 files (a pair is allowed: a declared callback);
  * in core/, a file in no folder of FLOORS (core/README.md), or a
    call from a file to one in a folder of a higher floor: a file calls
    its own folder and the folders below (docs/design.md, "Floors of
    core/").  The calls that must go up are callbacks through a table
    or a function pointer, which this lexical graph does not see, by
    design.

Files in a directory's subfolders count as the directory's: core/ is
one library, in folders.

The call graph is lexical: a file calls a function if the function's
name, defined (not static) in another file of the same directory tree,
appears in it followed by "(".  Good enough for C in this style; it
counts a mention in a comment as a call, which errs on the strict side.
"""
import os
import re
import sys

MAX_FILE = 800
MAX_FUNC = 120

# core/'s floors, bottom up, one or two folders each (core/README.md,
# docs/design.md "Floors of core/").  core/'s own top files are headers.
FLOORS = [
    'base',             # 1: files, buffers, checksums, index records, I/O
    'disk',             # 2: the object on disk
    'space',            # 3: space and lookup
    'object',           # 4: the object and its operations table
    'ops',              # 5: the operations
    'share',            # 6: sharing among a host's processes
    'cache',            # 7: the cache directory on top
    'wlog inspect',     # 8: beside 5 to 7, on the object's public API:
                        #    the write log and its writer; tools' access
]

DEF = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*) \(')


def functions(path):
    """(name, first line, length, static) of each function in PATH."""
    out = []
    lines = open(path, encoding='utf-8', errors='replace').read().split('\n')
    i = 0
    while i < len(lines):
        m = DEF.match(lines[i])
        if m and i > 0 and lines[i - 1] and not lines[i - 1].startswith(
                ('#', ' ', '/', '}')) and not lines[i - 1].endswith(';'):
            # Find the opening brace in column 0, then the closing one.
            j = i
            while j < len(lines) and lines[j] != '{':
                if lines[j].endswith(';'):
                    break
                j += 1
            if j < len(lines) and lines[j] == '{':
                k = j
                while k < len(lines) and lines[k] != '}':
                    k += 1
                static = 'static' in lines[i - 1]
                out.append((m.group(1), i + 1, k - i + 1, static))
                i = k
        i += 1
    return out


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main():
    args = sys.argv[1:]
    edges = '--edges' in args
    dirs = [a for a in args if a != '--edges'] or ['core', 'plugin']
    bad = 0
    for d in dirs:
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d)
                       for f in fs if f.endswith(('.c', '.h')))
        for f in files:
            n = sum(1 for _ in open(f, encoding='utf-8', errors='replace'))
            if n > MAX_FILE:
                print(f"file over {MAX_FILE} lines: {f} ({n})")
                bad += 1
        cfiles = [f for f in files if f.endswith('.c')]
        defined = {}
        for f in cfiles:
            for name, line, length, static in functions(f):
                if length > MAX_FUNC:
                    print(f"function over {MAX_FUNC} lines: {f}:{line} "
                          f"{name} ({length})")
                    bad += 1
                if not static:
                    defined[name] = f
        graph = {f: set() for f in cfiles}
        via = {}
        for f in cfiles:
            text = open(f, encoding='utf-8', errors='replace').read()
            for name in set(re.findall(r'\b([A-Za-z_][A-Za-z0-9_]*) ?\(',
                                       text)):
                g = defined.get(name)
                if g and g != f:
                    graph[f].add(g)
                    via.setdefault((f, g), []).append(name)
        if os.path.basename(os.path.normpath(d)) == 'core':
            level = {os.path.join(d, n): i + 1
                     for i, names in enumerate(FLOORS)
                     for n in names.split()}
            floor = {f: level[os.path.dirname(f)] for f in cfiles
                     if os.path.dirname(f) in level}
            for f in cfiles:
                if f not in floor:
                    print(f"file in no folder of a floor (tools/layers.py, "
                          f"FLOORS): {f}")
                    bad += 1
                    continue
                for g in sorted(graph[f]):
                    if floor.get(g, 0) > floor[f]:
                        print(f"call up a floor: {f} ({floor[f]}) -> "
                              f"{g} ({floor[g]}): "
                              + " ".join(sorted(via[(f, g)])))
                        bad += 1
        for comp in sccs(graph):
            if len(comp) > 2:
                print(f"circle of {len(comp)} files in {d}: "
                      + " ".join(os.path.basename(c) for c in comp))
                bad += 1
            elif len(comp) == 2:
                print(f"pair calling each other in {d}: "
                      + " ".join(os.path.basename(c) for c in comp))
            if edges and len(comp) >= 2:
                for a in comp:
                    for b in sorted(graph[a] & set(comp)):
                        print(f"  {os.path.basename(a)} -> "
                              f"{os.path.basename(b)}: "
                              + " ".join(sorted(via[(a, b)])))
    print(f"{bad} measures exceeded")
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
