"""Shell-command approval (`approve_shell_cmds`, `require_shell_escape`), the seed's API.

Runs against ipybox-rs and Python ipybox 0.9.2; assertions about what only ipybox-rs promises
(the `magic` argument, `PermissionError`, `%sx`/`%%script` coverage) are marked as such.
"""

import pytest

from ipybox import ApprovalRequest, CodeExecutionError, CodeExecutionResult, CodeExecutor
from sdk_support import is_ipybox_rs

RS = is_ipybox_rs()


async def run(executor: CodeExecutor, code: str, accept=lambda request: True):
    """Streams `code`, deciding each approval with `accept`; returns (requests, result or
    error)."""
    requests: list[ApprovalRequest] = []
    try:
        async for item in executor.stream(code):
            match item:
                case ApprovalRequest():
                    requests.append(item)
                    if accept(item):
                        await item.accept()
                    else:
                        await item.reject()
                case CodeExecutionResult():
                    return requests, item
    except CodeExecutionError as e:
        return requests, e
    raise AssertionError("stream() ended without a result")


def shell_requests(requests: list[ApprovalRequest]) -> list[tuple[str, str]]:
    assert all(r.server_name == "ipybox" for r in requests), requests
    return [(r.tool_name, r.tool_args["cmd"]) for r in requests]


async def test_line_commands_are_asked_with_the_expanded_command(workspace):
    async with CodeExecutor(approve_shell_cmds=True) as executor:
        requests, result = await run(executor, "name = 'world'\n!echo hello {name}")
        assert shell_requests(requests) == [("shell", "echo hello world")]
        assert result.text == "hello world"

        requests, result = await run(executor, "files = !echo captured {name}\nprint(files)")
        assert shell_requests(requests) == [("shell", "echo captured world")]
        assert result.text == "['captured world']"

        requests, result = await run(executor, "!!echo bang")
        assert shell_requests(requests) == [("shell", "echo bang")]
        assert result.text == "['bang']"


async def test_rejected_command_does_not_run(workspace):
    async with CodeExecutor(approve_shell_cmds=True) as executor:
        requests, error = await run(executor, "print('before')\n!touch rejected.txt", accept=lambda r: False)
        assert shell_requests(requests) == [("shell", "touch rejected.txt")]
        assert isinstance(error, CodeExecutionError)
        assert "ApprovalRejected" in str(error)
        assert not (workspace / "rejected.txt").exists()
        # the kernel keeps working, and asks again next time
        requests, result = await run(executor, "!touch accepted.txt\nprint('after')")
        assert shell_requests(requests) == [("shell", "touch accepted.txt")]
        assert result.text == "after"
        assert (workspace / "accepted.txt").exists()


@pytest.mark.skipif(
    not RS,
    reason="0.9.2 asks the approver about one %%bash cell hundreds of times (318 requests seen, the"
    " wrapper re-enters itself)",
)
async def test_bash_cell_magic_is_asked_with_the_cell(workspace):
    async with CodeExecutor(approve_shell_cmds=True) as executor:
        requests, result = await run(executor, "%%bash\necho from bash $((6 * 7))")
        assert shell_requests(requests) == [("shell_magic", "echo from bash $((6 * 7))\n")]
        assert result.text == "from bash 42"
        if RS:
            assert requests[0].tool_args["magic"] == "%%bash"

        requests, error = await run(executor, "%%sh\ntouch magic.txt", accept=lambda r: False)
        assert shell_requests(requests) == [("shell_magic", "touch magic.txt\n")]
        assert isinstance(error, CodeExecutionError)
        assert not (workspace / "magic.txt").exists()


@pytest.mark.skipif(
    not RS,
    reason="0.9.2 expands only `{name}` from the user namespace for approval, so the approved"
    " command is not what runs when it uses `$var` or a function's locals",
)
async def test_the_approved_command_is_the_one_that_runs(workspace):
    async with CodeExecutor(approve_shell_cmds=True) as executor:
        code = "name = 'world'\ndef local():\n    who = 'local'\n    !echo hello {name} $who\nlocal()"
        requests, result = await run(executor, code)
        assert shell_requests(requests) == [("shell", "echo hello world local")]
        assert result.text == "hello world local"
        # a value that itself looks like a variable is not expanded a second time
        code = "a = '$b'\nb = 'expanded twice'\n!echo $a"
        requests, result = await run(executor, code)
        assert shell_requests(requests) == [("shell", "echo $b")]


