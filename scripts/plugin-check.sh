#!/usr/bin/env bash
# Checks of the Claude Code bundle (.claude-plugin/marketplace.json, plugins/, skills/)
# with a pinned Claude Code, in a throwaway HOME: no login, no network beyond the npm registry
# (only to install Claude Code and Node 22 under target/clients/ the first time, through
# scripts/clients.sh) and PyPI (uvx fetches the wheel's dependencies into target/uv-cache/ when
# they are not there yet).
#
#   1. `claude plugin validate --strict` on the marketplace, each plugin and the skill plugin;
#      every plugin's version is the ipybox-rs package version (the launcher runs
#      `uvx --from ipybox-rs==<plugin version>`)
#   2. `claude plugin marketplace add ./`, then install codeact-default, codeact-ask,
#      codeact-sandbox and codeact-docker one at a time: the skill arrives with each (dependency
#      `codeact`) and `claude mcp list` shows the plugin's ipybox server `✔ Connected`, started by
#      the plugin launcher with the project directory as workspace (codeact-ask: with
#      `--approve ask --approve-shell` passed on to ipybox, and Claude Code's captured handshake:
#      `server/discover` at MCP 2026-07-28, answered with the tasks and skills extensions). The
#      binary is found the documented way
#      for a local checkout (target/{release,debug}/ipybox; this script runs `cargo build`).
#      codeact-docker runs the real image (scripts/docker-check.sh builds it) with Docker or
#      podman; without the image it is skipped, or fails under IPYBOX_TEST_STRICT=1.
#   3. Install from git (a local clone served over HTTP on 127.0.0.1; no checkout, so no
#      target/ for the launcher to fall back to): the launcher is copied into the plugin cache;
#      without `ipybox` and without uv it fails with the install commands (uv, pip, cargo);
#      with uvx (on PATH, or in ~/.local/bin) it runs the ipybox-rs wheel from a local directory
#      (`--find-links` through IPYBOX_UVX_ARGS, or UV_FIND_LINKS) and connects; with `ipybox`
#      on PATH it runs that. The wheel: $IPYBOX_WHEEL, else scripts/build-wheel.sh builds it.
# Prints each check; exits non-zero if any fails.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1

TIMEOUT=${PLUGIN_CHECK_TIMEOUT:-120}
dir="$root/target/plugin-check"
mkdir -p "$dir"

passed=0
failed=0
check() { printf 'check: %s ... ' "$1"; }
ok() { echo ok; passed=$((passed + 1)); }
fail() {
  echo FAIL
  [ $# -gt 0 ] && printf '%s\n' "$@" | sed 's/^/    /'
  failed=$((failed + 1))
}

# --- tools ------------------------------------------------------------------------------------
# The pinned Claude Code and Node 22 of scripts/clients.sh (one install for every script).
# shellcheck source=scripts/clients.sh
source "$root/scripts/clients.sh" || { echo "plugin-check: installing Claude Code and Node 22 failed" >&2; exit 1; }
set +e   # clients.sh runs under `set -e`; the checks below count failures themselves
bin_dir="$(dirname "$CLAUDE")"
claude_bin="$CLAUDE"
echo "plugin-check: $("$claude_bin" --version 2>/dev/null), node $("$bin_dir/node" --version)"

cargo build -q --bin ipybox || { echo "plugin-check: cargo build failed" >&2; exit 1; }
kernel_python=$("$root/target/debug/ipybox" setup | sed -n 's/^python: \([^ ]*\).*/\1/p')
[ -x "$kernel_python" ] || { echo "plugin-check: ipybox setup did not report a python" >&2; exit 1; }

# A PATH with Node 22 first and no directory that holds an `ipybox` or uv's `uvx` (the checks
# decide where the binary comes from, and whether uvx is there).
clean_path="$bin_dir"
IFS=: read -r -a path_dirs <<<"$PATH"
for d in "${path_dirs[@]}"; do
  [ -n "$d" ] && [ ! -x "$d/ipybox" ] && [ ! -x "$d/uvx" ] && clean_path="$clean_path:$d"
done
# uvx's cache (the wheel's dependencies, its environments) stays under target/, shared with
# scripts/wheel-check.sh, so only the first run downloads.
export UV_CACHE_DIR="$root/target/uv-cache"

work=$(mktemp -d "$dir/run.XXXXXX")
server_pids=()
cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$work" "${project:-}"
}
trap cleanup EXIT

