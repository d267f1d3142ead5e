#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that docs/tutorial.md quotes examples/custom_model as it is.

Every ```cpp block that follows a line `<!-- quoted from examples/custom_model/FILE -->` must appear in FILE
as consecutive lines (leading and trailing spaces and blank lines aside, so an excerpt may be dedented).
Exit 0 when every quote matches (and there is at least one), 1 naming each quote that does not.
Usage: check_tutorial.py [REPO_ROOT]
"""
import pathlib
import re
import sys

MARK = re.compile(r"^<!-- quoted from (examples/custom_model/[\w./-]+) -->$")


def lines_of(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def contains(haystack, needle):
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    tutorial = (root / "docs" / "tutorial.md").read_text().splitlines()
    quotes, bad = 0, []
    i = 0
    while i < len(tutorial):
        m = MARK.match(tutorial[i].strip())
        i += 1
        if not m:
            continue
        if i >= len(tutorial) or tutorial[i].strip() != "```cpp":
            bad.append(f"docs/tutorial.md:{i}: the quote mark is not followed by a ```cpp block")
            continue
        start = i + 1
        end = start
        while end < len(tutorial) and tutorial[end].strip() != "```":
            end += 1
        block = lines_of("\n".join(tutorial[start:end]))
        source = root / m.group(1)
        quotes += 1
        if not source.is_file():
            bad.append(f"docs/tutorial.md:{start}: quotes {m.group(1)}, which does not exist")
        elif not block or not contains(lines_of(source.read_text()), block):
            bad.append(f"docs/tutorial.md:{start}: the quote of {m.group(1)} is not in that file "
                       f"(first line: {block[0] if block else '(empty)'})")
        i = end + 1
    for b in bad:
        print(b)
    if quotes == 0:
        print("docs/tutorial.md quotes nothing from examples/custom_model")
        return 1
    print(f"{quotes} quotes checked, {len(bad)} out of date")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
