"""Makes the workspace importable once the kernel is up (``import mcptools.<server>``, the
codeact skill's ``mcpparse`` and ``gentools``, the user's own modules).

Installed at kernel start by the launcher (``--IPKernelApp.exec_lines``), after the kernel app has
started; nothing else here. The host keeps the workspace off ``PYTHONPATH`` and the launcher drops
the working directory (``''``) from ``sys.path`` before its first import, so nothing in the
workspace runs as the interpreter starts (``sitecustomize``, a module named like one the kernel
imports): a sandboxed kernel can write the workspace, and what it wrote must not run in a later,
less confined kernel. Here the directories go at the END of ``sys.path``: a file in the workspace
never shadows a module of the standard library or the kernel environment (``cloudpickle``,
``pydantic``, ``jedi``, ... which the kernel imports on demand); names found nowhere else (the
generated packages, the user's own modules) import from the workspace as before.
"""

import sys


def install(dirs: list) -> None:
    """Drops ``''`` (the working directory) from ``sys.path`` and appends ``dirs`` in order."""
    sys.path[:] = [p for p in sys.path if p]
    for d in dirs:
        if d not in sys.path:
            sys.path.append(d)
