#!/usr/bin/env bash
# Runs the Python ipybox's own MCP-server tests (tests/seed_python/, vendored from
# gradion-ai/ipybox) against this build's `ipybox` with default flags: the seed's exact outputs
# (issue 38). Its client is mcpygen's MCPClient over stdio (mcp 1.x, the handshake era); the
# registered fixture server runs with the venv's `python`. The macOS-only sandbox test skips.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export PATH="$HOME/.local/bin:$PATH"
command -v uv >/dev/null || python3 -m pip install --user -q uv
venv="$root/target/seed-python"
if [ ! -x "$venv/bin/pytest" ]; then
  echo "seed-mcp-tests: making $venv (pytest, pytest-asyncio, mcpygen, mcp 1.x)" >&2
  uv venv -q "$venv" --python "$(command -v python3)"
  VIRTUAL_ENV="$venv" uv pip install -q "mcp>=1.20,<2" "mcpygen==0.1.4" "pytest>=8" "pytest-asyncio>=0.24"
fi
[ -x target/debug/ipybox ] || cargo build --quiet
export IPYBOX_BIN="${IPYBOX_BIN:-$root/target/debug/ipybox}"
export PATH="$venv/bin:$PATH"
cd tests/seed_python
exec "$venv/bin/pytest" -q -p no:cacheprovider --asyncio-mode=auto -o asyncio_default_fixture_loop_scope=function test_mcp_server.py "$@"
