#!/usr/bin/env python3
"""Checks that the includes of the code match the map of docs/ARCHITECTURE.md.

The parts table there names, for each part (a folder of src/ with one
header), the parts it depends on; `base` (errors, allocation, assertions) is
below every part and may be left out of the table. This script reads every #include "..." of
src/, tools/cli/ and examples/ and fails, naming file and line, when:
  - a file of one part includes a header of another part that is not that
    part's one header (src/P/P.h);
  - a file of part P includes part Q but the table does not list Q among P's
    dependencies;
  - the table lists a dependency that no file of the part includes (the map
    is stale);
  - a file of tools/cli/ or examples/ includes anything but include/npumoe.h
    and files of its own folder.
Usage: check_layers.py [REPO_ROOT]"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), ".."))
src = os.path.join(root, "src")
problems = []


def read_map():
    """{part: set(dependencies)} from the parts table of ARCHITECTURE.md."""
    path = os.path.join(root, "docs", "ARCHITECTURE.md")
    deps = {}
    row = re.compile(r"^\|\s*`([a-z]+)`\s*\|\s*`src/([a-z]+)/([a-z]+)\.h`\s*\|.*\|\s*([^|]*)\|\s*$")
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if not m:
                continue
            part, folder, header, listed = m.groups()
            if not (part == folder == header):
                problems.append(f"{path}: row '{part}' names header src/{folder}/{header}.h")
            listed = listed.strip()
            listed = re.sub(r"\([^)]*\)", "", listed)  # "moe (types)": a note on the use
            deps[part] = set() if listed in ("-", "") else {d.strip() for d in listed.split(",")}
    if not deps:
        sys.exit(f"{path}: no parts table found")
    return deps


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m:
                yield n, m.group(1)


def resolve(path, name):
    for base in (os.path.dirname(path), src, os.path.join(root, "include")):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(cand):
            return cand
    return None


def sources(folder):
    for dirpath, _, files in os.walk(folder):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.join(dirpath, f)


deps = read_map()
public = os.path.join(root, "include", "npumoe.h")
used = {p: set() for p in deps}
for path in sources(src):
    rel = os.path.relpath(path, src)
    part = rel.split(os.sep)[0]
    if part not in deps:
        problems.append(f"src/{rel}: part '{part}' is not in the map of docs/ARCHITECTURE.md")
        continue
    for n, name in includes(path):
        target = resolve(path, name)
        if target is None:
            problems.append(f"src/{rel}:{n}: cannot find \"{name}\"")
            continue
        if target == public or not target.startswith(src + os.sep):
            continue
        trel = os.path.relpath(target, src)
        tpart = trel.split(os.sep)[0]
        if tpart == part:
            continue
        if trel != f"{tpart}/{tpart}.h":
            problems.append(f"src/{rel}:{n}: includes src/{trel}, which is inside part "
                            f"'{tpart}' (only src/{tpart}/{tpart}.h may be included from outside)")
        if tpart not in deps[part] and tpart != "base":
            problems.append(f"src/{rel}:{n}: part '{part}' includes part '{tpart}', which the "
                            f"map does not list among its dependencies")
        used[part].add(tpart)
for part, listed in sorted(deps.items()):
    for d in sorted(listed - used[part] - {"base"}):
        problems.append(f"docs/ARCHITECTURE.md: '{part}' is said to depend on '{d}', "
                        f"but no file of it includes src/{d}/{d}.h")
for folder in ("tools/cli", "examples"):
    top = os.path.join(root, folder)
    for path in sources(top) if os.path.isdir(top) else ():
        for n, name in includes(path):
            target = resolve(path, name)
            if target != public and (target is None or
                                     os.path.dirname(target) != os.path.dirname(path)):
                problems.append(f"{os.path.relpath(path, root)}:{n}: includes \"{name}\": "
                                f"{folder}/ is built on include/npumoe.h alone")
for p in problems:
    print(p)
print(f"check_layers: {len(problems)} problem(s) in the includes of {root}")
sys.exit(1 if problems else 0)
