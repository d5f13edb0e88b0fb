"""A session snapshot, kernel side: what the model built in this kernel, saved name by name and
loaded back into a fresh kernel.

What is saved: every variable, function and class of the user namespace (IPython's and ipybox's
own names left out), module-valued names by their module's name (imported again on restore), the
modules the cells imported (from the cell history), and the working directory. What cannot be
saved (open files, sockets, threads, generators, locks, objects that refuse to be pickled,
modules that cannot be imported by name) is listed by name with the reason.

Format (``FORMAT``): a data file (``MAGIC``, then one pickle per saved name, then the
out-of-band buffers of all of them: pickle protocol 5, so numpy arrays and pandas frames are
written straight from their memory) and a JSON manifest describing it (per name: type, size,
the byte ranges of its pickle and buffers, its range of pickle memo indices, whether it holds
code). Functions and classes defined in cells are pickled by value with cloudpickle (installed in
the kernel's environment; without it they are named as not saved), everything else by reference or
as data; a function defined in a cell keeps
the live user namespace as its globals after a restore (not a private copy of the names it used).

All names are written by one pickler that keeps its memo from one name to the next, so an
object reachable from two names (``b = a``, an instance and its class, a function stored in a
dict) is written once and is one object again after the restore. That is also why a name that
fails to save restarts the pickling without it (its partial pickle would leave memo entries no
reader sees), and why a name that fails to load marks its memo range as lost: the names that
refer into that range are reported as depending on it instead of being loaded wrong.

The host (``src/snapshot/``) decides where the files go, seals and stores them, and never
unpickles anything; it runs :func:`save_to_socket` and :func:`restore_from_dir` as silent cells.
Standard library only at import (cloudpickle is imported when a snapshot is taken).
"""

from __future__ import annotations

import _thread
import ast
import importlib
import io
import json
import os
import pickle
import pickletools
import platform
import re
import socket
import struct
import sys
import threading
import types

FORMAT = 1
MAGIC = b"IPYBOX-SNAPSHOT\x00\x01\n"
DATA = "data"
MANIFEST = "manifest.json"
REPORT = "report.json"

# Names IPython defines in every user namespace, and dunders (module attributes).
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh", "_sh", "_exit_code"})
_IPYTHON_PATTERN = re.compile(r"_+|_i+|_i\d+|_\d+|__.*__")
_MAX_REASON = 300


def _skipped(name: str, value, hidden: dict) -> bool:
    """IPython's names (history, output cache, helpers), dunders, ipybox's own names."""
    if name in _IPYTHON_NAMES or _IPYTHON_PATTERN.fullmatch(name) or name.startswith("_ipybox"):
        return True
    return name in hidden and hidden[name] is value


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def _type_name(value) -> str:
    if isinstance(value, type):
        return "class"
    if isinstance(value, types.FunctionType):
        return "lambda" if value.__name__ == "<lambda>" else "function"
    return type(value).__qualname__


_FILES = (io.TextIOWrapper, io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom)
_FRAMES = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, types.FrameType)
_LOCKS = (_thread.LockType, _thread.RLock)
# One isinstance check per object the pickler meets (this runs for every non-atomic object).
_REFUSED = _FILES + _FRAMES + _LOCKS + (socket.socket, threading.Thread)


def _refusal(obj) -> str | None:
    """What ``obj`` is, in words, if it is something a snapshot cannot hold (checked for every
    object the pickler meets, not only top-level values)."""
    if not isinstance(obj, _REFUSED):
        cls = type(obj)
        mod = cls.__module__
        if mod == "subprocess" and cls.__name__ == "Popen":
            return "a running process"
        if mod.startswith("asyncio") and cls.__name__ in ("Task", "Future", "_UnixSelectorEventLoop"):
            return "an asyncio task or loop"
        return None
    if isinstance(obj, _FILES):
        state = "closed file" if obj.closed else "open file"
        return f"an {state} ({getattr(obj, 'name', '?')!r}): a file handle belongs to this process"
    if isinstance(obj, socket.socket):
        return "a socket: a network connection belongs to this process"
    if isinstance(obj, threading.Thread):
        return f"a thread ({obj.name}): a running thread cannot be saved"
    if isinstance(obj, types.GeneratorType):
        return "a generator: its paused frame cannot be saved"
    if isinstance(obj, (types.CoroutineType, types.AsyncGeneratorType)):
        return "a coroutine: its paused frame cannot be saved"
    if isinstance(obj, types.FrameType):
        return "a stack frame"
    return "a lock: synchronisation objects belong to this process"


