"""Makes the workspace importable once the kernel is up (``import mcptools.<server>``, the
codeact skill's ``mcpparse`` and ``gentools``, the user's own modules), and a sandboxed kernel's
site layer (what ``install_package`` installed for this workspace's sandboxed kernels).

Installed at kernel start by the launcher (``--IPKernelApp.exec_lines``), after the kernel app has
started; nothing else here. The host keeps the workspace off ``PYTHONPATH`` and the launcher drops
the working directory (``''``) from ``sys.path`` before its first import, so nothing in the
workspace runs as the interpreter starts (``sitecustomize``, a module named like one the kernel
imports): a sandboxed kernel can write the workspace, and what it wrote must not run in a later,
less confined kernel. Here the directories go at the END of ``sys.path``: a file in the workspace
never shadows a module of the standard library or the kernel environment (``cloudpickle``,
``pydantic``, ``jedi``, ... which the kernel imports on demand); names found nowhere else (the
generated packages, the user's own modules) import from the workspace as before.

The site layer (``IPYBOX_SITE_LAYER``, set by the host for sandboxed kernels only; written by the
sandboxed installer, read-only to the kernel, never in the workspace) is added as a site
directory (its ``.pth`` files run, here, inside the sandbox) in front of the kernel environment's
``site-packages``, so that a version installed there wins over the environment's.

A trusted kernel (the host sets ``IPYBOX_TRUST_LEDGER`` for local kernels that are neither
sandboxed nor confined) also gets ``workspace_trust``'s finder: what a sandboxed kernel wrote in
the workspace is not imported here until a person accepts it.
"""

import os
import sys


def install(dirs: list) -> None:
    """Drops ``''`` (the working directory) from ``sys.path``, adds the site layer if the host
    named one, and appends ``dirs`` in order."""
    sys.path[:] = [p for p in sys.path if p]
    ledger = os.environ.get("IPYBOX_TRUST_LEDGER")
    if ledger:
        from ipybox_runtime import workspace_trust

        workspace_trust.install(ledger)
    _add_site_layer(os.environ.get("IPYBOX_SITE_LAYER"))
    for d in dirs:
        if d not in sys.path:
            sys.path.append(d)


def _add_site_layer(layer) -> None:
    if not layer or layer in sys.path:
        return
    import site

    before = list(sys.path)
    site.addsitedir(layer)
    added = [p for p in sys.path if p not in before]
    at = next((i for i, p in enumerate(before) if p.endswith("site-packages")), len(before))
    sys.path[:] = before[:at] + added + before[at:]
