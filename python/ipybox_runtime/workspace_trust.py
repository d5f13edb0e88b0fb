"""A trusted kernel's guard over what a sandboxed kernel wrote (docs/sandbox.md, "Code in the
workspace").

Installed by ``import_path.install`` only in kernels the host trusts (local, neither sandboxed
nor confined), which get the host's trust ledger in ``IPYBOX_TRUST_LEDGER``. A finder in front
of the path finder: every module the path finder finds in a file under a directory some sandboxed
kernel could write (a window of the ledger) is checked before it runs. The file is refused when
its ``ctime``, or that of a link on its path, falls inside such a window, unless the host
generated it or a person accepted it (``ipybox trust``) with exactly this content. A source file
is compiled from the bytes that were checked (never from ``__pycache__``, which the sandboxed
kernel could also have written). The ledger's format is ``src/workspace_trust/ledger.rs``'s.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import stat
import sys
import time
from typing import Any

LEDGER_ENV = "IPYBOX_TRUST_LEDGER"


class UntrustedModuleError(ImportError):
    """A module file a sandboxed kernel may have written, not (yet) accepted."""


class _Ledger:
    def __init__(self, path: str):
        self.path = path
        self._key: Any = None
        self.windows: list = []
        self.roots: list = []
        self.vouched: set = set()

    def load(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._key, self.windows, self.roots, self.vouched = None, [], [], set()
            return
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key == self._key:
            return
        with open(self.path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        windows: dict = {}
        vouched: set = set()
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if not isinstance(rec, dict):
                continue
            if "window" in rec and "start_ns" in rec:
                windows[rec["window"]] = {
                    "start": int(rec["start_ns"]),
                    "end": None,
                    "roots": [str(r) for r in rec.get("roots", [])],
                    "who": str(rec.get("who", "a sandboxed kernel")),
                }
            elif "close" in rec and "end_ns" in rec:
                w = windows.get(rec["close"])
                if w is not None:
                    end = int(rec["end_ns"])
                    w["end"] = end if w["end"] is None else min(w["end"], end)
            elif "generated" in rec and "sha256" in rec:
                vouched.add((str(rec["generated"]), str(rec["sha256"])))
            elif "accepted" in rec and "sha256" in rec:
                vouched.add((str(rec["accepted"]), str(rec["sha256"])))
        self.windows = list(windows.values())
        self.roots = sorted({r for w in self.windows for r in w["roots"]})
        self._key, self.vouched = key, vouched


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _covers(w: dict, t: int) -> bool:
    return t >= w["start"] and (w["end"] is None or t <= w["end"])


def _when(w: dict) -> str:
    def fmt(ns: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))

    end = "still running" if w["end"] is None else fmt(w["end"])
    return f"{fmt(w['start'])} to {end}"


def _suspect(ledger: _Ledger, path: str, opened: os.stat_result) -> Any:
    """The window ``path`` (absolute) was written or linked in, if any."""
    real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    for w in ledger.windows:
        roots = [r for r in w["roots"] if _under(path, r) or _under(real, r)]
        if not roots:
            continue
        times = [opened.st_ctime_ns]
        for p in {path, real}:
            try:
                times.append(os.lstat(p).st_ctime_ns)
            except OSError:
                pass
        for r in roots:
            if not _under(path, r):
                continue
            cur = r
            for part in os.path.relpath(path, r).split(os.sep):
                cur = os.path.join(cur, part)
                try:
                    st = os.lstat(cur)
                except OSError:
                    break
                if stat.S_ISLNK(st.st_mode):
                    times.append(st.st_ctime_ns)
        if any(_covers(w, t) for t in times):
            return w
    return None


def _refusal(path: str, w: dict) -> UntrustedModuleError:
    try:
        # Shown short, as a refused tool call is: the user's frames and the message.
        from ipybox_runtime import install_short_tracebacks

        install_short_tracebacks()
    except Exception:
        pass
    generated = f"{os.sep}mcptools{os.sep}" in path
    regen = (
        "; for a generated module under mcptools/, registering its server again writes it anew"
        if generated
        else ""
    )
    return UntrustedModuleError(
        f"{path} may have been written by {w['who']} (running {_when(w)}), and this kernel is "
        f"not sandboxed: it is not imported until a person accepts it\n"
        f"  help: read it, then run `ipybox trust {path}` (or `ipybox trust DIR` for a whole "
        f"directory){regen}; a sandboxed session imports it as it is"
    )


class _CheckedSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader that compiles exactly the bytes it checked."""

    def __init__(self, fullname: str, path: str, ledger: _Ledger):
        super().__init__(fullname, path)
        self._ledger = ledger

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        data = _checked_bytes(self._ledger, path)
        return compile(data, path, "exec", dont_inherit=True)


def _checked_bytes(ledger: _Ledger, path: str) -> bytes:
    path = os.path.abspath(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        opened = os.fstat(fd)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    ledger.load()
    w = _suspect(ledger, path, opened)
    if w is not None:
        digest = hashlib.sha256(data).hexdigest()
        if not {(path, digest), (os.path.realpath(path), digest)} & ledger.vouched:
            raise _refusal(path, w)
    return data


class _CheckedOtherLoader(importlib.abc.Loader):
    """Wraps a non-source loader (extension module, bytecode file): the file is checked first."""

    def __init__(self, inner: Any, path: str, ledger: _Ledger):
        self._inner = inner
        self._path = path
        self._ledger = ledger

    def create_module(self, spec: Any) -> Any:
        _checked_bytes(self._ledger, self._path)
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TrustFinder(importlib.abc.MetaPathFinder):
    """In front of the path finder: finds what it finds, and checks what lies under a window's
    roots."""

    def __init__(self, ledger: _Ledger):
        self._ledger = ledger
        # Directories' real paths: imports come from few directories, realpath costs an lstat
        # per component.
        self._real_dirs: dict = {}

    def _real(self, path: str) -> str:
        head, tail = os.path.split(path)
        real = self._real_dirs.get(head)
        if real is None:
            real = self._real_dirs[head] = os.path.realpath(head)
        return os.path.join(real, tail)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not spec.has_location or not spec.origin:
            return spec
        self._ledger.load()
        if not self._ledger.roots:
            return spec
        origin = os.path.abspath(spec.origin)
        real = self._real(origin)
        if not any(_under(origin, r) or _under(real, r) for r in self._ledger.roots):
            return spec
        if isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _CheckedSourceLoader(name, spec.origin, self._ledger)
        else:
            spec.loader = _CheckedOtherLoader(spec.loader, spec.origin, self._ledger)
        return spec

    def invalidate_caches(self) -> None:
        self._ledger._key = None
        self._real_dirs.clear()


def install(ledger_path: Any) -> None:
    """Puts the finder in front of the path finder (once). The path finder stays where it is
    (``importlib.metadata`` asks it for distributions); a module neither finds is looked for
    twice, which only a failing import pays."""
    if not ledger_path or any(isinstance(f, TrustFinder) for f in sys.meta_path):
        return
    finder = TrustFinder(_Ledger(ledger_path))
    at = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
        len(sys.meta_path),
    )
    sys.meta_path.insert(at, finder)
