"""Drives an ipybox MCP server with the Python `mcp` SDK's stdio clients (real MCP clients) of both
MCP eras and checks approvals and progress notifications end to end. Every group runs twice: with
`ClientSession` + `initialize` (the handshake era: approvals are `elicitation/create` requests)
and with `Client` (2026-07-28, negotiated by `server/discover`: approvals are `input_required`
rounds that the client answers through the same elicitation callback and retries):
  1. `--approve ask`: a tool call from kernel code is asked about (form elicitation with a boolean
     `remember`); accept once, decline, cancel, accept for the session, no answer in time
     (`--approval-timeout 1`).
  2. a client without the elicitation capability: tool calls and shell commands are rejected
     (never accepted), plain code still runs.
  3. `--approve-shell --require-shell-escape`: shell commands are asked about with the expanded
     command; a declined one does not run; subprocess calls need the shell escape.
  4. progress: a call with a progress token gets the cell's output as progress messages while it
     runs (whole lines, none in its first 250 ms, the rest is in the result only); a quick cell
     and a call without a token get none.
  5. rounds (2026-07-28 only): an accepted call resumes the same execution (it runs once), two
     calls in a row are two questions, eight concurrent calls (`asyncio.gather`) are asked about
     together.

Usage: mcp_approval_check.py [IPYBOX]
  IPYBOX  the ipybox binary (default: $IPYBOX_BIN, else target/debug/ipybox of this checkout)
Run it with a Python that has the `mcp` package (scripts/test-env.sh's venv): the same
interpreter serves tests/fixtures/mcp_fixture.py, the MCP server registered as `fx`.

Prints one line per check and a final `N passed, M failed`; exits 1 if any check failed.
"""

import os
import sys
import tempfile
from pathlib import Path

import anyio
import mcp.types as types
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

import checks
from checks import summary, text

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = str(ROOT / "tests" / "fixtures" / "mcp_fixture.py")

CALL_ADD = "from mcptools.fx import add\nprint(add.run(add.Params(a=1, b=2)).sum)"
ASK_ADD = (
    "ipybox: Allow executed code to call the tool `add` of the MCP server `fx`?\n\n"
    f"Server: {sys.executable} {FIXTURE} stdio\n"
    "Arguments: a=1, b=2"
)
REJECTED = "ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: "
NOBODY = (
    "ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: nobody could be asked: ipybox runs with "
    "--approve ask, but this MCP client did not declare the elicitation capability"
)
TIMEOUT = "ApprovalTimeoutError: Approval request for fx.add expired: tool call fx.add was not approved within 1 s, so it was not made"
ASK_SHELL = "ipybox: Run this shell command from executed code?\n\n"
SHELL_REJECTED = (
    "ApprovalRejectedError: Approval request for ipybox.shell rejected: shell command `touch declined.txt` was rejected: declined by the user"
)
PROGRESS_CELL = (
    "import time\n"
    "for i in range(6):\n"
    "    print(f'line {i}', flush=True)\n"
    "    time.sleep(0.2)\n"
    "print('end', end='')"
)
PROGRESS_TEXT = "\n".join(f"line {i}" for i in range(6)) + "\nend"


