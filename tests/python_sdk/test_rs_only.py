"""Behaviour that holds for ipybox-rs only (not for Python ipybox 0.9.2)."""

import pytest

from sdk_support import is_ipybox_rs

if not is_ipybox_rs():
    pytest.skip("ipybox-rs only (the installed ipybox is the Python reference)", allow_module_level=True)

from ipybox import CodeExecutor  # noqa: E402


async def test_cancel_after_an_earlier_execute(workspace):
    """cancel() stops the running execute() even when earlier execute() calls returned before it.

    0.9.2 loses this cancel(): execute() returns from inside its stream() loop, the abandoned
    generator is finalized later, during the next stream(), and its `finally` clears the new
    stream's cancel event, so the cell runs on to its end (here 10 s).
    """
    import asyncio
    import time

    from ipybox import CodeExecutionResult

    from sdk_support import wait_until

    marker = workspace / "started"
    code = f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(10)\nprint('not reached')"
    cancelled_at: list[float] = []

    async with CodeExecutor() as executor:
        await executor.execute("x = 'kept'")
        assert (await executor.execute("print(x)")).text == "kept"

        async def cancel_when_started():
            await wait_until(marker.exists, what="the cell to start")
            cancelled_at.append(time.monotonic())
            executor.cancel()

        canceller = asyncio.create_task(cancel_when_started())
        result = await executor.execute(code)
        returned_at = time.monotonic()
        await canceller

        assert result == CodeExecutionResult(text=None, images=[])
        assert returned_at - cancelled_at[0] < 3
        assert (await executor.execute("print(x)")).text == "kept"


