"""freeact 0.9.1 (the code-action agent built on Python ipybox) run unmodified on the installed
`ipybox`: ipybox-rs, or Python ipybox 0.9.2 as the control (scripts/freeact-check.sh).

Drives freeact's own `Agent` with a scripted pydantic-ai `FunctionModel` (no API key) through:
a code action and a second one reading its state; `!cmd` approved (it runs) and rejected (the
turn ends with "Tool call rejected" and the model is not asked again; the command did not run);
an MCP tool through the API freeact generates with mcpygen, approved (the fixture server computes
the result) and rejected (freeact sees `ApprovalRejectedError:` and ends the turn); an image;
cancel; reset. MCP servers are the repository's fixture (tests/fixtures/mcp_fixture.py, run by
FIXTURE_PYTHON), also in place of freeact's own search and (npx) filesystem servers.

Usage: python freeact_check.py rs|reference   (run from a scratch directory: it works there)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

MODE = sys.argv[1]
assert MODE in ("rs", "reference"), MODE
FIXTURE = [os.environ["FIXTURE_PYTHON"], str(Path(__file__).resolve().parents[1] / "fixtures" / "mcp_fixture.py"), "stdio"]
if MODE == "reference" and os.environ.get("IPYBOX_REFERENCE_SHIM", "1") != "0":
    # 0.9.2 loses a cell's output when its execute_reply overtakes the IOPub output (often, under
    # load): the same ordering shim as the SDK suite's reference run (nothing else changed).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_sdk"))
    import reference_shim

    reference_shim.install()
# freeact's search server runs as `python -m ...`: this venv's python.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel  # noqa: E402

from freeact.agent import (  # noqa: E402
    Agent,
    ApprovalRequest,
    Cancelled,
    CodeExecutionOutput,
    CodeExecutionOutputChunk,
    Response,
)
from freeact.agent.config import Config  # noqa: E402
from freeact.tools.pytools.apigen import generate_mcp_sources  # noqa: E402

# The scripted model: each request takes the next step (a code action, a reset, or a final text).
STEPS: list[tuple[str, str]] = []
asked = 0


async def scripted(messages, info: AgentInfo):
    global asked
    asked += 1
    kind, value = STEPS.pop(0)
    if kind == "text":
        yield value
    elif kind == "code":
        yield {0: DeltaToolCall(name="ipybox_execute_ipython_cell", json_args=json.dumps({"code": value}), tool_call_id=f"c{asked}")}
    elif kind == "reset":
        yield {0: DeltaToolCall(name="ipybox_reset", json_args="{}", tool_call_id=f"c{asked}")}


def check(cond: bool, what: str, seen: object = None) -> None:
    if not cond:
        raise AssertionError(f"{what}; seen: {seen!r}")
    print(f"freeact-check [{MODE}]: ok: {what}", flush=True)


async def turn(agent: Agent, steps: list[tuple[str, str]], decide=lambda e: True, on_chunk=None) -> list:
    """Runs one agent turn on `steps`; returns its events. `decide` answers approval requests."""
    STEPS[:] = steps
    events = []
    async for event in agent.stream("go"):
        events.append(event)
        if isinstance(event, ApprovalRequest):
            event.approve(decide(event))
        elif isinstance(event, CodeExecutionOutputChunk) and on_chunk is not None:
            on_chunk(agent, event)
    return events


def outputs(events: list) -> list[CodeExecutionOutput]:
    return [e for e in events if isinstance(e, CodeExecutionOutput)]


def responses(events: list) -> list[str]:
    return [e.content for e in events if isinstance(e, Response)]


def module_paths() -> None:
    """0.9.2's public module paths import; in ipybox-rs their names say what replaces them."""
    import importlib

    for module, name, instead in (
        ("ipybox.kernel_mgr.client", "KernelClient", "use ipybox.CodeExecutor"),
        ("ipybox.kernel_mgr.server", "KernelGateway", "ipybox.CodeExecutor starts its kernel itself"),
        ("ipybox.mcp_server", "MCPServer", "run the `ipybox` command"),
    ):
        mod = importlib.import_module(module)
        if MODE == "reference":
            check(isinstance(getattr(mod, name), type), f"{module}.{name} is 0.9.2's class")
            continue
        try:
            exec(f"from {module} import {name}")
        except ImportError as e:
            check(instead in str(e), f"{module}.{name} names its replacement", str(e))
        else:
            raise AssertionError(f"{module}.{name} imported")
    check(callable(importlib.import_module("ipybox.mcp_server").cli), "ipybox.mcp_server.cli exists")


