#!/usr/bin/env bash
# Whole Claude Code conversations against ipybox, offline and deterministic: Claude Code 2.1.330
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
# Then the codeact skill's "save a code action, use it in a later conversation", with ipybox
# started as the plugins start it (their .mcp.json, through plugins/shared/ipybox-mcp with
# IPYBOX_BIN; an IPYBOX_HOME of the run's own, so the trust ledger is the run's):
#   6. codeact-default (no sandbox), a project of its own: a conversation writes
#      gentools/demo/double/{api,impl}.py from a cell, resets, imports and calls it (42); a new
#      conversation (a fresh `claude -p`, a new ipybox) imports and calls it again (42);
#   7. codeact-sandbox (`--sandbox`, srt from target/sandbox-deps via IPYBOX_SRT), another
#      project: the same two conversations, both sandboxed (42, 42); then a third conversation
#      there with codeact-default's configuration (unsandboxed): its import is refused with the
#      UntrustedModuleError that names `ipybox trust`; `ipybox trust --yes <project>/gentools`
#      (the run's IPYBOX_HOME) accepts the two files, and a fourth unsandboxed conversation
#      gets 42. The refusal has its controls in the run: the same code saved unsandboxed is
#      imported by a later unsandboxed conversation (6.), and accepted it is imported (7.).
# Checks the exact tool_result texts Claude Code sent back to the stand-in (so, what a model
# reads), that the accepted call ran once and the declined one not at all (the counter file), that
# the hook was asked twice, that Claude Code ended the turn with the stand-in's last words, and
# that no process of the run outlives Claude Code.
# Needs: npm (first run only), target/test-env (scripts/test-env.sh: the `mcp` package for the
# counter server), target/sandbox-deps (scripts/sandbox-deps.sh: srt, bubblewrap, socat),
# python3. Prints each check; exits non-zero if any fails.
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
kernel_python="$("$ipybox" setup | sed -n 's/^kernel environment: //p')/bin/python"
[ -x "$kernel_python" ] || { echo "claude-e2e: $kernel_python (the kernel environment's python) is missing" >&2; exit 1; }
srt="${IPYBOX_SRT:-$root/target/sandbox-deps/node_modules/.bin/srt}"
[ -x "$srt" ] || { echo "claude-e2e: $srt is missing: run scripts/sandbox-deps.sh" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ipybox-claude-e2e.XXXXXX")
standin_pid=""
cleanup() {
  if [ -n "$standin_pid" ]; then kill "$standin_pid" 2>/dev/null; wait "$standin_pid" 2>/dev/null; fi
  if [ -n "${CLAUDE_E2E_KEEP:-}" ]; then echo "claude-e2e: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
home="$work/home"
project="$work/project"
# The codeact flows: a project each, and an IPYBOX_HOME of the run's own (its trust ledger).
saved="$work/saved"
sandboxed="$work/sandboxed"
ipybox_home="$work/ipybox-home"
mkdir -p "$home" "$project/.claude" "$saved" "$sandboxed" "$ipybox_home"
: >"$work/codes.txt"
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
cat >"$work/plan-ipybox.json" <<EOF
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
# The codeact conversations, one plan per prompt (the stand-in picks a conversation's plan by its
# prompt): "save" writes the code action from a cell, resets, imports and calls it; "use"
# imports and calls it.
python3 - "$work" <<'EOF' || { echo "claude-e2e: writing the plans failed" >&2; exit 1; }
import json, os, sys
work = sys.argv[1]
cell = "mcp__ipybox__execute_ipython_cell"
api = (
    '"""Doubles a number (a saved code action)."""\n\n\n'
    "def double(x: int) -> int:\n"
    '    """Twice `x`."""\n'
    "    from .impl import double as _impl\n\n"
    "    return _impl(x)\n"
)
impl = '"""Implementation of gentools.demo.double.api."""\n\n\ndef double(x: int) -> int:\n    return 2 * x\n'
write = (
    "from pathlib import Path\n"
    "d = Path('gentools/demo/double')\n"
    "d.mkdir(parents=True, exist_ok=True)\n"
    f"(d / 'api.py').write_text({api!r})\n"
    f"(d / 'impl.py').write_text({impl!r})\n"
    "print(sorted(str(p) for p in d.glob('*.py')))"
)
use = "from gentools.demo.double.api import double\nprint(double(21))"
save_plan = [
    {"tool": "ToolSearch", "input": {"query": f"select:{cell},mcp__ipybox__reset", "max_results": 5}},
    {"tool": cell, "input": {"code": write}},
    {"tool": "mcp__ipybox__reset", "input": {}},
    {"tool": cell, "input": {"code": use}},
    {"text": "Saved: stand-in end of turn."},
]
use_plan = [
    {"tool": "ToolSearch", "input": {"query": f"select:{cell}", "max_results": 5}},
    {"tool": cell, "input": {"code": use}},
    {"text": "Used: stand-in end of turn."},
]
with open(os.path.join(work, "plan-ipybox.json")) as f:
    plans = {"Use ipybox.": json.load(f)}
for prompt in ("codeact default 1: save double", "codeact sandbox 1: save double"):
    plans[prompt] = save_plan
for prompt in ("codeact default 2: use double", "codeact sandbox 2: use double",
               "codeact unsandboxed 3: use double", "codeact unsandboxed 4: use double"):
    plans[prompt] = use_plan
with open(os.path.join(work, "plan.json"), "w") as f:
    json.dump(plans, f, indent=1)
EOF

# ipybox as the codeact-default and codeact-sandbox plugins start it: their .mcp.json server,
# ${CLAUDE_PLUGIN_ROOT} the plugin's folder, the binary through IPYBOX_BIN.
for plugin in default sandbox; do
  python3 - "$root/plugins/codeact-$plugin" "$work/mcp-codeact-$plugin.json" "$ipybox" "$ipybox_home" "$kernel_python" "$srt" <<'EOF' || { echo "claude-e2e: plugins/codeact-$plugin/.mcp.json has no ipybox server" >&2; exit 1; }
import json, sys
plugin, out, ipybox, home, python, srt = sys.argv[1:]
with open(f"{plugin}/.mcp.json") as f:
    server = json.load(f)["mcpServers"]["ipybox"]
server = {
    "type": "stdio",
    "command": server["command"],
    "args": [a.replace("${CLAUDE_PLUGIN_ROOT}", plugin) for a in server["args"]],
    "env": {"IPYBOX_BIN": ipybox, "IPYBOX_HOME": home, "IPYBOX_PYTHON": python, "IPYBOX_SRT": srt},
}
with open(out, "w") as f:
    json.dump({"mcpServers": {"ipybox": server}}, f, indent=1)
EOF
done

python3 "$root/tests/claude_code/messages_standin.py" "$work/plan.json" "$work/requests" >"$work/standin.port" 2>"$work/standin.log" &
standin_pid=$!
for _ in $(seq 100); do [ -s "$work/standin.port" ] && break; sleep 0.1; done
[ -s "$work/standin.port" ] || { echo "claude-e2e: the stand-in did not start: $(cat "$work/standin.log")" >&2; exit 1; }

echo "claude-e2e: Claude Code $("$CLAUDE" --version 2>/dev/null | head -n 1), node $("$CLIENTS_NODE_BIN/node" --version), stand-in on 127.0.0.1:$(cat "$work/standin.port")"
start=$EPOCHREALTIME
# One headless Claude Code run: NAME (its files: NAME.jsonl, NAME.err; its exit status goes to
# codes.txt), the project directory it runs in, its MCP config, its prompt, then more flags.
run_claude() {
  local name=$1 dir=$2 config=$3 prompt=$4 t0=$EPOCHREALTIME code
  shift 4
  (cd "$dir" && env -u ANTHROPIC_AUTH_TOKEN -u CLAUDE_CODE_OAUTH_TOKEN -u CLAUDE_CONFIG_DIR \
    -u XDG_CONFIG_HOME -u IPYBOX_PYTHON -u IPYBOX_BIN -u IPYBOX_HOME -u IPYBOX_SRT \
    HOME="$home" PATH="$CLIENTS_NODE_BIN:$PATH" \
    ANTHROPIC_BASE_URL="http://127.0.0.1:$(cat "$work/standin.port")" ANTHROPIC_API_KEY=sk-ant-standin-offline \
    DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
    timeout "$TIMEOUT" "$CLAUDE" -p "$@" "$prompt" --output-format stream-json --verbose \
      --mcp-config "$config" --strict-mcp-config --allowedTools mcp__ipybox \
      </dev/null >"$work/$name.jsonl" 2>"$work/$name.err")
  code=$?
  echo "$name $code" >>"$work/codes.txt"
  echo "claude-e2e: $name: claude -p $* exited $code after $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')s"
}
run_claude claude "$project" "$work/mcp.json" "Use ipybox."
# The conversation resumed later (`claude -p --continue`): a new ipybox server, an empty kernel;
# the model passes the handle of the first result and gets the first turn's state back (ipybox
# checkpointed it while the model paused, the plan's "delay").
run_claude claude2 "$project" "$work/mcp.json" "Go on." --continue

# The codeact skill's "save a code action, use it in a later conversation" (each conversation a
# fresh `claude -p`, so a new ipybox and an empty kernel), without and with the sandbox.
run_claude default1 "$saved" "$work/mcp-codeact-default.json" "codeact default 1: save double"
run_claude default2 "$saved" "$work/mcp-codeact-default.json" "codeact default 2: use double"
run_claude sandbox1 "$sandboxed" "$work/mcp-codeact-sandbox.json" "codeact sandbox 1: save double"
run_claude sandbox2 "$sandboxed" "$work/mcp-codeact-sandbox.json" "codeact sandbox 2: use double"
# What the sandboxed conversations saved, imported by an unsandboxed one: refused until a person
# accepts it with `ipybox trust` (the ledger of the servers' IPYBOX_HOME).
run_claude unsandboxed3 "$sandboxed" "$work/mcp-codeact-default.json" "codeact unsandboxed 3: use double"
(cd "$work" && env -u IPYBOX_PYTHON -u IPYBOX_BIN -u IPYBOX_SRT HOME="$home" IPYBOX_HOME="$ipybox_home" \
  "$ipybox" trust --yes "$sandboxed/gentools" </dev/null >"$work/trust.out" 2>"$work/trust.err")
echo "trust $?" >>"$work/codes.txt"
run_claude unsandboxed4 "$sandboxed" "$work/mcp-codeact-default.json" "codeact unsandboxed 4: use double"
seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

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

# The checks read what Claude Code sent the stand-in (each conversation's last request holds
# every tool_use and its tool_result), its stream-json output, the hook's log, the counter file and
# what `ipybox trust` printed.
python3 - "$work" "$project" "$sandboxed" <<'EOF'
import glob, json, os, re, sys

work, project, sandboxed = sys.argv[1], sys.argv[2], sys.argv[3]
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


with open(os.path.join(work, "codes.txt")) as f:
    codes = dict(line.split() for line in f if line.strip())
requests = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, "requests", "*.json")))]
with open(os.path.join(work, "plan.json")) as f:
    plans = json.load(f)


