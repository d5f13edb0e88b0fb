"""What the Python-side checks share: `check:` lines, the tally, tool-result text."""

results: list[bool] = []


def check(name, actual, expected):
    """Records and prints one check: `actual` must equal `expected`."""
    ok = actual == expected
    results.append(ok)
    print(f"check: {name} ... {'ok' if ok else 'FAIL'}")
    if not ok:
        print(f"    expected: {expected!r}\n    actual:   {actual!r}")


def summary() -> int:
    """Prints `N passed, M failed`; returns M."""
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return failed


def text(result):
    """The text content of a `tools/call` result."""
    return "\n".join(c.text for c in result.content if c.type == "text")
