"""Imports modules from the host's workspace (``mcptools/``, ``gentools/``, saved code) into a
kernel on a Jupyter server, which cannot see the host's files.

A finder at the end of ``sys.meta_path``: a module that the kernel's own ``sys.path`` does not
have is asked for over the stdin channel (``POST /source {"module"}``); the host answers with its
source from the workspace, or ``found: false``. Sources are registered with ``linecache`` so
tracebacks show their lines. Submodules of a package loaded this way are loaded this way too.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import linecache
import sys
from typing import Any

ORIGIN = "ipybox-host://"


class _Loader(importlib.abc.Loader):
    def __init__(self, source: str, filename: str):
        self._source = source
        self._filename = filename

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        lines = self._source.splitlines(keepends=True)
        linecache.cache[self._filename] = (len(self._source), None, lines, self._filename)
        module.__file__ = self._filename
        exec(compile(self._source, self._filename, "exec"), module.__dict__)

    def get_source(self, name: str) -> str:
        return self._source


class HostFinder(importlib.abc.MetaPathFinder):
    """Finds modules in the host's workspace."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is not None and not any(str(p).startswith(ORIGIN) for p in path):
            return None  # a submodule of a package the kernel has itself
        from ipybox_runtime import ToolRunnerError, _request

        try:
            reply = _request("POST", "/source", {"module": name})
        except ToolRunnerError:
            return None  # no channel to the host: the module is simply not found

        if reply.get("error") is not None or not (reply.get("structured") or {}).get("found"):
            return None
        found = reply["structured"]
        filename = ORIGIN + found["path"]
        spec = importlib.util.spec_from_loader(
            name, _Loader(found["source"], filename), origin=filename, is_package=found["package"]
        )
        if spec is not None and found["package"]:
            spec.submodule_search_locations = [ORIGIN + name.replace(".", "/")]
        return spec


def install() -> None:
    if not any(isinstance(f, HostFinder) for f in sys.meta_path):
        sys.meta_path.append(HostFinder())
