#!/usr/bin/env bash
# Builds the ipybox Docker image (default tag `ipybox`, what the codeact-docker plugin runs).
# The image's user gets your UID/GID, so files the kernel writes to the mounted workspace are
# yours. Usage: docker/build.sh [TAG] [extra `docker build` arguments...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tag="${1:-ipybox}"
shift || true
if ! command -v docker >/dev/null 2>&1; then
  echo "error: docker is not installed or not on PATH" >&2
  echo "  help: install Docker (https://docs.docker.com/get-docker/) and rerun" >&2
  exit 1
fi
# BuildKit: cache mounts in the Dockerfile, Dockerfile.dockerignore for the context.
export DOCKER_BUILDKIT=1
exec docker build \
  --build-arg "UID=$(id -u)" \
  --build-arg "GID=$(id -g)" \
  --file "$root/docker/Dockerfile" \
  --tag "$tag" \
  "$@" \
  "$root"
