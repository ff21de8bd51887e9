#!/usr/bin/env python3
"""include_graph.py - the include graph has no circle, and each room includes
only the rooms CONTRIBUTING.md's table lets it.

Reads every #include "..." of the project's sources and headers (.c .h .cu
.cuh under common spec storage scheduler server api client executor cmd,
subfolders included), resolved as the compiler does: beside the including
file first, then from the top of the tree (-I.). It checks three things:

  modules  the graph whose nodes are modules (X.c, X.h, X.cu, X.cuh of one
           folder are one node; a private header X_int.h belongs to module X,
           as SQLite's sqliteInt.h belongs to it) has no cycle; a cycle is
           printed as the path of files that closes it;
  folders  the graph of folders (each of executor's subfolders a room of its
           own) has no cycle either;
  rooms    a file of room R includes only files of R and of the rooms that
           CONTRIBUTING.md's table ("The tree", read from it) lets R include;
           an include that names no file is an error.

Usage: tests/include_graph.py [ROOT]   (ROOT: the checkout, default: the one
this script is in). Prints what it checked; exits 1 on any violation.
"""
import os
import re
import sys
from collections import defaultdict, deque

ROOMS = ["common", "spec", "storage", "scheduler", "server", "api", "client",
         "executor", "cmd"]


def room_rules(root):
    """CONTRIBUTING.md's table "The tree": room -> the rooms it may include
    (a set), or None for "everything". The rooms it lists before a ";" count
    ("`common/`, `storage/`; never `api/`"); "nothing of ours" is none."""
    rules = {}
    with open(os.path.join(root, "CONTRIBUTING.md"), encoding="utf-8") as fh:
        for line in fh:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 3:
                continue
            m = re.fullmatch(r"`([a-z]+)/`", cells[0])
            if not m or m.group(1) not in ROOMS:
                continue
            may = cells[2].split(";")[0]
            if may.strip() == "everything":
                rules[m.group(1)] = None
            else:
                rules[m.group(1)] = set(re.findall(r"`([a-z]+)/`", may))
    missing = [r for r in ROOMS if r not in rules]
    if missing:
        sys.exit("include_graph: CONTRIBUTING.md's table of rooms has no row for %s"
                 % ", ".join(r + "/" for r in missing))
    return rules


EXTS = (".c", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
COMMENT_RE = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)


def strip_comments(text):
    # keep the line breaks of block comments so that line numbers hold
    return COMMENT_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def sources(root):
    for room in ROOMS:
        top = os.path.join(root, room)
        for d, dirs, files in os.walk(top):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(d, f), root)


def room_of(path):
    return path.split("/", 1)[0]


def folder_of(path):
    return os.path.dirname(path)


def module_of(path, files):
    """X.c, X.h, X.cu, X.cuh -> X; X_int.h -> X when module X exists."""
    stem = os.path.splitext(path)[0]
    if stem.endswith("_int"):
        base = stem[:-len("_int")]
        if any(base + e in files for e in EXTS):
            return base
    return stem


def includes(root, path):
    """[(line, spelled, resolved or None)] of one file."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
        text = strip_comments(fh.read())
    out = []
    for m in INCLUDE_RE.finditer(text):
        name = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        resolved = None
        for base in (folder_of(path), ""):
            cand = os.path.normpath(os.path.join(base, name))
            if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
                resolved = cand
                break
        out.append((line, name, resolved))
    return out


def shortest_cycle(start, succ, members):
    """A shortest cycle through start within members: [start, ..., start]."""
    prev = {}
    q = deque([start])
    seen = {start}
    while q:
        n = q.popleft()
        for s in sorted(succ[n]):
            if s not in members:
                continue
            if s == start:
                path = [n]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if s not in seen:
                seen.add(s)
                prev[s] = n
                q.append(s)
    return None


def sccs(nodes, succ):
    """Tarjan's strongly connected components (iterative: no recursion limit)."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(n):
        index[n] = low[n] = len(index)
        stack.append(n)
        on.add(n)
        return (n, iter(sorted(succ[n])))

    for root in sorted(nodes):
        if root in index:
            continue
        work = [visit(root)]
        while work:
            n, it = work[-1]
            nxt = next((s for s in it if s not in index or s in on), None)
            if nxt is not None:
                if nxt in index:
                    low[n] = min(low[n], index[nxt])
                else:
                    work.append(visit(nxt))
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[n])
            if low[n] == index[n]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == n:
                        break
                out.append(comp)
    return out


