#!/usr/bin/env bash
# Smoke-tests the ipybox MCP server with independent clients (offline, throwaway HOME), on stdio
# and over Streamable HTTP (`ipybox serve --http`, with a bearer token):
#   - MCP Inspector CLI: tools/list names the four tools; tools/call execute_ipython_cell answers.
#   - Claude Code: `claude mcp add` (stdio, and `--transport http` with the token header) then
#     `claude mcp list` shows ipybox ✔ Connected; with a wrong token it does not.
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
# 42, then (the first result of a conversation) the session's handle note.
grep -qE '"text": "42(\\n\\n\[ipybox session ipybox-s1\.stdio\.[^"]*)?"' <<<"$call" || fail "tools/call answered: $call"

echo "smoke-clients: Claude Code $("$CLAUDE" --version 2>/dev/null | head -1) mcp add / mcp list"
(cd "$work/project" && HOME="$work/home" timeout 60 "$CLAUDE" mcp add ipybox -e "IPYBOX_HOME=$kernel_home" -- "$ipybox" --workspace "$work/project" >/dev/null)
listed="$(cd "$work/project" && HOME="$work/home" timeout 120 "$CLAUDE" mcp list 2>&1)"
grep -q "^ipybox: .*✔ Connected" <<<"$listed" || fail "claude mcp list: $listed"

# Over HTTP: one service, a token, the same clients.
token="smoke-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port/mcp"
IPYBOX_HOME="$kernel_home" IPYBOX_TOKEN="$token" "$ipybox" serve --http "127.0.0.1:$port" --workspace "$work/project" 2>"$work/serve.log" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || fail "ipybox serve --http did not start: $(cat "$work/serve.log")"
echo "smoke-clients: MCP Inspector tools/list, tools/call over HTTP"
list="$(cd "$work/project" && HOME="$work/home" timeout 120 node "$INSPECTOR" --cli "$url" --header "Authorization: Bearer $token" --method tools/list 2>/dev/null)" || fail "tools/list over HTTP did not answer"
for tool in execute_ipython_cell install_package register_mcp_server reset; do
  grep -q "\"name\": \"$tool\"" <<<"$list" || fail "tools/list over HTTP lacks $tool"
done
call="$(cd "$work/project" && HOME="$work/home" timeout 120 node "$INSPECTOR" --cli "$url" --header "Authorization: Bearer $token" \
  --method tools/call --tool-name execute_ipython_cell --tool-arg 'code=print(6 * 7)' 2>/dev/null)" || fail "tools/call over HTTP did not answer"
grep -q '"text": "42' <<<"$call" || fail "tools/call over HTTP answered: $call"
echo "smoke-clients: Claude Code mcp add --transport http / mcp list"
(cd "$work/project" && HOME="$work/home" timeout 60 "$CLAUDE" mcp add --transport http ipybox-http "$url" --header "Authorization: Bearer $token" >/dev/null)
(cd "$work/project" && HOME="$work/home" timeout 60 "$CLAUDE" mcp add --transport http ipybox-wrong "$url" --header "Authorization: Bearer wrong-$token" >/dev/null)
listed="$(cd "$work/project" && HOME="$work/home" timeout 120 "$CLAUDE" mcp list 2>&1)"
grep -q "^ipybox-http: $url (HTTP) - ✔ Connected" <<<"$listed" || fail "claude mcp list over HTTP: $listed"
grep "^ipybox-wrong: " <<<"$listed" | grep -qv "✔ Connected" || fail "a wrong token connected: $listed"
grep -q "$token" "$work/serve.log" && fail "the token appears in ipybox's log"
echo "smoke-clients: 7 passed, 0 failed"
