#!/usr/bin/env bash
# One whole Claude Code turn against ipybox, offline and deterministic: Claude Code 2.1.330
# headless (`claude -p`, installed with Node 22 by scripts/clients.sh) in a throwaway HOME, ipybox
# (target/debug/ipybox, `--approve ask --checkpoint-after 3` as the codeact plugins pass it) as its MCP server through `--mcp-config`, and
# tests/claude_code/messages_standin.py in place of the Messages API (ANTHROPIC_BASE_URL): it plays
# a scripted model that
#   1. loads the deferred MCP tools (ToolSearch `select:`),
#   2. runs `execute_ipython_cell` twice, the second cell reading a variable the first set,
#   3. registers tests/claude_code/counter_server.py twice, as `fx` and as `notes` (its one tool
#      appends a line to a file: each call that runs is counted),
#   4. calls fx's tool from a cell and then notes' tool, each an approval (`--approve ask`)
#      answered by the `Elicitation` hook docs/plugins.md gives (taken from the page as it is):
#      it accepts calls of `fx` and declines the rest;
#   5. then, the conversation resumed (`claude -p --continue`: a new ipybox, an empty kernel),
#      runs a cell with the session handle the first result named, and gets `answer` back
#      (the stand-in paused 6 s in the first turn, so ipybox had checkpointed it).
# Checks the exact tool_result texts Claude Code sent back to the stand-in (so, what a model
# reads), that the accepted call ran once and the declined one not at all (the counter file), that
# the hook was asked twice, that Claude Code ended the turn with the stand-in's last words, and
# that no process of the run outlives Claude Code.
# Needs: npm (first run only), target/test-env (scripts/test-env.sh: the `mcp` package for the
# counter server), python3. Prints each check; exits non-zero if any fails.
# Usage: scripts/claude-e2e.sh [path/to/ipybox]   (default: target/debug/ipybox, built if missing)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
ipybox="${1:-$root/target/debug/ipybox}"
TIMEOUT=${CLAUDE_E2E_TIMEOUT:-150}

