"""`CodeExecutor(kernel_gateway_host=..., kernel_gateway_port=...)` / `kernel_gateway_url=...`:
kernels on a running Jupyter Kernel Gateway (ipybox-rs only: 0.9.2 starts a gateway of its own on
that port instead of using a running one).

The gateway comes from `target/test-env/jupyter/kg` (made by `scripts/test-env.sh`).
"""

import asyncio
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sdk_support import free_port, is_ipybox_rs

if not is_ipybox_rs():
    pytest.skip("ipybox-rs only (0.9.2 starts its own gateway on kernel_gateway_port)", allow_module_level=True)

from ipybox import ApprovalRequest, CodeExecutionError, CodeExecutionResult, CodeExecutor  # noqa: E402

JUPYTER = Path(__file__).resolve().parents[2] / "target/test-env/jupyter/kg/bin/jupyter"
TOKEN = "sdk-test-token"


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    if not JUPYTER.exists():
        pytest.skip(f"{JUPYTER} is missing: run `bash scripts/test-env.sh`")
    port = free_port()
    jupyter = tmp_path / "jupyter-paths"
    env = {
        **os.environ,
        "JUPYTER_DATA_DIR": str(jupyter / "data"),
        "JUPYTER_PATH": str(jupyter / "data"),
        "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
    }
    proc = subprocess.Popen(
        [str(JUPYTER), "kernelgateway", "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.port={port}",
         f"--KernelGatewayApp.auth_token={TOKEN}", "--JupyterWebsocketPersonality.list_kernels=True"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            kernels(port)
            break
        except OSError:
            assert proc.poll() is None, "the kernel gateway exited"
            assert time.monotonic() < deadline, "the kernel gateway did not start"
            time.sleep(0.1)
    monkeypatch.setenv("IPYBOX_GATEWAY_TOKEN", TOKEN)
    yield port
    proc.kill()
    proc.wait()


def kernels(port: int) -> list:
    """The gateway's kernels. Asked again on a 500: jupyter_server's listing fails while a kernel
    is still starting (the model reads `last_activity`, set once the kernel runs)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/kernels", headers={"Authorization": f"token {TOKEN}"})
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code < 500 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def test_host_and_port_run_kernels_on_the_gateway(workspace, gateway):
    code = "from mcptools.fixture.add import Params, run\nprint(run(Params(a=2, b=3)))"
    async with CodeExecutor(kernel_gateway_host="127.0.0.1", kernel_gateway_port=gateway) as executor:
        await executor.execute("x = 41")
        assert (await executor.execute("print(x + 1)")).text == "42"
        # The kernel is the gateway's, not a child of this process; its warm spare starts in the
        # background (seconds on a loaded machine).
        from sdk_support import wait_until

        await wait_until(lambda: len(kernels(gateway)) == 2, what="the kernel and its warm spare on the gateway")
        seen = []
        async for item in executor.stream(code):
            match item:
                case ApprovalRequest():
                    seen.append(str(item))
                    await item.accept()
                case CodeExecutionResult():
                    assert "5" in item.text
        assert seen == ["fixture.add(a=2, b=3)"]
        with pytest.raises(CodeExecutionError):
            async for item in executor.stream(code):
                if isinstance(item, ApprovalRequest):
                    await item.reject()
        await executor.reset()
        with pytest.raises(CodeExecutionError):
            await executor.execute("x")
    deadline = time.monotonic() + 10
    while kernels(gateway) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kernels(gateway) == []


async def test_url_with_a_wrong_token_fails_clearly(workspace, gateway):
    executor = CodeExecutor(kernel_gateway_url=f"http://127.0.0.1:{gateway}/?token=wrong")
    with pytest.raises(Exception) as exc_info:
        await executor.start()
    assert "refused ipybox's credentials" in str(exc_info.value)
    assert "token=wrong" not in str(exc_info.value)
