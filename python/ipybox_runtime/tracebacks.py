"""Short errors for failed tool calls: a ``ToolRunnerError`` (rejected, declined, timed out,
refused, or the tool's own error) that reaches the top of a cell is shown as the frames of the
user's own code and the error, not IPython's ~25 lines of ipybox's plumbing; and so is an
``UntrustedModuleError`` (a workspace module a sandboxed kernel wrote, refused by a trusted
kernel's import: ``workspace_trust``).

Installed into the running IPython shell as its custom exception handler
(``InteractiveShell.set_custom_exc``) the first time a tool is called or a tool module is
imported (``ipybox_runtime.install_short_tracebacks``); a kernel forked from a template that
imported this package before any shell existed installs it then. A shell that already has a
custom handler of someone else's keeps it.

What is shown::

    Traceback (most recent call last):
      Cell In[1], line 5
        print(total(1, 2))
      Cell In[1], line 3, in total
        return add.run(add.Params(a=a, b=b)).sum
    ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: declined by the user
      help: the call was not made, and the cell stopped there (what ran before it stands); do not make it again unless the user asks for it

Hidden frames: this package (the tool runner, the shell guard), the ``run``/``run_async`` of
generated tool modules (``mcptools.<server>.<tool>``), IPython and ipykernel (all by module
name), and the standard library (by path). The error line is ``<class>: <message>`` exactly as ``str()`` gives it (code and prompts
written for Python ipybox match on it); the ``help:`` line is added when the message has none.
Standard library only; not the place that decides what a message says (the host does).
"""

from __future__ import annotations

import linecache
import os
import sysconfig
import types
from typing import Any

_STDLIB_DIRS: tuple[str, ...] | None = None

# Modules whose frames are never the user's (by their module name: on a remote kernel this
# package is loaded from source the host sent, without files).
_HIDDEN_MODULES = ("ipybox_runtime", "IPython", "ipykernel")


def _stdlib_dirs() -> tuple[str, ...]:
    global _STDLIB_DIRS
    if _STDLIB_DIRS is None:
        dirs = {sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib")}
        _STDLIB_DIRS = tuple(os.path.abspath(d).rstrip(os.sep) + os.sep for d in dirs if d)
    return _STDLIB_DIRS


def _is_plumbing(frame: types.FrameType) -> bool:
    """Whether ``frame`` is ipybox's, IPython's or the standard library's, not the user's."""
    module = frame.f_globals.get("__name__") or ""
    if any(module == m or module.startswith(m + ".") for m in _HIDDEN_MODULES):
        return True
    filename = frame.f_code.co_filename
    if not filename.startswith("<") and os.path.abspath(filename).startswith(_stdlib_dirs()):
        return True
    # A generated tool module's run()/run_async(): `mcptools.<server>.<tool>` with a ToolRunner.
    if frame.f_code.co_name in ("run", "run_async") and module.startswith("mcptools."):
        from . import ToolRunner

        return isinstance(frame.f_globals.get("runner"), ToolRunner)
    return False


def _where(shell: Any, frame: types.FrameType, lineno: int) -> str:
    code = frame.f_code
    label = None
    try:
        label = shell.compile.format_code_name(code.co_filename)
    except Exception:
        pass
    place = f"{label[0]} {label[1]}" if label else f'File "{code.co_filename}"'
    where = f"  {place}, line {lineno}"
    if code.co_name != "<module>":
        where += f", in {code.co_name}"
    line = linecache.getline(code.co_filename, lineno, frame.f_globals).strip()
    return f"{where}\n    {line}" if line else where


_HELP = {
    "ApprovalRejectedError": "the call was not made, and the cell stopped there (what ran before it stands); do not make it again unless the user asks for it",
    "ApprovalTimeoutError": "the call was not made: nobody answered in time, and the cell stopped there (what ran before it stands); make it again only when the user is there to answer",
}


def render(shell: Any, etype: type, value: BaseException, tb: types.TracebackType | None) -> str:
    """The short error text for ``value`` raised with ``tb``."""
    import traceback

    frames = [(f, n) for f, n in traceback.walk_tb(tb) if not _is_plumbing(f)]
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):")
        lines.extend(_where(shell, f, n) for f, n in frames)
    message = str(value)
    lines.append(f"{etype.__name__}: {message}" if message else etype.__name__)
    help_text = next((h for cls in etype.__mro__ if (h := _HELP.get(cls.__name__))), None)
    if help_text and "help:" not in message:
        lines.append(f"  help: {help_text}")
    return "\n".join(lines)


def _handler(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> list[str]:
    import sys

    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # for %debug
    try:
        stb = [render(shell, etype, value, tb)]
    except Exception:
        # Never in the way: IPython's own rendering (the handler stays installed).
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    shell._showtraceback(etype, value, stb)
    return stb


def install(error_classes: tuple) -> bool:
    """Makes the running IPython shell show ``error_classes`` (and subclasses) short; returns
    whether it is installed (False outside IPython, or when another handler is there)."""
    try:
        from IPython import get_ipython
    except Exception:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    current = tuple(getattr(shell, "custom_exceptions", ()) or ())
    if current == error_classes:
        return True
    if current:
        return False  # someone else's handler: kept
    shell.set_custom_exc(error_classes, _handler)
    return True
