#!/usr/bin/env bash
# Builds the portable `ipybox` release binary for this machine's architecture on Linux, linked
# by zig against glibc 2.17's symbols (so it runs on every Linux since 2014; docs/releasing.md):
# `maturin build --zig --compatibility manylinux2014 -b bin` of the root crate, in target/portable
# (CARGO_TARGET_DIR) beside the wheel scripts/build-wheel.sh builds there. The same maturin and
# zig as that build means the same linker, which cargo counts in every crate's fingerprint: the
# dependencies the wheel build compiled are reused (`cargo zigbuild` would link through a
# wrapper at another path and compile everything again). Writes <binary>.sha256 (`sha256sum -c`
# format) next to it. Prints the binary's path (last line of stdout).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ "$(uname -s)" != Linux ]; then
  echo "build-release: builds the Linux binary; on $(uname -s) use \`cargo build --release --locked\`" >&2
  exit 2
fi
# The wheel build's venv (maturin + ziglang, pinned there); built by it when missing.
venv="$root/target/wheel-build/venv"
if [ ! -x "$venv/bin/maturin" ]; then
  bash scripts/build-wheel.sh >/dev/null
fi
export PATH="$venv/bin:$PATH"
export CARGO_TARGET_DIR="$root/target/portable"
target="$(uname -m)-unknown-linux-gnu"
out="$root/target/release-bin"
rm -rf "$out"
start=$(date +%s)
"$venv/bin/maturin" build --release --locked --zig --compatibility manylinux2014 --target "$target" \
  -b bin -m Cargo.toml -o "$out/wheel" >&2
bin="$CARGO_TARGET_DIR/$target/release/ipybox"
cp "$bin" "$out/ipybox"
(cd "$out" && sha256sum ipybox >ipybox.sha256)
echo "build-release: $out/ipybox ($(du -k "$out/ipybox" | cut -f1) KiB, $(( $(date +%s) - start )) s)" >&2
echo "$out/ipybox"
