"""Skips ipykernel's empty output flushes (installed by the host before the kernel app starts, or
by the bootstrap cell of a kernel on a Jupyter server).

ipykernel flushes stdout and stderr after every execution: each a round trip to its IO thread,
waited for, even when nothing was written. The flush is skipped only when the buffers are empty AND
no send is in flight (checked in that order), so stream output still goes out before the
execution's idle status.
"""

from __future__ import annotations

from typing import Any


def install() -> None:
    from ipykernel import iostream

    stream = iostream.OutStream
    if getattr(stream, "_ipybox_patched", False):
        return
    flush, send = stream.flush, stream._flush

    def send_marked(self: Any) -> Any:
        # Runs on ipykernel's IO thread: takes the buffers, then sends them. Marked busy from
        # before it takes the buffers until the send is done.
        self._ipybox_sending = True
        try:
            return send(self)
        finally:
            self._ipybox_sending = False

    def flush_if_pending(self: Any) -> Any:
        try:
            empty = self.echo is None and not any(b.tell() for b in list(self._buffers.values()))
            if empty and not getattr(self, "_ipybox_sending", False):
                return None
        except Exception:
            pass
        return flush(self)

    stream._flush = send_marked
    stream.flush = flush_if_pending
    stream._ipybox_patched = True
