"""Type stubs of the extension module (see crates/ipybox-py/src/lib.rs)."""

from typing import Any, Awaitable

__version__: str

class Executor:
    def __init__(
        self,
        *,
        python: str,
        working_dir: str,
        restore_working_dir: bool,
        images_dir: str,
        kernel_env: dict[str, str],
        approval_timeout: float | None,
        connect_timeout: float,
        kernel_start_timeout: float,
        sandbox: bool,
        sandbox_config: str | None,
        spare_kernels: int,
        approve_shell_cmds: bool,
        require_shell_escape: bool,
        kernel_gateway: str | None = None,
        notebook_dir: str | None = None,
    ) -> None: ...
    def start(self) -> Awaitable[None]: ...
    def stop(self) -> Awaitable[None]: ...
    def reset(self) -> Awaitable[None]: ...
    def stream(
        self, code: str, timeout: float | None, auto_accept: bool, accept_shell: bool, chunks: bool
    ) -> Stream: ...
    def kernel_pid(self) -> Awaitable[int | None]: ...
    def notebook_path(self) -> str | None: ...

class Stream:
    def next(self) -> Awaitable[tuple[Any, ...] | None]: ...
    def cancel(self) -> None: ...

class Approval:
    server_name: str
    tool_name: str
    arguments: str
    shell: bool
    calls: int
    server_command: str | None
    def accept(self) -> bool: ...
    def reject(self) -> bool: ...

def generate_mcp_sources(server_name: str, params: str, root_dir: str, async_api: bool) -> Awaitable[list[str]]: ...
def register_generated(server_name: str, params: str, root_dir: str) -> None: ...
def describe(server_name: str, tool_name: str, arguments: str, shell: bool = False, calls: int = 1) -> str: ...
def init_logging(level: str) -> None: ...
def run_cli(argv: list[str]) -> int: ...