def cycles(nodes, succ):
    """One shortest cycle per strongly connected component with a circle."""
    found = []
    for comp in sccs(nodes, succ):
        if len(comp) < 2:
            continue
        members = set(comp)
        best = None
        for n in sorted(comp):
            c = shortest_cycle(n, succ, members)
            if c and (best is None or len(c) < len(best)):
                best = c
        found.append((sorted(comp), best))
    return found


def file_path(edges):
    """The circle as one path of files: "a.c -> b.h ~ b.c -> a.h ~ a.c", where
    "~" steps to another file of the same module."""
    out = edges[0][0]
    for i, (_, _, t) in enumerate(edges):
        out += " -> " + t
        nxt = edges[(i + 1) % len(edges)][0]
        if nxt != t:
            out += " ~ " + nxt
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(here)
    allowed_by_room = room_rules(root)
    files = list(sources(root))
    fileset = set(files)
    errors = 0

    mod_succ = defaultdict(set)      # module -> modules it includes
    dir_succ = defaultdict(set)      # folder -> folders it includes
    witness = {}                     # (from, to) -> (file, line, included file)
    modules, folders = set(), set()
    nedges = 0
    for path in files:
        m = module_of(path, fileset)
        modules.add(m)
        folders.add(folder_of(path))
        room = room_of(path)
        for line, name, target in includes(root, path):
            where = "%s:%d" % (path, line)
            if target is None:
                print('include_graph: %s: #include "%s" names no file (beside it or from the top)'
                      % (where, name))
                errors += 1
                continue
            nedges += 1
            troom = room_of(target)
            allowed = allowed_by_room[room]
            if troom != room and allowed is not None and troom not in allowed:
                print("include_graph: %s: %s/ includes %s (%s/ may include %s)"
                      % (where, room, target, room,
                         ", ".join(r + "/" for r in ROOMS if r in allowed) or "nothing of ours"))
                errors += 1
            if target not in fileset:
                continue        # outside the rooms (tests/, bench/): reported above
            tm = module_of(target, fileset)
            if tm != m:
                mod_succ[m].add(tm)
                witness.setdefault((m, tm), (path, line, target))
            fa, fb = folder_of(path), folder_of(target)
            if fa != fb:
                dir_succ[fa].add(fb)
                witness.setdefault(("dir", fa, fb), (path, line, target))

    for comp, cyc in cycles(modules, mod_succ):
        errors += 1
        print("include_graph: the modules %s include each other; a circle:"
              % ", ".join(comp))
        for a, b in zip(cyc, cyc[1:]):
            f, line, t = witness[(a, b)]
            print("    %s:%d includes %s" % (f, line, t))
        print("  circle: " + file_path([witness[(a, b)] for a, b in zip(cyc, cyc[1:])]))
    for comp, cyc in cycles(folders, dir_succ):
        errors += 1
        print("include_graph: the folders %s include each other; a circle:"
              % ", ".join(c + "/" for c in comp))
        for a, b in zip(cyc, cyc[1:]):
            f, line, t = witness[("dir", a, b)]
            print("    %s:%d includes %s" % (f, line, t))

    print("include_graph: %d files, %d modules, %d folders, %d includes: %s"
          % (len(files), len(modules), len(folders), nedges,
             "no circle, every room within its rules" if not errors
             else "%d violation(s)" % errors))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