# claude [ARGS...] in the throwaway HOME: no credentials, no updater, no telemetry.
# EXTRA_PATH=DIRS goes before the clean PATH; UVX_ARGS=... becomes the launcher's
# IPYBOX_UVX_ARGS; OWN_PYTHON=1 leaves IPYBOX_PYTHON unset (the wheel's `ipybox` then runs the
# kernel on its own interpreter, as for a user), else the kernel runs on this checkout's.
run_claude() {
  local kernel_env=("IPYBOX_PYTHON=$kernel_python")
  [ -n "${OWN_PYTHON:-}" ] && kernel_env=()
  env -u ANTHROPIC_API_KEY -u ANTHROPIC_AUTH_TOKEN -u CLAUDE_CODE_OAUTH_TOKEN \
    -u CLAUDE_CONFIG_DIR -u XDG_CONFIG_HOME -u XDG_BIN_HOME -u CARGO_HOME -u IPYBOX_BIN \
    -u IPYBOX_PYTHON -u IPYBOX_UVX_ARGS \
    HOME="$HOME_DIR" PATH="${EXTRA_PATH:+$EXTRA_PATH:}$clean_path" \
    DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 \
    DISABLE_ERROR_REPORTING=1 "${kernel_env[@]}" \
    ${UVX_ARGS:+"IPYBOX_UVX_ARGS=$UVX_ARGS"} \
    IPYBOX_LAUNCH_LOG="$work/launch.log" \
    timeout "$TIMEOUT" "$claude_bin" "$@" </dev/null 2>&1
}

# expect_ok NAME ARGS...: the claude command succeeds.
expect_ok() {
  local name=$1 out
  shift
  check "$name"
  if out=$(run_claude "$@"); then ok; else fail "$out"; fi
}

# expect_connected PLUGIN PROJECT: `claude mcp list` in PROJECT shows the plugin's server
# connected (and no other plugin's ipybox server); prints the launch command it ran and how
# long `claude mcp list` took.
expect_connected() {
  local plugin=$1 project=$2 out line start
  check "claude mcp list: plugin:$plugin:ipybox ✔ Connected"
  : >"$work/launch.log"
  start=$EPOCHREALTIME
  out=$(cd "$project" && run_claude mcp list)
  mcp_list_seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  line=$(grep "^plugin:$plugin:ipybox:" <<<"$out")
  if grep -q "✔ Connected" <<<"$line" && [ "$(grep -c '^plugin:.*:ipybox:' <<<"$out")" = 1 ]; then
    ok
  else
    fail "$out" "launcher ran: $(cat "$work/launch.log")"
  fi
  echo "    launcher ran: $(head -n 1 "$work/launch.log")"
  echo "    claude mcp list took ${mcp_list_seconds}s"
}

# expect_modern_handshake PLUGIN PROJECT: `claude mcp list` again, with a wrapper `ipybox` first on
# PATH (the launcher takes it: see its search order) that records what Claude Code sends and what
# ipybox answers: Claude Code opens with `server/discover` at 2026-07-28 and declares form
# elicitation (what --approve ask needs); ipybox answers 2026-07-28 and offers the tasks and
# skills extensions.
expect_modern_handshake() {
  local plugin=$1 project=$2 out
  check "$plugin: captured handshake: server/discover at 2026-07-28, ipybox offers tasks and skills"
  mkdir -p "$work/tee-bin"
  printf '#!/bin/sh\ntee "%s" | "%s" "$@" | tee "%s"\n' \
    "$work/handshake.in" "$root/target/debug/ipybox" "$work/handshake.out" >"$work/tee-bin/ipybox"
  chmod +x "$work/tee-bin/ipybox"
  : >"$work/launch.log"
  out=$(cd "$project" && EXTRA_PATH="$work/tee-bin" run_claude mcp list)
  if ! grep -q "^plugin:$plugin:ipybox:.*✔ Connected" <<<"$out"; then
    fail "$out"
    return
  fi
  if out=$(python3 "$root/scripts/handshake_check.py" "$work/handshake.in" "$work/handshake.out"); then
    ok
    echo "    $out"
  else
    fail "$out"
  fi
}

