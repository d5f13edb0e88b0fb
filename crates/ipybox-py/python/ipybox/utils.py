"""Helpers of Python ipybox's public `ipybox.utils` module."""

import asyncio
import socket
from functools import partial
from typing import Any, Callable, TypeVar

T = TypeVar("T")


async def arun(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs a blocking `func(*args, **kwargs)` in the default thread pool and awaits it
    (e.g. `await arun(input, "Approve? ")`)."""
    return await asyncio.get_running_loop().run_in_executor(None, partial(func, *args, **kwargs))


def find_free_port() -> int:
    """A TCP port that is free right now (kept for code written for Python ipybox; ipybox-rs
    itself listens on no TCP port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return s.getsockname()[1]
