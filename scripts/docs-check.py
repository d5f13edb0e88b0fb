#!/usr/bin/env python3
"""The docs check (scripts/test.sh runs it right after `cargo build --bin ipybox`).

    python3 scripts/docs-check.py [IPYBOX_BINARY]     (default target/debug/ipybox)

Checks README.md and docs/*.md:
  1. every relative link resolves: the file or directory exists, and a `#anchor` (in the same
     page or another .md page) names a heading there, slugged as GitHub does (lower case, every
     character that is not a letter, digit, space, `-` or `_` dropped, spaces to `-`, a repeated
     slug gets `-1`, `-2`, ...), or an explicit `<a id=...>`/`<a name=...>`;
  2. every `--flag` the docs name exists in the `--help` of the ipybox binary (`ipybox --help`
     and `ipybox <sub> --help` for each subcommand it lists), unless it is listed in FOREIGN
     below as another tool's flag (cargo, claude, docker, bwrap, ...);
  3. no user doc names a test function (`module::test_name`, or a test's name alone): what a
     test shows is said in words; test names, measurement logs and history belong to the
     developers' pages (DEV_PAGES: docs/architecture.md, docs/benchmarks.md, docs/releasing.md).
Exits 1 with one line per problem (file:line: what is wrong); prints a one-line summary when all
is well. Standard library only.
"""
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Flags of other programs that the docs quote, with the program they belong to. A flag here is
# never checked against ipybox's --help; keep the list to flags the docs really use.
FOREIGN = {
    # cargo / rustc / test harness
    "--bench": "cargo", "--release": "cargo", "--test": "cargo", "--bin": "cargo",
    "--all-targets": "cargo", "--locked": "cargo", "--no-run": "cargo", "--path": "cargo install",
    "--git": "cargo install", "--target": "cargo", "--nocapture": "test harness",
    "--test-threads": "test harness", "--list": "test harness", "--zig": "maturin",
    "--no-deps": "cargo/pip", "--workspace-all": "cargo",
    # uv / pip / python
    "--from": "uvx", "--find-links": "pip/uv", "--index-url": "pip/uv", "--only-binary": "pip",
    "--offline": "uv", "--refresh": "uv", "--no-config": "uv", "--user": "pip",
    "--strict": "pip check/pytest", "--check": "cargo fmt/ruff", "--async": "python bench",
    "--rounds": "bench script", "--variant": "bench script", "--ignore-missing": "sha256sum",
    "--compatibility": "maturin", "--tag": "gh/git", "--verify-tag": "gh release",
    # claude / MCP clients
    "--transport": "claude mcp add", "--header": "claude mcp add", "--allowedTools": "claude -p",
    "--resume": "claude", "--continue": "claude", "--settings": "claude", "--mcp-config": "claude",
    "--permission-mode": "claude", "--dangerously-skip-permissions": "claude", "--debug": "claude",
    "--spec": "conformance runner",
    # scripts of this repository
    "--graph": "scripts/arch-check.py", "--pip": "scripts/freeact-check.sh",
    "--overrides": "uv pip install",
    # docker / podman / kubernetes / helm
    "--rm": "docker", "--network": "docker", "--ulimit": "docker", "--runtime": "docker",
    "--pull": "docker", "--docker": "build script", "--base": "docker/build.sh",
    "--set": "helm", "--namespace": "kubectl", "--reference": "docker/build.sh",
    "--binary": "docker/build.sh", "--ca-bundle": "docker/build.sh",
    "--opt": "podman", "--profile": "docker/build.sh", "--overlay": "fuse/podman",
    # bubblewrap / util-linux
    "--unshare-net": "bwrap", "--unshare-pid": "bwrap", "--unshare-user": "bwrap",
    "--die-with-parent": "bwrap", "--ro-bind": "bwrap", "--new-session": "bwrap",
    # Jupyter / Enterprise Gateway traitlets
    "--EnterpriseGatewayApp": "jupyter", "--MappingKernelManager": "jupyter",
    "--ZMQChannelsWebsocketConnection": "jupyter", "--InteractiveShell": "ipython",
    "--HistoryManager": "ipython",
    # curl
    "--POST": "curl -X", "--data": "curl",
    # not a flag: the demo's expected output (`Ada --collaborated with--> Charles`)
    "--collaborated": "examples/memory_demo.py output",
}