# expect_launch TEXT: the launcher's last command contains TEXT.
expect_launch() {
  check "launcher command contains: $1"
  if grep -qF -- "$1" "$work/launch.log"; then ok; else fail "$(cat "$work/launch.log")"; fi
}

# expect_launched COMMAND: the launcher ran exactly COMMAND (the launch log's only line).
expect_launched() {
  check "launcher ran exactly: $1"
  if [ "$(cat "$work/launch.log")" = "$1" ]; then ok; else fail "it ran: $(cat "$work/launch.log")"; fi
}

# --- 1. validation ----------------------------------------------------------------------------
HOME_DIR="$work/home"
mkdir -p "$HOME_DIR"
for target in . plugins/codeact-default plugins/codeact-ask plugins/codeact-sandbox plugins/codeact-docker skills; do
  expect_ok "claude plugin validate --strict $target" plugin validate --strict "$target"
done

# The launcher pins the package to its plugin's version (uvx --from ipybox-rs==<version>), so a
# plugin version without the same ipybox-rs release would not start.
package_version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' crates/ipybox-py/pyproject.toml)
check "plugin versions = ipybox-rs version ($package_version, crates/ipybox-py/pyproject.toml)"
mismatch=$(python3 - "$package_version" <<'EOF'
import json, sys
want = sys.argv[1]
market = {p["name"]: p.get("version") for p in json.load(open(".claude-plugin/marketplace.json"))["plugins"]}
for name in ("codeact-default", "codeact-ask", "codeact-sandbox", "codeact-docker"):
    have = json.load(open(f"plugins/{name}/.claude-plugin/plugin.json")).get("version")
    if have != want:
        print(f"plugins/{name}/.claude-plugin/plugin.json: version {have!r}, want {want!r}")
    if market.get(name) != want:
        print(f".claude-plugin/marketplace.json, plugin {name}: version {market.get(name)!r}, want {want!r}")
EOF
)
if [ -z "$mismatch" ]; then ok; else fail "$mismatch" "bump them together (the launcher runs ipybox-rs==<plugin version>)"; fi

check "marketplace.json at the top level resolves to .claude-plugin/marketplace.json"
if [ "$(readlink -f marketplace.json)" = "$root/.claude-plugin/marketplace.json" ]; then ok; else fail "marketplace.json must be a link to .claude-plugin/marketplace.json"; fi

check "the four plugins share one launcher (plugins/shared/ipybox-mcp)"
launchers_ok=1
for p in codeact-default codeact-ask codeact-sandbox codeact-docker; do
  [ "$(readlink -f "plugins/$p/scripts/ipybox-mcp")" = "$root/plugins/shared/ipybox-mcp" ] || launchers_ok=0
done
if [ $launchers_ok = 1 ]; then ok; else fail "plugins/*/scripts/ipybox-mcp must link to ../../shared/ipybox-mcp"; fi

# --- 2. local-directory marketplace -------------------------------------------------------------
# The project lives outside this checkout, like a user's.
project=$(mktemp -d "${TMPDIR:-/tmp}/ipybox-plugin-project.XXXXXX")
expect_ok "claude plugin marketplace add ./" plugin marketplace add ./

# codeact-docker runs the real image (built by scripts/docker-check.sh) with the engine
# scripts/docker-engine.sh picks (Docker, else podman with this machine's flags).
# shellcheck source=scripts/docker-engine.sh
. "$root/scripts/docker-engine.sh"
have_image=0
"$ENGINE" image inspect "${IPYBOX_DOCKER_IMAGE:-ipybox}" >/dev/null 2>&1 && have_image=1

