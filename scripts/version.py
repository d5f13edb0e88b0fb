#!/usr/bin/env python3
"""The one place a release's version changes (docs/releasing.md).

    python3 scripts/version.py                 prints the version every file carries; fails,
                                               naming each file, when they disagree
    python3 scripts/version.py --tag vX.Y.Z    the same, and the tag must name that version
    python3 scripts/version.py --set X.Y.Z     writes X.Y.Z into every file below

The files: Cargo.toml and crates/ipybox-py/Cargo.toml ([package] version, and their entries in
Cargo.lock), crates/ipybox-py/pyproject.toml (the PyPI package ipybox-rs), each
plugins/*/.claude-plugin/plugin.json, and .claude-plugin/marketplace.json (its metadata and each
plugin). They move together: the plugin launcher runs `uvx --from ipybox-rs==<plugin version>`.
"""

import json
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# X.Y.Z only: Cargo wants semver (1.2.3-rc.1) where PyPI wants PEP 440 (1.2.3rc1), and one string
# must serve both.
VERSION = re.compile(r"^\d+\.\d+\.\d+$")
TOML_PACKAGE = re.compile(r'(?ms)^(\[(?:package|project)\]\n(?:(?!^\[).)*?^version = ")([^"]*)(")')


def rel(path):
    return str(path.relative_to(ROOT))


def toml_files():
    return [ROOT / "Cargo.toml", ROOT / "crates/ipybox-py/Cargo.toml", ROOT / "crates/ipybox-py/pyproject.toml"]


def plugin_files():
    return sorted(ROOT.glob("plugins/*/.claude-plugin/plugin.json"))


MARKETPLACE = ROOT / ".claude-plugin/marketplace.json"
LOCK = ROOT / "Cargo.lock"
LOCK_ENTRY = re.compile(r'(?m)^(name = "(ipybox|ipybox-py)"\nversion = ")([^"]*)(")')


def found():
    out = {}
    for path in toml_files():
        data = tomllib.loads(path.read_text())
        out[rel(path)] = (data.get("package") or data.get("project"))["version"]
    for m in LOCK_ENTRY.finditer(LOCK.read_text()):
        out[f"Cargo.lock ({m.group(2)})"] = m.group(3)
    for path in plugin_files():
        out[rel(path)] = json.loads(path.read_text()).get("version")
    market = json.loads(MARKETPLACE.read_text())
    out[f"{rel(MARKETPLACE)} (metadata)"] = market.get("metadata", {}).get("version")
    for plugin in market["plugins"]:
        out[f"{rel(MARKETPLACE)} ({plugin['name']})"] = plugin.get("version")
    return out


def set_version(new):
    for path in toml_files():
        text, n = TOML_PACKAGE.subn(lambda m: m.group(1) + new + m.group(3), path.read_text(), count=1)
        if n != 1:
            sys.exit(f"version.py: no [package]/[project] version line in {rel(path)}")
        path.write_text(text)
    text, n = LOCK_ENTRY.subn(lambda m: m.group(1) + new + m.group(4), LOCK.read_text())
    if n != 2:
        sys.exit(f"version.py: found {n} of the 2 entries (ipybox, ipybox-py) in Cargo.lock")
    LOCK.write_text(text)
    for path in plugin_files():
        data = json.loads(path.read_text())
        data["version"] = new
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    market = json.loads(MARKETPLACE.read_text())
    market.setdefault("metadata", {})["version"] = new
    for plugin in market["plugins"]:
        plugin["version"] = new
    MARKETPLACE.write_text(json.dumps(market, indent=2, ensure_ascii=False) + "\n")


def main(argv):
    tag = None
    if argv[:1] == ["--set"] and len(argv) == 2:
        if not VERSION.match(argv[1]):
            sys.exit(f"version.py: {argv[1]!r} is not a version X.Y.Z (pre-releases are not supported: Cargo and PyPI spell them differently)")
        set_version(argv[1])
    elif argv[:1] == ["--tag"] and len(argv) == 2:
        tag = argv[1]
    elif argv:
        sys.exit(__doc__)
    versions = found()
    want = versions["crates/ipybox-py/pyproject.toml"]
    wrong = {path: v for path, v in versions.items() if v != want}
    for path, v in wrong.items():
        print(f"version.py: {path} has version {v}, {rel(toml_files()[2])} has {want}", file=sys.stderr)
    if wrong:
        sys.exit(f"version.py: the versions disagree: run `python3 scripts/version.py --set {want}` (or the version you mean)")
    if tag is not None and tag != f"v{want}":
        sys.exit(f"version.py: tag {tag} does not name the version {want}: tag v{want}, or `python3 scripts/version.py --set X.Y.Z` and commit first")
    print(want)


if __name__ == "__main__":
    main(sys.argv[1:])
