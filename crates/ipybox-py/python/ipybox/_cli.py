"""The `ipybox` command of the wheel: the same CLI and MCP server as the Rust binary."""

import os
import signal
import sys

from ipybox import _ipybox


def main() -> None:
    """Runs `ipybox` with this process's arguments. The kernel uses this package's interpreter
    (it has ipykernel and pydantic) unless IPYBOX_PYTHON or --python says otherwise."""
    os.environ.setdefault("IPYBOX_PYTHON", sys.executable)
    # Behave like the binary: Ctrl-C ends the process unless ipybox handles it itself.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_ipybox.run_cli([os.path.basename(sys.argv[0]) or "ipybox", *sys.argv[1:]]))