class User:
    """Answers elicitations from a script of answers (accept, remember, decline, cancel, never)
    and records each question as (message, requested schema)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.questions = []

    def messages(self):
        return [m for m, _ in self.questions]

    async def __call__(self, context, params):
        self.questions.append((params.message, getattr(params, "requested_schema", None)))
        answer = self.answers.pop(0) if self.answers else "decline"
        if answer == "accept":
            return types.ElicitResult(action="accept", content={})
        if answer == "remember":
            return types.ElicitResult(action="accept", content={"remember": True})
        if answer == "late":  # after the approval timeout (1 s in the checks that use it)
            await anyio.sleep(2.5)
            return types.ElicitResult(action="accept", content={})
        return types.ElicitResult(action=answer)


ERA = "handshake"  # or "2026-07-28"; set by main() for each pass


def check(name, actual, expected):
    checks.check(f"[{ERA}] {name}", actual, expected)


class Server:
    """One ipybox MCP server (fresh workspace) and a client of the current era to it."""

    def __init__(self, ipybox, flags, user=None):
        self.ipybox, self.flags, self.user = ipybox, flags, user

    async def __aenter__(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.workspace = Path(self._tmp.name)
        params = StdioServerParameters(
            command=self.ipybox,
            # No session handle in results (their exact text is checked here); resuming is
            # tested in tests/integration/stdio_resume.rs.
            args=["--workspace", str(self.workspace), "--log-level", "warn", "--checkpoint-after", "off"] + self.flags,
            env=dict(os.environ),
        )
        if ERA == "handshake":
            self._client = stdio_client(params)
            read, write = await self._client.__aenter__()
            self._session = ClientSession(read, write, elicitation_callback=self.user)
            self.session = await self._session.__aenter__()
            result = await self.session.initialize()
            version = result.protocol_version
        else:
            self._client = None
            self._session = Client(params, elicitation_callback=self.user)
            self.session = await self._session.__aenter__()
            version = self.session.protocol_version
        check("negotiated revision", version < "2026-07-28" if ERA == "handshake" else version, True if ERA == "handshake" else ERA)
        return self

    async def __aexit__(self, *exc):
        try:
            await self._session.__aexit__(*exc)
        finally:
            if self._client is not None:
                await self._client.__aexit__(*exc)
            self._tmp.cleanup()

    async def run(self, code, **kwargs):
        r = await self.session.call_tool("execute_ipython_cell", {"code": code}, **kwargs)
        return bool(r.is_error), text(r)

    async def register_fixture(self):
        r = await self.session.call_tool(
            "register_mcp_server",
            {
                "server_name": "fx",
                "server_params": {"command": sys.executable, "args": [FIXTURE, "stdio"]},
            },
        )
        check(
            "register_mcp_server fx (stdio)",
            (r.is_error, "add" in text(r).split("\n")),
            (False, True),
        )


def rejected(out, line):
    """(the cell failed, the exact error line is in its output)"""
    return line in out.split("\n")


def has_line(out, line):
    """`line` is one of the output's lines: a command's output on a pty ends its lines in
    `\\r\\n`, and the first line has no `\\n` before it."""
    return any(l.rstrip("\r").strip() == line for l in out.split("\n"))


async def ask_tool_calls(ipybox):
    user = User("accept", "decline", "cancel", "remember")
    async with Server(ipybox, ["--approve", "ask"], user) as s:
        await s.register_fixture()
        check("ask: accept once runs the call", await s.run(CALL_ADD), (False, "3"))
        check("ask: the question", user.messages(), [ASK_ADD])
        schema = user.questions[0][1] or {}
        check(
            "ask: the form has a boolean `remember`",
            (schema.get("type"), schema.get("properties", {}).get("remember", {}).get("type")),
            ("object", "boolean"),
        )
        err, out = await s.run(CALL_ADD)
        check("ask: decline", (err, rejected(out, REJECTED + "declined by the user")), (True, True))
        err, out = await s.run(CALL_ADD)
        check("ask: cancel", (err, rejected(out, REJECTED + "cancelled by the user")), (True, True))
        check("ask: accept for the session", await s.run(CALL_ADD), (False, "3"))
        check(
            "ask: then not asked again",
            (await s.run(CALL_ADD), await s.run(CALL_ADD)),
            ((False, "3"), (False, "3")),
        )
        check("ask: asked 4 times in all", user.messages(), [ASK_ADD] * 4)

    user = User("late")
    async with Server(ipybox, ["--approve", "ask", "--approval-timeout", "1"], user) as s:
        await s.register_fixture()
        err, out = await s.run(CALL_ADD)
        check(
            "ask: no answer within --approval-timeout 1",
            (err, rejected(out, TIMEOUT)),
            (True, True),
        )
        check("ask: the server still answers", await s.run("print(6*7)"), (False, "42"))
        check("ask: asked once", user.messages(), [ASK_ADD])


async def no_elicitation_capability(ipybox):
    async with Server(ipybox, ["--approve", "ask", "--approve-shell"]) as s:
        await s.register_fixture()
        err, out = await s.run(CALL_ADD)
        check(
            "no elicitation capability: tool call rejected",
            (err, any(line.startswith(NOBODY) for line in out.split("\n"))),
            (True, True),
        )
        err, out = await s.run("!echo never-runs")
        check(
            "no elicitation capability: shell command rejected, not run",
            (err, has_line(out, "never-runs")),
            (True, False),
        )
        check(
            "no elicitation capability: plain code runs", await s.run("print(6*7)"), (False, "42")
        )
    # The control: without --approve-shell the same command runs, and the same check finds it.
    async with Server(ipybox, ["--approve", "ask"]) as s:
        err, out = await s.run("!echo never-runs")
        check(
            "no elicitation capability, shell not asked: the command runs (the control)",
            (err, has_line(out, "never-runs")),
            (False, True),
        )


async def ask_shell(ipybox):
    user = User("accept", "decline")
    flags = ["--approve", "ask", "--approve-shell", "--require-shell-escape"]
    async with Server(ipybox, flags, user) as s:
        check(
            "shell: accepted command runs",
            await s.run("name='world'\n!echo hello {name}"),
            (False, "hello world"),
        )
        check(
            "shell: the question shows the expanded command",
            user.messages(),
            [ASK_SHELL + "echo hello world"],
        )
        err, out = await s.run("!touch declined.txt")
        check(
            "shell: decline",
            (err, rejected(out, SHELL_REJECTED)),
            (True, True),
        )
        check(
            "shell: declined command did not run", (s.workspace / "declined.txt").exists(), False
        )
        check(
            "shell: asked twice",
            user.messages(),
            [ASK_SHELL + "echo hello world", ASK_SHELL + "touch declined.txt"],
        )
        err, out = await s.run("import subprocess\nsubprocess.run(['true'])")
        check(
            "shell: subprocess needs the shell escape",
            (err, "ShellEscapeRequired" in out),
            (True, True),
        )
        check("shell: no question for subprocess", len(user.questions), 2)


async def progress(ipybox):
    async with Server(ipybox, []) as s:
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, total, message))

        err, out = await s.run(PROGRESS_CELL, progress_callback=on_progress)
        check("progress: result", (err, out), (False, PROGRESS_TEXT))
        sent = "\n".join(m or "" for _, _, m in seen)
        check("progress: messages are whole lines of the output", PROGRESS_TEXT.startswith(sent + "\n"), True)
        check("progress: none in the first 250 ms", all(p >= 0.25 for p, _, _ in seen), True)
        values = [p for p, _, _ in seen]
        check(
            "progress: values strictly increase",
            all(a < b for a, b in zip(values, values[1:])),
            True,
        )
        check("progress: no total", {t for _, t, _ in seen}, {None})
        check("progress: 2 to 5 notifications", 1 < len(seen) <= 5, True)
        if not 1 < len(seen) <= 5:
            print(f"    notifications: {seen!r}")
        n = len(seen)
        check("progress: a quick cell", await s.run("print(7)", progress_callback=on_progress), (False, "7"))
        await anyio.sleep(0.3)
        check("progress: none for a quick cell", len(seen), n)
        check(
            "progress: without a token", await s.run(PROGRESS_CELL), (False, PROGRESS_TEXT)
        )
        await anyio.sleep(0.5)
        check("progress: none without a token", len(seen), n)


async def rounds(ipybox):
    """2026-07-28 only: what input_required rounds add."""
    user = User("accept", "accept", "accept", *["accept"] * 8)
    async with Server(ipybox, ["--approve", "ask"], user) as s:
        await s.register_fixture()
        once = "runs = globals().get('runs', 0) + 1\nprint('before', flush=True)\n" + CALL_ADD + "\nprint('runs', runs)"
        check("rounds: the cell runs once, output before the pause kept", await s.run(once), (False, "before\n3\nruns 1"))
        two = CALL_ADD + "\n" + CALL_ADD
        check("rounds: two calls, two rounds", await s.run(two), (False, "3\n3"))
        check("rounds: asked three times so far", len(user.questions), 3)
        gather = (
            "import asyncio\nfrom mcptools.fx import runner\n"
            "sums = await asyncio.gather(*(runner.run_async('add', {'a': i, 'b': 1}) for i in range(8)))\n"
            "print([s['sum'] for s in sums])"
        )
        check("rounds: asyncio.gather of 8 calls", await s.run(gather), (False, str(list(range(1, 9)))))
        check("rounds: 8 more questions", len(user.questions), 11)


async def main(ipybox):
    global ERA
    for era in ("handshake", "2026-07-28"):
        ERA = era
        groups = [ask_tool_calls, no_elicitation_capability, ask_shell, progress]
        if era != "handshake":
            groups.append(rounds)
        for group in groups:
            try:
                await group(ipybox)
            except Exception as e:  # a broken session fails its group, the others still run
                check(f"{group.__name__}: ran to the end", f"{type(e).__name__}: {e}", None)
    return summary()


if __name__ == "__main__":
    default = os.environ.get("IPYBOX_BIN", str(ROOT / "target" / "debug" / "ipybox"))
    ipybox = sys.argv[1] if len(sys.argv) > 1 else default
    sys.exit(1 if anyio.run(main, ipybox) else 0)