async def test_task_cancellation_interrupts_the_cell(workspace):
    """Cancelling the task that awaits execute() interrupts the running cell at once (state kept):
    the next execution does not wait behind a cell that runs on."""
    import asyncio
    import time

    from sdk_support import wait_until

    marker = workspace / "started"
    async with CodeExecutor() as executor:
        await executor.execute("x = 'kept'")
        task = asyncio.create_task(
            executor.execute(f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(30)\nx = 'no'")
        )
        await wait_until(marker.exists, what="the cell to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.monotonic()
        assert (await executor.execute("print(x)")).text == "kept"
        assert time.monotonic() - started < 5


async def test_the_event_loop_runs_while_a_cell_runs(workspace):
    """The executor's futures are driven by tokio, not by blocking the event loop: a 10 ms ticker
    keeps ticking through a 1 s cell."""
    import asyncio

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async with CodeExecutor() as executor:
        task = asyncio.create_task(ticker())
        await executor.execute("import time; time.sleep(1)")
        task.cancel()
    assert ticks >= 50, ticks


async def test_errors_keep_prior_output_and_timeouts_are_code_execution_errors(workspace):
    import asyncio

    from ipybox import CodeExecutionError

    async with CodeExecutor() as executor:
        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute("print('before')\nraise KeyError('k')")
        assert exc_info.value.output == "before"
        assert str(exc_info.value).startswith("KeyError: 'k'\n")
        with pytest.raises(CodeExecutionError) as exc_info:
            await executor.execute("import time\nprint('slow', flush=True)\ntime.sleep(5)", timeout=0.5)
        assert isinstance(exc_info.value, asyncio.TimeoutError)
        assert exc_info.value.output == "slow"


def test_ctrl_c_under_asyncio_run_interrupts_and_cleans_up(workspace):
    """Ctrl-C (SIGINT) while `asyncio.run()` awaits a cell: the program ends within seconds and
    its kernel is gone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = workspace / "ctrl_c.py"
    script.write_text(
        "import asyncio\n"
        "from ipybox import CodeExecutor\n"
        "async def main():\n"
        "    async with CodeExecutor() as ex:\n"
        "        pid = (await ex.execute('import os; print(os.getpid())')).text\n"
        "        print(pid, flush=True)\n"
        "        await ex.execute('import time; time.sleep(60)')\n"
        "asyncio.run(main())\n"
    )
    # A program run from a terminal has SIGINT at its default; a suite started in the background
    # by a non-interactive shell (`cmd &`) passes SIGINT on ignored, and Python keeps it ignored.
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    kernel_pid = int(proc.stdout.readline())
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the program did not end within 10 s of Ctrl-C")
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in proc.stderr.read()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(kernel_pid, 0)
        except ProcessLookupError:
            break
        # A zombie (ended, not yet reaped) counts as gone.
        with open(f"/proc/{kernel_pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                break
        time.sleep(0.05)
    else:
        raise AssertionError(f"kernel {kernel_pid} still running after Ctrl-C")


def test_a_program_that_exits_right_after_its_last_await_exits_cleanly(workspace):
    """The extension's futures finish on tokio threads just after waking asyncio; exiting at once
    must not finalize the interpreter under them (it crashed in ~half of the runs before the exit
    pause of ipybox/_exit.py)."""
    import subprocess
    import sys

    script = workspace / "short.py"
    script.write_text(
        "import asyncio\n"
        "from ipybox import CodeExecutor\n"
        "async def main():\n"
        "    async with CodeExecutor() as ex:\n"
        "        print((await ex.execute('print(1)')).text)\n"
        "asyncio.run(main())\n"
    )
    for _ in range(10):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, "1\n", "")


async def test_str_of_a_request_shows_names_escaped_and_nothing_cut(workspace):
    """str(request) is rendered by the same code as every ipybox prompt (issue 18): names quoted
    and escaped when they are not plain, strings escaped, nothing cut; 0.9.2's form otherwise."""
    from ipybox import ApprovalRequest, CodeExecutionError

    code = (
        "from mcptools.fixture import runner\n"
        "runner.run('add', {'a': 1, 'b=2)\\nfixture.add(a': 2, 'text': 'gnp.\\u202eexe' + 'x' * 3000})"
    )
    shown = []
    async with CodeExecutor() as executor:
        with pytest.raises(CodeExecutionError, match="ApprovalRejected"):
            async for item in executor.stream(code):
                if isinstance(item, ApprovalRequest):
                    shown.append(str(item))
                    assert item.tool_args["b=2)\nfixture.add(a"] == 2  # the attributes are as sent
                    await item.reject()
    assert shown == ["fixture.add(a=1, 'b=2)\\nfixture.add(a'=2, text='gnp.\\u202eexe" + "x" * 3000 + "')"]

    async def respond(accepted: bool) -> None:
        pass

    request = ApprovalRequest("s\x1b[2J", "t", {"k": "v\u200b"}, respond)
    assert str(request) == "'s\\x1b[2J'.t(k='v\\u200b')"
    assert repr(request) == "ApprovalRequest('s\\x1b[2J'.t(k='v\\u200b'))"


async def test_notebook_records_the_session_when_asked(workspace):
    """`notebook=True` writes `notebooks/<UTC start>-<tag>.ipynb` of the working directory, a
    cell per execution; the default writes none (0.9.2 wrote none)."""
    import json

    async with CodeExecutor() as executor:
        await executor.execute("print(1)")
        assert executor.notebook_path is None
    assert not (workspace / "notebooks").exists()

    async with CodeExecutor(notebook=True) as executor:
        await executor.execute("x = 6 * 7\nprint(x)")
        path = executor.notebook_path
        assert path is not None and path.parent == workspace / "notebooks"
    # Written in the background; stop() (the end of `async with`) waits for it.
    notebook = json.loads(path.read_text())
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert notebook["nbformat"] == 4 and notebook["nbformat_minor"] == 5
    assert [c["source"] for c in cells] == ["x = 6 * 7\nprint(x)"]
    assert cells[0]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "42\n"}]
    assert cells[0]["metadata"]["ipybox"]["status"] == "ok"
