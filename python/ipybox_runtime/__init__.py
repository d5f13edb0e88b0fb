"""Kernel-side runtime of ipybox: calls MCP tools through the host's tool server.

Embedded in the ipybox binary and put on the kernel's ``sys.path`` by the host; nothing here is
pip-installed. Generated modules (``mcptools/<server>/``) bind a :class:`ToolRunner` to their server
and call :meth:`ToolRunner.run` (blocking; keep-alive connections, one per thread) or, when
generated with the async style, await :meth:`ToolRunner.run_async` (one connection per call on the
running event loop, so many calls can be in flight at once). Standard library only.

The tool server speaks HTTP/1.1 on a Unix socket whose path is in ``IPYBOX_TOOL_SOCKET``.
Kernels on Jupyter servers send the same requests over the Jupyter stdin channel instead
(``stdin_channel``) and import workspace modules from the host (``host_import``). A
``ToolRunnerError`` that ends a cell is shown short, the user's frames only (``tracebacks``).

``POST /run`` takes ``{"server_name", "server_params", "tool_name", "arguments"}`` and answers
``{"structured": <object or null>, "text": <str>}`` or ``{"error": {"kind", "message"}}``; the kind
selects the exception (``_ERRORS``). ``POST /approve`` (``{"tool_name", "arguments"}``) asks
whether a shell command may run (``shell_guard``, installed with ``approve_shell_cmds``). The host side is ``src/tools/protocol.rs``; a round-trip test
there runs this module on the replies it serializes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import os
import select
import signal
import socket
import threading
import time
from typing import Any

__all__ = [
    "ToolRunner",
    "ToolRunnerError",
    "ToolError",
    "ApprovalRejected",
    "ApprovalTimeout",
    "ApprovalRejectedError",
    "ApprovalTimeoutError",
]


class ToolRunnerError(Exception):
    """Base class of every error raised by a tool call through ipybox."""


class ToolError(ToolRunnerError):
    """The MCP server reported an error for the call (or could not be reached)."""


class ApprovalRejectedError(ToolRunnerError):
    """The application rejected the tool call (Python ipybox 0.9's and mcpygen's name, which
    applications find in the output: ``ApprovalRejectedError: Approval request for ...``)."""


class ApprovalTimeoutError(ToolRunnerError):
    """No approval decision arrived in time; the call was not made (0.9's name)."""


# The names ipybox-rs used before (generated packages re-export them).
ApprovalRejected = ApprovalRejectedError
ApprovalTimeout = ApprovalTimeoutError


_short_tracebacks = False


def install_short_tracebacks() -> None:
    """Makes the running IPython shell show a ``ToolRunnerError`` that ends a cell as the user's
    own frames and the error (``tracebacks``); called on the first tool module import and call.
    Cheap after the first time."""
    global _short_tracebacks
    if not _short_tracebacks:
        from . import tracebacks
        from .workspace_trust import UntrustedModuleError

        _short_tracebacks = tracebacks.install((ToolRunnerError, UntrustedModuleError))


# Error kinds on the wire -> the exception raised in the kernel (kept in step with ErrorKind in
# src/tools/protocol.rs by its tests). An unknown kind raises the base class.
_ERRORS = {
    "tool_error": ToolError,
    "rejected": ApprovalRejected,
    "approval_timeout": ApprovalTimeout,
    "bad_request": ToolRunnerError,
}


def _result(reply: dict) -> dict[str, Any] | str:
    """The value of a ``/run`` reply: structured content if any, else text; raises for errors."""
    __tracebackhide__ = True  # IPython shows the caller's line, not this one
    error = reply.get("error")
    if error is not None:
        raise _ERRORS.get(error.get("kind"), ToolRunnerError)(error.get("message", "tool call failed"))
    structured = reply.get("structured")
    if structured is not None:
        return structured
    return reply.get("text", "")


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None = None):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


_local = threading.local()

# The host's limits (src/tools/server.rs, kept in step by its tests): the largest request body,
# and how long it keeps an idle connection (a connection idle for half of that is not reused, so
# a request never races the host closing it).
_MAX_BODY_BYTES = 33554432
_HOST_IDLE_TIMEOUT = 30.0


