"""An MCP server (stdio, PyPI `mcp` 2.x) with one tool whose every call leaves a trace, for
scripts/claude-e2e.sh: `record(note)` appends `note` as a line to the file $COUNTER_FILE and
answers `recorded <note> (<n> in all)`. The check counts the lines to tell a call that ran from
one that did not (an approval declined must leave the file as it was).

Usage: COUNTER_FILE=/path counter_server.py
"""

import os

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("ipybox-e2e-counter")


@mcp.tool(structured_output=False)
def record(note: str) -> str:
    """Append a note to the counter file and say how many notes it holds."""
    path = os.environ["COUNTER_FILE"]
    with open(path, "a") as f:
        f.write(note + "\n")
    with open(path) as f:
        count = sum(1 for _ in f)
    return f"recorded {note} ({count} in all)"


if __name__ == "__main__":
    mcp.run("stdio")
