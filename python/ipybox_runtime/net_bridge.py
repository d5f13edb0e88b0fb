"""The bridge from ``127.0.0.1:<port>`` in a confined kernel's own network namespace to ipybox's
egress proxy on the host, a Unix socket in the kernel's runtime directory (host side:
``src/confine/egress_proxy.rs``; ``--session-network proxy``).

It runs as daemon threads in the kernel process, started before the first cell (the kernel's
``exec_lines``): the namespace has no other way out, and the kernel's ``HTTP_PROXY``,
``HTTPS_PROXY`` and ``ALL_PROXY`` name ``http://127.0.0.1:<port>``. It only copies bytes: the
proxy on the host checks every destination, so a kernel that breaks or replaces this bridge only
breaks its own network. In the kernel rather than in the namespace's pid 1: the same code for a
forked kernel and a bubblewrap'd one (whose pid 1 is bubblewrap), and a kernel reset starts a new
one with the new kernel.

Standard library only.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["install"]

_BUF = 64 * 1024


def install(port: int, proxy_socket: str) -> None:
    """Listens on ``127.0.0.1:port`` now (so the first cell finds it) and serves in a thread."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_accept, args=(listener, proxy_socket), name="ipybox-net-bridge", daemon=True).start()


def _accept(listener: socket.socket, proxy_socket: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_serve, args=(client, proxy_socket), name="ipybox-net-bridge-conn", daemon=True).start()


def _serve(client: socket.socket, proxy_socket: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(proxy_socket)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), name="ipybox-net-bridge-back", daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies ``src`` to ``dst`` until ``src`` ends, then ends ``dst``'s writing side."""
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
