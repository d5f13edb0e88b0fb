"""Keeps ipykernel from loading debugpy (installed by the host before the kernel app starts: the
launcher of a plainly started kernel and the kernel factory's template).

ipykernel imports ``debugpy.server.api`` and pydevd when it first asks whether a debugger is
available (``ipykernel.debugger._is_debugpy_available``), at every kernel's start. That import is
~29 MB of the kernel's memory (measured: 43.7 -> 72.4 MB RSS for ``import ipykernel.debugger``)
and ~0.8 s of import time, for the Jupyter debug protocol (``debug_request``), which no ipybox
client sends. Here ``ipykernel.debugger`` is imported once with ``debugpy`` made unimportable, so
it records "not available" (the kernel's ``kernel_info`` then says ``"debugger": false``), and
``debugpy`` is importable again right after: code in a cell can still ``import debugpy``.
"""

from __future__ import annotations

import sys

_MISSING = object()


def install() -> None:
    if "ipykernel.debugger" in sys.modules:
        return
    saved = sys.modules.get("debugpy", _MISSING)
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # `import debugpy` raises ImportError
    try:
        import ipykernel.debugger  # noqa: F401  (records _is_debugpy_available = False)
    except Exception as e:  # another ipykernel: it decides for itself later
        print(f"ipybox: ipykernel.debugger did not import without debugpy: {e}", file=sys.stderr)
    finally:
        if saved is _MISSING:
            del sys.modules["debugpy"]
        else:
            sys.modules["debugpy"] = saved  # type: ignore[assignment]
