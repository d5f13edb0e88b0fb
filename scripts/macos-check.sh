#!/usr/bin/env bash
# Does the workspace compile for macOS? `cargo clippy --workspace --all-targets -D warnings` for
# aarch64-apple-darwin (what ci.yml's macOS job runs first), from Linux: rustup's target for the
# Rust code, zig (the `ziglang` wheel of scripts/build-wheel.sh's venv) as the C compiler of the
# build scripts (ring, aws-lc-sys). Nothing is linked or run: that is for the macOS job on
# GitHub (docs/releasing.md). Not part of scripts/test.sh (about 3 min on 2 cores the first
# time, seconds after); run it after touching Linux-only code (docs/architecture.md, "Platform-
# specific code").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target=aarch64-apple-darwin
venv="$root/target/wheel-build/venv"
if ! "$venv/bin/python" -m ziglang version >/dev/null 2>&1; then
  echo "macos-check: no zig in $venv: run \`bash scripts/build-wheel.sh\` once (it installs maturin and ziglang there)" >&2
  exit 2
fi
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
out="$root/target/macos-check"
mkdir -p "$out"
# cc-rs passes clang's --target and -mmacosx-version-min; zig takes its own -target instead.
cat >"$out/zig-cc" <<EOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do case "\$a" in --target=*|-mmacosx-version-min=*) ;; *) args+=("\$a") ;; esac; done
exec "$venv/bin/python" -m ziglang cc -target aarch64-macos "\${args[@]}"
EOF
printf '#!/bin/sh\nexec "%s/bin/python" -m ziglang ar "$@"\n' "$venv" >"$out/zig-ar"
chmod +x "$out/zig-cc" "$out/zig-ar"
CC_aarch64_apple_darwin="$out/zig-cc" AR_aarch64_apple_darwin="$out/zig-ar" CARGO_TARGET_DIR="$out" \
  cargo clippy --locked --workspace --all-targets --target "$target" -- -D warnings
echo "macos-check: the workspace compiles for $target (clippy, no warnings)"
