"""Where Python ipybox 0.9.2's users generate their tool API, and how their kernels import it
(issue 28). Code written for 0.9.2 in each layout runs unchanged: an approved call with a
structured result, a rejected call, a streamed execution with calls in it, and (ipybox-rs: 0.9.2
waits for the decision forever) a cancel while a call waits for approval. Also several executors
in one process, each reaching only the server generated for it.

The layouts:
- cwd_mcptools: `root_dir=Path("mcptools")`, then `CodeExecutor()` in the same directory;
- temp_dir_on_pythonpath: the package generated into a temporary directory that is put on
  `kernel_env`'s `PYTHONPATH` (`from fixture import ...`), the program running elsewhere;
- working_dir_elsewhere: `root_dir=<work>/mcptools` and `CodeExecutor(working_dir=<work>)`, the
  program running elsewhere;
- cwd_mcptools_on_pythonpath: `root_dir=Path("mcptools")` in a directory that is not the
  kernel's working directory but is on its `PYTHONPATH`;
- apigen_root (ipybox-rs): `ipybox apigen fixture --root tools`, then `kernel_env={"PYTHONPATH":
  "tools"}` (relative: from the working directory, as Python takes it);
- mcp_server (ipybox-rs): the MCP server's `register_mcp_server` (over a real MCP client), then
  `CodeExecutor()` in its workspace.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    generate_mcp_sources,
)

from sdk_support import FIXTURE_PYTHON, FIXTURE_SCRIPT, SERVER_NAME, is_ipybox_rs, stdio_params

RS_ONLY = {"apigen_root", "mcp_server"}


def ipybox_command() -> str:
    """The `ipybox` console script of the installed package."""
    return str(Path(sys.executable).parent / "ipybox")


async def register_over_mcp(workspace: Path, server_params: dict) -> None:
    """`register_mcp_server` on the installed package's MCP server (`ipybox --workspace WS`),
    through the Python `mcp` SDK's stdio client."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=ipybox_command(), args=["--workspace", str(workspace)], env=dict(os.environ)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(
                "register_mcp_server", {"server_name": SERVER_NAME, "server_params": server_params}
            )
            assert not result.is_error, result


