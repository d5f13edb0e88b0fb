"""The "Code execution" page: execute(), approval, chunks, plots, timeouts, kernel env, reset, cwd."""

import asyncio
import os
import tempfile
import time
from pathlib import Path

import pytest

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
)


async def test_basic_execution(workspace):
    async with CodeExecutor() as executor:
        result = await executor.execute("print('hello world')")
        assert result.text == "hello world"
        assert result.images == []

        # no output: text is None
        result = await executor.execute("x = 21")
        assert result.text is None
        assert result.images == []

        # variables and definitions persist across executions
        await executor.execute("def double(v):\n    return 2 * v")
        result = await executor.execute("print(double(x))")
        assert result.text == "42"

        # the value of a trailing expression is part of the output, as in IPython
        result = await executor.execute("double(x) + 1")
        assert result.text == "43"

        # without chunks=True, stream() yields only the final result
        items = [item async for item in executor.stream("print('a')\nprint('b')")]
        assert len(items) == 1
        assert isinstance(items[0], CodeExecutionResult)
        assert items[0].text == "a\nb"


async def test_tool_call_approval(workspace):
    code = """
from mcptools.fixture.add import Params, Result, run

result: Result = run(Params(a=2, b=3))
print(f"sum = {result.sum}")
"""
    requests: list[ApprovalRequest] = []
    results: list[CodeExecutionResult] = []
    async with CodeExecutor() as executor:
        async for item in executor.stream(code):
            match item:
                case ApprovalRequest():
                    assert item.server_name == "fixture"
                    assert item.tool_name == "add"
                    assert item.tool_args["a"] == 2
                    assert item.tool_args["b"] == 3
                    assert item.tool_args == {"a": 2, "b": 3}
                    assert str(item) == "fixture.add(a=2, b=3)"
                    requests.append(item)
                    await item.accept()
                case CodeExecutionResult():
                    assert item.text == "sum = 5"
                    results.append(item)
    assert len(requests) == 1
    assert len(results) == 1


async def test_approval_request_details(workspace):
    """The API reference's example (module-level import of a tool), and str(request) for
    string, float, bool and list arguments and for a tool whose name is not an identifier."""
    cases = [
        (
            'from mcptools.fixture import greet\nresult = greet.run(greet.Params(name="ipybox"))\nprint(result)',
            ("greet", {"name": "ipybox"}, "fixture.greet(name='ipybox')"),
            "Hello, ipybox!",
        ),
        (
            "from mcptools.fixture import echo\n"
            'print(echo.run(echo.Params(text="hi", number=1.5, flag=True, items=[1, "x"])))',
            (
                "echo",
                {"text": "hi", "number": 1.5, "flag": True, "items": [1, "x"]},
                "fixture.echo(text='hi', number=1.5, flag=True, items=[1, 'x'])",
            ),
            '{"text": "hi", "number": 1.5, "flag": true, "items": [1, "x"]}',
        ),
        (
            'from mcptools.fixture import get_thing\nprint(get_thing.run(get_thing.Params(id="7")))',
            ("get-thing", {"id": "7"}, "fixture.get-thing(id='7')"),
            "thing 7",
        ),
    ]
    async with CodeExecutor() as executor:
        for code, (tool_name, tool_args, text), output in cases:
            seen = []
            async for item in executor.stream(code):
                match item:
                    case ApprovalRequest():
                        seen.append((item.server_name, item.tool_name, item.tool_args, str(item)))
                        await item.accept()
                    case CodeExecutionResult():
                        assert item.text == output
            assert seen == [("fixture", tool_name, tool_args, text)]


async def test_reject_raises_code_execution_error(workspace):
    code = """
from mcptools.fixture.add import Params, run
result = run(Params(a=2, b=3))
print("not reached")
"""
    requests = []
    async with CodeExecutor() as executor:
        with pytest.raises(CodeExecutionError) as exc_info:
            async for item in executor.stream(code):
                match item:
                    case ApprovalRequest():
                        requests.append(str(item))
                        await item.reject()
                    case CodeExecutionResult():
                        pytest.fail(f"rejected tool call produced a result: {item}")
        assert requests == ["fixture.add(a=2, b=3)"]
        assert "rejected" in str(exc_info.value)

        # the executor goes on working
        result = await executor.execute("print('still here')")
        assert result.text == "still here"


async def test_stream_output_chunks(workspace):
    code = """
from time import sleep
print("chunk 1")
sleep(0.5)
print("chunk 2")
"""
    chunks: list[tuple[str, float]] = []
    results: list[tuple[str | None, float]] = []
    async with CodeExecutor() as executor:
        async for item in executor.stream(code, chunks=True):
            match item:
                case CodeExecutionChunk():
                    assert item.text.strip() in ["chunk 1", "chunk 2"]
                    chunks.append((item.text, time.monotonic()))
                case CodeExecutionResult():
                    assert item.text == "chunk 1\nchunk 2"
                    results.append((item.text, time.monotonic()))
    assert [text.strip() for text, _ in chunks] == ["chunk 1", "chunk 2"]
    assert len(results) == 1
    # incremental: "chunk 1" arrived while the code was still sleeping
    # The first chunk streams before the cell ends: ipykernel sends stdout on a 0.2 s flush timer,
    # so it arrives up to 0.2 s after its print, i.e. at least ~0.3 s before the result (0.5 s
    # sleep); 0.2 s leaves room for that timer's jitter (0.2999 s was seen).
    assert results[0][1] - chunks[0][1] >= 0.2


