#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that include/hetmesh/ keeps to its rooms (docs/architecture.md).

Every folder under include/hetmesh/ is a room; a room's headers may include only the rooms the table
below allows (and themselves). The script reads every `#include "..."` and `#include <hetmesh/...>` of
every header, resolves it to a room and reports each include that breaks the table, with the file and
line, the include and the rule. It also reports a room that reaches into another room's `detail::`
namespace (`seq::detail::x` used from balance/): internals stay internal; a helper other rooms need
becomes a public name of its room. `config.hpp` at the top level may be included by anyone; the umbrella
`hetmesh.hpp` and `src.hpp` may include everything. Every header that declares a HETMESH_COMPILED function
must be included by `src.hpp` (else a HETMESH_SEPARATE_COMPILATION build would not define it).

Usage: check_rooms.py [--root REPO]   exit 0 when clean, 1 naming every offence
       check_rooms.py --self-test     checks the checker on a fake tree with known offences
"""

import argparse
import os
import re
import sys
import tempfile

# The rooms table: room -> the rooms its headers may include (besides itself). Keep in step with
# docs/architecture.md.
ROOMS = {
    "core": [],
    "mesh": ["core"],
    "cost": ["core", "mesh"],
    "comm": ["core", "mesh"],
    "seq": ["core", "mesh", "cost"],
    "balance": ["core", "mesh", "cost", "seq"],
    "pipeline": ["core", "cost"],
    "data": ["core", "mesh", "cost", "seq", "balance"],
    "model": ["core", "seq"],
    "run": ["core", "mesh", "comm", "seq", "balance", "pipeline", "data", "model"],
    "train": ["core", "mesh", "cost", "comm", "seq", "balance", "pipeline", "data", "model", "run"],
    "cuda": ["core"],
    "libtorch": ["core", "mesh", "comm", "seq", "model", "run"],
}
ANYONE_MAY_INCLUDE = {"config.hpp"}  # top-level headers every room may include
UMBRELLAS = {"hetmesh.hpp", "src.hpp"}  # top-level headers that may include every room
COMPILED_SOURCE = "src.hpp"  # includes every header with a HETMESH_COMPILED function (separate compilation)
COMPILED_RE = re.compile(r"\bHETMESH_COMPILED\b")
HEADER_SUFFIXES = (".hpp", ".h", ".cuh", ".inl")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(hetmesh/[^>]+)>)')
DETAIL_RE = re.compile(r"\b(?:hetmesh::)?(" + "|".join(ROOMS) + r")(?:::\w+)*?::detail::")
TOP_DETAIL_RE = re.compile(r"(?<![\w:])(?:::)?hetmesh::detail::")


def rule(room):
    allowed = ROOMS[room]
    return "{}/ may include {}".format(room, ", ".join(allowed) if allowed else "std only (no other room)")


def room_of(rel):
    """The room of a path relative to include/hetmesh: its first folder, or None for a top-level file."""
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else None


def strip_comments_and_strings(line):
    line = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)
    return line.split("//", 1)[0]


def check(root):
    """Returns the offences under root/include/hetmesh as printable lines."""
    base = os.path.join(root, "include", "hetmesh")
    offences = []
    compiled = set()  # headers with HETMESH_COMPILED functions
    if not os.path.isdir(base):
        return ["{}: no include/hetmesh folder to check".format(root)]
    for dirpath, dirs, files in os.walk(base):
        dirs.sort()  # a stable report
        for name in sorted(files):
            if not name.endswith(HEADER_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, base).replace(os.sep, "/")
            shown = "include/hetmesh/" + rel
            room = room_of(rel)
            if room is not None and room not in ROOMS:
                offences.append("{}: folder {}/ is not a room of the table; add it to the rooms table "
                                "(scripts/check_rooms.py, docs/architecture.md)".format(shown, room))
                continue
            if room is None and rel not in ANYONE_MAY_INCLUDE | UMBRELLAS:
                offences.append("{}: a top-level header outside every room; expected it in a room folder "
                                "(only config.hpp, the umbrella hetmesh.hpp and src.hpp live at the top)".format(shown))
                continue
            if room is not None:
                with open(path, encoding="utf-8", errors="replace") as f:
                    if COMPILED_RE.search(f.read()):
                        compiled.add(rel)
            in_block_comment = False
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    where = "{}:{}".format(shown, lineno)
                    m = INCLUDE_RE.match(line)
                    if m:
                        offences.extend(check_include(base, dirpath, rel, room, where, m))
                        continue
                    # `detail::` of another room, outside comments and strings.
                    code = line
                    if in_block_comment:
                        if "*/" not in code:
                            continue
                        code = code.split("*/", 1)[1]
                        in_block_comment = False
                    code = strip_comments_and_strings(code)
                    if "/*" in code:
                        code, _, rest = code.partition("/*")
                        in_block_comment = "*/" not in rest
                    if room is None:
                        continue
                    for d in DETAIL_RE.finditer(code):
                        if d.group(1) != room:
                            offences.append(
                                "{}: uses {}, an internal of {}/; expected only public names of other rooms "
                                "(make the helper public in {}/)".format(where, d.group(0), d.group(1), d.group(1)))
                    if room != "core" and TOP_DETAIL_RE.search(code):
                        offences.append(
                            "{}: uses hetmesh::detail::, an internal of core/; expected only public names of "
                            "other rooms".format(where))
    src = os.path.join(base, COMPILED_SOURCE)
    listed = set()
    if os.path.exists(src):
        with open(src, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = INCLUDE_RE.match(line)
                if m and m.group(1):
                    listed.add(os.path.normpath(m.group(1)).replace(os.sep, "/"))
    for rel in sorted(compiled - listed):
        offences.append("include/hetmesh/{}: declares HETMESH_COMPILED functions but include/hetmesh/{} does not "
                        "include it; expected #include \"{}\" there (separate compilation would not define "
                        "them)".format(rel, COMPILED_SOURCE, rel))
    return offences


def check_include(base, dirpath, rel, room, where, m):
    quoted, angled = m.group(1), m.group(2)
    text = '"{}"'.format(quoted) if quoted else "<{}>".format(angled)
    if quoted:
        target = os.path.normpath(os.path.join(dirpath, quoted))
    else:
        target = os.path.normpath(os.path.join(base, angled[len("hetmesh/"):]))
    target_rel = os.path.relpath(target, base).replace(os.sep, "/")
    if target_rel.startswith("../"):
        if quoted and not os.path.exists(target):
            return []  # a system or third-party header spelled with quotes: not ours to judge
        return ["{}: includes {}, outside include/hetmesh/; expected hetmesh headers only".format(where, text)]
    target_room = room_of(target_rel)
    if room is None:  # a top-level file
        if rel in UMBRELLAS:
            return []
        if target_rel in ANYONE_MAY_INCLUDE:
            return []
        return ["{}: includes {} ({}); config.hpp includes nothing of hetmesh".format(where, text, target_rel)]
    if target_room is None:
        if target_rel in ANYONE_MAY_INCLUDE:
            return []
        return ["{}: includes {} ({}), an umbrella; rooms include the headers they need, not the "
                "umbrella".format(where, text, target_rel)]
    if target_room == room or target_room in ROOMS[room]:
        return []
    if target_room not in ROOMS:
        return ["{}: includes {} ({}), in {}/, which is not a room of the table".format(
            where, text, target_rel, target_room)]
    return ["{}: includes {} ({}): {}".format(where, text, target_rel, rule(room))]


def self_test():
    """Builds a fake tree with known offences and checks that each is caught, and nothing else."""
    files = {
        "config.hpp": "#pragma once\n",
        "hetmesh.hpp": '#include "config.hpp"\n#include "comm/c.hpp"\n#include "data/d.hpp"\n',
        "core/e.hpp": '#include "../config.hpp"\n#include <vector>\n',
        "comm/c.hpp": '#include "../core/e.hpp"\nnamespace hetmesh::comm::detail { int x; }\n',
        "cuda/h.hpp": '#include "../comm/c.hpp"\n',  # offence 1: cuda/ includes comm/
        "seq/s.hpp": ('#include "../core/e.hpp"\nnamespace hetmesh::seq::detail { int y; }\n'
                      "HETMESH_COMPILED int listed();\n"),  # in src.hpp: fine
        "src.hpp": '#include "seq/s.hpp"\n',
        "mesh/m.hpp": "HETMESH_COMPILED int unlisted();\n",  # offence 7: not in src.hpp
        "data/d.hpp": ('#include "../comm/c.hpp"\n'  # offence 2: data/ includes comm/
                       '#include "../balance/b.hpp"\n'
                       "// seq::detail::y in a comment is fine\n"
                       'const char* s = "seq::detail::y";\n'),
        "balance/b.hpp": ('#include "../seq/s.hpp"\n'
                          "#include <hetmesh/pipeline/p.hpp>\n"  # offence 3: balance/ includes pipeline/
                          "int z = seq::detail::y;\n"),  # offence 4: another room's detail
        "pipeline/p.hpp": '#include "../hetmesh.hpp"\n',  # offence 5: a room includes the umbrella
        "run/r.hpp": ('#include "../comm/c.hpp"\n#include "../data/d.hpp"\n'
                      "int w = comm::detail::x;\n"),  # offence 6
    }
    expected = [
        ("cuda/h.hpp:1", "cuda/ may include core"),
        ("data/d.hpp:1", "data/ may include core, mesh, cost, seq, balance"),
        ("balance/b.hpp:2", "balance/ may include core, mesh, cost, seq"),
        ("balance/b.hpp:3", "seq::detail::"),
        ("pipeline/p.hpp:1", "umbrella"),
        ("run/r.hpp:3", "comm::detail::"),
        ("mesh/m.hpp", "does not include it"),
    ]
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, "include", "hetmesh", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        got = check(root)
    ok = len(got) == len(expected)
    for loc, what in expected:
        if not any(("include/hetmesh/" + loc + ":") in g and what in g for g in got):
            print("self-test: the offence at {} ({}) was not reported".format(loc, what))
            ok = False
    if not ok:
        print("self-test: reported:\n  " + "\n  ".join(got))
        return 1
    print("check_rooms self-test: all {} planted offences caught, nothing else reported".format(len(expected)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="repository root (default: the one holding this script)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on planted offences")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    offences = check(args.root)
    for o in offences:
        print(o)
    if offences:
        print("check_rooms: {} offence(s) against the rooms table (docs/architecture.md)".format(len(offences)))
        return 1
    print("check_rooms: include/hetmesh keeps to its rooms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