@dataclass
class Layout:
    """One layout: `generate(params)` lays the tool API out as its users do and returns the
    `CodeExecutor` arguments and the module the code imports."""

    name: str
    tmp_path: Path
    monkeypatch: pytest.MonkeyPatch
    kwargs: dict = field(default_factory=dict)
    module: str = ""
    cleanup: list = field(default_factory=list)

    async def generate(self, server_params: dict) -> "Layout":
        t = self.tmp_path
        if self.name == "cwd_mcptools":
            (t / "app").mkdir()
            self.monkeypatch.chdir(t / "app")
            await generate_mcp_sources(SERVER_NAME, server_params, Path("mcptools"))
            self.kwargs, self.module = {}, f"mcptools.{SERVER_NAME}"
        elif self.name == "temp_dir_on_pythonpath":
            tmp = tempfile.mkdtemp()
            self.cleanup.append(tmp)
            self.monkeypatch.chdir(t)
            await generate_mcp_sources(SERVER_NAME, server_params, root_dir=Path(tmp))
            self.kwargs, self.module = {"kernel_env": {"PYTHONPATH": tmp}}, SERVER_NAME
        elif self.name == "working_dir_elsewhere":
            (t / "work").mkdir()
            (t / "elsewhere").mkdir()
            self.monkeypatch.chdir(t / "elsewhere")
            await generate_mcp_sources(SERVER_NAME, server_params, t / "work" / "mcptools")
            self.kwargs, self.module = {"working_dir": t / "work"}, f"mcptools.{SERVER_NAME}"
        elif self.name == "cwd_mcptools_on_pythonpath":
            (t / "project").mkdir()
            (t / "work").mkdir()
            self.monkeypatch.chdir(t / "project")
            await generate_mcp_sources(SERVER_NAME, server_params, Path("mcptools"))
            self.kwargs = {"working_dir": t / "work", "kernel_env": {"PYTHONPATH": str(t / "project")}}
            self.module = f"mcptools.{SERVER_NAME}"
        elif self.name == "apigen_root":
            (t / "project").mkdir()
            self.monkeypatch.chdir(t / "project")
            done = subprocess.run(
                [ipybox_command(), "apigen", SERVER_NAME, "--params", json.dumps(server_params), "--root", "tools"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            self.kwargs, self.module = {"kernel_env": {"PYTHONPATH": "tools"}}, SERVER_NAME
        elif self.name == "mcp_server":
            (t / "ws").mkdir()
            await register_over_mcp(t / "ws", server_params)
            self.monkeypatch.chdir(t / "ws")
            self.kwargs, self.module = {}, f"mcptools.{SERVER_NAME}"
        else:
            raise AssertionError(self.name)
        return self


@pytest.fixture(
    params=[
        "cwd_mcptools",
        "temp_dir_on_pythonpath",
        "working_dir_elsewhere",
        "cwd_mcptools_on_pythonpath",
        "apigen_root",
        "mcp_server",
    ]
)
def layout(request, tmp_path, monkeypatch):
    if request.param in RS_ONLY and not is_ipybox_rs():
        pytest.skip("ipybox-rs's command line and MCP server")
    lay = Layout(request.param, tmp_path, monkeypatch)
    yield lay
    for d in lay.cleanup:
        shutil.rmtree(d, ignore_errors=True)


def marked_params(marker: Path) -> dict:
    """The fixture server behind `sh`, which touches `marker` each time the server is started:
    whether a tool call reached it shows on disk."""
    return {
        "command": "sh",
        "args": ["-c", 'touch "$0" && exec "$1" "$2" stdio', str(marker), FIXTURE_PYTHON, str(FIXTURE_SCRIPT)],
    }


async def test_approved_call_with_a_structured_result(layout):
    lay = await layout.generate(stdio_params())
    code = f"from {lay.module}.add import Params, Result, run\nr = run(Params(a=2, b=3))\nprint(r.sum, isinstance(r, Result), r.operands)"
    asked = []
    async with CodeExecutor(**lay.kwargs) as executor:
        async for item in executor.stream(code):
            match item:
                case ApprovalRequest():
                    asked.append((item.server_name, item.tool_name, item.tool_args, str(item)))
                    await item.accept()
                case CodeExecutionResult():
                    assert item.text == "5 True [2, 3]"
        assert asked == [(SERVER_NAME, "add", {"a": 2, "b": 3}, f"{SERVER_NAME}.add(a=2, b=3)")]
        # execute() accepts every call
        result = await executor.execute(code.replace("a=2", "a=39"))
        assert result.text == "42 True [39, 3]"


async def test_rejected_call(layout):
    lay = await layout.generate(stdio_params())
    code = f"from {lay.module}.add import Params, run\nprint(run(Params(a=2, b=3)))\nprint('not reached')"
    async with CodeExecutor(**lay.kwargs) as executor:
        with pytest.raises(CodeExecutionError) as exc_info:
            async for item in executor.stream(code):
                match item:
                    case ApprovalRequest():
                        await item.reject()
                    case CodeExecutionResult():
                        pytest.fail(f"a rejected call produced a result: {item}")
        assert f"Approval request for {SERVER_NAME}.add rejected" in str(exc_info.value)
        assert (await executor.execute("print('still here')")).text == "still here"


async def test_streamed_execution_with_calls(layout):
    lay = await layout.generate(stdio_params())
    code = (
        f"from {lay.module} import greet\n"
        "print('before', flush=True)\n"
        "print(greet.run(greet.Params(name='one')))\n"
        "print(greet.run(greet.Params(name='two')))\n"
        "print('after')"
    )
    chunks, asked, results = [], [], []
    async with CodeExecutor(**lay.kwargs) as executor:
        async for item in executor.stream(code, chunks=True):
            match item:
                case CodeExecutionChunk():
                    chunks.append(item.text)
                case ApprovalRequest():
                    asked.append(str(item))
                    await item.accept()
                case CodeExecutionResult():
                    results.append(item.text)
    expected = "before\nHello, one!\nHello, two!\nafter"
    assert asked == [f"{SERVER_NAME}.greet(name='one')", f"{SERVER_NAME}.greet(name='two')"]
    assert "".join(chunks).strip() == expected
    assert results == [expected]


async def test_cancel_while_a_call_waits_for_approval(layout, tmp_path):
    if not is_ipybox_rs():
        pytest.skip("0.9.2's stream waits for the decision forever after cancel()")
    marker = tmp_path / "server-started"
    lay = await layout.generate(marked_params(marker))
    marker.unlink()  # listing the tools started the server once
    async with CodeExecutor(**lay.kwargs) as executor:
        await executor.execute("kept = 'state'")
        items, held, cancelled_at = [], None, None
        async for item in executor.stream(f"from {lay.module} import greet\nprint(greet.run(greet.Params(name='never')))"):
            items.append(item)
            if isinstance(item, ApprovalRequest):
                held, cancelled_at = item, time.monotonic()
                executor.cancel()
        assert held is not None
        assert time.monotonic() - cancelled_at < 2
        assert not any(isinstance(i, CodeExecutionResult) for i in items), items
        await held.accept()  # too late: the call was rejected by the cancel
        await asyncio.sleep(0.3)
        assert not marker.exists(), "the cancelled call reached the server"
        assert (await executor.execute("print(kept)")).text == "state"
        # The control: an accepted call does start the server.
        result = await executor.execute(f"from {lay.module} import greet\nprint(greet.run(greet.Params(name='now')))")
        assert result.text == "Hello, now!"
        assert marker.exists()


@pytest.fixture
def two_dirs(request, tmp_path, monkeypatch):
    """Two directories for two executors: temporary directories (outside the working
    directory), or two subdirectories of the working directory (from which the kernels could
    also import each other's package, as `one.fixture`)."""
    monkeypatch.chdir(tmp_path)
    if request.param == "temp":
        dirs = [Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())]
        yield dirs
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    else:
        yield [tmp_path / "one", tmp_path / "two"]


@pytest.mark.parametrize("two_dirs", ["temp", "cwd"], indirect=True)
async def test_several_executors_each_reach_their_own(two_dirs):
    """Two executors at once in one process, each with its own directory on `PYTHONPATH`
    holding a server of the same name with other params (one per agent): each reaches its own."""
    one, two = two_dirs
    await generate_mcp_sources(SERVER_NAME, stdio_params(env={"WHO": "one"}), one)
    await generate_mcp_sources(SERVER_NAME, stdio_params(env={"WHO": "two"}), two)
    code = f"from {SERVER_NAME} import get_env\nprint(get_env.run(get_env.Params(name='WHO')))"

    async def streamed(executor):
        asked, text = [], None
        async for item in executor.stream(code):
            match item:
                case ApprovalRequest():
                    asked.append(str(item))
                    await item.accept()
                case CodeExecutionResult():
                    text = item.text
        return asked, text

    async with (
        CodeExecutor(kernel_env={"PYTHONPATH": str(one)}) as e1,
        CodeExecutor(kernel_env={"PYTHONPATH": str(two)}) as e2,
    ):
        (a1, t1), (a2, t2) = await asyncio.gather(streamed(e1), streamed(e2))
        assert (t1, t2) == ("one", "two")
        assert a1 == a2 == [f"{SERVER_NAME}.get_env(name='WHO')"]
        r1, r2 = await asyncio.gather(e1.execute(code), e2.execute(code))
        assert (r1.text, r2.text) == ("one", "two")


@pytest.mark.parametrize("two_dirs", ["temp"], indirect=True)
async def test_a_server_of_another_executors_directory_is_not_reached(two_dirs):
    """ipybox-rs's trust rule: a kernel reaches only the servers registered for the directories
    its executor imports from, whatever it does to `sys.path`; a call that no package of two
    reachable registrations of one name makes is an error that says what to do."""
    if not is_ipybox_rs():
        pytest.skip("0.9.2 calls whatever params the kernel sends")
    one, two = two_dirs
    await generate_mcp_sources(SERVER_NAME, stdio_params(env={"WHO": "one"}), one)
    await generate_mcp_sources(SERVER_NAME, stdio_params(env={"WHO": "two"}), two)
    await generate_mcp_sources("only_two", stdio_params(), two)
    async with CodeExecutor(kernel_env={"PYTHONPATH": str(one)}) as executor:
        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute(f"import sys\nsys.path.insert(0, {str(two)!r})\nfrom only_two import greet\ngreet.run(greet.Params(name='x'))")
        assert "ToolError: MCP server `only_two` is not registered for any directory this kernel imports from" in str(exc_info.value)
    async with CodeExecutor(kernel_env={"PYTHONPATH": f"{one}:{two}"}) as executor:
        code = f"from {SERVER_NAME} import get_env\nprint(get_env.run(get_env.Params(name='WHO')))"
        assert (await executor.execute(code)).text == "one"
        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute(f"from ipybox_runtime import ToolRunner\nToolRunner({SERVER_NAME!r}, {{}}).run('greet', {{'name': 'x'}})")
        message = str(exc_info.value)
        assert f"ToolError: MCP server `{SERVER_NAME}` is registered for 2 directories this kernel imports from, with different params" in message
        listed = sorted(str(d.resolve()) for d in (one, two))
        assert f"    {listed[0]}\n    {listed[1]}\n  help: call it through the package generated in one of these directories" in message
