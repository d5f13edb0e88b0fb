"""Drives an ipybox MCP server with the Python `mcp` SDK's stdio clients (real MCP clients) and
checks the main job end to end: the tool list, stateful execution, registering an MCP server, a
tool call from kernel code through the generated API, and reset. Twice, once per MCP era: a
`ClientSession` that sends `initialize` (handshake era) and a `Client` that negotiates 2026-07-28
with `server/discover`; each starts its own server.

Usage: mcp_server_check.py FIXTURE_URL -- COMMAND [ARGS...]
  FIXTURE_URL  streamable-HTTP URL of tests/fixtures/mcp_fixture.py, reachable from the server
  COMMAND      how to start the ipybox MCP server (e.g. the codeact-docker plugin launcher)
  IPYBOX_EXPECT_WORKSPACE  the kernel's expected working directory (default: /app/workspace,
               the image's)

Prints one line per check and a final `N passed, M failed`; exits 1 if any check failed.
"""

import re
import os
import sys

from contextlib import asynccontextmanager

import anyio
import checks
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import summary, text

ERA = "handshake"


def check(name, actual, expected):
    checks.check(f"[{ERA}] {name}", actual, expected)


@asynccontextmanager
async def connect(params):
    """A session of the current era, after checking the negotiated revision and server name."""
    if ERA == "handshake":
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                check("negotiated a handshake revision", init.protocol_version < "2026-07-28", True)
                check("server name", init.server_info.name, "ipybox")
                yield session
    else:
        async with Client(params) as client:
            check("negotiated revision", client.protocol_version, ERA)
            check("server name", client.server_info.name, "ipybox")
            yield client


async def main(url, command):
    global ERA
    for era in ("handshake", "2026-07-28"):
        ERA = era
        await one_era(url, command)
    return summary()


async def one_era(url, command):
    # The whole environment: the SDK passes only a few variables by default, and the launcher
    # reads IPYBOX_* ones.
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    async with connect(params) as session:
        tools = await session.list_tools()
        check(
            "tools",
            sorted(t.name for t in tools.tools),
            ["execute_ipython_cell", "install_package", "register_mcp_server", "reset"],
        )

        async def run(code):
            r = await session.call_tool("execute_ipython_cell", {"code": code})
            return r.is_error, text(r)

        # The first result names the session's handle (docs/mcp-server.md, "Resuming a
        # conversation"), unless the server cannot keep snapshots (no writable data directory).
        err, out = await run("x = 21")
        note = re.fullmatch(
            r'\[ipybox session (ipybox-s1\.stdio\.[A-Za-z0-9_-]+): pass session="\1" in later calls; '
            r"a resumed conversation passes it to get its state back\]",
            out,
        )
        check("execute: assignment (the first result names the session's handle)", (err, out == "" or bool(note)), (False, True))
        check("execute: state kept", await run("x * 2"), (False, "42"))
        check(
            "execute: runs in the workspace",
            await run("import os; os.getcwd()"),
            (False, repr(os.environ.get("IPYBOX_EXPECT_WORKSPACE", "/app/workspace"))),
        )
        r = await session.call_tool(
            "register_mcp_server", {"server_name": "fx", "server_params": {"url": url}}
        )
        check(
            "register_mcp_server (streamable HTTP)",
            (r.is_error, "greet" in text(r).split("\n")),
            (False, True),
        )
        check(
            "tool call from kernel code",
            await run(
                "from mcptools.fx import add, greet\n"
                "print(add.run(add.Params(a=2, b=40)).sum)\n"
                "print(greet.run(greet.Params(name='ipybox')))"
            ),
            (False, "42\nHello, ipybox!"),
        )
        r = await session.call_tool("reset", {})
        check("reset", r.is_error, False)
        err, out = await run("x")
        check("reset cleared the state", (err, "NameError" in out), (True, True))


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(1 if anyio.run(main, sys.argv[1], sys.argv[sep + 1 :]) else 0)
