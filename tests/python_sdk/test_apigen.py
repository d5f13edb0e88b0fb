"""The "Python tool API generation" page (and generate_mcp_sources' API reference)."""

import asyncio
import time
from pathlib import Path

import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources

from sdk_support import FIXTURE_MODULES, fixture_http_server, stdio_params


def _module_files(package: Path) -> list[str]:
    return sorted(p.name for p in package.iterdir() if p.is_file())


async def test_stdio_server_generates_a_module_per_tool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fixture_mcp_params = stdio_params()

    names = await generate_mcp_sources(
        server_name="fixture",
        server_params=fixture_mcp_params,
        root_dir=Path("mcptools"),
    )

    # the sanitized tool names, one per generated module ("get-thing" -> get_thing)
    assert isinstance(names, list)
    assert sorted(names) == sorted(FIXTURE_MODULES)
    assert len(names) == len(set(names))
    # mcptools/fixture/ with __init__.py and a module named after each tool
    assert _module_files(tmp_path / "mcptools" / "fixture") == sorted(["__init__.py"] + [f"{n}.py" for n in names])


async def test_existing_server_directory_is_replaced(tmp_path):
    root = tmp_path / "mcptools"
    (root / "fixture").mkdir(parents=True)
    (root / "fixture" / "stale.py").write_text("raise RuntimeError('stale')\n")
    (root / "other").mkdir()
    (root / "other" / "keep.py").write_text("")

    names = await generate_mcp_sources("fixture", stdio_params(), root)

    assert not (root / "fixture" / "stale.py").exists()
    assert _module_files(root / "fixture") == sorted(["__init__.py"] + [f"{n}.py" for n in names])
    assert (root / "other" / "keep.py").exists()


async def test_generated_modules_have_params_result_and_run(workspace):
    code = """
import typing
from pydantic import BaseModel
from mcptools.fixture import add, greet
print(issubclass(add.Params, BaseModel), issubclass(add.Result, BaseModel), typing.get_type_hints(add.run)["return"] is add.Result)
print(issubclass(greet.Params, BaseModel), hasattr(greet, "Result"), typing.get_type_hints(greet.run)["return"] is str)
"""
    async with CodeExecutor() as executor:
        result = await executor.execute(code)
    # a tool with an output schema gets a Result class, one without returns str
    assert result.text == "True True True\nTrue False True"


async def test_using_the_generated_api(workspace):
    code = """
from mcptools.fixture.add import Params, Result, run

# Params validates input
try:
    Params(a="not a number", b=3)
except ValueError as e:
    print(f"invalid: {type(e).__name__}")

params = Params(a=2, b=3)

# run() calls the MCP tool and returns a Result (or str for untyped tools)
result: Result = run(params)
print(type(result).__name__, result.sum)
for operand in result.operands:
    print(operand)
"""
    async with CodeExecutor() as executor:
        result = await executor.execute(code)
        assert result.text == "invalid: ValidationError\nResult 5\n2\n3"

        result = await executor.execute(
            "from mcptools.fixture.greet import Params, run\n"
            "greeting = run(Params(name='ipybox'))\n"
            "print(type(greeting).__name__, greeting)"
        )
        assert result.text == "str Hello, ipybox!"


async def test_environment_variable_substitution(workspace, monkeypatch):
    """`${VAR_NAME}` placeholders are replaced from the environment when connecting to the server,
    which keeps the secret out of the generated code."""
    monkeypatch.setenv("FIXTURE_SECRET_TOKEN", "s3cret-value")
    params = stdio_params(env={"FIXTURE_SECRET_TOKEN": "${FIXTURE_SECRET_TOKEN}"})

    await generate_mcp_sources(server_name="fixture_env", server_params=params, root_dir=Path("mcptools"))
    for module in (workspace / "mcptools" / "fixture_env").glob("*.py"):
        assert "s3cret-value" not in module.read_text(), module

    async with CodeExecutor() as executor:
        result = await executor.execute(
            "from mcptools.fixture_env.get_env import Params, run\nprint(run(Params(name='FIXTURE_SECRET_TOKEN')))"
        )
    assert result.text == "s3cret-value"


@pytest.mark.parametrize(
    "mode,path,explicit_type",
    [
        ("http", "/mcp", None),  # URLs containing /mcp use streamable HTTP
        ("sse", "/sse", None),  # URLs containing /sse use SSE
        ("http", "/rpc", "streamable_http"),
        ("sse", "/events", "sse"),
    ],
)
async def test_http_servers(workspace, monkeypatch, mode, path, explicit_type):
    monkeypatch.setenv("FIXTURE_HTTP_TOKEN", "tok-123")
    with fixture_http_server(mode, path) as port:
        http_params = {
            "url": f"http://127.0.0.1:{port}{path}",
            "headers": {"Authorization": "Bearer ${FIXTURE_HTTP_TOKEN}"},
        }
        if explicit_type is not None:
            http_params["type"] = explicit_type

        names = await generate_mcp_sources(server_name="remote", server_params=http_params, root_dir=Path("mcptools"))
        assert sorted(names) == sorted(FIXTURE_MODULES)

        code = """
from mcptools.remote import get_header, greet
print(greet.run(greet.Params(name="http")))
print(get_header.run(get_header.Params(name="Authorization")))
"""
        async with CodeExecutor() as executor:
            result = await executor.execute(code)
    assert result.text == "Hello, http!\nBearer tok-123"


async def test_async_api_calls_in_flight_concurrently(workspace):
    """async_api=True generates `async def run`, awaited (and gathered) by kernel code."""
    names = await generate_mcp_sources("fixture_async", stdio_params(), Path("mcptools"), async_api=True)
    assert sorted(names) == sorted(FIXTURE_MODULES)

    async with CodeExecutor() as executor:
        result = await executor.execute(
            "import inspect\n"
            "from mcptools.fixture_async import add, greet, sleep\n"
            "print(inspect.iscoroutinefunction(add.run), inspect.iscoroutinefunction(greet.run))"
        )
        assert result.text == "True True"

        # the first call starts the MCP server (not part of the measurement below)
        result = await executor.execute("result = await add.run(add.Params(a=1, b=2))\nprint(result.sum)")
        assert result.text == "3"

        code = """
import asyncio, time
_start = time.monotonic()
results = await asyncio.gather(*[sleep.run(sleep.Params(seconds=0.5)) for _ in range(5)])
elapsed = time.monotonic() - _start
print(results)
"""
        # all five calls wait for approval at the same time: accept them only once all are pending
        pending: list[ApprovalRequest] = []
        texts: list[str | None] = []
        async with asyncio.timeout(60):
            async for item in executor.stream(code):
                match item:
                    case ApprovalRequest():
                        assert str(item) == "fixture_async.sleep(seconds=0.5)"
                        pending.append(item)
                        if len(pending) == 5:
                            for request in pending:
                                await request.accept()
                    case CodeExecutionResult():
                        texts.append(item.text)
        assert len(pending) == 5
        assert texts == [str(["slept 0.5"] * 5)]
        elapsed = float((await executor.execute("print(elapsed)")).text)
        assert elapsed < 2.0, f"5 x sleep(0.5) took {elapsed:.2f}s: not concurrent"

        # the same through execute() (auto-approval)
        start = time.monotonic()
        result = await executor.execute(code)
        assert result.text == str(["slept 0.5"] * 5)
        elapsed = float((await executor.execute("print(elapsed)")).text)
        assert elapsed < 2.0, f"5 x sleep(0.5) took {elapsed:.2f}s: not concurrent"
        assert time.monotonic() - start < 5
