#!/usr/bin/env bash
# Runs every server scenario of the MCP conformance runner (as `conformance list` names them)
# against `ipybox serve --http --session-header` (loopback, no token: the runner sends none),
# with the baseline tests/conformance/baseline.yml: the checks that cannot apply to ipybox (the
# runner's fixture tools, prompts, resources; capabilities ipybox does not declare), each with
# its reason. Every other check must pass, `wire-schema-valid` of every scenario included.
# Exits non-zero on any unexpected failure, and on a baselined check that passes (stale).
# Usage: scripts/conformance.sh [path/to/ipybox]   (default: target/debug/ipybox)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ipybox="${1:-$root/target/debug/ipybox}"
source "$root/scripts/clients.sh"     # Node 22
export PATH="$CLIENTS_NODE_BIN:$PATH"
dir="$root/target/conformance"
pkg="@modelcontextprotocol/conformance@0.2.0-alpha.12"
mkdir -p "$dir"
if [ ! -f "$dir/.stamp" ] || [ "$(cat "$dir/.stamp")" != "$pkg" ]; then
  echo "conformance: installing $pkg" >&2
  source "$root/scripts/npm-install.sh"
  npm_install "$dir" "$pkg"
  echo "$pkg" > "$dir/.stamp"
fi
# Every server scenario of the pinned runner ("Server scenarios:" up to "Client scenarios:").
mapfile -t SCENARIOS < <(cd "$dir" && npx --no-install conformance list 2>/dev/null \
  | sed -n '/^Server scenarios/,/^Client scenarios/s/^  - \([^ ]*\).*/\1/p')
[ "${#SCENARIOS[@]}" -gt 50 ] || { echo "conformance: the runner listed ${#SCENARIOS[@]} server scenarios" >&2; exit 1; }
work="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# --session-header: the `session` argument is declared a header parameter (SEP-2243), which the
# custom-header scenario needs to find something to test.
"$ipybox" serve --http "127.0.0.1:$port" --workspace "$work/ws" --warm-sessions 0 --session-header 2>"$work/serve.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
failed=0
for scenario in "${SCENARIOS[@]}"; do
  if (cd "$dir" && npx --no-install conformance server --url "http://127.0.0.1:$port/mcp" \
        --scenario "$scenario" --expected-failures "$root/tests/conformance/baseline.yml" >"$work/$scenario.log" 2>&1); then
    echo "conformance: $scenario: $(grep -E '^Passed:' "$work/$scenario.log" | tail -1)"
  else
    echo "conformance: $scenario FAILED:" >&2
    grep -vE 'npm warn' "$work/$scenario.log" | grep -E 'FAILURE|Error|stale|unexpected' >&2 || tail -20 "$work/$scenario.log" >&2
    failed=$((failed + 1))
  fi
done
echo "conformance: $(( ${#SCENARIOS[@]} - failed )) scenarios passed, $failed failed"
[ "$failed" -eq 0 ]
