"""CodeExecutor's API reference: public names, signatures, lifecycle, errors, timeouts, cancel."""

import asyncio
import inspect
import operator
import os
import threading
import time

import pytest

from sdk_support import is_ipybox_rs, wait_until

ADD_CODE = """
from mcptools.fixture.add import Params, run
print(run(Params(a=2, b=3)).sum)
"""


def test_public_names():
    from ipybox import (  # noqa: F401
        ApprovalRequest,
        CodeExecutionChunk,
        CodeExecutionError,
        CodeExecutionResult,
        CodeExecutor,
        generate_mcp_sources,
    )
    from ipybox.utils import arun  # noqa: F401

    assert issubclass(CodeExecutionError, Exception)


def test_result_and_chunk_types():
    from pathlib import Path

    from ipybox import CodeExecutionChunk, CodeExecutionResult

    result = CodeExecutionResult(text="out", images=[Path("a.png")])
    assert (result.text, result.images) == ("out", [Path("a.png")])
    assert result == CodeExecutionResult(text="out", images=[Path("a.png")])
    assert result != CodeExecutionResult(text=None, images=[])
    assert CodeExecutionChunk(text="part").text == "part"
    assert CodeExecutionChunk(text="part") == CodeExecutionChunk(text="part")


def _params(func) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(func).parameters.values()]


def test_code_executor_signature():
    from ipybox import CodeExecutor

    # 0.9.2's parameters, in its order and with its defaults; ipybox-rs adds keyword
    # parameters after them only (kernel_gateway_url, see docs/remote-kernels.md; notebook,
    # off by default, see docs/notebook.md).
    params = _params(CodeExecutor)
    if is_ipybox_rs():
        assert params[16:] == [("kernel_gateway_url", None), ("notebook", False)]
        params = params[:16]
    assert params == [
        ("tool_server_host", "localhost"),
        ("tool_server_port", None),
        ("kernel_gateway_host", "localhost"),
        ("kernel_gateway_port", None),
        ("kernel_env", None),
        ("working_dir", None),
        ("images_dir", None),
        ("approval_timeout", None),
        ("connect_timeout", 30),
        ("kernel_init_timeout", 10),
        ("sandbox", False),
        ("sandbox_config", None),
        ("log_level", "WARNING"),
        ("approve_tool_calls", True),
        ("approve_shell_cmds", False),
        ("require_shell_escape", False),
    ]


def test_method_signatures():
    from ipybox import CodeExecutor, generate_mcp_sources

    empty = inspect.Parameter.empty
    assert _params(CodeExecutor.execute) == [("self", empty), ("code", empty), ("timeout", None)]
    assert _params(CodeExecutor.stream) == [("self", empty), ("code", empty), ("timeout", None), ("chunks", False)]
    for name in ("start", "stop", "reset", "cancel"):
        assert _params(getattr(CodeExecutor, name)) == [("self", empty)], name
    assert _params(generate_mcp_sources) == [
        ("server_name", empty),
        ("server_params", empty),
        ("root_dir", empty),
        ("async_api", False),
    ]


async def test_arun_runs_a_blocking_function_in_a_thread():
    from ipybox.utils import arun

    assert await arun(operator.add, 2, 3) == 5
    assert await arun(lambda a, b=0: a - b, 5, b=2) == 3
    assert await arun(threading.get_ident) != threading.get_ident()


async def test_start_and_stop(workspace):
    from ipybox import CodeExecutor

    executor = CodeExecutor()
    await executor.start()
    try:
        result = await executor.execute("print('started')")
        assert result.text == "started"
    finally:
        await executor.stop()


async def test_cell_error_raises_code_execution_error(workspace):
    from ipybox import CodeExecutionError, CodeExecutor

    async with CodeExecutor() as executor:
        await executor.execute("kept = 'yes'")
        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute("raise ValueError('bad input: 42')")
        assert "ValueError" in str(exc_info.value)
        assert "bad input: 42" in str(exc_info.value)

        # stream() raises it too
        with pytest.raises(CodeExecutionError) as exc_info:
            async for _ in executor.stream("print('before')\n1 / 0"):
                pass
        assert "ZeroDivisionError" in str(exc_info.value)

        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute("def broken(:\n    pass")
        assert "SyntaxError" in str(exc_info.value)

        result = await executor.execute("print(kept)")
        assert result.text == "yes"


async def test_failing_tool_raises_code_execution_error(workspace):
    from ipybox import CodeExecutionError, CodeExecutor

    code = "from mcptools.fixture.fail import Params, run\nrun(Params(message='fixture failure 7'))"
    async with CodeExecutor() as executor:
        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute(code)
        assert "fixture failure 7" in str(exc_info.value)

        result = await executor.execute("from mcptools.fixture.greet import Params, run\nprint(run(Params(name='x')))")
        assert result.text == "Hello, x!"


async def test_without_tool_call_approval(workspace):
    from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor

    async with CodeExecutor(approve_tool_calls=False) as executor:
        items = [item async for item in executor.stream(ADD_CODE)]
    assert not [item for item in items if isinstance(item, ApprovalRequest)]
    assert len(items) == 1
    assert isinstance(items[0], CodeExecutionResult)
    assert items[0].text == "5"


async def test_execution_timeout_keeps_kernel_state(workspace):
    from ipybox import CodeExecutor

    async with CodeExecutor() as executor:
        await executor.execute("x = 'survives'")
        with pytest.raises(asyncio.TimeoutError) as exc_info:
            await executor.execute("import time; time.sleep(5)", timeout=1)
        assert str(exc_info.value) == "Code execution exceeded timeout of 1.00s (approval wait excluded)."

        result = await executor.execute("print(x)")
        assert result.text == "survives"


