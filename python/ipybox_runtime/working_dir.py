"""Keeps the kernel in its working directory (ipybox's `restore_working_dir`, the Python SDK's
`working_dir`): after a cell that left it, change back and say so in that cell's output.

Installed at kernel start by the launcher (`--IPKernelApp.exec_lines`); nothing else here.
"""

import os


def install(path: str) -> None:
    """Registers the post-cell hook that restores `path` as the working directory."""

    def _ipybox_restore_cwd(result=None, _cwd=path, _os=os):
        try:
            current = _os.getcwd()
        except FileNotFoundError:
            current = None
        if current != _cwd:
            _os.chdir(_cwd)
            print(f"[ipybox] cwd reset to {_cwd}")

    get_ipython().events.register("post_run_cell", _ipybox_restore_cwd)  # noqa: F821