class _Refused(Exception):
    def __init__(self, what: str, top: bool):
        super().__init__(what)
        self.what = what
        self.top = top


class _TooLarge(Exception):
    pass


# The user namespace a restore loads into: what functions defined in cells get as their globals.
_target_ns: dict | None = None


def _user_namespace() -> dict:
    if _target_ns is not None:
        return _target_ns
    return _shell().user_ns


def _shell():
    from IPython import get_ipython

    return get_ipython()


class _Namespace:
    """Stands for the user namespace in a pickle: loads as the restoring kernel's namespace."""

    def __reduce__(self):
        return (_user_namespace, ())


_NAMESPACE = _Namespace()


def _function_state(func, state) -> None:
    """cloudpickle's function state setter, minus its globals: a cell's function uses the live
    namespace (``_Namespace``), which must not be overwritten with a snapshot of the names."""
    state, slotstate = state
    func.__dict__.update(state)
    slotstate.pop("__globals__", None)
    slotstate.pop("_cloudpickle_submodules", None)
    closure = slotstate.pop("__closure__", None)
    if closure is not None:
        for i, cell in enumerate(closure):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            func.__closure__[i].cell_contents = value
    for k, v in slotstate.items():
        setattr(func, k, v)


# What a function or class defined in a cell is refused with when cloudpickle is not usable.
_NO_CLOUDPICKLE = (
    "code defined in a cell: saving it needs cloudpickle 3.x in the kernel's Python "
    "(`pip install 'cloudpickle>=3,<4'`; ipybox's managed environment has it)"
)


def _cloudpickle():
    """The installed cloudpickle if it has what this module uses (3.x), else None."""
    try:
        from cloudpickle import cloudpickle as cp
    except ImportError:
        return None
    needed = ("Pickler", "_should_pickle_by_reference", "_function_getstate", "_make_function")
    if not all(hasattr(cp, n) for n in needed) or not hasattr(cp.Pickler, "_function_getnewargs"):
        return None
    return cp


def _defined_in_cells(obj) -> bool:
    return isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__"


def _pickler_class():
    cp = _cloudpickle()
    if cp is None:
        return _plain_pickler_class()

    class Pickler(cp.Pickler):
        def __init__(self, file, ns, buffer_callback):
            super().__init__(file, protocol=5, buffer_callback=buffer_callback)
            self.ns = ns
            self.top = None
            self.has_code = False

        def reducer_override(self, obj):
            what = _refusal(obj)
            if what is not None:
                raise _Refused(what, obj is self.top)
            if isinstance(obj, types.FunctionType) and obj.__globals__ is self.ns and not cp._should_pickle_by_reference(obj):
                self.has_code = True
                code, _globals, name, argdefs, closure = self._function_getnewargs(obj)
                state, slotstate = cp._function_getstate(obj)
                slotstate["__globals__"] = {}
                # Submodules the code uses stay (they are imported when it loads).
                return (cp._make_function, (code, _NAMESPACE, name, argdefs, closure), (state, slotstate), None, None, _function_state)
            reduced = super().reducer_override(obj)
            if reduced is not NotImplemented and isinstance(obj, (type, types.FunctionType)):
                self.has_code = True
            return reduced

    return Pickler