source "$root/scripts/clients.sh" || { echo "claude-e2e: installing the clients failed" >&2; exit 1; }
set +e   # clients.sh turns errexit on; this script reports each failure itself
[ -x "$ipybox" ] || cargo build -q --bin ipybox || { echo "claude-e2e: cargo build failed" >&2; exit 1; }
venv_python="$root/target/test-env/venv/bin/python"
[ -x "$venv_python" ] || { echo "claude-e2e: $venv_python is missing: run scripts/test-env.sh" >&2; exit 1; }
kernel_home="$(dirname "$("$ipybox" setup | sed -n 's/^kernel environment: //p')")"
[ -n "$kernel_home" ] || { echo "claude-e2e: ipybox setup did not report a managed kernel environment" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ipybox-claude-e2e.XXXXXX")
standin_pid=""
cleanup() {
  if [ -n "$standin_pid" ]; then kill "$standin_pid" 2>/dev/null; wait "$standin_pid" 2>/dev/null; fi
  if [ -n "${CLAUDE_E2E_KEEP:-}" ]; then echo "claude-e2e: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
home="$work/home"
project="$work/project"
mkdir -p "$home" "$project/.claude"
counter="$work/counter.txt"
: >"$counter"

# The Elicitation hook exactly as docs/plugins.md shows it: the settings block (it runs
# $CLAUDE_PROJECT_DIR/.claude/approve.py) and the script, saved unchanged as documented-approve.py;
# approve.py runs that on the same input and logs what it was asked and what it answered.
python3 - "$root/docs/plugins.md" "$project/.claude" <<'EOF' || { echo "claude-e2e: docs/plugins.md no longer shows the Elicitation hook (a json block with \"Elicitation\" and a python block with hookSpecificOutput)" >&2; exit 1; }
import pathlib, re, sys
text = pathlib.Path(sys.argv[1]).read_text()
blocks = re.findall(r"^ *```(\w+)\n(.*?)^ *```", text, re.S | re.M)
settings = next(b for lang, b in blocks if lang == "json" and '"Elicitation"' in b)
hook = next(b for lang, b in blocks if lang == "python" and "hookSpecificOutput" in b)
dedent = lambda b: "\n".join(line[2:] if line.startswith("  ") else line for line in b.splitlines()) + "\n"
out = pathlib.Path(sys.argv[2])
(out / "settings.json").write_text(dedent(settings))
(out / "documented-approve.py").write_text(dedent(hook))
EOF
cat >"$project/.claude/approve.py" <<EOF
import json, subprocess, sys
event = sys.stdin.read()
answer = subprocess.run([sys.executable, "$project/.claude/documented-approve.py"], input=event,
                        capture_output=True, text=True)
sys.stdout.write(answer.stdout)
sys.stderr.write(answer.stderr)
try:
    action = json.loads(answer.stdout)["hookSpecificOutput"]["action"]
except Exception:
    action = "unreadable: " + answer.stdout + answer.stderr
question = json.loads(event).get("message", "").split(chr(10), 1)[0]
with open("$work/hook.log", "a") as log:
    log.write(json.dumps({"message": question, "action": action}) + chr(10))
sys.exit(answer.returncode)
EOF

cat >"$work/mcp.json" <<EOF
{"mcpServers": {"ipybox": {"type": "stdio", "command": "$ipybox",
  "args": ["--workspace", "$project", "--approve", "ask", "--checkpoint-after", "3"],
  "env": {"IPYBOX_HOME": "$kernel_home"}}}}
EOF

server_params() {
  printf '{"command": "%s", "args": ["%s"], "env": {"COUNTER_FILE": "%s"}}' \
    "$venv_python" "$root/tests/claude_code/counter_server.py" "$counter"
}
cat >"$work/plan.json" <<EOF
[
  {"tool": "ToolSearch", "input": {"query": "select:mcp__ipybox__execute_ipython_cell,mcp__ipybox__register_mcp_server", "max_results": 5}},
  {"tool": "mcp__ipybox__execute_ipython_cell", "input": {"code": "answer = 6 * 7\nprint('set answer')"}},
  {"tool": "mcp__ipybox__execute_ipython_cell", "input": {"code": "print(f'answer is {answer}')"}},
  {"tool": "mcp__ipybox__register_mcp_server", "delay": 6, "input": {"server_name": "fx", "server_params": $(server_params)}},
  {"tool": "mcp__ipybox__register_mcp_server", "input": {"server_name": "notes", "server_params": $(server_params)}},
  {"tool": "mcp__ipybox__execute_ipython_cell", "input": {"code": "from mcptools.fx import record\nprint(record.run(record.Params(note='from fx')))"}},
  {"tool": "mcp__ipybox__execute_ipython_cell", "input": {"code": "from mcptools.notes import record as notes_record\nprint(notes_record.run(notes_record.Params(note='from notes')))"}},
  {"text": "All done: stand-in end of turn."},
  {"tool": "mcp__ipybox__execute_ipython_cell", "input": {"code": "print(f'resumed: answer is {answer}')", "session": "{handle}"}},
  {"text": "Resumed: stand-in end of turn."}
]
EOF

python3 "$root/tests/claude_code/messages_standin.py" "$work/plan.json" "$work/requests" >"$work/standin.port" 2>"$work/standin.log" &
standin_pid=$!
for _ in $(seq 100); do [ -s "$work/standin.port" ] && break; sleep 0.1; done
[ -s "$work/standin.port" ] || { echo "claude-e2e: the stand-in did not start: $(cat "$work/standin.log")" >&2; exit 1; }

echo "claude-e2e: Claude Code $("$CLAUDE" --version 2>/dev/null | head -n 1), node $("$CLIENTS_NODE_BIN/node" --version), stand-in on 127.0.0.1:$(cat "$work/standin.port")"
start=$EPOCHREALTIME
(cd "$project" && env -u ANTHROPIC_AUTH_TOKEN -u CLAUDE_CODE_OAUTH_TOKEN -u CLAUDE_CONFIG_DIR \
  -u XDG_CONFIG_HOME -u IPYBOX_PYTHON -u IPYBOX_BIN \
  HOME="$home" PATH="$CLIENTS_NODE_BIN:$PATH" \
  ANTHROPIC_BASE_URL="http://127.0.0.1:$(cat "$work/standin.port")" ANTHROPIC_API_KEY=sk-ant-standin-offline \
  DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  timeout "$TIMEOUT" "$CLAUDE" -p "Use ipybox." --output-format stream-json --verbose \
    --mcp-config "$work/mcp.json" --strict-mcp-config --allowedTools mcp__ipybox \
    </dev/null >"$work/claude.jsonl" 2>"$work/claude.err")
code=$?
seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
echo "claude-e2e: claude -p exited $code after ${seconds}s"
# The conversation resumed later (`claude -p --continue`): a new ipybox server, an empty kernel;
# the model passes the handle of the first result and gets the first turn's state back (ipybox
# checkpointed it while the model paused, the plan's "delay").
(cd "$project" && env -u ANTHROPIC_AUTH_TOKEN -u CLAUDE_CODE_OAUTH_TOKEN -u CLAUDE_CONFIG_DIR \
  -u XDG_CONFIG_HOME -u IPYBOX_PYTHON -u IPYBOX_BIN \
  HOME="$home" PATH="$CLIENTS_NODE_BIN:$PATH" \
  ANTHROPIC_BASE_URL="http://127.0.0.1:$(cat "$work/standin.port")" ANTHROPIC_API_KEY=sk-ant-standin-offline \
  DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  timeout "$TIMEOUT" "$CLAUDE" -p --continue "Go on." --output-format stream-json --verbose \
    --mcp-config "$work/mcp.json" --strict-mcp-config --allowedTools mcp__ipybox \
    </dev/null >"$work/claude2.jsonl" 2>"$work/claude2.err")
code2=$?
echo "claude-e2e: claude -p --continue exited $code2"

# Nothing of the run may outlive Claude Code: ipybox, its kernels and the counter servers (every
# process whose command line, environment or working directory names this run's directory).
leftovers() {
  local p pid
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$standin_pid" ] && continue
    if grep -qsF -- "$work" "$p/cmdline" "$p/environ" || [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$work"* ]]; then
      echo "$pid $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
    fi
  done
}
for _ in $(seq 30); do left=$(leftovers); [ -z "$left" ] && break; sleep 0.1; done
printf '%s' "$left" >"$work/leftovers.txt"

# The checks read what Claude Code sent the stand-in (the main conversation's last request holds
# every tool_use and its tool_result), its stream-json output, the hook's log and the counter file.
python3 - "$work" "$code" "$project" "$code2" <<'EOF'
import glob, json, os, sys

work, code, project, code2 = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
failures = 0


checks = 0


def check(name, got, want):
    global failures, checks
    checks += 1
    print(f"check: {name} ... ", end="")
    if got == want:
        print("ok")
    else:
        failures += 1
        print("FAIL")
        print(f"    want: {want!r}")
        print(f"    got:  {got!r}")


def text_of(content):
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", json.dumps(b)) for b in content if b.get("type") == "text") or content


check("claude -p exits 0", code, 0)
requests = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, "requests", "*.json")))]
main = [r["body"] for r in requests if any(t.get("name") == "ToolSearch" for t in r["body"].get("tools") or [])]
messages = main[-1]["messages"] if main else []
uses, results = [], {}
for m in messages:
    if isinstance(m["content"], str):
        continue
    for b in m["content"]:
        if b["type"] == "tool_use":
            uses.append(b)
        elif b["type"] == "tool_result":
            results[b["tool_use_id"]] = b