def prompt_of(body):
    """The prompt of a main-conversation request (its first user message's text block that is a
    plan's prompt), or None for Claude Code's side requests."""
    if not any(t.get("name") == "ToolSearch" for t in body.get("tools") or []):
        return None
    first = next((m for m in body.get("messages", []) if m.get("role") == "user"), {})
    content = first.get("content")
    texts = [content] if isinstance(content, str) else [b.get("text", "") for b in content or [] if b.get("type") == "text"]
    return next((t.strip() for t in texts if t.strip() in plans), None)


def transcript(prompt):
    """The conversation of `prompt` as Claude Code last sent it (its last request holds every
    tool_use and tool_result): [(tool, is_error, result text or content)], the tool_use blocks
    and the results by id."""
    bodies = [r["body"] for r in requests if prompt_of(r["body"]) == prompt]
    messages = bodies[-1]["messages"] if bodies else []
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
    return got, uses, results


def tool_refs(uses, results, i):
    """What ToolSearch (the i-th call) loaded: the tool names it referenced."""
    if i >= len(uses):
        return None
    result = results.get(uses[i]["id"], {}).get("content")
    return sorted(b.get("tool_name") for b in result) if isinstance(result, list) else result


def final_words(name):
    final = None
    with open(os.path.join(work, f"{name}.jsonl")) as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") == "result":
                final = {k: event.get(k) for k in ("subtype", "is_error", "result")}
    return final