async def test_capturing_plots(workspace):
    code = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""
    with tempfile.TemporaryDirectory() as images_dir:
        async with CodeExecutor(images_dir=Path(images_dir)) as executor:
            result = await executor.execute(code)
            assert len(result.images) == 1
            assert result.images[0].exists()
            assert result.images[0].suffix == ".png"
            assert result.images[0].resolve().parent == Path(images_dir).resolve()
            assert result.images[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


async def test_plots_default_to_images_in_the_current_directory(workspace):
    code = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""
    async with CodeExecutor() as executor:
        result = await executor.execute(code)
    assert len(result.images) == 1
    assert result.images[0].suffix == ".png"
    assert result.images[0].resolve().parent == workspace / "images"
    assert result.images[0].resolve().exists()


async def test_custom_timeouts(workspace):
    code = """
from mcptools.fixture.greet import Params, run
print(run(Params(name="timeouts")))
"""
    texts = []
    # set custom approval timeout
    async with CodeExecutor(approval_timeout=10) as executor:
        # set custom execution timeout
        async for item in executor.stream(code, timeout=10):
            match item:
                case ApprovalRequest():
                    await item.accept()
                case CodeExecutionResult():
                    texts.append(item.text)
    assert texts == ["Hello, timeouts!"]


async def test_kernel_environment(workspace):
    # IPython kernel does not inherit environment variables from parent process
    # Kernel environment must be explicitly set using the kernel_env parameter
    async with CodeExecutor(kernel_env={"TEST_VAR": "test_val"}) as executor:
        result = await executor.execute("import os; print(os.environ['TEST_VAR'])")
        assert result.text == "test_val"


async def test_kernel_does_not_inherit_environment(workspace, monkeypatch):
    monkeypatch.setenv("IPYBOX_SDK_PARENT_ONLY", "parent-value")
    async with CodeExecutor() as executor:
        result = await executor.execute("import os; print(os.environ.get('IPYBOX_SDK_PARENT_ONLY'))")
        assert result.text == "None"


async def test_kernel_reset(workspace):
    async with CodeExecutor() as executor:
        await executor.execute("x = 42")
        result = await executor.execute("print(x)")
        assert result.text == "42"

        await executor.reset()

        code = """
try:
    print(x)
except NameError:
    print("x not defined")
"""
        result = await executor.execute(code)
        assert result.text == "x not defined"


async def test_reset_stops_mcp_servers_which_restart_lazily(workspace):
    code = "from mcptools.fixture.get_pid import Params, run\nprint(run(Params()))"
    async with CodeExecutor() as executor:
        first = (await executor.execute(code)).text
        assert (await executor.execute(code)).text == first  # the started server is kept

        await executor.reset()

        second = (await executor.execute(code)).text
        assert first.isdigit() and second.isdigit()
        assert second != first


async def test_working_directory_is_shared_with_parent(workspace):
    async with CodeExecutor() as executor:
        result = await executor.execute("import os; print(os.getcwd())")
        assert result.text == os.getcwd()
    assert os.getcwd() == str(workspace)


async def test_cwd_changes_persist_without_working_dir(workspace):
    async with CodeExecutor() as executor:
        result = await executor.execute("import os; os.chdir('/'); print(os.getcwd())")
        assert result.text == "/"
        result = await executor.execute("print(os.getcwd())")
        assert result.text == "/"


async def test_working_dir(tmp_path, monkeypatch):
    from ipybox import generate_mcp_sources
    from sdk_support import SERVER_NAME, stdio_params

    working_dir = tmp_path / "work"
    working_dir.mkdir()
    await generate_mcp_sources(SERVER_NAME, stdio_params(), working_dir / "mcptools")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    wd = str(working_dir.resolve())

    async with CodeExecutor(working_dir=working_dir) as executor:
        result = await executor.execute("import os; print(os.getcwd())")
        assert result.text == wd

        # the generated API under working_dir is importable
        result = await executor.execute("from mcptools.fixture.greet import Params, run\nprint(run(Params(name='wd')))")
        assert result.text == "Hello, wd!"

        # a cell that leaves the directory: the kernel is moved back, with a note in the output
        result = await executor.execute("os.chdir('/'); print(os.getcwd())")
        assert result.text == f"/\n[ipybox] cwd reset to {wd}"
        result = await executor.execute("print(os.getcwd())")
        assert result.text == wd

        # also after a failing cell
        with pytest.raises(CodeExecutionError):
            await executor.execute("os.chdir('/')\nraise ValueError('after chdir')")
        result = await executor.execute("print(os.getcwd())")
        assert result.text == wd