got = [(u["name"], bool(results.get(u["id"], {}).get("is_error")), text_of(results.get(u["id"], {}).get("content", "<no tool_result>"))) for u in uses]
plan = json.load(open(os.path.join(work, "plan.json")))
check("the model's tool calls reached ipybox through Claude Code, in order", [u["name"] for u in uses], [s["tool"] for s in plan if "tool" in s])
# The first result of the conversation names its session handle (docs/mcp-server.md, "Resuming
# a conversation"); the handle is random, its note's text is not.
import re
first = got[1][2] if len(got) > 1 and isinstance(got[1][2], str) else ""
handle = re.search(r"ipybox-s1\.stdio\.[A-Za-z0-9_-]+", first)
handle = handle.group(0) if handle else "<no handle in the first result>"
handle_note = f'[ipybox session {handle}: pass session="{handle}" in later calls; a resumed conversation passes it to get its state back]'
want = [
    ("ToolSearch select: loads the deferred ipybox tools", None),
    ("execute_ipython_cell: answer = 6 * 7, and the session's handle", (False, "set answer\n\n" + handle_note)),
    ("execute_ipython_cell: the next cell reads answer (state kept)", (False, "answer is 42")),
    ("register_mcp_server fx", (False, "record")),
    ("register_mcp_server notes", (False, "record")),
    ("--approve ask, hook accepts fx.record: the call ran, its result reached the model", (False, "recorded from fx (1 in all)")),
    ("--approve ask, hook declines notes.record: ApprovalRejected, short, reached the model as an error", (True,
        "Traceback (most recent call last):\n"
        "  Cell In[4], line 2\n"
        "    print(notes_record.run(notes_record.Params(note='from notes')))\n"
        "ApprovalRejected: Approval request for notes.record rejected: tool call notes.record was rejected: declined by the user\n"
        "  help: the call was not made, and the cell stopped there (what ran before it stands); do not make it again unless the user asks for it")),
]
for i, (name, expect) in enumerate(want):
    have = got[i] if i < len(got) else None
    if expect is None:
        refs = None
        if have is not None:
            result = results.get(uses[i]["id"], {}).get("content")
            refs = sorted(b.get("tool_name") for b in result) if isinstance(result, list) else result
        check(name, refs, ["mcp__ipybox__execute_ipython_cell", "mcp__ipybox__register_mcp_server"])
    else:
        check(f"tool_result: {name}", have[1:] if have else None, expect)