async def test_stream_timeout(workspace):
    from ipybox import CodeExecutor

    async with CodeExecutor() as executor:
        with pytest.raises(asyncio.TimeoutError) as exc_info:
            async for _ in executor.stream("import time; time.sleep(5)", timeout=1.5):
                pass
        assert str(exc_info.value) == "Code execution exceeded timeout of 1.50s (approval wait excluded)."
        result = await executor.execute("print('after timeout')")
        assert result.text == "after timeout"


async def test_approval_wait_does_not_count_toward_timeout(workspace):
    from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor

    async with CodeExecutor() as executor:
        # import the module and start the MCP server first: only the approval wait is under test
        result = await executor.execute(ADD_CODE)
        assert result.text == "5"

        texts = []
        async for item in executor.stream("print(run(Params(a=20, b=22)).sum)", timeout=1):
            match item:
                case ApprovalRequest():
                    await asyncio.sleep(2)  # the user thinks for longer than the timeout
                    await item.accept()
                case CodeExecutionResult():
                    texts.append(item.text)
        assert texts == ["42"]


async def test_approval_timeout_expires(workspace):
    from ipybox import ApprovalRequest, CodeExecutionError, CodeExecutionResult, CodeExecutor

    async with CodeExecutor(approval_timeout=1) as executor:
        requests = []
        start = time.monotonic()
        with pytest.raises(CodeExecutionError):
            async for item in executor.stream(ADD_CODE):
                match item:
                    case ApprovalRequest():
                        requests.append(str(item))  # nobody answers
                    case CodeExecutionResult():
                        pytest.fail(f"unapproved tool call produced a result: {item}")
        elapsed = time.monotonic() - start
        assert requests == ["fixture.add(a=2, b=3)"]
        assert 1 <= elapsed < 30

        result = await executor.execute("print('still here')")
        assert result.text == "still here"


async def test_no_approval_timeout_waits(workspace):
    from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor

    async with CodeExecutor(approval_timeout=None) as executor:
        texts = []
        async for item in executor.stream(ADD_CODE):
            match item:
                case ApprovalRequest():
                    await asyncio.sleep(2)
                    await item.accept()
                case CodeExecutionResult():
                    texts.append(item.text)
        assert texts == ["5"]


async def test_cancel_execute_from_concurrent_task(workspace):
    from ipybox import CodeExecutionResult, CodeExecutor

    marker = workspace / "started"
    code = (
        "import pathlib, time\n"
        "x = 'kept'\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "time.sleep(10)\n"
        "print('not reached')"
    )
    cancelled_at: list[float] = []

    async with CodeExecutor() as executor:
        executor.cancel()  # no execution in progress: no effect

        async def cancel_when_started():
            await wait_until(marker.exists, what="the cell to start")
            cancelled_at.append(time.monotonic())
            executor.cancel()

        # (the cancelled cell is the executor's first: 0.9.2 loses a cancel() that follows an
        # earlier execute(), see test_rs_only.py)
        canceller = asyncio.create_task(cancel_when_started())
        result = await executor.execute(code)
        returned_at = time.monotonic()
        await canceller

        assert result == CodeExecutionResult(text=None, images=[])
        assert returned_at - cancelled_at[0] < 3

        # the executor works afterwards, with the kernel's state
        result = await executor.execute("print(x)")
        assert result.text == "kept"


async def test_cancel_stream_ends_without_result(workspace):
    from ipybox import CodeExecutionChunk, CodeExecutor

    code = "import time\nprint('started', flush=True)\ntime.sleep(10)\nprint('not reached')"
    async with CodeExecutor() as executor:
        items = []
        cancelled_at = None
        async for item in executor.stream(code, chunks=True):
            items.append(item)
            if isinstance(item, CodeExecutionChunk) and cancelled_at is None:
                cancelled_at = time.monotonic()
                executor.cancel()
        assert cancelled_at is not None
        assert time.monotonic() - cancelled_at < 3
        assert [type(item) for item in items] == [CodeExecutionChunk]
        assert items[0].text.strip() == "started"

        result = await executor.execute("print('after cancel')")
        assert result.text == "after cancel"


def _fixture_servers_under_this_process() -> list[int]:
    """Pids of fixture MCP servers started (directly or not) by this test process."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
        except OSError:
            continue
        if b"mcp_fixture.py" not in cmdline:
            continue
        pid = int(entry)
        while pid > 1:
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                break
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            if pid == me:
                found.append(int(entry))
                break
    return found


async def test_cancel_while_an_approval_is_pending_ends_the_stream(workspace):
    """A user presses stop while a permission prompt is open: the stream ends without a result,
    the pending tool call is never made, the executor keeps its state."""
    from ipybox import ApprovalRequest, CodeExecutor

    code = "x = 'kept'\n" + ADD_CODE + "print('not reached')"
    async with CodeExecutor() as executor:  # approval_timeout=None: nothing else ends the wait
        items = []
        cancelled_at = None
        async for item in executor.stream(code):
            items.append(item)
            if isinstance(item, ApprovalRequest):
                cancelled_at = time.monotonic()
                executor.cancel()
        ended_at = time.monotonic()
        assert [type(item) for item in items] == [ApprovalRequest]
        # ipybox-rs: within 1 s; 0.9.2 (the reference) took 1.2 s on this loaded 2-core machine
        bound = 1.0 if is_ipybox_rs() else 3.0
        assert ended_at - cancelled_at <= bound, ended_at - cancelled_at
        if is_ipybox_rs():
            # too late: the call was rejected when the execution was cancelled
            await items[0].accept()
            await asyncio.sleep(0.3)
        assert _fixture_servers_under_this_process() == []

        result = await executor.execute("print(x)")
        assert result.text == "kept"
        result = await executor.execute(ADD_CODE)
        assert result.text == "5"
