# Sourced by the container scripts. Sets ENGINE (the container command: $IPYBOX_CONTAINER_ENGINE,
# else docker when it reaches a daemon, else podman) and the flags this machine's engine needs.
# Docker: none. podman on hosts whose default OCI runtime (crun) fails with "cgroups in hybrid
# mode not supported" or whose default rlimits cannot be set ("setrlimit RLIMIT_NOFILE:
# Operation not permitted"), like this project's machines: runc and explicit ulimits, for builds
# (ENGINE_BUILD_ARGS) and, through IPYBOX_DOCKER_ARGS (read by the plugin launcher), for runs.
if [ -n "${IPYBOX_CONTAINER_ENGINE:-}" ]; then
  ENGINE=$IPYBOX_CONTAINER_ENGINE
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  ENGINE=docker
else
  ENGINE=podman
fi
export IPYBOX_CONTAINER_ENGINE=$ENGINE
ENGINE_BUILD_ARGS=()
if "$ENGINE" --version 2>/dev/null | grep -qi podman; then
  podman_flags=(--ulimit nofile=1024:4096 --ulimit nproc=1024:4096)
  if command -v runc >/dev/null 2>&1; then podman_flags=(--runtime runc "${podman_flags[@]}"); fi
  ENGINE_BUILD_ARGS=("${podman_flags[@]}")
  export IPYBOX_DOCKER_ARGS="${podman_flags[*]}"
fi
