"""Servers whose package mcpygen generated (Python ipybox 0.9's generator, which freeact and other
applications call directly) are registered as if `ipybox.generate_mcp_sources` had written them.

Kernel code reaches only servers the host registered for a directory it imports from
(docs/tool-calling.md). mcpygen does not know that rule, so once `ipybox` is imported,
`mcpygen.generate_mcp_sources` (also as `mcpygen.apigen.generate_mcp_sources`) is wrapped: after it
wrote `root_dir/<name>/`, the server is recorded for `root_dir` with the params it was given,
which are the params the generated `__init__.py` holds. The registration is the application's
own call, in the host process; the kernel still cannot register anything. If mcpygen is imported
after ipybox, the wrapping happens when its import finishes.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import sys
from pathlib import Path
from typing import Any

_MARK = "__ipybox_registers__"


def install() -> None:
    """Wraps mcpygen's generator now if it is imported, else when it is."""
    if "mcpygen" in sys.modules and "mcpygen.apigen" in sys.modules:
        _wrap()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _wrap() -> None:
    apigen = sys.modules.get("mcpygen.apigen")
    package = sys.modules.get("mcpygen")
    original = getattr(apigen, "generate_mcp_sources", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def generate_mcp_sources(
        server_name: str, server_params: dict[str, Any], root_dir: Path, *args: Any, **kwargs: Any
    ) -> Any:
        result = await original(server_name, server_params, root_dir, *args, **kwargs)
        from ipybox import _ipybox

        _ipybox.register_generated(server_name, json.dumps(server_params), str(root_dir))
        return result

    setattr(generate_mcp_sources, _MARK, True)
    apigen.generate_mcp_sources = generate_mcp_sources
    if package is not None and getattr(package, "generate_mcp_sources", None) is original:
        package.generate_mcp_sources = generate_mcp_sources


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `mcpygen` is imported, wraps its generator once the package
    module has run (it imports `mcpygen.apigen` itself)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "mcpygen":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap()

        loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec
