"""Drives `ipybox serve --http` with the Python `mcp` SDK over Streamable HTTP, whichever major
version is installed:

- `mcp` 2.x: `Client` (negotiates 2026-07-28 with `server/discover`): a cell without `session`
  starts a new kernel session whose handle the result names; passing it back keeps the state;
  another connection sees that state only with the handle. Also `Client(mode="legacy")` (the
  handshake era over the 2.x SDK): the MCP session keeps its own kernel.
- `mcp` 1.x: `ClientSession` + `streamablehttp_client` (2025-11-25, `initialize`): the MCP
  session keeps its own kernel; a second MCP session has another; a wrong token is refused.

Usage: http_clients_check.py URL TOKEN
Prints one line per check and a final `N passed, M failed`; exits 1 if any check failed.
"""

import importlib.metadata
import re
import sys

import anyio

import checks
from checks import check, summary, text

URL, TOKEN = sys.argv[1], sys.argv[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
NOTE = re.compile(r"\n*\[ipybox session (ipybox-s1\.[^:]+): a new kernel session; pass session=\"\1\" in later calls to keep its state\]$")


def split(result):
    """(output, handle or None) of a cell's result."""
    t = text(result)
    m = NOTE.search(t)
    return (t[: m.start()], m.group(1)) if m else (t, None)


async def modern():
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    def client(**kw):
        return Client(streamable_http_client(URL, http_client=httpx2.AsyncClient(headers=AUTH)), **kw)

    async with client() as a, client() as b:
        check("2.x negotiates", a.session.protocol_version, "2026-07-28")
        r = await a.call_tool("execute_ipython_cell", {"code": "x = 7\nprint('set')"})
        out, handle = split(r)
        check("2.x new session names its handle", (out, handle is not None), ("set", True))
        r = await a.call_tool("execute_ipython_cell", {"code": "print(x * 6)", "session": handle})
        check("2.x handle keeps the state", (r.is_error, text(r)), (False, "42"))
        r = await b.call_tool("execute_ipython_cell", {"code": "print(x)"})
        out, other = split(r)
        check("2.x without the handle: a fresh kernel", ("NameError" in out, other not in (None, handle)), (True, True))
        r = await b.call_tool("execute_ipython_cell", {"code": "print(x)", "session": handle})
        check("2.x another connection with the handle", text(r), "7")
    async with client(mode="legacy") as c:
        check("2.x legacy negotiates", c.session.protocol_version, "2025-11-25")
        await c.call_tool("execute_ipython_cell", {"code": "y = 'legacy'"})
        r = await c.call_tool("execute_ipython_cell", {"code": "print(y)"})
        check("2.x legacy: the MCP session keeps its kernel", (r.is_error, text(r)), (False, "legacy"))


async def legacy():
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with streamablehttp_client(URL, headers=AUTH) as (r1, w1, _), streamablehttp_client(URL, headers=AUTH) as (r2, w2, _):
        async with ClientSession(r1, w1) as a, ClientSession(r2, w2) as b:
            init = await a.initialize()
            await b.initialize()
            check("1.x negotiates", init.protocolVersion, "2025-11-25")
            await a.call_tool("execute_ipython_cell", {"code": "x = 5"})
            r = await a.call_tool("execute_ipython_cell", {"code": "print(x + 1)"})
            check("1.x: the MCP session keeps its kernel", (r.isError, text(r)), (False, "6"))
            r = await b.call_tool("execute_ipython_cell", {"code": "print(x)"})
            check("1.x: another MCP session has another kernel", (r.isError, "NameError" in text(r)), (True, True))
            r = await a.call_tool("reset", {})
            check("1.x reset", text(r), "Kernel reset: a fresh kernel is running and MCP sessions were closed.")
            r = await a.call_tool("execute_ipython_cell", {"code": "print(x)"})
            check("1.x reset cleared the state", "NameError" in text(r), True)
    try:
        async with streamablehttp_client(URL, headers={"Authorization": "Bearer not-the-token-0123456789"}) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
        refused = "no error"
    except BaseException as e:  # the transport's task group wraps the HTTP error
        refused = "401" if "401" in repr(e) else repr(e)
    check("1.x wrong token refused", refused, "401")


async def main():
    if MAJOR >= 2:
        await modern()
    else:
        await legacy()


anyio.run(main)
sys.exit(1 if summary() else 0)
