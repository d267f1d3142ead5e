#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the bad-input cases the test suite asserts (issue 17; the figure docs/reliability.md quotes).

A case is one bad input whose test asserts a typed exception naming the field, or exit code 2 with one
line naming the option or line. Counted, per file: each CHECK_THROWS*/REQUIRE_THROWS* assertion; each call
of the tool-running helpers check_refused(...) and check_bad_input(...); each row of a table of bad inputs
(check_all({...}) rows in tests/reliability/plan.cpp, bad{...} rows in tests/tools/tools.cpp). A loop
that asserts one throw over several inputs counts once, so the total is a lower bound.
Usage: python3 scripts/count_bad_inputs.py  (prints a line per file and the total)."""
import pathlib
import re

root = pathlib.Path(__file__).resolve().parent.parent
files = sorted((root / "tests" / "reliability").glob("*.cpp")) + [root / "tests" / "tools" / "tools.cpp"]
total = 0
for f in files:
    text = f.read_text()
    n = len(re.findall(r"\b(?:CHECK|REQUIRE)_THROWS\w*\(", text))
    n += len(re.findall(r"^\s*(?:check_refused|check_bad_input)\(", text, re.M))
    n += len(re.findall(r"\bbad\{", text))
    if f.name == "plan.cpp":  # rows of check_all({...}): lines opening a row
        n += len(re.findall(r"^\s*\{(?:\{\"|zigzag\(|with\(|cmp\()", text, re.M))
    print(f"{f.relative_to(root)}: {n}")
    total += n
print(f"total: {total}")
