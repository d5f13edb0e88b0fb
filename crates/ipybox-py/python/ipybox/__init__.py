"""ipybox: a code-execution sandbox for agents that act by writing Python (ipybox-rs, the Rust
implementation; a drop-in for the Python ipybox 0.9.2 SDK).

Python code runs in a stateful IPython kernel; the tools of MCP servers become a typed Python
API (`generate_mcp_sources`), and every tool call goes through the application for approval.
"""

from ipybox import _mcpygen
from ipybox._approval import ApprovalRequest
from ipybox._ipybox import __version__
from ipybox.apigen import generate_mcp_sources
from ipybox.code_exec import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult, CodeExecutor

_mcpygen.install()

__all__ = [
    "ApprovalRequest",
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "CodeExecutor",
    "generate_mcp_sources",
    "__version__",
]
