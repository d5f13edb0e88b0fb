#!/usr/bin/env bash
# Smoke-tests the ipybox MCP server with independent clients (offline, throwaway HOME):
#   - MCP Inspector CLI: tools/list names the four tools; tools/call execute_ipython_cell answers.
#   - Claude Code: `claude mcp add` then `claude mcp list` shows ipybox ✔ Connected.
# Usage: scripts/smoke-clients.sh [path/to/ipybox]   (default: target/debug/ipybox)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ipybox="${1:-$root/target/debug/ipybox}"
source "$root/scripts/clients.sh"
export PATH="$CLIENTS_NODE_BIN:$PATH"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home" "$work/project"
fail() { echo "smoke-clients: FAIL: $*" >&2; exit 1; }
# The clients run with a throwaway HOME; keep using the already provisioned kernel environment.
kernel_home="$(dirname "$("$ipybox" setup | sed -n 's/^kernel environment: //p')")"
[ -n "$kernel_home" ] || fail "ipybox setup did not report a managed kernel environment"

echo "smoke-clients: MCP Inspector $(node "$INSPECTOR" --version 2>/dev/null || true) tools/list"
list="$(cd "$work/project" && HOME="$work/home" timeout 120 node "$INSPECTOR" --cli -e "IPYBOX_HOME=$kernel_home" "$ipybox" --workspace "$work/project" --method tools/list 2>/dev/null)" || fail "tools/list did not answer"
for tool in execute_ipython_cell install_package register_mcp_server reset; do
  grep -q "\"name\": \"$tool\"" <<<"$list" || fail "tools/list lacks $tool"
done
echo "smoke-clients: MCP Inspector tools/call execute_ipython_cell"
call="$(cd "$work/project" && HOME="$work/home" timeout 120 node "$INSPECTOR" --cli -e "IPYBOX_HOME=$kernel_home" "$ipybox" --workspace "$work/project" \
  --method tools/call --tool-name execute_ipython_cell --tool-arg 'code=print(6 * 7)' 2>/dev/null)" || fail "tools/call did not answer"
grep -q '"text": "42"' <<<"$call" || fail "tools/call answered: $call"

echo "smoke-clients: Claude Code $("$CLAUDE" --version 2>/dev/null | head -1) mcp add / mcp list"
(cd "$work/project" && HOME="$work/home" timeout 60 "$CLAUDE" mcp add ipybox -e "IPYBOX_HOME=$kernel_home" -- "$ipybox" --workspace "$work/project" >/dev/null)
listed="$(cd "$work/project" && HOME="$work/home" timeout 120 "$CLAUDE" mcp list 2>&1)"
grep -q "^ipybox: .*✔ Connected" <<<"$listed" || fail "claude mcp list: $listed"
echo "smoke-clients: 3 passed, 0 failed"
