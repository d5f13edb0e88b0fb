"""A safe process exit after using the extension's futures.

Each awaited `_ipybox` future completes on a tokio worker thread, which wakes asyncio (through
`call_soon_threadsafe`, releasing the GIL while it writes to the loop's self-pipe) and then
finishes its own Python work. A program that exits right after its last await can start
finalizing the interpreter in that gap, and the worker then crashes the process ("PyGILState_Release:
thread state must be current", or a segfault; seen in 9 of 20 runs of a two-line script). At
exit, releasing the GIL for a moment lets those workers finish first (0 of 20).
"""

import atexit
import time

_armed = False


def arm() -> None:
    """Called before the first extension future is created; registers the exit pause once."""
    global _armed
    if not _armed:
        atexit.register(time.sleep, 0.05)
        _armed = True