# Pages for the project's developers, which may name tests (check 3 skips them).
DEV_PAGES = {"architecture.md", "benchmarks.md", "releasing.md"}

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)")
HTML_ID = re.compile(r"<a\s+[^>]*(?:id|name)=[\"']([^\"']+)[\"']", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FLAG = re.compile(r"(?<![A-Za-z0-9_/.=-])--([A-Za-z][A-Za-z0-9-]*[A-Za-z0-9])")


def strip_code(line):
    """The line with inline code spans removed (for links: a link in code is not a link)."""
    return re.sub(r"(`+)(.+?)\1", "", line)


def prose_lines(text):
    """(lineno, line, in_fence) for every line, fences marked."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark[0] * len(mark)
                yield n, line, True
                continue
            if mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
                yield n, line, True
                continue
        yield n, line, fence is not None


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links/images -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    text = text.strip().lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in ("L", "N") or cat == "Mn":
            out.append("-" if ch == " " else ch)
    return "".join(out)


_anchors = {}


def anchors(path):
    if path not in _anchors:
        found, seen = set(), {}
        for _, line, fenced in prose_lines(path.read_text(encoding="utf-8")):
            if fenced:
                continue
            for m in HTML_ID.finditer(line):
                found.add(m.group(1))
            h = HEADING.match(line)
            if h:
                s = slug(h.group(2))
                if s in seen:
                    seen[s] += 1
                    found.add(f"{s}-{seen[s]}")
                else:
                    seen[s] = 0
                    found.add(s)
        _anchors[path] = found
    return _anchors[path]


def check_links(doc, problems):
    for n, line, fenced in prose_lines(doc.read_text(encoding="utf-8")):
        if fenced:
            continue
        bare = strip_code(line)
        targets = [m.group(1) for m in LINK.finditer(bare)]
        targets += [m.group(1) for m in IMAGE.finditer(bare)]
        m = REFDEF.match(bare)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            where = f"{doc.relative_to(ROOT)}:{n}"
            dest = doc if not path_part else (doc.parent / path_part).resolve()
            if not dest.exists():
                problems.append(f"{where}: link to {target}: {path_part} does not exist")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix.lower() != ".md":
                    problems.append(f"{where}: link to {target}: an anchor into a non-Markdown target")
                elif anchor not in anchors(dest):
                    problems.append(
                        f"{where}: link to {target}: no heading in {dest.relative_to(ROOT)} "
                        f"has the anchor #{anchor}")


def help_flags(binary):
    def run(*args):
        out = subprocess.run([str(binary), *args, "--help"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=60)
        if out.returncode != 0:
            sys.exit(f"docs-check: `{binary} {' '.join(args)} --help` exited {out.returncode}:\n"
                     f"{out.stderr}")
        return out.stdout

    top = run()
    subs, in_commands = [], False
    for line in top.splitlines():
        if line.strip().lower().startswith("commands:"):
            in_commands = True
            continue
        if in_commands:
            m = re.match(r"^\s{2}([a-z][a-z0-9-]*)\s", line)
            if m:
                if m.group(1) != "help":
                    subs.append(m.group(1))
            elif line.strip() and not line.startswith(" "):
                in_commands = False
    if not subs:
        sys.exit(f"docs-check: found no subcommands in `{binary} --help`; is it the ipybox binary?")
    flags = set(FLAG.findall(top))
    for sub in subs:
        flags |= set(FLAG.findall(run(sub)))
    return flags, subs


def check_flags(doc, known, problems):
    for n, line, _ in prose_lines(doc.read_text(encoding="utf-8")):
        # a URL's path or a command-line of `--x=...` still names the flag --x
        for name in FLAG.findall(re.sub(r"https?://\S+", "", line)):
            flag = f"--{name}"
            if name in known or flag in FOREIGN:
                continue
            problems.append(f"{doc.relative_to(ROOT)}:{n}: {flag} is in no `ipybox [SUB] --help` "
                            f"(if it is another program's flag, add it to FOREIGN in "
                            f"scripts/docs-check.py)")


def test_names():
    """Names of the integration tests (functions under #[test] / #[tokio::test] in
    tests/integration/) with at least two underscores (a one-word test name is a common word),
    and the test modules."""
    names, mods = set(), set()
    attr = re.compile(r"#\[(?:tokio::)?test[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?(?:async\s+)?"
                      r"fn\s+(\w+)")
    for f in sorted((ROOT / "tests/integration").glob("*.rs")):
        mods.add(f.stem)
        for name in attr.findall(f.read_text(encoding="utf-8")):
            if name.count("_") >= 2:
                names.add(name)
    return names, mods


def check_test_names(doc, names, mods, problems):
    for n, line, _ in prose_lines(doc.read_text(encoding="utf-8")):
        found = [w for w in re.findall(r"\b[a-z_][a-z0-9_]*\b", line) if w in names]
        found += [m.group(0) for m in re.finditer(r"\b([a-z_0-9]+)::([a-z_0-9]+)", line)
                  if m.group(1) in mods and m.group(2).count("_") >= 2]
        for name in dict.fromkeys(found):
            problems.append(f"{doc.relative_to(ROOT)}:{n}: names the test {name}: say what it "
                            f"shows in words (test names belong in docs/benchmarks.md or the tests)")


def main():
    binary = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target/debug/ipybox"
    if not binary.exists():
        sys.exit(f"docs-check: {binary} does not exist; build it (`cargo build --bin ipybox`) or "
                 f"pass the binary's path")
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    known, subs = help_flags(binary)
    names, mods = test_names()
    problems = []
    for doc in docs:
        check_links(doc, problems)
        check_flags(doc, known, problems)
        if doc.name not in DEV_PAGES:
            check_test_names(doc, names, mods, problems)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"docs-check: {len(problems)} problem(s) in README.md and docs/*.md", file=sys.stderr)
        sys.exit(1)
    print(f"docs-check: {len(docs)} pages, links and anchors resolve, every --flag is in "
          f"`ipybox --help` or `ipybox {{{','.join(subs)}}} --help`, no user page names one of "
          f"{len(names)} tests")


if __name__ == "__main__":
    main()