previous=""
for plugin in codeact-default codeact-ask codeact-sandbox codeact-docker; do
  if [ -n "$previous" ]; then
    expect_ok "claude plugin uninstall $previous@ipybox" plugin uninstall "$previous@ipybox"
  fi
  expect_ok "claude plugin install $plugin@ipybox" plugin install "$plugin@ipybox"
  check "claude plugin details codeact@ipybox: skill codeact installed"
  out=$(run_claude plugin details codeact@ipybox)
  if grep -q "Skills (1) *codeact" <<<"$out"; then ok; else fail "$out"; fi
  if [ "$plugin" = codeact-docker ] && [ "$have_image" = 0 ]; then
    check "codeact-docker: the ipybox image exists"
    if [ -n "${IPYBOX_TEST_STRICT:-}" ]; then
      fail "no image ${IPYBOX_DOCKER_IMAGE:-ipybox}: run scripts/docker-check.sh first"
    else
      echo "skipped (no image ${IPYBOX_DOCKER_IMAGE:-ipybox}: run scripts/docker-check.sh first)"
    fi
  elif [ "$plugin" = codeact-docker ]; then
    expect_connected "$plugin" "$project"
    expect_launch "$ENGINE run -i --rm -v $project:/app/workspace"
  else
    expect_connected "$plugin" "$project"
    expect_launch "$root/target/"
    expect_launch "--workspace $project"
  fi
  [ "$plugin" = codeact-sandbox ] && expect_launch "--sandbox --sandbox-config sandbox-config.json --checkpoint-after 3"
  if [ "$plugin" = codeact-ask ]; then
    expect_launch "--workspace $project --approve ask --approve-shell --checkpoint-after 3"
    expect_modern_handshake "$plugin" "$project"
  fi
  previous=$plugin
done

# --- 3. install from git ----------------------------------------------------------------------
if git help -a 2>/dev/null | grep -q http-backend; then
  repo="$work/repo"
  mkdir -p "$repo"
  cp -a .claude-plugin plugins skills Cargo.toml "$repo/"
  git -C "$repo" init -q
  git -C "$repo" add -A
  git -C "$repo" -c user.name=plugin-check -c user.email=plugin-check@localhost commit -qm snapshot
  git clone -q --bare "$repo" "$work/srv/ipybox.git"
  cat >"$work/githttp.py" <<'EOF'
