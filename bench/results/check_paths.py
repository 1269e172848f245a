#!/usr/bin/env python3
"""Checks that every `bench/results/...` path cited in a Markdown file names committed files.

Usage (from the repository root): python3 bench/results/check_paths.py [FILE ...]
(default: bench/results/LOG.md). A citation is a `...`-quoted path starting with bench/results/;
it may hold shell braces ({a,b}, expanded first) and * or ? globs, and each expansion must match
at least one file. Placeholders such as `bench/results/runs/<date>/` (with < >) are not citations. Prints every path that matches nothing and exits 1 if there is one.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from typing import List


def expand_braces(pattern: str) -> List[str]:
    """`a{b,c}d{,e}` -> [abd, abde, acd, acde] (innermost-first, like the shell)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    out: List[str] = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(pattern[: m.start()] + alt + pattern[m.end():]))
    return out


def missing_paths(markdown: str, root: str) -> List[str]:
    missing = []
    for cited in re.findall(r"`(bench/results/[^`\s<>]+)`", markdown):
        for path in expand_braces(cited):
            if not glob.glob(os.path.join(root, path)):
                missing.append(path if path == cited else f"{path} (from {cited})")
    return missing


def main(argv: List[str]) -> int:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = argv or [os.path.join(root, "bench", "results", "LOG.md")]
    status = 0
    for name in files:
        with open(name, encoding="utf-8") as f:
            text = f.read()
        cited = len(re.findall(r"`bench/results/[^`\s<>]+`", text))
        missing = missing_paths(text, root)
        for path in missing:
            print(f"{name}: {path} does not exist")
        print(f"{name}: {cited} citations, {len(missing)} missing")
        status |= 1 if missing else 0
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
