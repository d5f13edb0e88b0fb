#!/usr/bin/env bash
# ipybox's main job, end to end, with no API keys:
#   1. build ipybox and provision the kernel's Python environment (first use only, with progress);
#   2. register a real MCP server (@modelcontextprotocol/server-memory, run with npx) — this
#      generates a typed Python API for its tools in <workspace>/mcptools/memory/;
#   3. run agent-style Python (examples/memory_demo.py) in a kernel; every tool call goes through
#      ipybox, which asks you to approve it on the terminal (without a terminal: --yes).
# Usage: bash scripts/demo.sh [WORKSPACE]   (default: target/demo-workspace)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ws="${1:-$root/target/demo-workspace}"
mkdir -p "$ws"
ws="$(cd "$ws" && pwd)"

echo "==> building ipybox" >&2
cargo build -q --manifest-path "$root/Cargo.toml" --bin ipybox
ipybox="$root/target/debug/ipybox"

echo "==> kernel environment" >&2
"$ipybox" setup

echo "==> registering MCP server 'memory' (npx @modelcontextprotocol/server-memory)" >&2
params=$(printf '{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory@2026.8.31"], "env": {"MEMORY_FILE_PATH": "%s/memory.jsonl"}}' "$ws")
"$ipybox" apigen memory --params "$params" --root "$ws/mcptools" >/dev/null
echo "    generated: $(ls "$ws/mcptools/memory" | tr '\n' ' ')" >&2

echo "==> running examples/memory_demo.py in the kernel" >&2
approve=()
if ! [ -t 0 ] || ! [ -t 2 ]; then
  echo "    (no terminal: approving tool calls with --yes)" >&2
  approve=(--yes)
fi
"$ipybox" exec "${approve[@]}" --workspace "$ws" "$root/examples/memory_demo.py"
