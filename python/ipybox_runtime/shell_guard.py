"""Shell-command approval in the kernel (ipybox's `approve_shell_cmds` / `require_shell_escape`).

Installed at kernel start by the launcher (`--IPKernelApp.exec_lines`) when approval of shell
commands is on. Every way IPython runs a shell command asks the host first (``POST /approve``,
see ``src/tools/server.rs``) and runs only when the application accepts:

- ``!cmd``, ``x = !cmd``, ``!!cmd``, ``%sx``, ``%system``, shell aliases (``%ls``, ...) and
  ``%pip``/``%conda`` go through ``InteractiveShell.system`` / ``getoutput``: tool name
  ``shell``, arguments ``{"cmd": <the command after variable expansion>}``; the command that runs
  is exactly the approved one (it is not expanded a second time);
- ``get_ipython().system_raw(cmd)`` the same way;
- ``%%bash``, ``%%sh``, ``%%script <program>`` and the other script magics (``%%perl``,
  ``%%ruby``, ``%%python3``, ...): tool name ``shell_magic``, arguments ``{"cmd": <the cell>,
  "magic": <the magic line as it runs>}``, e.g. ``"%%script /bin/sh"`` for ``%%script {prog}``:
  IPython expands the line once, the guard sits after that expansion, so what is asked about is
  what runs. The guard is on the magic functions themselves (the entries of
  ``magics_manager.magics["cell"]``), so ``find_cell_magic("bash")(...)``, dict access and
  ``%alias_magic`` aliases (which call the real magic's function) ask about the magic that
  really runs; and ``ScriptMagics.shebang``, where every script magic ends, asks about
  ``%%script <program>`` whatever reached it unasked (a re-registered ``ScriptMagics``, a saved
  reference).

A rejected command raises ``ApprovalRejectedError`` (no decision in time: ``ApprovalTimeoutError``) and
nothing runs.

With ``require_escape`` direct process creation from Python raises :class:`ShellEscapeRequired`
(a ``PermissionError``, so code that copes with a missing program copes with this too):
``subprocess.Popen`` (and so ``run``, ``call``, ``check_output``, ``os.popen``, asyncio
subprocesses), ``os.system``, ``os.popen``, ``os.exec*``, ``os.spawn*``, ``os.posix_spawn*`` and
``pty.spawn``, except while an approved command or magic runs. This is a guard against accidents
and casual misuse by cooperating code, not a security boundary: ``importlib.reload(subprocess)``,
``_posixsubprocess.fork_exec``, ``os.fork`` + ``os.execv`` saved before..., ``ctypes`` and
``multiprocessing`` get around it. Confinement is the sandbox's job (``--sandbox``).
"""

from __future__ import annotations

import contextvars
import functools
import os
import subprocess
import threading

from . import _approve

__all__ = ["install", "ShellEscapeRequired"]


class ShellEscapeRequired(PermissionError, RuntimeError):
    """Direct process creation was blocked (``require_shell_escape``): use ``!cmd``.

    A ``PermissionError`` (code that copes with a missing program copes with this too) and a
    ``RuntimeError`` (what Python ipybox 0.9.2 raised, so ``except RuntimeError`` keeps working).
    """


# Set while an approved `!` command runs (in this context) or an approved cell magic runs (any
# thread: script magics run their program from an event loop of their own).
_line_allowed = contextvars.ContextVar("ipybox_shell_allowed", default=False)
_magic_lock = threading.Lock()
_magics_running = 0

# Set while an approved command runs through IPython: its own expansion then passes it through.
_expanded = threading.local()

# Set while an asked-about cell magic runs its function in this thread: `shebang` under it was
# asked about already.
_magic_asked = threading.local()


def _allowed() -> bool:
    return _line_allowed.get() or _magics_running > 0


def _blocked(what: str) -> ShellEscapeRequired:
    # Python ipybox 0.9.2's sentence first (code and prompts match on it), then ours. 0.9.2 blocks
    # os.popen through subprocess.Popen, so both say "subprocess".
    call = "subprocess" if what in ("subprocess", "os.popen") else f"{what}()"
    return ShellEscapeRequired(
        f"Direct {call} calls are not allowed. Use ! syntax. "
        f"(direct process creation ({what}) is blocked in this kernel (require_shell_escape): "
        "run shell commands as `!cmd` (or in a %%bash cell) so they can be approved)"
    )


def install(require_escape: bool = False) -> None:
    """Routes the shell commands of the running IPython through approval; with `require_escape`
    also blocks direct process creation outside approved commands. If that fails the kernel
    exits, with the reason on stderr: it never runs with approval silently off."""
    try:
        ip = get_ipython()  # noqa: F821
        _install_line_commands(ip)
        _install_cell_magics(ip)
        if require_escape:
            _install_process_guards()
    except BaseException as e:  # noqa: BLE001 - anything leaves the kernel unguarded
        import sys

        print(f"ipybox: cannot install shell-command approval: {e!r}", file=sys.stderr, flush=True)
        os._exit(70)