def handle_note(handle):
    return f'[ipybox session {handle}: pass session="{handle}" in later calls; a resumed conversation passes it to get its state back]'


# The first result of a conversation names its session handle (docs/mcp-server.md, "Resuming
# a conversation"); the handle is random, its note's text is not.
HANDLE = re.compile(r"ipybox-s1\.stdio\.[A-Za-z0-9_-]+")


def with_note(text):
    """`text` with the session note that ends it replaced by `<note>` (when it is the note of the
    handle it names)."""
    if not isinstance(text, str):
        return text
    found = HANDLE.search(text)
    note = "\n\n" + handle_note(found.group(0)) if found else None
    return text[: -len(note)] + "\n\n<note>" if note and text.endswith(note) else text


for name in ("claude", "claude2"):
    check(f"{name}: claude -p{' --continue' if name == 'claude2' else ''} exits 0", codes.get(name), "0")
got, uses, results = transcript("Use ipybox.")
check("the model's tool calls reached ipybox through Claude Code, in order", [u["name"] for u in uses], [s["tool"] for s in plans["Use ipybox."] if "tool" in s])
first = got[1][2] if len(got) > 1 and isinstance(got[1][2], str) else ""
handle = HANDLE.search(first)
handle = handle.group(0) if handle else "<no handle in the first result>"
want = [
    ("ToolSearch select: loads the deferred ipybox tools", None),
    ("execute_ipython_cell: answer = 6 * 7, and the session's handle", (False, "set answer\n\n" + handle_note(handle))),
    ("execute_ipython_cell: the next cell reads answer (state kept)", (False, "answer is 42")),
    ("register_mcp_server fx", (False, "record")),
    ("register_mcp_server notes", (False, "record")),
    ("--approve ask, hook accepts fx.record: the call ran, its result reached the model", (False, "recorded from fx (1 in all)")),
    ("--approve ask, hook declines notes.record: ApprovalRejectedError, short, reached the model as an error", (True,
        "Traceback (most recent call last):\n"
        "  Cell In[4], line 2\n"
        "    print(notes_record.run(notes_record.Params(note='from notes')))\n"
        "ApprovalRejectedError: Approval request for notes.record rejected: tool call notes.record was rejected: declined by the user\n"
        "  help: the call was not made, and the cell stopped there (what ran before it stands); do not make it again unless the user asks for it")),
]
for i, (name, expect) in enumerate(want):
    have = got[i] if i < len(got) else None
    if expect is None:
        check(name, tool_refs(uses, results, i), ["mcp__ipybox__execute_ipython_cell", "mcp__ipybox__register_mcp_server"])
    else:
        check(f"tool_result: {name}", have[1:] if have else None, expect)

