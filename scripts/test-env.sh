#!/usr/bin/env bash
# Provisions what the integration tests need beside ipybox's own kernel environment:
#   target/test-env/venv           Python with the MCP SDK (fixture servers) and schema-testing tools
#   target/test-env/node_modules   @modelcontextprotocol/server-everything (pinned)
# Idempotent: a stamp file records what was installed; rerun after changing the pins below.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/test-env"
mkdir -p "$dir"

# hypothesis is pinned below 6.170: 6.170 changed the internal `many()` API that
# hypothesis-jsonschema 0.23.1 drives.
PY_PKGS=(mcp==2.3.0 pydantic==2.13.4 jsonschema==4.26.0 hypothesis==6.169.4 hypothesis-jsonschema==0.23.1)
NPM_PKGS=(@modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-memory@2026.8.31)

stamp="$dir/.stamp"
want="${PY_PKGS[*]} | ${NPM_PKGS[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if ! command -v uv >/dev/null 2>&1; then
  echo "test-env: installing uv (pip install --user uv)" >&2
  python3 -m pip install -q --user uv >&2 || python3 -m pip install -q uv >&2
  export PATH="$HOME/.local/bin:$PATH"
fi
echo "test-env: creating $dir/venv" >&2
rm -rf "$dir/venv"
uv venv -q --python "$(command -v python3)" "$dir/venv"
uv pip install -q --python "$dir/venv/bin/python" "${PY_PKGS[@]}"

echo "test-env: installing ${NPM_PKGS[*]}" >&2
( cd "$dir" && [ -f package.json ] || echo '{"private":true}' > "$dir/package.json"
  cd "$dir" && npm install --no-audit --no-fund --silent "${NPM_PKGS[@]}" )
echo "$want" > "$stamp"
