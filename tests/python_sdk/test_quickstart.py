"""The Quickstart page: generate a tool API, run code that calls it, approve the call.

The docs use the Brave Search MCP server; here the fixture server stands in for it (no network),
with its `add` tool in place of `brave_image_search`.
"""

from pathlib import Path

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources
from ipybox.utils import arun

from sdk_support import FIXTURE_PYTHON, FIXTURE_SCRIPT

SERVER_PARAMS = {
    "command": FIXTURE_PYTHON,
    "args": [str(FIXTURE_SCRIPT), "stdio"],
    "env": {
        "FIXTURE_API_KEY": "${FIXTURE_API_KEY}",
    },
}

CODE = """
from mcptools.fixture.add import Params, Result, run

result: Result = run(Params(a=2, b=3))
for operand in result.operands:
    print(f"- operand {operand}")
print(f"sum = {result.sum}")
"""


async def test_complete_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FIXTURE_API_KEY", "quickstart-key")

    prompts: list[str] = []
    printed: list[str | None] = []

    def user_input(prompt: str) -> str:  # stands in for `input`: the user presses Enter
        prompts.append(prompt)
        return ""

    # Generate a Python tool API for the fixture MCP server
    await generate_mcp_sources(
        server_name="fixture",
        server_params=SERVER_PARAMS,
        root_dir=Path("mcptools"),
    )

    # Launch ipybox code executor
    async with CodeExecutor() as executor:
        # Execute code that calls an MCP tool programmatically in an IPython kernel
        async for item in executor.stream(CODE):
            match item:
                # Handle approval requests
                case ApprovalRequest() as req:
                    prompt = f"Tool call: [{req}]\nApprove? (Y/n): "
                    if await arun(user_input, prompt) in ["y", ""]:
                        await req.accept()
                    else:
                        await req.reject()
                # Handle final execution result
                case CodeExecutionResult(text=text):
                    printed.append(text)

    assert prompts == ["Tool call: [fixture.add(a=2, b=3)]\nApprove? (Y/n): "]
    assert printed == ["- operand 2\n- operand 3\nsum = 5"]


async def test_how_it_works_server_params_placeholder(tmp_path, monkeypatch):
    """`${FIXTURE_API_KEY}` in server_params is replaced with the value from the environment
    (of the application, not the kernel) when ipybox starts the MCP server."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FIXTURE_API_KEY", "quickstart-key")
    await generate_mcp_sources(server_name="fixture", server_params=SERVER_PARAMS, root_dir=Path("mcptools"))

    async with CodeExecutor() as executor:
        result = await executor.execute(
            "from mcptools.fixture.get_env import Params, run\nprint(run(Params(name='FIXTURE_API_KEY')))"
        )
    assert result.text == "quickstart-key"