def _connection(path: str) -> _UnixHTTPConnection:
    """One keep-alive connection per thread and socket path: safe from many threads at once. A
    connection idle for a while, or closed by the host (at its connection limit it closes the
    least recently used idle one), is replaced before use."""
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    conn = conns.get(path)
    if conn is not None and (
        time.monotonic() - getattr(conn, "_ipybox_used", 0.0) > _HOST_IDLE_TIMEOUT / 2 or _closed_by_host(conn)
    ):
        _drop(conn, path)
        conn = None
    if conn is None:
        conn = conns[path] = _UnixHTTPConnection(path)
    return conn


def _closed_by_host(conn: _UnixHTTPConnection) -> bool:
    """Whether the host has closed an idle connection (it is readable: end of file)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _refusal(conn: _UnixHTTPConnection, method: str) -> dict | None:
    """The reply already waiting on a connection the host closed without reading the request
    (it refuses connections beyond its limit with a reply that says so), if there is one."""
    sock = conn.sock
    if sock is None:
        return None
    raw = b""
    try:
        while True:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
            if not data:
                break
            raw += data
    except OSError:
        pass
    if not raw.startswith(b"HTTP/"):
        return None
    try:
        return _decode(*_parse_response(raw, method))
    except (http.client.HTTPException, ToolRunnerError, ValueError):
        return None


def _drop(conn: _UnixHTTPConnection, path: str) -> None:
    conn.close()
    _local.conns.pop(path, None)


def _socket_path() -> str:
    path = os.environ.get("IPYBOX_TOOL_SOCKET")
    if not path:
        raise ToolRunnerError(
            "IPYBOX_TOOL_SOCKET is not set: MCP tools can only be called from a kernel started by ipybox"
        )
    return path


def _encode(body: dict | None) -> tuple[bytes, dict[str, str]]:
    """The payload and headers of a request (both call paths send the same); a payload over the
    host's limit raises here, with what to do, instead of being cut off by the host."""
    payload = b"" if body is None else json.dumps(body).encode()
    if len(payload) > _MAX_BODY_BYTES:
        raise ToolRunnerError(
            f"the request is {len(payload)} bytes as JSON, over the {_MAX_BODY_BYTES >> 20} MiB the ipybox "
            "tool server takes per request (a limit that keeps kernel code from filling the host's memory); "
            "it was not sent\n  help: pass large data through a file in the workspace"
        )
    return payload, {"Content-Type": "application/json", "Content-Length": str(len(payload))}


def _decode(status: int, data: bytes) -> dict:
    try:
        return json.loads(data)
    except ValueError as e:
        raise ToolRunnerError(f"tool server sent an invalid response ({status})") from e


# Set by ``stdin_channel.install`` in kernels on Jupyter servers: requests then travel over the
# Jupyter stdin channel instead of the Unix socket (same requests, same replies).
_channel: Any = None


def _request(method: str, url: str, body: dict | None = None) -> dict:
    install_short_tracebacks()
    return _send(method, url, body)


def _send(method: str, url: str, body: dict | None = None) -> dict:
    """One request to the host, from any thread (``mcpygen_endpoint`` calls it from its own)."""
    if _channel is not None:
        return _channel(method, url, body)
    path = _socket_path()
    payload, headers = _encode(body)
    for attempt in (0, 1):
        conn = _connection(path)
        try:
            conn.request(method, url, body=payload, headers=headers)
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            # The host may have refused the connection (at its connection limit) and closed it
            # before the request went out: its reply says why.
            refusal = _refusal(conn, method)
            # Not delivered (e.g. a stale keep-alive connection): safe to retry once.
            _drop(conn, path)
            if refusal is not None:
                return refusal
            if attempt == 1:
                raise ToolRunnerError(f"cannot reach the ipybox tool server at {path}: {e}") from e
            continue
        try:
            response = conn.getresponse()
            data = response.read()
            conn._ipybox_used = time.monotonic()  # type: ignore[attr-defined]
            break
        except (http.client.RemoteDisconnected, ConnectionResetError) as e:
            # Closed before a single byte of reply: the host closed the connection without
            # reading the request (an idle connection it closed at its limit just as this was
            # sent). It never closes a connection whose request it read without replying, so
            # sending once more is safe.
            _drop(conn, path)
            if attempt == 1:
                raise ToolRunnerError(f"lost the connection to the ipybox tool server during a call: {e}") from e
            continue
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            # The request may have been carried out: never send it twice.
            _drop(conn, path)
            raise ToolRunnerError(f"lost the connection to the ipybox tool server during a call: {e}") from e
    return _decode(response.status, data)