def _install_line_commands(ip) -> None:
    original_expand = ip.var_expand
    original_system = ip.system
    original_system_raw = ip.system_raw
    original_getoutput = ip.getoutput

    def var_expand(cmd, depth=0, **kwargs):
        if getattr(_expanded, "active", False):
            return cmd
        return original_expand(cmd, depth + 1, **kwargs)

    def run_approved(cmd: str, depth: int, run):
        __tracebackhide__ = True  # tracebacks show the cell's line, not ipybox's frames
        if _line_allowed.get():
            # Inside an approved command (IPython calling one of these from another): asked.
            return run(cmd)
        # depth + 2: this frame and the wrapper's are between var_expand and the caller's code.
        command = original_expand(cmd, depth + 2)
        _approve("shell", {"cmd": command})
        token = _line_allowed.set(True)
        _expanded.active = True
        try:
            return run(command)
        finally:
            _expanded.active = False
            _line_allowed.reset(token)

    @functools.wraps(original_system)
    def system(cmd):
        __tracebackhide__ = True
        return run_approved(cmd, 0, original_system)

    @functools.wraps(original_system_raw)
    def system_raw(cmd):
        __tracebackhide__ = True
        return run_approved(cmd, 0, original_system_raw)

    @functools.wraps(original_getoutput)
    def getoutput(cmd, split=True, depth=0):
        __tracebackhide__ = True
        return run_approved(cmd, depth, lambda c: original_getoutput(c, split=split))

    for wrapper in (system, system_raw, getoutput):
        del wrapper.__wrapped__
    ip.var_expand = var_expand
    ip.system = ip.system_piped = system
    ip.system_raw = system_raw
    ip.getoutput = getoutput


def _script_magics(ip) -> set[str]:
    """The cell magics that run a program: ``script`` and the ones ``ScriptMagics`` made
    (``bash``, ``sh``, ``perl``, ...)."""
    # `%%script` is ScriptMagics.shebang, bound to the instance that made the others.
    shebang = ip.magics_manager.magics["cell"].get("script")
    made = getattr(getattr(shebang, "__self__", None), "script_magics", None) or ()
    return {"script", "bash", "sh"} | set(made)


def _run_magic(magic: str, cell: str, run):
    """Asks about `cell` run by `magic` (the full magic line), then runs it."""
    __tracebackhide__ = True
    _approve("shell_magic", {"cmd": cell, "magic": magic})
    global _magics_running
    with _magic_lock:
        _magics_running += 1
    outer = getattr(_magic_asked, "active", False)
    _magic_asked.active = True
    try:
        return run()
    finally:
        _magic_asked.active = outer
        with _magic_lock:
            _magics_running -= 1


def _guarded_magic(name: str, function):
    """`function` (the cell magic `name`) asking first about ``%%name <line>`` and the cell."""

    def guarded(line, cell, *args, **kwargs):
        __tracebackhide__ = True
        magic = f"%%{name} {line}".rstrip()
        return _run_magic(magic, cell, lambda: function(line, cell, *args, **kwargs))

    # IPython reads attributes of magic functions (no variable expansion, local scope, argument
    # parser, docstring): the guarded one has the same.
    functools.update_wrapper(guarded, function)
    del guarded.__wrapped__
    guarded._ipybox_guarded = True
    return guarded


def _install_cell_magics(ip) -> None:
    from IPython.core.magics.script import ScriptMagics

    # Every script magic ends in ScriptMagics.shebang (`%%bash` calls `self.shebang`): asked
    # there unless a guarded magic below asked already.
    original_shebang = ScriptMagics.shebang

    def shebang(self, line, cell):
        __tracebackhide__ = True
        if getattr(_magic_asked, "active", False):
            return original_shebang(self, line, cell)
        return _run_magic(f"%%script {line}".rstrip(), cell, lambda: original_shebang(self, line, cell))

    functools.update_wrapper(shebang, original_shebang)
    del shebang.__wrapped__
    ScriptMagics.shebang = shebang

    # The registry's entries (what `%%name`, `find_cell_magic`, dict access and `%alias_magic`
    # aliases call) ask with their own name: `%%bash`, not `%%script bash`.
    cells = ip.magics_manager.magics["cell"]
    for name in _script_magics(ip):
        function = cells.get(name)
        if function is not None and not getattr(function, "_ipybox_guarded", False):
            cells[name] = _guarded_magic(name, function)


def _guard(function, what: str):
    @functools.wraps(function)
    def guarded(*args, **kwargs):
        __tracebackhide__ = True
        if not _allowed():
            raise _blocked(what)
        return function(*args, **kwargs)

    return guarded


def _install_process_guards() -> None:
    # Popen._execute_child is where every Popen creates its process: guarding it also covers
    # references to Popen taken before this ran (asyncio, run, check_output, os.popen).
    execute_child = subprocess.Popen._execute_child
    subprocess.Popen._execute_child = _guard(execute_child, "subprocess")
    for name in (
        "system",
        "popen",
        "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
        "posix_spawn", "posix_spawnp",
    ):  # fmt: skip
        function = getattr(os, name, None)
        if function is not None:
            setattr(os, name, _guard(function, f"os.{name}"))
    try:
        import pty
    except ImportError:  # not on this platform
        return
    pty.spawn = _guard(pty.spawn, "pty.spawn")
