#!/usr/bin/env bash
# Installs the Python ipybox we replace (0.9.2, with mcp<2 which it needs) into
# target/reference/venv, so `cargo bench --bench mcp_server` can measure it side by side.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/reference"
[ -x "$dir/venv/bin/ipybox" ] && exit 0
export PATH="$HOME/.local/bin:$PATH"
uv venv -q "$dir/venv"
uv pip install -q --python "$dir/venv/bin/python" "ipybox==0.9.2" "mcp<2"
