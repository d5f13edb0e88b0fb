"""Python ipybox 0.9.2 (which runs its kernels on a Jupyter Kernel Gateway it starts) on the
figures of `cargo bench --bench remote`: cold start to the first result, the `print(1)` round
trip, and a tool call round trip (approved at once) on the MCP fixture server. Prints one JSON
line (ms; `lost_outputs` counts results whose text was not the expected one: 0.9.2 loses output
now and then, see tests/python_sdk/reference_shim.py). Run by benches/remote.rs with target/bench-python/py/bin/python when that exists
(`scripts/bench-python.sh` makes it).

    python benches/remote_reference.py FIXTURE_PYTHON FIXTURE_SCRIPT WORKDIR
"""

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path


async def main(fixture_python: str, fixture: str, workdir: Path) -> None:
    from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources

    os.chdir(workdir)
    await generate_mcp_sources("fx", {"command": fixture_python, "args": [fixture, "stdio"]}, workdir / "mcptools")
    res = {}
    lost = 0
    cold = []
    for _ in range(3):
        t0 = time.perf_counter()
        async with CodeExecutor() as ex:
            lost += (await ex.execute("print(1)")).text != "1"
            cold.append(time.perf_counter() - t0)
    res["cold_start_ms"] = statistics.median(cold) * 1000
    async with CodeExecutor() as ex:
        for _ in range(20):
            await ex.execute("print(1)")
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            lost += (await ex.execute("print(1)")).text != "1"
            times.append(time.perf_counter() - t0)
        res["print1_ms"] = statistics.median(times) * 1000
        code = "from mcptools.fx.add import Params, run; print(run(Params(a=1, b=2)).sum)"
        times = []
        for i in range(55):
            t0 = time.perf_counter()
            async for item in ex.stream(code):
                if isinstance(item, ApprovalRequest):
                    await item.accept()
                elif isinstance(item, CodeExecutionResult):
                    lost += item.text != "3"
            if i >= 5:
                times.append(time.perf_counter() - t0)
        res["tool_call_ms"] = statistics.median(times) * 1000
    res["lost_outputs"] = lost
    print(json.dumps(res))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
