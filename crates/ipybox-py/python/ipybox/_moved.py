"""Modules of Python ipybox 0.9.2 that ipybox-rs has no counterpart for: importing them works,
and using a name from them raises an ImportError that says what replaces it."""

from __future__ import annotations

from typing import NoReturn


def moved(module: str, name: str, replacements: dict[str, str]) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)
    instead = replacements.get(name, replacements.get("*", ""))
    raise ImportError(
        f"{module}.{name} is part of Python ipybox 0.9.2's internals, which ipybox-rs does not have: {instead}",
        name=module,
    )