# Smart-HTTP git server (git http-backend) on 127.0.0.1 for plugin-check.sh.
import http.server, os, subprocess, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def handle_git(self):
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = dict(os.environ, GIT_PROJECT_ROOT=sys.argv[1], GIT_HTTP_EXPORT_ALL="1",
                   PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""), REMOTE_ADDR="127.0.0.1",
                   GIT_PROTOCOL=self.headers.get("Git-Protocol", ""))
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            key, _, value = line.partition(": ")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)

    do_GET = do_POST = handle_git

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
EOF
  python3 "$work/githttp.py" "$work/srv" >"$work/githttp.port" 2>"$work/githttp.log" &
  server_pids+=($!)
  for _ in $(seq 50); do [ -s "$work/githttp.port" ] && break; sleep 0.1; done
  url="http://127.0.0.1:$(cat "$work/githttp.port")/ipybox.git"

  HOME_DIR="$work/home-git"
  mkdir -p "$HOME_DIR"
  expect_ok "git: claude plugin marketplace add $url" plugin marketplace add "$url"
  expect_ok "git: claude plugin install codeact-default@ipybox" plugin install codeact-default@ipybox
  launcher=$(find "$HOME_DIR/.claude/plugins/cache/ipybox/codeact-default" -path '*/scripts/ipybox-mcp' 2>/dev/null | head -n 1)
  check "git: the launcher is a file in the plugin cache (symlink dereferenced)"
  if [ -f "$launcher" ] && [ ! -L "$launcher" ]; then ok; else fail "found: ${launcher:-nothing}"; fi

  check "git: without ipybox and without uvx the launcher exits 127 with the install commands"
  : >"$work/launch.log"
  msg=$(cd "$project" && env -u CARGO_HOME -u XDG_BIN_HOME -u IPYBOX_BIN -u IPYBOX_UVX_ARGS \
    HOME="$HOME_DIR" PATH="$clean_path" IPYBOX_LAUNCH_LOG="$work/launch.log" \
    sh "$launcher" </dev/null 2>&1)
  code=$?
  missing=""
  for want in "uvx --from ipybox-rs==$package_version ipybox" "uv tool install ipybox-rs" \
    "pip install ipybox-rs" "cargo install --git $url ipybox"; do
    grep -qF -- "$want" <<<"$msg" || missing="$missing${missing:+; }$want"
  done
  if [ $code = 127 ] && [ -z "$missing" ] && [ ! -s "$work/launch.log" ]; then
    ok
  else
    fail "exit $code (want 127)${missing:+, message lacks: $missing}, launched: $(cat "$work/launch.log")" "$msg"
  fi

  # The uvx route: no ipybox anywhere (no checkout either: the plugin runs from Claude Code's
  # cache), uvx available, the ipybox-rs wheel in a local directory, its dependencies from PyPI.
  uvx_real=$(command -v uvx || true)
  for d in "$HOME/.local/bin" "${CARGO_HOME:-$HOME/.cargo}/bin"; do
    [ -z "$uvx_real" ] && [ -x "$d/uvx" ] && uvx_real="$d/uvx"
  done
  wheel=""
  check "git/uvx: uv and the ipybox-rs $package_version wheel are at hand"
  if [ -z "$uvx_real" ]; then
    fail "no uvx on PATH, in ~/.local/bin or ~/.cargo/bin: install uv (python3 -m pip install --user uv, or https://docs.astral.sh/uv/getting-started/installation/)"
  else
    if [ -n "${IPYBOX_WHEEL:-}" ]; then
      wheel=$IPYBOX_WHEEL
    else
      echo "plugin-check: IPYBOX_WHEEL is not set; building the wheel with scripts/build-wheel.sh (minutes)" >&2
      wheel=$(PATH="$(dirname "$uvx_real"):$PATH" bash scripts/build-wheel.sh | tail -n 1)
    fi
    case $(basename "$wheel") in
      "ipybox_rs-$package_version-"*.whl) [ -f "$wheel" ] && ok || { fail "no such file: $wheel"; wheel=""; } ;;
      *) fail "IPYBOX_WHEEL=$wheel is not an ipybox_rs-$package_version-*.whl: build one with scripts/build-wheel.sh"; wheel="" ;;
    esac
  fi
  if [ -n "$wheel" ]; then
    # A new directory each run: uv reuses the environment it built for a package version from a
    # --find-links location even after the wheel there changed.
    wheel_dir="$work/wheelhouse"
    uv_bin="$work/uv-bin"
    mkdir -p "$wheel_dir" "$uv_bin"
    cp "$wheel" "$wheel_dir/"
    ln -s "$uvx_real" "$uv_bin/uvx"
    echo "    wheel: $wheel; uvx: $uvx_real ($("$uvx_real" --version 2>/dev/null)); UV_CACHE_DIR=$UV_CACHE_DIR"

    # uvx on PATH, the wheel's directory through IPYBOX_UVX_ARGS.
    OWN_PYTHON=1 EXTRA_PATH="$uv_bin" UVX_ARGS="--find-links $wheel_dir" \
      expect_connected codeact-default "$project"
    expect_launched "$uv_bin/uvx --find-links $wheel_dir --from ipybox-rs==$package_version ipybox --workspace $project --checkpoint-after 3"

    # uvx only in ~/.local/bin (a client started without it on PATH), the wheel's directory
    # through uv's own UV_FIND_LINKS.
    mkdir -p "$HOME_DIR/.local/bin"
    ln -s "$uvx_real" "$HOME_DIR/.local/bin/uvx"
    OWN_PYTHON=1 UV_FIND_LINKS="$wheel_dir" expect_connected codeact-default "$project"
    expect_launched "$HOME_DIR/.local/bin/uvx --from ipybox-rs==$package_version ipybox --workspace $project --checkpoint-after 3"
    rm -f "$HOME_DIR/.local/bin/uvx"
  fi

  path_bin="$work/path-bin"
  mkdir -p "$path_bin"
  ln -s "$root/target/debug/ipybox" "$path_bin/ipybox"
  EXTRA_PATH="$path_bin" expect_connected codeact-default "$project"
  expect_launch "$path_bin/ipybox --workspace $project --checkpoint-after 3"
else
  check "git: install from git (needs git http-backend)"
  fail "git http-backend is not available: install git"
fi

echo "plugin-check: $passed passed, $failed failed"
[ "$failed" = 0 ]
