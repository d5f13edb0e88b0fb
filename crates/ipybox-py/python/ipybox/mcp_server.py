"""Python ipybox 0.9.2's MCP server module. In ipybox-rs the MCP server is the `ipybox` command
(the same server as the Rust binary): `cli()` runs it as 0.9.2's did; the class is gone."""

from ipybox._moved import moved

_INSTEAD = {
    "MCPServer": "run the `ipybox` command (`ipybox --workspace DIR`, or ipybox.mcp_server.cli()); "
    "from Python, ipybox.CodeExecutor gives the same execution without MCP",
    "*": "run the `ipybox` command (`ipybox --help`)",
}


def cli() -> None:
    """Runs the MCP server (the `ipybox` command) with this process's arguments."""
    from ipybox._cli import main

    main()


def __getattr__(name: str):
    moved(__name__, name, _INSTEAD)
