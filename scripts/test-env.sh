#!/usr/bin/env bash
# Provisions what the integration tests need beside ipybox's own kernel environment:
#   target/test-env/venv           Python with the MCP SDK (fixture servers), schema-testing tools,
#                                  and nbformat + nbconvert (the session notebooks validate and render)
#   target/test-env/node_modules   @modelcontextprotocol/server-everything (pinned)
#   target/mcp1/venv              Python `mcp` 1.x (a handshake-era client for the HTTP service)
#   target/test-env/kernel-data    a kernel interpreter (--python) with numpy and pandas: the snapshot
#                                  tests (tests/integration/snapshot.rs) and benches/snapshot.rs
#   target/test-env/jupyter/{kg,eg,js}  Jupyter Kernel Gateway, Enterprise Gateway and Jupyter Server
#                                  (separate venvs: EG pins jupyter-server 1.x), each with the
#                                  kernel image ipybox needs on a server: ipykernel + pydantic (+ cloudpickle for snapshots)
# Idempotent: a stamp file records what was installed; rerun after changing the pins below.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/test-env"
mkdir -p "$dir"

# hypothesis is pinned below 6.170: 6.170 changed the internal `many()` API that
# hypothesis-jsonschema 0.23.1 drives.
PY_PKGS=(mcp==2.3.0 pydantic==2.13.4 jsonschema==4.26.0 hypothesis==6.169.4 hypothesis-jsonschema==0.23.1 nbformat==5.11.1 nbconvert==7.17.2)
# Remote-kernel servers (tests/integration/remote_kernels.rs), one venv each.
JUPYTER_KG=(jupyter-kernel-gateway==3.0.1 ipykernel==7.4.0 pydantic==2.13.4 cloudpickle==3.1.2)
JUPYTER_EG=(jupyter-enterprise-gateway==3.3.0 ipykernel==6.29.5 pydantic==2.13.4 cloudpickle==3.1.2)
JUPYTER_JS=(jupyter-server==2.21.1 ipykernel==7.4.0 pydantic==2.13.4 cloudpickle==3.1.2)
# A kernel environment with data libraries, for session snapshots of numpy/pandas objects.
KERNEL_DATA=(ipykernel==7.4.0 pydantic==2.13.4 cloudpickle==3.1.2 numpy==2.4.6 pandas==3.1.1)
NPM_PKGS=(@modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-memory@2026.8.31)

# The handshake-era Python client for the HTTP service tests (tests/python/http_clients_check.py):
# `mcp` 1.x in a venv of its own, target/mcp1/venv (its own stamp: independent of the rest).
MCP1_PKGS=(mcp==1.30.0)
mcp1="$root/target/mcp1"
if [ ! -f "$mcp1/.stamp" ] || [ "$(cat "$mcp1/.stamp")" != "${MCP1_PKGS[*]}" ]; then
  command -v uv >/dev/null 2>&1 || { python3 -m pip install -q --user uv >&2 || python3 -m pip install -q uv >&2; }
  export PATH="$HOME/.local/bin:$PATH"
  echo "test-env: creating $mcp1/venv (${MCP1_PKGS[*]})" >&2
  rm -rf "$mcp1/venv"
  mkdir -p "$mcp1"
  uv venv -q --python "$(command -v python3)" "$mcp1/venv"
  uv pip install -q --python "$mcp1/venv/bin/python" "${MCP1_PKGS[@]}"
  echo "${MCP1_PKGS[*]}" > "$mcp1/.stamp"
fi

stamp="$dir/.stamp"
want="${PY_PKGS[*]} | ${NPM_PKGS[*]} | ${JUPYTER_KG[*]} | ${JUPYTER_EG[*]} | ${JUPYTER_JS[*]} | ${KERNEL_DATA[*]}"
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

echo "test-env: creating $dir/kernel-data (numpy, pandas)" >&2
rm -rf "$dir/kernel-data"
uv venv -q --python "$(command -v python3)" "$dir/kernel-data"
uv pip install -q --python "$dir/kernel-data/bin/python" "${KERNEL_DATA[@]}"

for server in kg eg js; do
  case $server in
    kg) pkgs=("${JUPYTER_KG[@]}") ;;
    eg) pkgs=("${JUPYTER_EG[@]}") ;;
    js) pkgs=("${JUPYTER_JS[@]}") ;;
  esac
  echo "test-env: creating $dir/jupyter/$server (${pkgs[0]})" >&2
  rm -rf "$dir/jupyter/$server"
  uv venv -q --python "$(command -v python3)" "$dir/jupyter/$server"
  uv pip install -q --python "$dir/jupyter/$server/bin/python" "${pkgs[@]}"
done

echo "test-env: installing ${NPM_PKGS[*]}" >&2
source "$root/scripts/npm-install.sh"
npm_install "$dir" "${NPM_PKGS[@]}"
echo "$want" > "$stamp"
