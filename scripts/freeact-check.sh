#!/usr/bin/env bash
# freeact 0.9.1 (gradion-ai's code-action agent, built on Python ipybox) run unmodified on the
# ipybox-rs wheel, installed by the documented command (docs/python.md, "Applications that depend
# on ipybox"): tests/python/freeact_check.py drives its Agent with a scripted model.
#   bash scripts/freeact-check.sh [WHEEL]       ipybox-rs (default: the target/wheels/ipybox_rs-*.whl build-wheel.sh left)
#   bash scripts/freeact-check.sh --pip [WHEEL] ipybox-rs installed with pip and the `ipybox`
#                                               compatibility wheel (crates/ipybox-py/compat) instead
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
installer=uv
if [ "${1:-}" = --pip ]; then
  installer=pip
  shift
fi
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
[ "$installer" = pip ] && venv="$root/target/freeact/venv-pip"
stamp="${PKGS[*]} $mode $installer"
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
if [ "$installer" = pip ]; then
  # The pip way: the compatibility distribution `ipybox` (no files; requires this ipybox-rs)
  # meets freeact's requirement on ipybox.
  compat=$(python3 crates/ipybox-py/compat/build_compat_wheel.py "$root/target/freeact/compat")
  [ -n "${fresh:-}" ] && "$venv/bin/python" -m ensurepip >/dev/null
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PKGS[@]}" "$wheel" "$compat"
  "$venv/bin/python" -m pip check --disable-pip-version-check
  if ! "$venv/bin/python" -m pip show -q ipybox-rs >/dev/null || [ -n "$(find "$venv"/lib/python3*/site-packages -maxdepth 1 -name 'ipybox-0.9.2.dist-info')" ]; then
    echo "freeact-check: expected ipybox-rs and the compatibility ipybox, not Python ipybox" >&2
    exit 1
  fi
elif [ "$mode" = rs ]; then
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
