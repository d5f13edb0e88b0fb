#!/usr/bin/env bash
# Builds the ipybox image (default tag `ipybox`, what the codeact-docker plugin runs) from a
# prebuilt binary, with Docker or podman.
#
#   docker/build.sh [--binary PATH] [--ca-bundle FILE] [--base IMAGE] [TAG] [-- BUILD ARGS...]
#
#   --binary PATH     the ipybox binary to put in the image (default: target/release/ipybox,
#                     built with `cargo build --release` when missing). It must run on Debian 12
#                     (bookworm): build it on bookworm or an older glibc.
#   --ca-bundle FILE  CA certificates to trust during and after the build (a TLS-intercepting
#                     proxy in front of the package index); default: none.
#   --base IMAGE      the Debian 12 base image (default debian:bookworm-slim).
#
# The image's user gets your UID/GID, so files the kernel writes to the mounted workspace are
# yours. The build runs with the host's network (`--network host`). With podman on hosts whose
# defaults fail (crun, rlimits), the flags from scripts/docker-engine.sh are added. The image the
# tag named before is removed once nothing else uses it; the build context is a temporary
# directory, removed on exit.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
binary="" ca="" base="debian:bookworm-slim" tag="ipybox"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --ca-bundle) ca=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) tag=$1; shift ;;
  esac
done

# The engine and the flags this host needs (scripts/docker-engine.sh): $IPYBOX_CONTAINER_ENGINE,
# else docker when it reaches a daemon, else podman.
# shellcheck source=scripts/docker-engine.sh
. "$root/scripts/docker-engine.sh"
if ! command -v "$ENGINE" >/dev/null 2>&1; then
  echo "error: neither docker (with a running daemon) nor podman is installed" >&2
  echo "  help: install Docker (https://docs.docker.com/get-docker/) or podman and rerun" >&2
  exit 1
fi

if [ -z "$binary" ]; then
  binary="$root/target/release/ipybox"
  if [ ! -x "$binary" ]; then
    echo "docker/build.sh: building the release binary (cargo build --release)" >&2
    cargo build --release --locked --bin ipybox --manifest-path "$root/Cargo.toml"
  fi
fi
[ -x "$binary" ] || { echo "error: $binary is not an executable" >&2; exit 1; }

context=$(mktemp -d "${TMPDIR:-/tmp}/ipybox-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
cp "$root/docker/Dockerfile" "$context/Dockerfile"
cp "$binary" "$context/ipybox"
if [ -n "$ca" ]; then cp "$ca" "$context/extra-ca.crt"; else : >"$context/extra-ca.crt"; fi

# The image this build replaces under the same tag, if any: removed afterwards when nothing else
# names it (no other tag, no container), so rebuilding does not leave an ~860 MB untagged image
# behind each time.
old_id=$("$ENGINE" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)

"$ENGINE" build \
  "${ENGINE_BUILD_ARGS[@]}" \
  --network host \
  --build-arg "BASE=$base" \
  --build-arg "UID=$(id -u)" \
  --build-arg "GID=$(id -g)" \
  --tag "$tag" \
  "$@" \
  "$context"

new_id=$("$ENGINE" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  # `rmi` by ID refuses an image that still has a tag or a container; that refusal is fine.
  "$ENGINE" rmi "$old_id" >/dev/null 2>&1 \
    && echo "docker/build.sh: removed the image $tag replaced (${old_id:0:12})" >&2 || true
fi
