#!/usr/bin/env bash
# What the container checks need, installed when missing (idempotent):
#   - a container engine: Docker if its daemon runs, else Debian's podman + runc (+ podman-docker
#     for a `docker` command where none is installed) via apt-get;
#   - the base image debian:bookworm-slim: pulled by the engine where a registry serves it; where
#     none does (this project's machines), made with `debootstrap --variant=minbase bookworm`
#     from the host's own apt mirror and imported.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base=debian:bookworm-slim

if ! { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
  if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 \
    || ! command -v debootstrap >/dev/null 2>&1; then
    echo "docker-deps: installing podman, runc, podman-docker, debootstrap (apt-get)" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
      podman runc podman-docker debootstrap uidmap slirp4netns fuse-overlayfs >&2
  fi
fi

# shellcheck source=scripts/docker-engine.sh
. "$root/scripts/docker-engine.sh"
if "$ENGINE" image inspect "$base" >/dev/null 2>&1; then
  exit 0
fi
if timeout 60 "$ENGINE" pull -q "$base" >/dev/null 2>&1; then
  exit 0
fi
# No registry: build the base image from the host's Debian mirror.
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "docker-deps: no Debian mirror configured in /etc/apt" >&2; exit 1; }
rootfs="$root/target/docker/rootfs"
if [ ! -x "$rootfs/bin/sh" ]; then
  echo "docker-deps: debootstrap --variant=minbase bookworm (from the host's mirror)" >&2
  rm -rf "$rootfs"
  mkdir -p "$(dirname "$rootfs")"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$root/target/docker/debootstrap.log" 2>&1 \
    || { tail -20 "$root/target/docker/debootstrap.log" >&2; exit 1; }
fi
# The rootfs's apt sources point at the same mirror the host uses.
echo "docker-deps: importing $rootfs as $base" >&2
tar -C "$rootfs" -c . | "$ENGINE" import - "$base" >/dev/null