# The resumed conversation (`claude -p --continue`, a new ipybox): the handle brought the first
# turn's `answer` back; the result starts with what was restored.
resumed = got[7] if len(got) > 7 else None
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
check("Claude Code ends the turn with the stand-in's last words", final_words("claude"),
      {"subtype": "success", "is_error": False, "result": "All done: stand-in end of turn."})
check("Claude Code ends the resumed turn with the stand-in's last words", final_words("claude2"),
      {"subtype": "success", "is_error": False, "result": "Resumed: stand-in end of turn."})

# The codeact flows: save a code action, use it in later conversations.
cell = "mcp__ipybox__execute_ipython_cell"
saved = (False, "['gentools/demo/double/api.py', 'gentools/demo/double/impl.py']\n\n<note>")
reset = (False, "Kernel reset: a fresh kernel is running and MCP sessions were closed.")
used_first = (False, "42\n\n<note>")  # the conversation's first ipybox result: it names the handle
used_after_reset = (False, "42")
flows = [
    ("default1", "codeact default 1: save double", "codeact-default (no sandbox): writes gentools/demo/double from a cell, resets, imports it",
     [saved, reset, used_after_reset], "Saved: stand-in end of turn."),
    ("default2", "codeact default 2: use double", "codeact-default, a later conversation (a new ipybox): imports the saved code action",
     [used_first], "Used: stand-in end of turn."),
    ("sandbox1", "codeact sandbox 1: save double", "codeact-sandbox (--sandbox): writes gentools/demo/double from a cell, resets, imports it",
     [saved, reset, used_after_reset], "Saved: stand-in end of turn."),
    ("sandbox2", "codeact sandbox 2: use double", "codeact-sandbox, a later conversation (a new sandboxed ipybox): imports what a sandboxed kernel saved, as it is",
     [used_first], "Used: stand-in end of turn."),
]
for name, prompt, what, results_want, last in flows:
    check(f"{name}: claude -p exits 0", codes.get(name), "0")
    got, uses, results = transcript(prompt)
    check(f"{name}: the model's tool calls reached ipybox, in order", [u["name"] for u in uses], [s["tool"] for s in plans[prompt] if "tool" in s])
    check(f"{name}: ToolSearch select: loads the deferred ipybox tools", tool_refs(uses, results, 0),
          sorted(plans[prompt][0]["input"]["query"].removeprefix("select:").split(",")))
    check(f"tool_result: {what}", [(e, with_note(t)) for _, e, t in got[1:]], results_want)
    check(f"{name}: Claude Code ends the turn with the stand-in's last words", final_words(name),
          {"subtype": "success", "is_error": False, "result": last})

