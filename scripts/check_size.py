#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that the headers under include/ stay short: no file over 500 lines, no function over 120.

design.md: "Files stay short; split by operation family, not by line count." This script holds the two
numbers. It reads every .hpp, .h, .cuh and .inl under include/, reports each file longer than 500 lines and
each named function or member function (at namespace or class scope) whose definition is longer than 120
lines, counted from the first line of its signature (its `template <...>` line where it has one) to its
closing brace. Lambdas and local classes count as part of the function that holds them. Comments, string
and character literals (raw strings too) are skipped, so braces in them do not count; of a preprocessor
conditional only the first branch is read (the `#if HETMESH_BODIES { body } #else ; #endif` pattern of
config.hpp reads as the body).

CI runs it as the "size check" stage of scripts/test.sh; the before-stop hook calls scripts/check_size*
automatically, so a session that leaves a violation behind hears about it.

Usage: check_size.py [--root REPO] [--list [N]]   exit 0 when within limits, 1 naming every violation
       check_size.py --self-test                  checks the checker on fixtures with known violations
Output: `path:line: function NAME has N lines (limit 120)` and `path: N lines (limit 500)`.
"""

import argparse
import os
import re
import sys
import tempfile

FILE_LIMIT = 500
FUNCTION_LIMIT = 120
HEADER_SUFFIXES = (".hpp", ".h", ".cuh", ".inl")

# One token per match: comments, literals and preprocessor directives are whole tokens (so braces inside
# them are never seen); identifiers, numbers (with digit separators) and the punctuation the scope walker
# reads; anything else is a one-character token that only ends up in a signature.
TOKEN_RE = re.compile(
    r"""
      (?P<ws>[ \t\r\n\f\v]+)
    | (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<pp>(?<![^\n])[ \t]*\#(?:\\\n|[^\n])*)
    | (?P<raw>(?:u8|[uUL])?R"(?P<delim>[^()\\ \t\n]{0,16})\(.*?\)(?P=delim)")
    | (?P<str>(?:u8|[uUL])?"(?:\\.|[^"\\\n])*")
    | (?P<chr>(?:u8|[uUL])?'(?:\\.|[^'\\\n])+')
    | (?P<num>\.?\d(?:'(?=\w)|[\w.]|[eEpP][+-])*)
    | (?P<ident>[A-Za-z_]\w*)
    | (?P<punct>::|->|.)
    """,
    re.S | re.X,
)
PP_COND_RE = re.compile(r"[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b")

# Words before a `(` that do not name a function.
NOT_A_NAME = {
    "requires", "decltype", "noexcept", "sizeof", "alignof", "alignas", "static_assert", "__attribute__",
    "__declspec", "explicit", "if", "for", "while", "switch", "catch", "return", "throw", "typeid",
    "co_await", "co_return", "co_yield", "template", "operator",
}
CLASS_KEYS = {"class", "struct", "union"}


def tokens(text):
    """Yields (kind, text, line) for the code of a header: comments and whitespace dropped, and of each
    preprocessor conditional only the first branch kept (directives themselves dropped)."""
    line = 1
    stack = []  # per open #if: True while its later branches are being skipped
    skipping = 0  # how many enclosing conditionals are in a skipped branch
    for m in TOKEN_RE.finditer(text):
        kind = "raw" if m.lastgroup == "delim" else m.lastgroup
        s = m.group(0)
        start_line = line
        line += s.count("\n")
        if kind in ("ws", "comment"):
            continue
        if kind == "pp":
            c = PP_COND_RE.match(s)
            if not c:
                continue
            d = c.group(1)
            if d in ("if", "ifdef", "ifndef"):
                stack.append(False)
                if skipping:
                    skipping += 1
                    stack[-1] = None  # opened inside a skipped branch
            elif d in ("elif", "else"):
                if stack and stack[-1] is False:
                    stack[-1] = True
                    skipping += 1
            elif d == "endif" and stack:
                top = stack.pop()
                if top is True or top is None:
                    skipping -= 1
            continue
        if skipping:
            continue
        if kind in ("raw", "str", "chr"):
            kind = "lit"
        yield kind, s, start_line


def strip_templates(head):
    """The head without its `template <...>` parameter lists (whose defaults hold `=` and whose
    `class` keywords are not class heads)."""
    out = []
    i = 0
    while i < len(head):
        t = head[i][1]
        if t == "template" and i + 1 < len(head) and head[i + 1][1] == "<":
            depth = 0
            j = i + 1
            while j < len(head):
                u = head[j][1]
                if u == "<":
                    depth += 1
                elif u == ">":
                    depth -= 1
                    if depth == 0:
                        break
                elif u in ("(", "["):  # skip nested brackets whole: `(a > b)` is no closing angle
                    close = ")" if u == "(" else "]"
                    inner = 1
                    while j + 1 < len(head) and inner:
                        j += 1
                        inner += {u: 1, close: -1}.get(head[j][1], 0)
                j += 1
            i = j + 1
            continue
        out.append(head[i])
        i += 1
    return out


def classify(head):
    """What a `{` at namespace or class scope opens, from the tokens since the previous `;`, `{` or `}`:
    ("namespace", name), ("class", name), ("function", name) or ("other", None)."""
    if not head:
        return "other", None
    words = [t for _, t, _ in head]
    if words[0] == "namespace" or (words[0] == "inline" and len(words) > 1 and words[1] == "namespace"):
        names = [t for k, t, _ in head if k == "ident" and t not in ("namespace", "inline")]
        return "namespace", "::".join(names)
    if words[0] == "extern" and len(words) == 2 and head[1][0] == "lit":
        return "namespace", ""
    body = strip_templates(head)
    # The declarator's parameter list: the first `(` at depth 0 that follows a name (an identifier that
    # is no keyword, or an operator), skipping requires-clauses and attribute arguments.
    depth = 0
    name = None
    before_paren = []
    for i, (k, t, _) in enumerate(body):
        if t in ("(", "[", "{"):
            if t == "(" and depth == 0 and i > 0:
                prev = body[i - 1][1]
                op = operator_name(body, i)
                if op:
                    name = op
                elif body[i - 1][0] == "ident" and prev not in NOT_A_NAME:
                    name = prev
                    # a qualified name: `foo::bar(`
                    j = i - 1
                    while j >= 2 and body[j - 1][1] == "::" and body[j - 2][0] == "ident":
                        name = body[j - 2][1] + "::" + name
                        j -= 2
                elif prev == "]" and "=" in [u for _, u, _ in before_paren]:
                    return "other", None  # a lambda bound to a variable
                if name:
                    break
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
        if depth == 0:
            before_paren.append((k, t, _))
    top = [t for _, t, _ in before_paren]
    if "enum" in top or "concept" in top:
        return "other", None
    for idx, t in enumerate(top):
        if t in CLASS_KEYS:
            spelled = []  # the class's (possibly qualified) name: `fmt::formatter`
            for u in top[idx + 1:]:
                if u != "::" and not re.match(r"[A-Za-z_]\w*$", u) or u == "final":
                    break
                spelled.append(u)
            return "class", "".join(spelled) or "(anonymous)"
    if name is None:
        return "other", None
    if "=" in top and not name.startswith("operator"):
        return "other", None  # `x = f(...) {`: not a declarator
    return "function", name


def operator_name(body, i):
    """`operator==(`, `operator()(`, `operator bool(`: the operator's name when body[i] opens its
    parameter list, else None."""
    for j in range(i - 1, max(-1, i - 6), -1):
        if body[j][1] == "operator":
            spelled = "".join(t for _, t, _ in body[j + 1:i])
            if spelled == "" and i + 1 < len(body) and body[i + 1][1] == ")":
                return None  # `operator(` then `)`: the call operator's first `(`; the next `(` is the list
            return "operator" + spelled
        if body[j][1] in (";", "{", "}", "(", ")") and not (body[j][1] == ")" and body[j - 1][1] == "("):
            break
    # `operator()(`: the parameter list follows the `()` that spells the operator
    if i >= 3 and body[i - 1][1] == ")" and body[i - 2][1] == "(" and body[i - 3][1] == "operator":
        return "operator()"
    return None


def is_init_brace(head):
    """Whether a `{` after this function head opens a member initializer (`: a_{x}`, `base<T>{}`) rather
    than the body: the head has a constructor's `:` after its parameter list and ends in a name or `>`."""
    depth = 0
    seen_params = False
    colon = False
    for k, t, _ in head:
        if t in ("(", "[", "{"):
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0 and t == ")":
                seen_params = True
        elif depth == 0 and seen_params and t == ":":
            colon = True
    if not colon:
        return False
    k, t, _ = head[-1]
    return k == "ident" or t == ">"


def scan(text):
    """(name, first line, last line) of every function defined at namespace or class scope."""
    toks = list(tokens(text))
    found = []
    scopes = []  # the names of the enclosing namespaces and classes
    head = []
    i = 0
    n = len(toks)
    while i < n:
        k, t, ln = toks[i]
        if t == ";":
            head = []
        elif t == "}":
            if scopes:
                scopes.pop()
            head = []
        elif t == "{":
            # braces inside a head's parentheses (default arguments, requires-expressions) are head
            paren = sum(1 if u in ("(", "[") else -1 if u in (")", "]") else 0 for _, u, _ in head)
            kind, name = ("other", None) if paren > 0 else classify(head)
            if kind == "function" and is_init_brace(head):
                kind = "other"
                head.append(toks[i])
                i, _ = skip_block(toks, i)
                head.append(toks[i])
                i += 1
                continue
            if kind in ("namespace", "class"):
                scopes.append(name)
                head = []
            else:
                first = head[0][2] if head else ln
                end, last = skip_block(toks, i)
                if kind == "function":
                    qual = [s for s in scopes if s and s != "hetmesh"]
                    qual = [q[len("hetmesh::"):] if q.startswith("hetmesh::") else q for q in qual]
                    found.append(("::".join(qual + [name]), first, last))
                    head = []
                else:
                    head.append(toks[i])
                    head.append(toks[end])
                i = end
        else:
            head.append(toks[i])
        i += 1
    return found


def skip_block(toks, i):
    """From the `{` at toks[i]: the index and line of its matching `}`."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j][1]
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                return j, toks[j][2]
    return len(toks) - 1, toks[-1][2]


def headers(root):
    base = os.path.join(root, "include")
    for dirpath, dirs, files in os.walk(base):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(HEADER_SUFFIXES):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path


def check(root):
    """(violations as printable lines, every function as (lines, path, line, name))."""
    violations = []
    functions = []
    for rel, path in headers(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > FILE_LIMIT:
            violations.append("{}: {} lines (limit {})".format(rel, lines, FILE_LIMIT))
        for name, first, last in scan(text):
            count = last - first + 1
            functions.append((count, rel, first, name))
            if count > FUNCTION_LIMIT:
                violations.append("{}:{}: function {} has {} lines (limit {})".format(
                    rel, first, name, count, FUNCTION_LIMIT))
    return violations, functions


def self_test():
    """Fixtures with known violations (a 121-line function, a 501-line file) and a clean tree beside them;
    each violation is caught, nothing else is, and the lexical traps (braces in comments, strings,
    character literals, raw strings, the HETMESH_BODIES pattern, initializer braces) count nothing."""
    def body(n):  # a function of exactly n lines
        return "inline int f{}() {{\n".format(n) + "  int x = 0;\n" * (n - 2) + "  return x; }\n"
    traps = (
        "// SPDX-License-Identifier: Apache-2.0\n#pragma once\n"
        "namespace a {\n"
        "// a } in a comment {\n/* { } { */\n"
        "inline const char* s = \"}}}{\";\n"
        "inline char c = '{';\n"
        "inline const char* r = R\"x(}}\")x\";\n"
        "inline int big = 1'000'000;\n"
        "template <class T, int N = 3>\n"
        "requires requires(T t) { t.x; }\n"
        "struct holder {\n"
        "  int v{3};\n"
        "  holder(int x) : v{x} { }\n"
        "  bool operator==(const holder&) const = default;\n"
        "  int operator()(int y) const { return y; }\n"
        "};\n"
        "inline auto lam = [](int x) { return x; };\n"
        "int declared(int x)\n#if HETMESH_BODIES\n{\n  return x;\n}\n#else\n;\n#endif\n"
        "}  // namespace a\n")
    clean = {
        "include/ok/traps.hpp": traps,
        "include/ok/short.hpp": "#pragma once\n" + body(FUNCTION_LIMIT) + "\n" * (FILE_LIMIT - 200),
        "include/ok/long_ok.cuh": "\n" * (FILE_LIMIT - 1) + "// end\n",
    }
    bad = dict(clean)
    bad["include/bad/long_fn.hpp"] = "#pragma once\nnamespace hetmesh::b {\nstruct k {\n" + \
        body(FUNCTION_LIMIT + 1) + "};\n}\n"
    bad["include/bad/long_file.hpp"] = "\n" * FILE_LIMIT + "// end\n"
    expected = [
        "include/bad/long_file.hpp: {} lines (limit {})".format(FILE_LIMIT + 1, FILE_LIMIT),
        "include/bad/long_fn.hpp:4: function b::k::f{} has {} lines (limit {})".format(
            FUNCTION_LIMIT + 1, FUNCTION_LIMIT + 1, FUNCTION_LIMIT),
    ]
    ok = True
    for files, want in ((clean, []), (bad, expected)):
        with tempfile.TemporaryDirectory() as root:
            for rel, text in files.items():
                path = os.path.join(root, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            got, functions = check(root)
        if sorted(got) != sorted(want):
            print("self-test: expected\n  {}\ngot\n  {}".format("\n  ".join(want), "\n  ".join(got)))
            ok = False
        if files is clean:
            names = sorted(name for _, rel, _, name in functions if rel.endswith("traps.hpp"))
            expect = ["a::declared", "a::holder::holder", "a::holder::operator()"]
            if names != expect:
                print("self-test: functions in traps.hpp: expected {}, got {}".format(expect, names))
                ok = False
    if not ok:
        return 1
    print("check_size self-test: a {}-line function and a {}-line file caught, the clean tree passes".format(
        FUNCTION_LIMIT + 1, FILE_LIMIT + 1))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="repository root (default: the one holding this script)")
    ap.add_argument("--list", nargs="?", type=int, const=20, metavar="N",
                    help="also print the N longest functions (default 20)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on planted violations")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    violations, functions = check(args.root)
    if args.list:
        print("longest functions:")
        for count, rel, first, name in sorted(functions, key=lambda f: (-f[0], f[1], f[2]))[:args.list]:
            print("  {:5d}  {}:{}: {}".format(count, rel, first, name))
    for v in violations:
        print(v)
    if violations:
        print("check_size: {} violation(s) (files <= {} lines, functions <= {} lines)".format(
            len(violations), FILE_LIMIT, FUNCTION_LIMIT))
        return 1
    print("check_size: include/ within limits (files <= {} lines, functions <= {} lines; {} functions)".format(
        FILE_LIMIT, FUNCTION_LIMIT, len(functions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