@pytest.mark.skipif(not RS, reason="0.9.2 asks about %%bash and %%sh only, and runs %sx's command expanded twice")
async def test_sx_and_script_magics_are_asked_too(workspace):
    async with CodeExecutor(approve_shell_cmds=True) as executor:
        requests, result = await run(executor, "out = %sx echo sx\nprint(out)")
        assert shell_requests(requests) == [("shell", "echo sx")]
        assert result.text == "['sx']"

        requests, result = await run(executor, "%%script python3\nprint(40 + 2)")
        assert shell_requests(requests) == [("shell_magic", "print(40 + 2)\n")]
        assert requests[0].tool_args["magic"] == "%%script python3"
        assert result.text == "42"


async def test_execute_accepts_shell_commands(workspace):
    async with CodeExecutor(approve_shell_cmds=True) as executor:
        result = await executor.execute("!echo accepted")
        assert result.text == "accepted"


BLOCKED_CALLS = {
    "subprocess.run": "import subprocess\nsubprocess.run(['true'])",
    "subprocess.Popen": "import subprocess\nsubprocess.Popen(['true'])",
    "os.system": "import os\nos.system('true')",
    "os.popen": "import os\nos.popen('true')",
    "os.execv": "import os\nos.execv('/bin/true', ['true'])",
    "os.spawnv": "import os\nos.spawnv(os.P_WAIT, '/bin/true', ['true'])",
    "os.posix_spawn": "import os\nos.posix_spawn('/bin/true', ['true'], {})",
    "pty.spawn": "import pty\npty.spawn('true')",
}


# What Python ipybox 0.9.2 says for each blocked call (it blocks os.popen through subprocess.Popen).
BLOCKED_MESSAGES = {
    name: "Direct subprocess calls are not allowed. Use ! syntax."
    if name.startswith("subprocess.") or name == "os.popen"
    else f"Direct {name}() calls are not allowed. Use ! syntax."
    for name in BLOCKED_CALLS
}


@pytest.mark.parametrize("name", list(BLOCKED_CALLS))
async def test_require_shell_escape_blocks_direct_process_creation(workspace, name):
    if not RS and name == "os.popen":
        pytest.skip("0.9.2 blocks os.popen through subprocess.Popen; covered by the other cases")
    async with CodeExecutor(approve_shell_cmds=True, require_shell_escape=True) as executor:
        requests, error = await run(executor, BLOCKED_CALLS[name])
        assert requests == []
        assert isinstance(error, CodeExecutionError), error
        # 0.9.2's sentence for the call, exactly (code and prompts match on it)
        assert BLOCKED_MESSAGES[name] in str(error), str(error)
        if RS:
            assert "ShellEscapeRequired" in str(error)
        # `!` still works, after approval
        requests, result = await run(executor, "!echo via bang")
        assert shell_requests(requests) == [("shell", "echo via bang")]
        assert result.text == "via bang"


async def test_blocked_creation_is_a_runtime_error_as_in_0_9_2(workspace):
    async with CodeExecutor(approve_shell_cmds=True, require_shell_escape=True) as executor:
        code = "import subprocess\ntry:\n    subprocess.run(['true'])\nexcept RuntimeError as e:\n    print(str(e).split('. ')[0])"
        requests, result = await run(executor, code)
        assert result.text == "Direct subprocess calls are not allowed"


@pytest.mark.skipif(not RS, reason="0.9.2 raises RuntimeError")
async def test_blocked_creation_is_a_permission_error(workspace):
    async with CodeExecutor(approve_shell_cmds=True, require_shell_escape=True) as executor:
        code = "import subprocess\ntry:\n    subprocess.run(['true'])\nexcept PermissionError as e:\n    print(type(e).__name__)"
        requests, result = await run(executor, code)
        assert result.text == "ShellEscapeRequired"


async def test_generated_tools_work_with_require_shell_escape(workspace):
    code = "from mcptools.fixture.add import Params, run as add\nprint(add(Params(a=2, b=3)).sum)"
    async with CodeExecutor(approve_shell_cmds=True, require_shell_escape=True) as executor:
        requests, result = await run(executor, code)
        assert [(r.server_name, r.tool_name) for r in requests] == [("fixture", "add")]
        assert result.text == "5"


async def test_require_shell_escape_needs_approve_shell_cmds(workspace):
    with pytest.raises(ValueError, match="require_shell_escape=True requires approve_shell_cmds=True"):
        CodeExecutor(require_shell_escape=True)
