#!/usr/bin/env bash
# Installs what `ipybox --sandbox` needs on Linux, for the sandbox tests, benches and local use:
#   Debian packages   bubblewrap socat ripgrep   (apt-get; skipped when already on PATH)
#   target/sandbox-deps/node_modules/.bin/srt    @anthropic-ai/sandbox-runtime (pinned)
# Tests and benches find srt through IPYBOX_SRT=target/sandbox-deps/node_modules/.bin/srt.
# Users install srt globally instead: `npm install -g @anthropic-ai/sandbox-runtime@<pin below>`.
# Idempotent: a stamp file records the pinned version.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/sandbox-deps"
SRT_PKG="@anthropic-ai/sandbox-runtime@0.0.78"

if [ "$(uname -s)" = "Linux" ]; then
  missing=()
  command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
  command -v socat >/dev/null 2>&1 || missing+=(socat)
  command -v rg >/dev/null 2>&1 || missing+=(ripgrep)
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "sandbox-deps: installing ${missing[*]} (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
fi

mkdir -p "$dir"
stamp="$dir/.stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SRT_PKG" ] && [ -x "$dir/node_modules/.bin/srt" ]; then
  exit 0
fi
echo "sandbox-deps: installing $SRT_PKG into $dir" >&2
source "$root/scripts/npm-install.sh"
npm_install "$dir" "$SRT_PKG"
echo "$SRT_PKG" > "$stamp"
