#!/usr/bin/env bash
# The ipybox image end to end: installs a container engine and the base image when missing
# (scripts/docker-deps.sh), builds the image from a release binary (docker/build.sh), then
# starts the MCP server in a container through the codeact-docker plugin's launcher and drives
# it with a real MCP client (the Python `mcp` SDK, tests/python/mcp_server_check.py): tool list,
# state across cells, registering an MCP server (the fixture over streamable HTTP on the host's
# loopback), a tool call from kernel code, reset. Ends with `N passed, M failed`. Then the same
# image serving MCP over HTTP (`ipybox serve --http`), checked with tests/python/http_clients_check.py.
#
# Needs scripts/test-env.sh (the client and the fixture run from its venv). Image tag: ipybox
# (what the plugin runs; override with IPYBOX_DOCKER_IMAGE).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
image=${IPYBOX_DOCKER_IMAGE:-ipybox}
export PATH="$HOME/.local/bin:$PATH"
bash scripts/test-env.sh
bash scripts/docker-deps.sh
# shellcheck source=scripts/docker-engine.sh
. scripts/docker-engine.sh

# The binary: $IPYBOX_RELEASE_BINARY when set (scripts/test.sh passes the portable release binary
# of scripts/build-release.sh, so the test command compiles one release build, not two), else
# target/release/ipybox, rebuilt when older than the sources.
binary=${IPYBOX_RELEASE_BINARY:-target/release/ipybox}
if [ -z "${IPYBOX_RELEASE_BINARY:-}" ] && { [ ! -x "$binary" ] || [ -n "$(find src Cargo.toml Cargo.lock templates python -newer "$binary" -print -quit)" ]; }; then
  echo "docker-check: cargo build --release" >&2
  cargo build -q --release --locked --bin ipybox
fi
ca=()
for f in "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [ -n "$f" ] && [ -s "$f" ]; then ca=(--ca-bundle "$f"); break; fi
done
start=$(date +%s)
echo "docker-check: building image $image" >&2
bash docker/build.sh --binary "$binary" "${ca[@]}" "$image" -- -q >/dev/null
echo "docker-check: image built in $(( $(date +%s) - start )) s ($("$ENGINE" image inspect "$image" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}'))"

py="$root/target/test-env/venv/bin/python"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$py" tests/fixtures/mcp_fixture.py http "$port" >/dev/null 2>&1 &
fixture=$!
trap 'kill $fixture 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

mkdir -p "$root/target/docker"
workspace=$(mktemp -d "$root/target/docker/ws.XXXXXX")
# The launcher as Claude Code runs it for codeact-docker; --network host lets the container
# reach the fixture on the host's loopback.
IPYBOX_WORKSPACE="$workspace" IPYBOX_DOCKER_IMAGE="$image" \
  "$py" tests/python/mcp_server_check.py "http://127.0.0.1:$port/mcp" -- \
  sh plugins/shared/ipybox-mcp --docker --network host
status=$?
rm -rf "$workspace"

# The image as a service: `ipybox serve --http` in a container (docs/http.md), driven by the
# Python SDK's clients of both eras over HTTP, then stopped (SIGTERM: every kernel stopped).
# --unconfined-sessions: a default container grants no namespaces for bubblewrap (docs/docker.md).
token="docker-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
hport=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# shellcheck disable=SC2086 # IPYBOX_DOCKER_ARGS holds several flags
cid=$("$ENGINE" run -d --rm --network host -e IPYBOX_TOKEN="$token" ${IPYBOX_DOCKER_ARGS:-} \
  "$image" serve --http "127.0.0.1:$hport" --unconfined-sessions)
trap 'kill $fixture 2>/dev/null || true; "$ENGINE" rm -f "$cid" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && break; sleep 0.1; done
echo "docker-check: ipybox serve --http in a container"
"$py" tests/python/http_clients_check.py "http://127.0.0.1:$hport/mcp" "$token" || status=1
stop_start=$(date +%s)
"$ENGINE" stop -t 20 "$cid" >/dev/null
echo "docker-check: the HTTP service stopped in $(( $(date +%s) - stop_start )) s"
exit $status