# An unsandboxed conversation in the sandboxed conversations' workspace: the import is refused,
# naming the file, the sandboxed kernel's window and `ipybox trust`. The error is shown short,
# as a refused tool call is (the cell's frame, then the error and help lines): checked exactly,
# with the policy's digest and the window's times (which vary) replaced by placeholders.
api = os.path.join(sandboxed, "gentools/demo/double/api.py")
refused = (True, [
    "Traceback (most recent call last):",
    "  Cell In[1], line 1",
    "    from gentools.demo.double.api import double",
], f"UntrustedModuleError: {api} may have been written by a sandboxed kernel (--sandbox, policy sha256:<digest>) "
    "(running <UTC> to <UTC>), and this kernel is not sandboxed: it is not imported until a person accepts it\n"
    f"  help: read it, then run `ipybox trust {api}` (or `ipybox trust DIR` for a whole directory); "
    "a sandboxed session imports it as it is\n\n<note>")


def refusal(result):
    """(is_error, the traceback's lines before the error, the error line on, placeholders in)."""
    e, text = result
    if not isinstance(text, str) or "\nUntrustedModuleError: " not in text:
        return result
    head, _, tail = text.rpartition("\nUntrustedModuleError: ")
    tail = "UntrustedModuleError: " + tail
    tail = re.sub(r"policy sha256:[0-9a-f]{12}\)", "policy sha256:<digest>)", tail)
    tail = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "<UTC>", tail)
    return (e, head.split("\n"), with_note(tail))


check("unsandboxed3: claude -p exits 0", codes.get("unsandboxed3"), "0")
got, uses, results = transcript("codeact unsandboxed 3: use double")
check("tool_result: codeact-default after codeact-sandbox (same workspace): UntrustedModuleError naming `ipybox trust`",
      [refusal(r[1:]) for r in got[1:]], [refused])
check("ipybox trust --yes <workspace>/gentools exits 0", codes.get("trust"), "0")
with open(os.path.join(work, "trust.out")) as f:
    out = f.read().splitlines()
check("ipybox trust lists the two files the sandboxed conversation wrote and accepts them",
      ([line for line in out if line.startswith("=== ")], out[-2:]),
      ([f"=== {sandboxed}/gentools/demo/double/api.py", f"=== {sandboxed}/gentools/demo/double/impl.py"],
       ["2 file(s) written while a sandboxed kernel could write them.",
        "accepted 2 file(s): unsandboxed kernels import them as they are now"]))
check("unsandboxed4: claude -p exits 0", codes.get("unsandboxed4"), "0")
got, uses, results = transcript("codeact unsandboxed 4: use double")
check("tool_result: codeact-default after `ipybox trust`: imports the accepted code action",
      [(e, with_note(t)) for _, e, t in got[1:]], [used_first])
check("unsandboxed4: Claude Code ends the turn with the stand-in's last words", final_words("unsandboxed4"),
      {"subtype": "success", "is_error": False, "result": "Used: stand-in end of turn."})

with open(os.path.join(work, "leftovers.txt")) as f:
    check("no process of the run (ipybox, kernels, MCP servers) is left 3 s after the last claude -p exits", f.read(), "")
print(f"claude-e2e: {checks - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
EOF
status=$?
if [ $status != 0 ]; then
  for err in "$work"/*.err; do
    [ -s "$err" ] || continue
    echo "claude-e2e: $(basename "$err"):" && sed 's/^/    /' "$err" | tail -n 20
  done
  echo "claude-e2e: rerun with CLAUDE_E2E_KEEP=1 to keep $work (requests/, NAME.jsonl, hook.log, trust.out)"
fi
echo "claude-e2e: $seconds s for the $(wc -l <"$work/codes.txt") runs (claude -p and ipybox trust)"
exit $status

