"""Tool calls over the Jupyter stdin channel, for kernels on Jupyter servers (Kernel Gateway,
Enterprise Gateway, Jupyter Server) that have no route to the host's Unix socket.

A call becomes one ``input_request`` whose prompt is ``PREFIX`` + a JSON payload
``{"method", "path", "body"}`` (the same requests ``/run``, ``/approve`` and ``/source`` take on the
socket); the host runs it through the same tool-server code (approvals included) and answers with
an ``input_reply`` whose value is the JSON reply. Every Jupyter server relays the stdin channel.

One request is in flight at a time: the kernel's stdin socket takes one reply per request, so
calls from many threads queue on a lock (in arrival order, roughly). The route of the requests
(the client's identity and the parent message) is taken from the last execution, so a thread
started by a cell can still call tools after that cell finished. ``input()`` in user code stays
unavailable (ipybox sends ``allow_stdin: false``), as with local kernels.
"""

from __future__ import annotations

import json
import threading
from typing import Any

PREFIX = "\x1eipybox\x1e"

_lock = threading.Lock()
_kernel: Any = None
_route: tuple[Any, Any] | None = None


def _remember(*_args: Any) -> None:
    """Records where input requests go (runs in the execution's context: ipykernel 7 keeps the
    parent in context variables that other threads do not see)."""
    global _route
    kernel = _kernel
    if kernel is not None:
        _route = (kernel._parent_ident["shell"], kernel.get_parent("shell"))


def install(shell: Any) -> None:
    """Routes ``ipybox_runtime`` requests over stdin (called by the host's bootstrap cell)."""
    global _kernel
    _kernel = shell.kernel
    _remember()
    shell.events.register("pre_execute", _remember)
    import ipybox_runtime

    ipybox_runtime._channel = call
    from ipybox_runtime.import_path import _mcpygen_endpoint

    _mcpygen_endpoint()


def call(method: str, path: str, body: dict | None) -> dict:
    """Sends one request to the host and waits for its JSON reply."""
    from ipybox_runtime import ToolRunnerError

    route = _route
    if _kernel is None or route is None:
        raise ToolRunnerError("the ipybox stdin channel is not installed in this kernel")
    payload = PREFIX + json.dumps({"method": method, "path": path, "body": body})
    with _lock:
        reply = _kernel._input_request(payload, route[0], route[1], password=False)
    try:
        return json.loads(reply)
    except ValueError as e:
        raise ToolRunnerError(f"the host sent an invalid reply over the stdin channel: {reply[:200]!r}") from e