def _plain_pickler_class():
    """Without cloudpickle: plain pickle, and code defined in cells (functions, classes, and what
    holds them) is refused with the reason instead of being saved by a reference that a new
    kernel could not resolve."""

    class Pickler(pickle.Pickler):
        def __init__(self, file, ns, buffer_callback):
            super().__init__(file, protocol=5, buffer_callback=buffer_callback)
            self.ns = ns
            self.top = None
            self.has_code = False

        def reducer_override(self, obj):
            what = _refusal(obj)
            if what is None and _defined_in_cells(obj):
                what = _NO_CLOUDPICKLE
            if what is not None:
                raise _Refused(what, obj is self.top)
            return NotImplemented

    return Pickler


class _Sink:
    """The data file as the pickler writes it, counting against the size limit."""

    def __init__(self, f, limit: int):
        self.f = f
        self.limit = limit

    def write(self, b) -> int:
        n = len(b) if not isinstance(b, memoryview) else b.nbytes
        if self.f.tell() + n > self.limit:
            raise _TooLarge()
        return self.f.write(b)


def _history_imports(shell) -> list[str]:
    """Modules imported by the cells (``import a.b``, ``from a.b import c``), in order, that are
    imported now: on restore they are imported again before any name is loaded."""
    cells = getattr(shell.history_manager, "input_hist_parsed", None) or shell.user_ns.get("In", [])
    names: list[str] = []
    for cell in cells:
        try:
            tree = ast.parse(cell)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
                names.extend(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
    seen: dict[str, None] = {}
    for n in names:
        m = sys.modules.get(n)
        if m is not None and getattr(m, "__spec__", None) is not None and not n.startswith("ipybox_runtime"):
            seen.setdefault(n, None)
    return list(seen)[:1000]


def _module_refusal(module: types.ModuleType) -> str | None:
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or sys.modules.get(name) is not module or getattr(module, "__spec__", None) is None:
        return "a module that cannot be imported by name (it was made in code, not imported)"
    if name == "__main__":
        return "the __main__ module"
    return None


def save(f, ns: dict, hidden: dict, limit: int) -> dict:
    """Writes the snapshot of ``ns`` to the binary file ``f`` (at most ``limit`` bytes) and returns
    its manifest (without ``cwd`` and ``imports``, which :func:`_save_all` adds)."""
    Pickler = _pickler_class()
    modules: list[dict] = []
    not_saved: dict[str, dict] = {}
    candidates: list[str] = []
    for name, value in list(ns.items()):
        if not isinstance(name, str) or _skipped(name, value, hidden):
            continue
        if not name.isidentifier():
            not_saved[name] = {"name": name, "type": _type_name(value), "reason": "not an identifier"}
        elif isinstance(value, types.ModuleType):
            why = _module_refusal(value)
            if why is None:
                modules.append({"name": name, "module": value.__name__})
            else:
                not_saved[name] = {"name": name, "type": "module", "reason": why}
        elif value is ns:
            not_saved[name] = {"name": name, "type": "dict", "reason": "the namespace itself (globals())"}
        else:
            why = _refusal(value)
            if why is None:
                candidates.append(name)
            else:
                not_saved[name] = {"name": name, "type": _type_name(value), "reason": why}

    while True:  # restarted without a name whenever one fails (see the module comment)
        f.seek(0)
        f.truncate()
        f.write(MAGIC)
        sink = _Sink(f, limit)
        buffers: list = []
        pickler = Pickler(sink, ns, buffers.append)
        records: list[dict] = []
        wrappers: list[list] = []
        failed = None
        for name in candidates:
            if name in not_saved:
                continue
            value = ns[name]
            wrapper = [value]
            buffers.clear()
            pickler.top = value
            pickler.has_code = False
            start = f.tell()
            try:
                pickler.dump(wrapper)
                sizes = [pb.raw().nbytes for pb in buffers]
                end = f.tell()
                if end + sum(sizes) + sum(r["buffer_bytes"] for r in records) > limit:
                    raise _TooLarge()
            except _TooLarge:
                failed = (name, f"too large: the snapshot would pass its limit of {limit} bytes")
            except _Refused as e:
                failed = (name, ("is " if e.top else "holds ") + e.what)
            except RecursionError:
                failed = (name, "nested too deeply to pickle")
            except Exception as e:  # noqa: BLE001 - any object may refuse in any way
                failed = (name, _short(f"cannot be pickled: {type(e).__name__}: {e}"))
            if failed is not None:
                break
            wrappers.append(wrapper)
            records.append(
                {
                    "name": name,
                    "type": _type_name(value),
                    "pickle": [start, end - start],
                    "buffer_list": list(buffers),
                    "buffer_bytes": sum(sizes),
                    "code": pickler.has_code,
                }
            )
        if failed is None:
            break
        name, reason = failed
        not_saved[name] = {"name": name, "type": _type_name(ns[name]), "reason": reason}

    memo = pickler.memo.copy()
    total = len(memo)
    starts = [memo[id(w)][0] for w in wrappers]
    saved = []
    for i, r in enumerate(records):
        ranges = []
        for pb in r.pop("buffer_list"):
            raw = pb.raw()
            ranges.append([f.tell(), raw.nbytes])
            f.write(raw)
        buffer_bytes = r.pop("buffer_bytes")
        r["buffers"] = ranges
        r["bytes"] = r["pickle"][1] + buffer_bytes
        r["memo"] = [starts[i], starts[i + 1] if i + 1 < len(starts) else total]
        saved.append(r)
    f.flush()
    return {
        "format": FORMAT,
        "python": platform.python_version(),
        "modules": modules,
        "saved": saved,
        "not_saved": sorted(not_saved.values(), key=lambda e: e["name"]),
        "data_bytes": f.tell(),
    }


def _save_all(f, shell, limit: int) -> dict:
    manifest = save(f, shell.user_ns, shell.user_ns_hidden, limit)
    try:
        manifest["cwd"] = os.getcwd()
    except OSError:
        manifest["cwd"] = None
    manifest["imports"] = _history_imports(shell)
    return manifest


class _Frames:
    """The data file as the pickler writes it, sent to the host over a Unix socket as frames
    (``src/snapshot/stream.rs``): a kind byte, a little-endian length, the bytes. Small writes are
    gathered up to ``_GATHER``; a large buffer (a numpy array's memory) goes as it is. The only
    seek is back to the start (the pickling starts over without a name that failed), sent as a
    restart frame."""

    _GATHER = 1 << 20

    def __init__(self, sock):
        self.sock = sock
        self.pos = 0
        self.pending = bytearray()

    def _frame(self, kind: int, data) -> None:
        self.sock.sendall(struct.pack("<BQ", kind, len(data)))
        if len(data):
            self.sock.sendall(data)

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = view.nbytes
        if n >= self._GATHER:
            self.flush()
            self._frame(_FRAME_DATA, view)
        else:
            self.pending += view
            if len(self.pending) >= self._GATHER:
                self.flush()
        self.pos += n
        return n

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise io.UnsupportedOperation("a snapshot stream only goes back to its start")
        self.pending.clear()
        self._frame(_FRAME_RESTART, b"")
        self.pos = 0
        return 0

    def truncate(self, size=None) -> int:
        if self.pos != 0 or size not in (None, 0):
            raise io.UnsupportedOperation("a snapshot stream is only emptied at its start")
        return 0

    def flush(self) -> None:
        if self.pending:
            self._frame(_FRAME_DATA, self.pending)
            self.pending = bytearray()

    def finish(self, manifest: dict) -> None:
        self.flush()
        self._frame(_FRAME_MANIFEST, json.dumps(manifest).encode())


_FRAME_DATA, _FRAME_RESTART, _FRAME_MANIFEST = 0, 1, 2


def save_to_socket(path: str, limit: int) -> None:
    """Snapshots this kernel's user namespace and sends it to the host over the Unix socket at
    ``path``, which the host bound for this save: the local-kernel transport, run by the host as
    a silent cell. Nothing is written to a file."""
    shell = _shell()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        out = _Frames(sock)
        manifest = _save_all(out, shell, limit)
        out.finish(manifest)
        sock.shutdown(socket.SHUT_WR)


# Kernels on Jupyter servers share no filesystem with the host: the snapshot travels over the
# stdin channel (``stdin_channel``) in chunks small enough for every server's WebSocket limits.
CHUNK = 4 << 20


def _call(path: str, body: dict) -> dict:
    import ipybox_runtime

    channel = ipybox_runtime._channel
    if channel is None:
        raise RuntimeError("the ipybox stdin channel is not installed in this kernel")
    reply = channel("POST", path, body)
    if "error" in reply:
        raise RuntimeError(f"the host refused the snapshot transfer: {reply['error']}")
    return reply


def save_to_channel(limit: int) -> None:
    """Snapshots this kernel's user namespace and sends it to the host over the stdin channel:
    the data in chunks (``/snapshot/chunk``), then the manifest (``/snapshot/manifest``)."""
    import base64
    import tempfile

    shell = _shell()
    with tempfile.TemporaryFile() as f:
        manifest = _save_all(f, shell, limit)
        f.seek(0)
        offset = 0
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            _call("/snapshot/chunk", {"offset": offset, "data": base64.b64encode(chunk).decode()})
            offset += len(chunk)
    _call("/snapshot/manifest", {"manifest": manifest})


class _Feed:
    """The pickle of the name being loaded, as the unpickler's file (exact reads, no read-ahead,
    so one unpickler can go from one name's pickle to the next)."""

    def __init__(self):
        self.view = memoryview(b"")
        self.pos = 0

    def set(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        out = self.view[self.pos : end].tobytes()
        self.pos = end
        return out

    def readinto(self, b) -> int:
        n = min(len(b), len(self.view) - self.pos)
        memoryview(b).cast("B")[:n] = self.view[self.pos : self.pos + n]
        self.pos += n
        return n

    def readline(self) -> bytes:
        rest = self.view[self.pos :].tobytes()
        i = rest.find(b"\n")
        line = rest if i < 0 else rest[: i + 1]
        self.pos += len(line)
        return line


class _Buffers:
    """The out-of-band buffers of the name being loaded, as the unpickler's ``buffers``."""

    def __init__(self):
        self.it = iter(())

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it)


class _Lost:
    """Fills the memo indices of a name that did not load (see the module comment)."""


_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


class _Loader:
    def __init__(self, f):
        self.f = f
        self.feed = _Feed()
        self.buffers = _Buffers()
        self.unpickler = pickle.Unpickler(self.feed, buffers=self.buffers)
        self.lost: list[tuple[int, int, str]] = []

    def _mark_lost(self, entry: dict) -> None:
        start, end = entry["memo"]
        kept = {i: v for i, v in self.unpickler.memo.copy().items() if i < start}
        kept.update({i: _Lost() for i in range(start, end)})
        self.unpickler = pickle.Unpickler(self.feed, buffers=self.buffers)
        self.unpickler.memo = kept
        self.lost.append((start, end, entry["name"]))

    def _depends_on_lost(self, data: bytes) -> str | None:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in _GETS:
                for start, end, name in self.lost:
                    if start <= arg < end:
                        return name
        return None

    def skip(self, entry: dict) -> None:
        self._mark_lost(entry)

    def load(self, entry: dict):
        """The value of ``entry``; raises ``_NotLoaded`` with the reason if it does not load."""
        off, length = entry["pickle"]
        self.f.seek(off)
        data = self.f.read(length)
        if len(data) != length:
            self._mark_lost(entry)
            raise _NotLoaded("its data is cut short")
        if self.lost:
            other = self._depends_on_lost(data)
            if other is not None:
                self._mark_lost(entry)
                raise _NotLoaded(f"refers to {other}, which did not come back")
        bufs = []
        for boff, blen in entry["buffers"]:
            self.f.seek(boff)
            b = bytearray(blen)
            if self.f.readinto(b) != blen:
                self._mark_lost(entry)
                raise _NotLoaded("its data is cut short")
            bufs.append(b)
        self.feed.set(data)
        self.buffers.it = iter(bufs)
        try:
            wrapper = self.unpickler.load()
        except Exception as e:  # noqa: BLE001 - unpickling runs arbitrary reducers
            self._mark_lost(entry)
            raise _NotLoaded(_short(f"{type(e).__name__}: {e}")) from None
        if not (isinstance(wrapper, list) and len(wrapper) == 1):
            self._mark_lost(entry)
            raise _NotLoaded("its data is not a snapshot record")
        return wrapper[0]


class _NotLoaded(Exception):
    pass


def restore(f, manifest: dict, ns: dict) -> dict:
    """Loads the snapshot ``manifest`` describes from the binary file ``f`` into ``ns`` and returns
    what came back and what did not (the working directory is :func:`restore_from_dir`'s)."""
    global _target_ns
    report: dict = {"restored": [], "failed": [], "modules": [], "imports_failed": []}
    for module in manifest.get("imports", []):
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - an import runs the module's code
            report["imports_failed"].append({"module": module, "reason": _short(f"{type(e).__name__}: {e}")})
    for m in manifest.get("modules", []):
        try:
            ns[m["name"]] = importlib.import_module(m["module"])
            report["modules"].append(m["name"])
        except Exception as e:  # noqa: BLE001
            report["failed"].append({"name": m["name"], "reason": _short(f"import {m['module']} failed: {type(e).__name__}: {e}")})
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not an ipybox snapshot (its data does not start with the snapshot header)")
    same_python = manifest.get("python", "").split(".")[:2] == platform.python_version().split(".")[:2]
    loader = _Loader(f)
    _target_ns = ns
    try:
        for entry in manifest.get("saved", []):
            name = entry["name"]
            if entry.get("code") and not same_python:
                loader.skip(entry)
                report["failed"].append(
                    {
                        "name": name,
                        "reason": f"holds code compiled by Python {manifest.get('python')}, and this kernel runs "
                        f"{platform.python_version()}: run the cell that defined it again",
                    }
                )
                continue
            try:
                ns[name] = loader.load(entry)
                report["restored"].append(name)
            except _NotLoaded as e:
                report["failed"].append({"name": name, "reason": str(e)})
    finally:
        _target_ns = None
    return report


def _restore_all(f, manifest: dict, shell) -> dict:
    cwd = manifest.get("cwd")
    cwd_report = None
    if cwd:
        try:
            os.chdir(cwd)
            cwd_report = {"path": cwd, "restored": True}
        except OSError as e:
            cwd_report = {"path": cwd, "restored": False, "reason": _short(e.strerror or str(e))}
    report = restore(f, manifest, shell.user_ns)
    report["cwd"] = cwd_report
    return report


def restore_from_dir(directory: str, report: str) -> None:
    """Restores the snapshot in ``directory`` (``data``, ``manifest.json``, put there by the host)
    into this kernel and writes the report to ``report`` (a new file): the local-kernel transport."""
    with open(os.path.join(directory, MANIFEST), encoding="utf-8") as m:
        manifest = json.load(m)
    with open(os.path.join(directory, DATA), "rb") as f:
        result = _restore_all(f, manifest, _shell())
    with open(report, "x", encoding="utf-8") as out:
        json.dump(result, out)


def restore_from_channel() -> None:
    """Restores the snapshot the host offers over the stdin channel (``/snapshot/offer``, then
    the data by ``/snapshot/read``) and sends the report back (``/snapshot/report``)."""
    import base64
    import tempfile

    manifest = _call("/snapshot/offer", {})["manifest"]
    total = manifest["data_bytes"]
    with tempfile.TemporaryFile() as f:
        offset = 0
        while offset < total:
            data = base64.b64decode(_call("/snapshot/read", {"offset": offset, "length": min(CHUNK, total - offset)})["data"])
            if not data:
                raise RuntimeError("the host sent no snapshot data")
            f.write(data)
            offset += len(data)
        f.seek(0)
        report = _restore_all(f, manifest, _shell())
    _call("/snapshot/report", {"report": report})