# The resumed conversation (`claude -p --continue`, a new ipybox): the handle brought the first
# turn's `answer` back; the result starts with what was restored.
resumed = got[7] if len(got) > 7 else None
check("claude -p --continue exits 0", code2, 0)
def restored(result):
    if not result or not isinstance(result[2], str):
        return result
    lines = result[2].split("\n")
    taken = lines[0].startswith("[ipybox] This session's kernel was restored from a snapshot taken ")
    return (result[1], taken, lines[1:2], lines[-1])
check("tool_result: the resumed conversation passes the handle and reads answer (state restored)",
      restored(resumed), (False, True, ["Came back (1): answer (int)."], "resumed: answer is 42"))
with open(os.path.join(work, "counter.txt")) as f:
    check("counter server: the accepted call ran once, the declined one never", f.read(), "from fx\n")
try:
    with open(os.path.join(work, "hook.log")) as f:
        hook = [json.loads(line) for line in f]
except FileNotFoundError:
    hook = []
check("the Elicitation hook of docs/plugins.md was asked twice and answered accept, decline", hook, [
    {"message": "ipybox: Allow executed code to call the tool `record` of the MCP server `fx`?", "action": "accept"},
    {"message": "ipybox: Allow executed code to call the tool `record` of the MCP server `notes`?", "action": "decline"},
])
with open(os.path.join(work, "leftovers.txt")) as f:
    check("no process of the run (ipybox, kernels, MCP servers) is left 3 s after claude -p exits", f.read(), "")
final = None
with open(os.path.join(work, "claude.jsonl")) as f:
    for line in f:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "result":
            final = {k: event.get(k) for k in ("subtype", "is_error", "result")}
check("Claude Code ends the turn with the stand-in's last words", final,
      {"subtype": "success", "is_error": False, "result": "All done: stand-in end of turn."})
final2 = None
with open(os.path.join(work, "claude2.jsonl")) as f:
    for line in f:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "result":
            final2 = {k: event.get(k) for k in ("subtype", "is_error", "result")}
check("Claude Code ends the resumed turn with the stand-in's last words", final2,
      {"subtype": "success", "is_error": False, "result": "Resumed: stand-in end of turn."})
print(f"claude-e2e: {checks - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
EOF
status=$?
if [ $status != 0 ]; then
  echo "claude-e2e: Claude Code's stderr:" && sed 's/^/    /' "$work/claude.err" | tail -n 20
  echo "claude-e2e: rerun with CLAUDE_E2E_KEEP=1 to keep $work (requests/, claude.jsonl, hook.log)"
fi
echo "claude-e2e: $seconds s for the turn"
exit $status
