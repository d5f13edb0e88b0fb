#!/usr/bin/env bash
# freeact 0.9.1 (gradion-ai's code-action agent, built on Python ipybox) run unmodified on the
# ipybox-rs wheel, installed by the documented command (docs/python.md, "Applications that depend
# on ipybox"): tests/python/freeact_check.py drives its Agent with a scripted model.
#   bash scripts/freeact-check.sh [WHEEL]       ipybox-rs (default: the target/wheels/ipybox_rs-*.whl build-wheel.sh left)
#   bash scripts/freeact-check.sh --reference   the same check against Python ipybox 0.9.2 (the control)
# Versions are pinned as freeact 0.9.1's lock pins them (pydantic-ai 1.59.0); mcpygen 0.1.4
# breaks on `mcp` 2.x, so mcp is the last 1.x. The venvs live under target/freeact/ and are kept
# between runs while their package list is unchanged (the wheel is reinstalled each run).
# Needs scripts/test-env.sh (the fixture MCP server runs from its venv: mcp 2.x).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export PATH="$HOME/.local/bin:$PATH"
export UV_CACHE_DIR="$root/target/uv-cache"
PKGS=(freeact==0.9.1 pydantic-ai==1.59.0 mcp==1.30.0)

mode=rs
wheel=""
case "${1:-}" in
  --reference) mode=reference ;;
  "") wheels=(target/wheels/ipybox_rs-*.whl); wheel=${wheels[0]} ;;  # build-wheel.sh leaves one
  *) wheel="$1" ;;
esac
if [ "$mode" = rs ] && [ ! -f "$wheel" ]; then
  echo "freeact-check: no wheel: run scripts/build-wheel.sh or pass its path" >&2
  exit 2
fi

venv="$root/target/freeact/venv-$mode"
stamp="${PKGS[*]} $mode"
if [ "$(cat "$venv/.ipybox-pkgs" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  uv venv -q --python "$(command -v python3)" "$venv"
  fresh=1
fi
overrides="$root/target/freeact/overrides.txt"
# The documented install: uv's override drops the dependency on `ipybox` (the PyPI package);
# ipybox-rs provides the `ipybox` module in its place.
printf 'ipybox ; sys_platform == "never"\n' > "$overrides"
if [ "$mode" = rs ]; then
  uv pip install -q --python "$venv/bin/python" --reinstall-package ipybox-rs "${PKGS[@]}" "$wheel" --overrides "$overrides"
  if uv pip show -q --python "$venv/bin/python" ipybox >/dev/null 2>&1; then
    echo "freeact-check: Python ipybox got installed beside ipybox-rs" >&2
    exit 1
  fi
else
  uv pip install -q --python "$venv/bin/python" "${PKGS[@]}" ipybox==0.9.2
fi
[ -n "${fresh:-}" ] && echo "$stamp" > "$venv/.ipybox-pkgs"

work=$(mktemp -d)
home=$(mktemp -d)
trap 'rm -rf "$work" "$home"' EXIT
start=$(date +%s)
(cd "$work" && IPYBOX_HOME="$home" FIXTURE_PYTHON="$root/target/test-env/venv/bin/python" \
  "$venv/bin/python" "$root/tests/python/freeact_check.py" "$mode")
echo "freeact-check [$mode]: $(( $(date +%s) - start )) s"
