"""Lets an interrupt reach a cell that waits in top-level `await` (a tool call through the async
API, `await asyncio.sleep(...)`), so a timeout interrupts it and the kernel keeps its state.

ipykernel cancels an awaiting cell from a SIGINT handler, which only runs when the main thread
runs Python; while the event loop sleeps, the signal can land on another thread and the cell is
cancelled only at the loop's next event (ipybox then restarted the kernel). Using the loop's
self-pipe as the signal wakeup fd while such a cell runs wakes the loop at once.

Imported once at kernel start (ipykernel's `exec_lines`); nothing else here.
"""

import asyncio
import contextlib
import signal

from ipykernel import ipkernel

_original = getattr(ipkernel.IPythonKernel, "_cancel_on_sigint", None)


@contextlib.contextmanager
def _cancel_on_sigint_woken(self, future):
    with _original(self, future):
        try:
            old = signal.set_wakeup_fd(asyncio.get_running_loop()._csock.fileno(), warn_on_full_buffer=False)
        except Exception:
            old = None
        try:
            yield
        finally:
            if old is not None:
                signal.set_wakeup_fd(old)


if _original is not None:
    ipkernel.IPythonKernel._cancel_on_sigint = _cancel_on_sigint_woken
