#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""No type name defined in two rooms (issue 32: one vocabulary).

Lists, per room (a folder of include/hetmesh/), the types its headers define at namespace scope --
`struct NAME {`, `class NAME {`, `union NAME {`, `enum [class] NAME {` and `using NAME = ...;` -- outside
any `detail` namespace, and fails when one name is defined in two rooms (data::step_batch beside
model::step_batch reads as one type in a user's code and is two). Forward declarations, specialisations
(`struct hash<T>`, `struct fmt::formatter<T>`), members of classes, names inside functions and re-exports
(`using link = mesh::link;`: the other room's type under its own name, not a second type) are skipped. A name defined twice in one room (an alias in one namespace of the type in another) is that
room's business. Stdlib only; reads comments and string literals as blanks.

Usage: check_names.py [--root REPO] [--list]   exit 0 when no name repeats, 1 naming each repeat and where
       check_names.py --self-test              checks the checker on a fake tree with known repeats
"""
import argparse
import os
import re
import sys
import tempfile

TYPE_HEAD = re.compile(
    r"\b(?:struct|class|union)\s+(?:\[\[[^\]]*\]\]\s*)?(?:alignas\s*\([^)]*\)\s*)?(\w+)\s*(?:final\s*)?"
    r"(?::(?!:)[^{;]*)?$")
ENUM_HEAD = re.compile(r"\benum\s+(?:class\s+|struct\s+)?(\w+)\s*(?::\s*[\w:\s]+)?$")
USING = re.compile(r"\busing\s+(\w+)\s*(?:\[\[[^\]]*\]\]\s*)?=\s*(.*)$")
REEXPORT = re.compile(r"^(?:typename\s+)?(?:::)?(?:\w+::)+(\w+)$")
NAMESPACE_HEAD = re.compile(r"\b(?:inline\s+)?namespace\s*([\w:]*)\s*(?:\[\[[^\]]*\]\]\s*)?$")


def strip(text):
    """`text` with comments, string and character literals and preprocessor lines blanked (newlines kept,
    so positions still give line numbers)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        m = re.match(r'R"([^(\s]*)\(', text[i:i + 20]) if c == "R" and (i == 0 or not text[i - 1].isalnum()) \
            else None
        if m:
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator (1'000)
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
            continue
        out.append(c)
        at_line_start = c == "\n" or (at_line_start and c in " \t")
        i += 1
    return "".join(out)


def definitions(text):
    """(name, line) of each type `text` defines at namespace scope outside `detail` namespaces."""
    s = strip(text)
    found = []
    stack = []  # per open brace: ("ns", name) or ("other", "")
    head_start = 0

    def at_namespace_scope():
        return all(kind == "ns" for kind, _ in stack) and not any(
            part == "detail" for kind, name in stack for part in name.split("::"))

    def line_of(pos):
        return s.count("\n", 0, pos) + 1

    for i, c in enumerate(s):
        if c not in "{};":
            continue
        head = " ".join(s[head_start:i].split())
        if c == "{":
            ns = NAMESPACE_HEAD.search(head)
            if ns and not re.search(r"[=(]", head):
                stack.append(("ns", ns.group(1)))
            elif head.startswith('extern') and head.endswith('"'):
                stack.append(("ns", ""))  # extern "C" { ... }: transparent
            else:
                if at_namespace_scope():
                    m = TYPE_HEAD.search(head) or ENUM_HEAD.search(head)
                    if m and "(" not in head[m.start():] and "=" not in head[m.start():]:
                        found.append((m.group(1), line_of(head_start + len(s[head_start:i]) - len(
                            s[head_start:i].lstrip()))))
                stack.append(("other", ""))
        elif c == "}":
            if stack:
                stack.pop()
        elif c == ";":
            if at_namespace_scope():
                m = USING.search(head)
                target = REEXPORT.match(m.group(2).strip()) if m else None
                if m and target and target.group(1) == m.group(1):
                    m = None  # `using link = mesh::link;`: the other room's type, re-exported, not a second one
                if m and not head.startswith("using namespace"):
                    found.append((m.group(1), line_of(head_start + len(s[head_start:i]) - len(
                        s[head_start:i].lstrip()))))
        head_start = i + 1
    return found


def scan(root):
    """{name: [(room, path, line)]} over include/hetmesh/<room>/ (top-level headers belong to no room)."""
    base = os.path.join(root, "include", "hetmesh")
    names = {}
    for room in sorted(os.listdir(base)):
        folder = os.path.join(base, room)
        if not os.path.isdir(folder):
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith((".hpp", ".cuh", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                for name, line in definitions(text):
                    names.setdefault(name, []).append((room, os.path.relpath(path, root), line))
    return names


def repeats(names):
    """Lines naming each name defined in more than one room."""
    out = []
    for name in sorted(names):
        rooms = sorted({room for room, _, _ in names[name]})
        if len(rooms) > 1:
            where = ", ".join("{}:{} ({}::)".format(p, l, r) for r, p, l in names[name])
            out.append("{}: defined in {} rooms ({}): {}".format(name, len(rooms), ", ".join(rooms), where))
    return out


def self_test():
    files = {
        "a/x.hpp": "namespace hetmesh::a {\nstruct item { int x; };\nclass plan final : base {};\n"
                   "using tokens = int;\nenum class kind { p, q };\nstruct fwd;\n"
                   "namespace detail { struct hidden {}; }\ntemplate <class T> struct box { struct inner {}; };\n"
                   "inline int f() { struct local {}; return 0; }\n}\n",
        "b/y.hpp": "// struct item { } in a comment\nnamespace hetmesh::b {\nstruct item {};\n"
                   "template <class T>\nusing plan = T;\nenum kind : int { r };\n"
                   "const char* s = \"struct box {\";\nnamespace detail { struct hidden {}; }\n"
                   "template <> struct box<int> {};\nstruct inner {};\n}\n",
        "c/z.hpp": "#define X struct item {}\nnamespace hetmesh::c::detail { struct item {}; }\n"
                   "namespace hetmesh::c { using namespace std; using std::size_t; struct unique_c {}; }\n"
                   "namespace hetmesh::c { using item2 = a::item; using plan = hetmesh::a::plan; }\n"
                   "template <> struct fmt::formatter<hetmesh::c::unique_c> : base {};\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            path = os.path.join(tmp, "include", "hetmesh", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
        found = repeats(scan(tmp))
    got = sorted(line.split(":")[0] for line in found)
    # b's namespace-scope `inner` repeats nothing: a's is a member of box; box<int> is a specialisation.
    expected = ["item", "kind", "plan"]
    if got != expected:
        print("check_names self-test FAILED: expected repeats {}, got {}".format(expected, got))
        for line in found:
            print("  " + line)
        return 1
    print("check_names self-test: all {} planted repeats caught, nothing else reported".format(len(expected)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--list", action="store_true", help="print every room's names too")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    names = scan(args.root)
    if args.list:
        by_room = {}
        for name, places in names.items():
            for room, _, _ in places:
                by_room.setdefault(room, set()).add(name)
        for room in sorted(by_room):
            print("{}: {}".format(room, " ".join(sorted(by_room[room]))))
    found = repeats(names)
    for line in found:
        print(line)
    if found:
        print("check_names: {} type name(s) defined in more than one room; rename one side "
              "(CHANGELOG: old name -> new name)".format(len(found)))
        return 1
    print("check_names: {} type names, none defined in two rooms".format(len(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
