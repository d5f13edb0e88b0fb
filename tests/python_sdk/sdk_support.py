"""Shared helpers of the Python SDK suite (the fixture MCP server in place of the docs' servers)."""

import asyncio
import importlib.metadata
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

FIXTURE_SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_fixture.py"

# The fixture server needs PyPI `mcp` 2.x. Against ipybox-rs it runs with the test venv's python;
# against Python ipybox 0.9.2 (whose mcpygen needs `mcp` 1.x) from a venv of its own.
FIXTURE_PYTHON = os.environ.get("IPYBOX_FIXTURE_PYTHON") or sys.executable

SERVER_NAME = "fixture"

# The fixture's tools as sanitized module names ("get-thing" becomes get_thing).
FIXTURE_MODULES = [
    "add",
    "greet",
    "get_thing",
    "fail",
    "echo",
    "sleep",
    "get_header",
    "get_env",
    "get_cwd",
    "get_pid",
]


def is_ipybox_rs() -> bool:
    """Whether the installed `ipybox` is ipybox-rs (and not the Python original)."""
    try:
        importlib.metadata.distribution("ipybox-rs")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def stdio_params(**extra) -> dict:
    """server_params of the fixture as a stdio server (the docs' `command`/`args`/`env` form)."""
    return {"command": FIXTURE_PYTHON, "args": [str(FIXTURE_SCRIPT), "stdio"], **extra}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fixture_http_server(mode: str, path: str) -> Iterator[int]:
    """Runs the fixture as an HTTP server (mode "http": streamable HTTP, "sse": SSE) on 127.0.0.1
    and yields its port once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen(
        [FIXTURE_PYTHON, str(FIXTURE_SCRIPT), mode, str(port), path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fixture server exited: {proc.stderr.read().decode(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fixture server not listening on port {port}")
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


async def wait_until(condition: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    """Polls `condition` (e.g. a marker file written by kernel code) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