async def main() -> None:
    module_paths()
    work = Path.cwd()
    fixture = {"command": FIXTURE[0], "args": FIXTURE[1:]}
    config = Config(
        working_dir=work,
        model=FunctionModel(stream_function=scripted),
        model_settings={},
        enable_persistence=False,
        enable_subagents=False,
        ptc_servers={"fx": fixture},
        # freeact's own JSON-tool servers (its search server, the npx filesystem server) are not
        # what this checks: the fixture in their place, with time to start on a loaded machine.
        mcp_servers={name: {**fixture, "timeout": 60} for name in ("pytools", "filesystem")},
        execution_timeout=60,
    )
    # What freeact's CLI does before it starts the agent: the Python API of its PTC servers.
    await generate_mcp_sources(config.ptc_servers, config.generated_dir)
    check((config.generated_dir / "mcptools" / "fx" / "add.py").is_file(), "mcpygen generated mcptools/fx/add.py")

    agent = Agent(config)
    for attempt in range(3):
        try:
            await agent.start()
            break
        except RuntimeError as e:
            # 0.9.2 gives its kernel gateway 10 x 1 s to come up, sometimes too short on a loaded
            # machine ("Failed to create kernel"); only the reference is given more tries.
            if MODE != "reference" or attempt == 2 or "Failed to create kernel" not in repr(e.__cause__):
                raise
            print(f"freeact-check [{MODE}]: retrying the start: {e.__cause__}", flush=True)
            agent = Agent(config)
    try:
        # A code action, and a second one reading its state.
        ev = await turn(agent, [("code", "x = 21\nprint('set')"), ("text", "done")])
        check([o.text for o in outputs(ev)] == ["set"], "first code action ran", [o.text for o in outputs(ev)])
        ev = await turn(agent, [("code", "print(x * 2)"), ("text", "done")])
        check([o.text for o in outputs(ev)] == ["42"], "second code action reads the first's state", [o.text for o in outputs(ev)])

        # `!cmd` approved: it runs.
        ev = await turn(agent, [("code", "!echo shell-ok && touch approved.txt"), ("text", "done")])
        check([o.text for o in outputs(ev)] == ["shell-ok"], "approved !cmd ran", [o.text for o in outputs(ev)])
        check((work / "approved.txt").exists(), "approved !cmd made its file")
        # ... rejected: not run, the turn ends with freeact's "Tool call rejected", the model is not asked again.
        before = asked
        ev = await turn(agent, [("code", "!touch rejected.txt"), ("text", "never")], decide=lambda e: False)
        check(responses(ev) == ["Tool call rejected"], "rejected !cmd ends the turn", responses(ev))
        check(asked == before + 1 and STEPS == [("text", "never")], "the model was not asked after the rejection", STEPS)
        check(not (work / "rejected.txt").exists(), "rejected !cmd did not run")

        # An MCP tool through freeact's generated (mcpygen) API, approved: the call reaches the server.
        ptc = []

        def approve_all(e: ApprovalRequest) -> bool:
            if e.ptc:
                ptc.append((e.tool_name, e.tool_args))
            return True

        code = "from mcptools.fx.add import Params, run\nr = run(Params(a=2, b=3))\nprint(r.sum, r.operands)"
        ev = await turn(agent, [("code", code), ("text", "done")], decide=approve_all)
        check(ptc == [("fx_add", {"a": 2, "b": 3})], "the tool call was an approval request", ptc)
        check([o.text for o in outputs(ev)] == ["5 [2, 3]"], "approved tool call returned the server's result", [o.text for o in outputs(ev)])

        if MODE == "rs":
            # The endpoint behind TOOL_SERVER_HOST/PORT takes no call without the kernel's
            # credential (the approved call above is the control: it carried it).
            code = (
                "import os, urllib.request, urllib.error\n"
                "req = urllib.request.Request(f\"http://127.0.0.1:{os.environ['TOOL_SERVER_PORT']}/run\", "
                "data=b'{\"server_name\": \"fx\", \"server_params\": {}, \"tool_name\": \"add\", \"tool_args\": {\"a\": 1, \"b\": 1}}', method='POST')\n"
                "try:\n    urllib.request.urlopen(req)\nexcept urllib.error.HTTPError as e:\n    print(e.code, os.environ['TOOL_SERVER_HOST'].startswith('ipybox:'))"
            )
            ptc.clear()
            ev = await turn(agent, [("code", code), ("text", "done")], decide=approve_all)
            check([o.text for o in outputs(ev)] == ["401 True"] and ptc == [], "a call without the credential is refused, unasked", ([o.text for o in outputs(ev)], ptc))

        # Server params written by kernel code are never used on ipybox-rs: a ToolRunner of its own
        # for a server nobody registered starts nothing. 0.9.2 is the control: there the same
        # call makes the host run the kernel's command.
        rogue = work / "rogue.txt"
        code = (
            "import os\nfrom mcpygen.tool_exec.client import ToolRunner\n"
            f"r = ToolRunner('rogue', {{'command': 'sh', 'args': ['-c', 'touch {rogue}']}}, "
            "host=os.environ.get('TOOL_SERVER_HOST', 'localhost'), port=int(os.environ.get('TOOL_SERVER_PORT', '8900')))\n"
            "try:\n    r.run_sync('x', {})\nexcept Exception as e:\n    print(type(e).__name__, str(e).splitlines()[0])"
        )
        ptc.clear()
        ev = await turn(agent, [("code", code), ("text", "done")], decide=approve_all)
        texts = [o.text or "" for o in outputs(ev)]
        if MODE == "rs":
            check(
                texts == ["ToolRunnerError MCP server `rogue` is not registered for any directory this kernel imports from: "
                          "kernel code can only call servers the host registered, with the params recorded then"]
                and ptc == [] and not rogue.exists(),
                "a server the kernel names itself is not started (not registered), nobody asked",
                (texts, ptc),
            )
        else:
            check(rogue.exists() and ptc == [("rogue_x", {})], "0.9.2 ran the command the kernel named (the control)", (texts, ptc))

        # ... rejected: freeact recognises the rejection and ends the turn.
        before = asked
        code = "from mcptools.fx.greet import Params, run\nprint(run(Params(name='nobody')))"
        ev = await turn(agent, [("code", code), ("text", "never")], decide=lambda e: not e.ptc)
        texts = [o.text or "" for o in outputs(ev)]
        check(len(texts) == 1 and "ApprovalRejectedError:" in texts[0] and "Hello" not in texts[0], "rejected tool call raised ApprovalRejectedError", texts)
        check("Approval request for fx.greet rejected" in texts[0], "with 0.9.2's message", texts)
        check(responses(ev) == ["Tool call rejected"] and asked == before + 1, "rejected tool call ends the turn", responses(ev))

        # An image.
        code = "from PIL import Image\nfrom IPython.display import display\ndisplay(Image.new('RGB', (4, 4), 'red'))"
        ev = await turn(agent, [("code", code), ("text", "done")])
        images = [p for o in outputs(ev) for p in o.images]
        check(len(images) == 1 and Path(images[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "an image came back as a PNG file", images)

        # Cancel while a code action runs.
        def cancel_on_start(agent: Agent, chunk: CodeExecutionOutputChunk) -> None:
            if "started" in chunk.text:
                agent.cancel()

        code = "import time\nprint('started', flush=True)\ntime.sleep(60)\nprint('not reached')"
        ev = await turn(agent, [("code", code), ("text", "never")], on_chunk=cancel_on_start)
        check(any(isinstance(e, Cancelled) for e in ev), "cancel ended the turn", [type(e).__name__ for e in ev])
        check(all("not reached" not in (o.text or "") for o in outputs(ev)), "the cancelled cell stopped")
        if MODE == "rs":
            # ipybox-rs keeps the kernel's state after a cancel (0.9.2 fails the next action with HTTP 403).
            ev = await turn(agent, [("code", "print(x * 2)"), ("text", "done")])
            check([o.text for o in outputs(ev)] == ["42"], "state kept after cancel", [o.text for o in outputs(ev)])

        # Reset: the kernel's state is gone, and the kernel works.
        await turn(agent, [("reset", ""), ("text", "done")])
        code = "print('x' in globals())\nfrom mcptools.fx.add import Params, run\nprint(run(Params(a=1, b=1)).sum)"
        ev = await turn(agent, [("code", code), ("text", "done")], decide=approve_all)
        check([o.text for o in outputs(ev)] == ["False\n2"], "reset cleared the state; the new kernel calls tools", [o.text for o in outputs(ev)])
    finally:
        await agent.stop()
    print(f"freeact-check [{MODE}]: all passed", flush=True)


asyncio.run(main())
