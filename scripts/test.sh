#!/usr/bin/env bash
# The test command (README): provisions what the tests need, then runs every test against real
# components — a real ipykernel, real MCP servers, real MCP clients, real srt + bubblewrap.
#   scripts/arch-check.py    the module map (docs/architecture.md): no import circle, no arrow up
#   scripts/long-fns.py      no function in src/ over 150 lines
#   scripts/docs-check.py    README.md + docs/*.md: relative links and #anchors resolve, every
#                            --flag the docs name is in the binary's --help
#   scripts/test-env.sh      Python fixture servers + server-everything + schema-testing tools
#   scripts/sandbox-deps.sh  bubblewrap, socat, ripgrep (apt-get) and a pinned srt
#   scripts/build-wheel.sh   the ipybox-rs wheel, manylinux2014 (glibc 2.17, zig)
#   scripts/build-release.sh the portable release binary (glibc 2.17, zig): release_artifacts, image
#   scripts/docker-check.sh  the ipybox image (Docker, else podman) built and driven by an MCP client
#   scripts/wheel-check.sh   the ipybox-rs wheel: the Python SDK suite, `uvx --from <wheel> ipybox`, freeact 0.9.1 on it
#   scripts/plugin-check.sh  the Claude Code marketplace and its four plugins, ✔ Connected
#   scripts/smoke-clients.sh the ipybox MCP server under MCP Inspector and Claude Code
#   tests/python/mcp_approval_check.py  --approve ask and progress with the Python `mcp` client
#   scripts/claude-e2e.sh    one whole Claude Code turn (claude -p) offline, a stand-in for the model
#   scripts/seed-mcp-tests.sh the Python ipybox's own MCP-server tests against `ipybox` (defaults)
#   scripts/unlucky-machine.sh before the cargo tests: process ids past 99 999 (seven digits where
#                            pid_max allows), iniconfig & co. in the kernel environment the tests
#                            would find, a 38-byte runtime base (XDG_RUNTIME_DIR)
# Extra arguments go to `cargo test` (e.g. `bash scripts/test.sh kernel::` for one module).
# Plain `cargo test` skips tests whose components are missing (one line each); here nothing is
# skipped: IPYBOX_TEST_STRICT=1 turns a missing component into a failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python3 scripts/arch-check.py        # seconds: the module map holds before anything is built
python3 scripts/long-fns.py                          # no function in src/ over 150 lines
export PATH="$HOME/.local/bin:$PATH"   # where `pip install --user uv` puts uv
bash scripts/test-env.sh
bash scripts/sandbox-deps.sh
export IPYBOX_SRT="$root/target/sandbox-deps/node_modules/.bin/srt"
cargo build --bin ipybox
python3 scripts/docs-check.py target/debug/ipybox   # links, #anchors, every --flag in --help (~1 s)
"$root/target/debug/ipybox" setup     # provision the kernel environment once, before tests race
# The release artifacts, built once (docs/releasing.md): the manylinux2014 wheel (zig), then the
# glibc 2.17 binary, which reuses every dependency the wheel compiled and is the binary the image
# below is built from (the one release build of the ipybox crate's dependencies here), and the
# pinned tools; tests/integration/release_artifacts.rs checks all three.
IPYBOX_WHEEL=$(bash scripts/build-wheel.sh | tail -1)   # manylinux2014, zig (docs/releasing.md)
export IPYBOX_WHEEL                  # plugin-check.sh runs the launcher's uvx path with it
IPYBOX_RELEASE_TOOLS=$(bash scripts/release-tools.sh | tail -1)
IPYBOX_RELEASE_BINARY=$(bash scripts/build-release.sh | tail -1)
export IPYBOX_RELEASE_TOOLS IPYBOX_RELEASE_BINARY
bash scripts/docker-check.sh         # builds the image codeact-docker runs in plugin-check.sh
bash scripts/wheel-check.sh
IPYBOX_TEST_STRICT=1 bash scripts/plugin-check.sh
bash scripts/smoke-clients.sh
bash scripts/conformance.sh          # the MCP conformance runner against `ipybox serve --http`
target/test-env/venv/bin/python tests/python/mcp_approval_check.py target/debug/ipybox  # --approve ask, progress
bash scripts/claude-e2e.sh           # claude -p with a stand-in Messages API: state, approvals by hook, codeact save/use (+ sandbox, trust)
bash scripts/seed-mcp-tests.sh       # the seed's tests/integration/test_mcp_server.py, exact outputs
# The suite runs as an unlucky machine would (issue 49): long process ids, a kernel environment
# that already holds common packages, a long runtime base. Once, after everything above.
source scripts/unlucky-machine.sh
unlucky_pids
unlucky_kernel_env "$root/target/debug/ipybox"
unlucky_runtime_base /var/tmp
# 2 test threads on 2 cores: each test starts real kernels and servers.
# RUST_BACKTRACE=0: a failure prints its message, not 40 frames that push it out of a log's tail.
RUST_BACKTRACE=0 IPYBOX_TEST_STRICT=1 cargo test --no-fail-fast "$@" -- --test-threads=2
