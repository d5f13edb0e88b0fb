#!/usr/bin/env bash
# Builds the ipybox-rs wheel (the Python SDK `import ipybox` + the `ipybox` command) into
# target/wheels/, with maturin from a private build venv. Prints the wheel's path (last line of
# stdout).
#   bash scripts/build-wheel.sh            release build (what users install), portable:
#                                          manylinux2014 (glibc 2.17), linked by zig (`maturin
#                                          --zig`, the `ziglang` wheel from PyPI), so it installs
#                                          on every x86_64 Linux since 2014 (docs/releasing.md)
#   IPYBOX_WHEEL_PROFILE=dev bash ...      unoptimized, linked for this machine's glibc, faster
# The portable build compiles into target/portable (CARGO_TARGET_DIR), apart from the dev builds
# in target/debug; scripts/build-release.sh builds the `ipybox` binary there too and reuses the
# dependencies this build compiled.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
MATURIN=maturin==1.16.0
ZIG=ziglang==0.17.0
venv="$root/target/wheel-build/venv"
if [ ! -x "$venv/bin/maturin" ] || ! "$venv/bin/maturin" --version 2>/dev/null | grep -q "${MATURIN#maturin==}" \
   || ! "$venv/bin/python" -m ziglang version 2>/dev/null | grep -qx "${ZIG#ziglang==}"; then
  if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q --user uv >&2 || python3 -m pip install -q uv >&2
    export PATH="$HOME/.local/bin:$PATH"
  fi
  echo "build-wheel: installing $MATURIN $ZIG into $venv" >&2
  rm -rf "$venv"
  uv venv -q --python "$(command -v python3)" "$venv" >&2
  uv pip install -q --python "$venv/bin/python" "$MATURIN" "$ZIG" >&2
fi
profile=${IPYBOX_WHEEL_PROFILE:-release}
args=(build -m crates/ipybox-py/Cargo.toml --interpreter "$(command -v python3)" -o target/wheels)
if [ "$profile" = release ] && [ "$(uname -s)" != Linux ]; then
  args+=(--release --locked)
elif [ "$profile" = release ]; then
  # maturin finds zig as `python -m ziglang` of the interpreter it runs under (the venv's).
  args+=(--release --locked --zig --compatibility manylinux2014 --target "$(uname -m)-unknown-linux-gnu")
  export CARGO_TARGET_DIR="$root/target/portable"
  export PATH="$venv/bin:$PATH"
fi
# Only this build's wheel is left in target/wheels, so "the newest wheel" is unambiguous.
rm -f target/wheels/ipybox_rs-*.whl
start=$(date +%s)
"$venv/bin/maturin" "${args[@]}" >&2
wheel=$(ls -t target/wheels/ipybox_rs-*.whl | head -1)
echo "build-wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB, $(( $(date +%s) - start )) s)" >&2
echo "$root/$wheel"