class _Received:
    """A complete HTTP response in memory, shaped like the socket ``http.client`` parses."""

    def __init__(self, data: bytes):
        self._data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self._data)


def _parse_response(raw: bytes, method: str) -> tuple[int, bytes]:
    """Status and body of a complete HTTP/1.1 response (``http.client`` does the parsing)."""
    response = http.client.HTTPResponse(_Received(raw), method=method)
    response.begin()
    return response.status, response.read()


def _request_text(method: str, url: str, payload: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {url} HTTP/1.1", "Host: localhost", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


async def _request_async(method: str, url: str, body: dict | None = None) -> dict:
    """:func:`_request` on the running event loop: its own connection, closed by the server after
    the reply (``Connection: close``), so concurrent calls never share one. Over the stdin channel,
    the call waits in a worker thread (calls queue there, see ``stdin_channel``)."""
    install_short_tracebacks()
    if _channel is not None:
        return await asyncio.get_running_loop().run_in_executor(None, _channel, method, url, body)
    path = _socket_path()
    payload, headers = _encode(body)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
    except OSError as e:
        raise ToolRunnerError(f"cannot reach the ipybox tool server at {path}: {e}") from e
    try:
        try:
            writer.write(_request_text(method, url, payload, headers))
            await writer.drain()
            raw = await reader.read()
            status, data = _parse_response(raw, method)
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            # The request may have been carried out: never send it twice.
            raise ToolRunnerError(f"lost the connection to the ipybox tool server during a call: {e}") from e
    finally:
        writer.close()
    return _decode(status, data)


_waking = 0
_saved_wakeup_fd = -1


@contextlib.contextmanager
def _signals_wake_the_loop():
    """While awaited calls are pending, a signal wakes the event loop (its self-pipe becomes the
    signal wakeup fd), so an interrupt (a timeout) cancels the awaiting cell at once: ipykernel's
    SIGINT handler runs only when the main thread runs Python, and the signal may land on another
    thread while the loop sleeps. The first pending call sets it, the last one restores it."""
    global _waking, _saved_wakeup_fd
    if _waking == 0:
        try:
            fd = asyncio.get_running_loop()._csock.fileno()  # type: ignore[attr-defined]
            _saved_wakeup_fd = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        except (AttributeError, OSError, ValueError):  # not the main thread, another loop
            yield
            return
    _waking += 1
    try:
        yield
    finally:
        _waking -= 1
        if _waking == 0:
            signal.set_wakeup_fd(_saved_wakeup_fd)


def _approve(tool_name: str, arguments: dict[str, Any]) -> None:
    """Waits for the application's approval of a shell command (``shell`` or ``shell_magic``);
    raises ``ApprovalRejectedError`` / ``ApprovalTimeoutError`` when it does not come."""
    __tracebackhide__ = True
    _result(_request("POST", "/approve", {"tool_name": tool_name, "arguments": arguments}))


class ToolRunner:
    """Calls the tools of one MCP server through the host.

    ``server_params`` are kept as written at registration (``${VAR}`` placeholders unresolved);
    the host resolves them when it connects.
    """

    def __init__(self, server_name: str, server_params: dict[str, Any]):
        self.server_name = server_name
        self.server_params = server_params
        install_short_tracebacks()

    def run(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any] | str:
        """Call ``tool_name`` with ``arguments``; returns structured content if any, else text."""
        return _result(_request("POST", "/run", self._request_body(tool_name, arguments)))

    async def run_async(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any] | str:
        """:meth:`run` as a coroutine: waits for the reply without blocking the event loop, so
        several calls can run at once (``asyncio.gather``). Same result, same exceptions."""
        with _signals_wake_the_loop():
            return _result(await _request_async("POST", "/run", self._request_body(tool_name, arguments)))

    def _request_body(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {
            "server_name": self.server_name,
            "server_params": self.server_params,
            "tool_name": tool_name,
            "arguments": arguments,
        }
