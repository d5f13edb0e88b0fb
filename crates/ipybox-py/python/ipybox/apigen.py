"""`generate_mcp_sources`: a typed Python tool API for an MCP server's tools."""

import json
from pathlib import Path
from typing import Any

from ipybox import _exit, _ipybox


async def generate_mcp_sources(
    server_name: str,
    server_params: dict[str, Any],
    root_dir: Path,
    async_api: bool = False,
) -> list[str]:
    """Generate a typed Python tool API for an MCP server.

    Connects to the MCP server, lists its tools and writes the package
    `root_dir/server_name/` with one module per tool: a Pydantic `Params` model, a `Result`
    model (or `str` for tools without an output schema) and `run()`. An existing package of
    that name is replaced.

    The server is also registered on this host for `root_dir`: code in a kernel whose executor
    imports from `root_dir` (`from server_name import ...`, with `root_dir` on `kernel_env`'s
    `PYTHONPATH`) or from its parent (`from mcptools.server_name import ...` for
    `root_dir=Path("mcptools")` in the working directory) may call it, with these params.

    Args:
        server_name: Name of the generated package (a Python identifier); also how the
            generated code names the server when it calls it.
        server_params: Connection parameters: `command`, `args`, `env` (and `cwd`) for stdio
            servers; `url` and `headers` (and `type`: `streamable_http` or `sse`) for HTTP
            servers. `${VAR}` placeholders are replaced from the environment.
        root_dir: Parent directory of the generated package (relative: from the current
            directory).
        async_api: Generate `async def run(...)` functions, awaited from (async) kernel code;
            many calls can be in flight at once with `asyncio.gather`.

    Returns:
        The module names, one per tool (sanitized tool names).
    """
    _exit.arm()
    return await _ipybox.generate_mcp_sources(
        server_name, json.dumps(server_params), str(root_dir), async_api
    )
