#!/usr/bin/env python3
"""Functions in src/ longer than a limit (default 150 lines), longest first: `fn` items found by
their signature line and measured to the matching closing brace (comments and strings left out).
Exit 1 when any is over, outside the files named with --except (e.g. src/main.rs).
Usage: scripts/long-fns.py [--limit N] [--except PATH ...]"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
arch = __import__("arch-check")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def functions(path):
    code = arch.strip_code(open(path, encoding="utf-8").read())
    for m in re.finditer(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+(\w+)", code, re.M):
        i = m.end()
        # the body: the first `{` at paren depth 0 (before a `;`: a declaration, no body)
        depth = 0
        while i < len(code):
            c = code[i]
            if c in "([<":
                depth += 1
            elif c in ")]>" and depth:
                depth -= 1
            elif c == ";" and depth == 0:
                i = -1
                break
            elif c == "{" and depth == 0:
                break
            i += 1
        if i < 0 or i >= len(code):
            continue
        braces, j = 0, i
        while j < len(code):
            if code[j] == "{":
                braces += 1
            elif code[j] == "}":
                braces -= 1
                if braces == 0:
                    break
            j += 1
        start = code.count("\n", 0, m.start()) + 1
        end = code.count("\n", 0, j) + 1
        yield m.group(1), start, end - start + 1


def main():
    args = sys.argv[1:]
    limit = 150
    skip = set()
    while args:
        a = args.pop(0)
        if a == "--limit":
            limit = int(args.pop(0))
        elif a == "--except":
            while args and not args[0].startswith("--"):
                skip.add(os.path.normpath(args.pop(0)))
    found = []
    for d, _, fs in os.walk(os.path.join(ROOT, "src")):
        for f in fs:
            if f.endswith(".rs"):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, ROOT)
                for name, line, n in functions(p):
                    if n > limit:
                        found.append((n, rel, line, name, rel in skip))
    for n, rel, line, name, skipped in sorted(found, reverse=True):
        print(f"{n:5} {rel}:{line} {name}" + ("  (excepted)" if skipped else ""))
    return 1 if any(not s for *_, s in found) else 0


if __name__ == "__main__":
    sys.exit(main())
