#!/usr/bin/env bash
# The ipybox-rs wheel end to end (see docs/python.md):
#   1. builds it (scripts/build-wheel.sh) unless IPYBOX_WHEEL names one;
#   2. the Python SDK suite in a fresh venv (scripts/python-sdk-check.sh: every example of Python
#      ipybox's docs, against a real kernel and the fixture MCP server);
#   3. `uvx --from <wheel> ipybox` as an MCP server, driven by a real MCP client (the Python `mcp`
#      SDK, tests/python/mcp_server_check.py): tool list, state, registering the fixture over
#      streamable HTTP, a tool call from kernel code, reset;
#   4. freeact 0.9.1 installed with the wheel in place of ipybox by the documented command, driven
#      through its Agent (scripts/freeact-check.sh; its control: --reference, on ipybox 0.9.2).
# Needs scripts/test-env.sh (the client and the fixture run from its venv).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export PATH="$HOME/.local/bin:$PATH"
bash scripts/test-env.sh
wheel=${IPYBOX_WHEEL:-$(bash scripts/build-wheel.sh | tail -1)}
echo "wheel-check: $wheel ($(du -k "$wheel" | cut -f1) KiB)"

bash scripts/python-sdk-check.sh "$wheel"
bash scripts/freeact-check.sh "$wheel"

py="$root/target/test-env/venv/bin/python"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$py" tests/fixtures/mcp_fixture.py http "$port" >/dev/null 2>&1 &
fixture=$!
workspace=$(mktemp -d)
trap 'kill $fixture 2>/dev/null || true; rm -rf "$workspace"' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
# The uv cache of these checks lives under target/, not in HOME.
export UV_CACHE_DIR="$root/target/uv-cache"
echo "wheel-check: uvx --from $(basename "$wheel") ipybox, driven by an MCP client"
IPYBOX_EXPECT_WORKSPACE="$(cd "$workspace" && pwd -P)" \
  "$py" tests/python/mcp_server_check.py "http://127.0.0.1:$port/mcp" -- \
  uvx --from "$wheel" ipybox --workspace "$workspace"
