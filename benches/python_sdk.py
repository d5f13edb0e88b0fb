"""Benchmark of the ipybox Python SDK, public API only.

Runs with the python of a venv in which *either* ipybox-rs (our wheel) or Python ipybox 0.9.2 is
installed (both are `import ipybox`), and prints one JSON line with all figures (ms unless the
key says otherwise) to stdout; progress goes to stderr. `scripts/bench-python.sh` runs it in both
and prints a comparison table.

    python benches/python_sdk.py [--fixture-python PY] [--fixture PATH] [--quick]

Measured (with `from ipybox import CodeExecutor, ApprovalRequest, CodeExecutionResult,
generate_mcp_sources` only):
- import: `import ipybox` in this process (first import; files in the page cache).
- cold start: `async with CodeExecutor() as ex: await ex.execute("print(1)")`, from entering to
  the first result; 5 fresh executors, each in a fresh event loop (split into `__aenter__` and
  the first `execute`; `__aexit__` is timed too).
- `execute("print(1)")` round trip: 200 after 20 warm-up.
- a tool call with approval through `stream()` on the generated API of the MCP fixture server
  (tests/fixtures/mcp_fixture.py, stdio): every ApprovalRequest accepted at once; 50 after
  warm-up, the MCP server session stays open between calls.
  For the split of that time: the same cell without the call, and the call on an executor with
  `approve_tool_calls=False`.
- reset to next result: `await ex.reset(); await ex.execute("print(1)")`, 10 back-to-back and
  10 after a 1 s pause each.
- memory: RSS (and PSS) of this process plus all its descendants with one started executor
  (after its first result), from /proc.

The fixture server needs PyPI `mcp` 2.x; Python ipybox 0.9.2 needs `mcp<2`, so the server can
run on another venv's python (`--fixture-python` or $FIXTURE_PYTHON; default: this python).
Nothing here asserts a time: it is a measurement.
"""

import argparse
import asyncio
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[python_sdk] {msg}", file=sys.stderr, flush=True)


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def pctl(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def summary(values_s: list[float]) -> dict:
    v = [ms(x) for x in values_s]
    return {
        "n": len(v),
        "median": round(statistics.median(v), 3),
        "mean": round(statistics.fmean(v), 3),
        "min": min(v),
        "p99": pctl(v, 99),
        "max": max(v),
    }


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


# --- the process tree, from /proc -------------------------------------------------------------


def _ppids() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: split after the last ')'.
        rest = stat[stat.rfind(")") + 2 :].split()
        out[int(entry)] = int(rest[1])
    return out


def descendants(pid: int) -> list[int]:
    ppids = _ppids()
    children: dict[int, list[int]] = {}
    for p, pp in ppids.items():
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            found.append(c)
            todo.append(c)
    return found


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
        parts = [p.decode(errors="replace") for p in parts if p]
        # Short form: program name + the first arguments that say what it is.
        short = [os.path.basename(parts[0])]
        for p in parts[1:4]:
            if "\n" in p or len(p) > 40:
                short.append("<code>" if short[-1] == "-c" else p[:40] + "...")
            else:
                short.append(os.path.basename(p) if p.startswith("/") else p)
        return " ".join(short)
    except (OSError, IndexError):
        return "?"


def tree_memory() -> dict:
    me = os.getpid()
    procs = []
    for pid in [me] + descendants(me):
        rss = _status_kb(pid, "VmRSS")
        if rss is None:
            continue
        procs.append({"pid": pid, "cmd": _cmdline(pid), "rss_mb": round(rss / 1024, 1),
                      "pss_mb": round((_pss_kb(pid) or 0) / 1024, 1)})
    return {
        "rss_mb": round(sum(p["rss_mb"] for p in procs), 1),
        "pss_mb": round(sum(p["pss_mb"] for p in procs), 1),
        "self_rss_mb": procs[0]["rss_mb"] if procs else None,
        "processes": procs,
    }


def wait_no_children(timeout: float = 10.0) -> float:
    """Waits (bounded) until the previous executor's processes are gone, so they don't eat the
    CPU of the next measurement. Returns how long it waited."""
    t0 = time.perf_counter()
    while descendants(os.getpid()) and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)
    return time.perf_counter() - t0


def subprocess_ms(argv: list[str], n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return ms(statistics.median(times))


# --- the measurements -------------------------------------------------------------------------


class Checks:
    """Counts results whose output is not what the code printed, and errors, per phase: they are
    reported, not hidden, and don't stop the run (Python ipybox 0.9.2 can return `text=None`
    for `print(1)`: it ends an execution at `execute_reply` and can drop the stdout that
    arrives after it)."""

    def __init__(self, res: dict):
        self.wrong = res.setdefault("wrong_output", {})
        self.errors = res.setdefault("errors", {})

    def text(self, phase: str, got, expected: str) -> None:
        if got is None or got.strip() != expected:
            self.wrong.setdefault(phase, {"count": 0, "examples": []})
            self.wrong[phase]["count"] += 1
            if len(self.wrong[phase]["examples"]) < 3:
                self.wrong[phase]["examples"].append(repr(got))

    def error(self, phase: str, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}".strip()
        log(f"ERROR in {phase}: {msg[:500]}")
        self.errors.setdefault(phase, []).append(msg[:2000])


async def cold_start_once(CodeExecutor, checks: Checks) -> dict:
    t0 = time.perf_counter()
    ex = CodeExecutor()
    async with ex:
        t1 = time.perf_counter()
        r = await ex.execute("print(1)")
        t2 = time.perf_counter()
        checks.text("cold_start", r.text, "1")
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    return {"total": t2 - t0, "enter": t1 - t0, "first_execute": t2 - t1, "exit": t4 - t3}


async def tool_call_once(ex, ApprovalRequest, CodeExecutionResult, code: str, checks: Checks,
                         phase: str) -> float:
    approvals = 0
    text = None
    t0 = time.perf_counter()
    async for item in ex.stream(code):
        if isinstance(item, ApprovalRequest):
            approvals += 1
            await item.accept()
        elif isinstance(item, CodeExecutionResult):
            text = item.text
    dt = time.perf_counter() - t0
    checks.text(phase, text, "3")
    checks.text(phase + "_approvals", str(approvals), "0" if phase == "tool_call_no_approval" else "1")
    return dt


async def steady(args, workdir: Path, ipybox_mod, res: dict, checks: Checks) -> None:
    CodeExecutor = ipybox_mod.CodeExecutor
    ApprovalRequest = ipybox_mod.ApprovalRequest
    CodeExecutionResult = ipybox_mod.CodeExecutionResult
    generate_mcp_sources = ipybox_mod.generate_mcp_sources

    fixture_params = {"command": args.fixture_python, "args": [str(args.fixture), "stdio"]}
    have_api = False
    try:
        t0 = time.perf_counter()
        modules = await generate_mcp_sources("fx", fixture_params, workdir / "mcptools")
        res["generate_mcp_sources_ms"] = ms(time.perf_counter() - t0)
        log(f"generated {len(modules)} modules in {res['generate_mcp_sources_ms']:.0f} ms")
        have_api = True
    except Exception as e:  # reported, and the tool-call phase is skipped
        checks.error("generate_mcp_sources", e)

    n_exec, n_warm = (40, 5) if args.quick else (200, 20)
    n_tool, n_tool_warm = (10, 3) if args.quick else (50, 5)
    n_reset = 3 if args.quick else 10

    async with CodeExecutor(working_dir=workdir) as ex:
        r = await ex.execute("print(1)")
        checks.text("steady_first", r.text, "1")
        await asyncio.sleep(2.0)  # let background work of the start (e.g. a spare kernel) settle
        res["memory_started"] = tree_memory()
        log(f"memory with one started executor: {res['memory_started']['rss_mb']} MB RSS "
            f"({len(res['memory_started']['processes'])} processes)")

        try:
            for _ in range(n_warm):
                await ex.execute("print(1)")
            times = []
            for _ in range(n_exec):
                t0 = time.perf_counter()
                r = await ex.execute("print(1)")
                times.append(time.perf_counter() - t0)
                checks.text("execute_print1", r.text, "1")
            res["execute_print1"] = summary(times)
            log(f"print(1): median {res['execute_print1']['median']} ms, p99 {res['execute_print1']['p99']} ms")
        except Exception as e:
            checks.error("execute_print1", e)

        if have_api:
            code = "from mcptools.fx.add import Params, run; print(run(Params(a=1, b=2)).sum)"
            try:
                # The first call imports the generated module and starts the MCP server.
                res["tool_call_first_ms"] = ms(await tool_call_once(
                    ex, ApprovalRequest, CodeExecutionResult, code, checks, "tool_call_first"))
                for _ in range(n_tool_warm - 1):
                    await tool_call_once(ex, ApprovalRequest, CodeExecutionResult, code, checks, "tool_call_warmup")
                times = []
                for _ in range(n_tool):
                    times.append(await tool_call_once(
                        ex, ApprovalRequest, CodeExecutionResult, code, checks, "tool_call_approval"))
                res["tool_call_approval"] = summary(times)
                log(f"tool call: first {res['tool_call_first_ms']:.0f} ms, "
                    f"median {res['tool_call_approval']['median']} ms")
                res["memory_with_mcp_server"] = tree_memory()
                # Diagnostics for the split of the tool call's time: the same cell without the
                # call (import + Pydantic model + print) ...
                nocall = "from mcptools.fx.add import Params, run; print(Params(a=1, b=2).a + 2)"
                times = []
                for i in range(n_tool_warm + n_tool):
                    t0 = time.perf_counter()
                    r = await ex.execute(nocall)
                    if i >= n_tool_warm:
                        times.append(time.perf_counter() - t0)
                    checks.text("tool_cell_without_call", r.text, "3")
                res["tool_cell_without_call"] = summary(times)
            except Exception as e:
                checks.error("tool_call_approval", e)

        for label, pause in (("reset_back_to_back", 0.0), ("reset_after_1s", 1.0)):
            try:
                times = []
                for _ in range(n_reset):
                    if pause:
                        await asyncio.sleep(pause)
                    t0 = time.perf_counter()
                    await ex.reset()
                    r = await ex.execute("print(1)")
                    times.append(time.perf_counter() - t0)
                    checks.text(label, r.text, "1")
                res[label] = summary(times)
                res[label]["first_ms"] = ms(times[0])
                log(f"{label}: median {res[label]['median']} ms (first {res[label]['first_ms']} ms)")
            except Exception as e:
                checks.error(label, e)
        t0 = time.perf_counter()
    res["steady_exit_ms"] = ms(time.perf_counter() - t0)

    if have_api:
        # ... and the call without approval (`approve_tool_calls=False`), on a second executor.
        try:
            async with CodeExecutor(working_dir=workdir, approve_tool_calls=False) as ex:
                times = []
                for i in range(n_tool_warm + n_tool):
                    dt = await tool_call_once(ex, ApprovalRequest, CodeExecutionResult, code, checks,
                                              "tool_call_no_approval")
                    if i >= n_tool_warm:
                        times.append(dt)
                res["tool_call_no_approval"] = summary(times)
                log(f"tool call without approval: median {res['tool_call_no_approval']['median']} ms")
        except Exception as e:
            checks.error("tool_call_no_approval", e)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture-python", default=os.environ.get("FIXTURE_PYTHON", sys.executable))
    ap.add_argument("--fixture", type=Path, default=ROOT / "tests" / "fixtures" / "mcp_fixture.py")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--cold-runs", type=int, default=5)
    args = ap.parse_args()
    args.fixture = args.fixture.resolve()

    res: dict = {"load_start": loadavg()}

    t0 = time.perf_counter()
    import ipybox  # noqa: E402  (timed on purpose)
    from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources  # noqa: F401

    res["import_ms"] = ms(time.perf_counter() - t0)

    impl, version = None, None
    for dist in ("ipybox-rs", "ipybox"):
        try:
            version = importlib.metadata.version(dist)
            impl = dist
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    res = {"implementation": impl, "version": version, **res}
    res["python"] = platform.python_version()
    res["cpus"] = os.cpu_count()
    res["fixture_python"] = args.fixture_python
    log(f"{impl} {version} on Python {res['python']}, load {res['load_start']}")

    # For context: what starting a bare interpreter and importing ipykernel costs here.
    res["baseline_python_startup_ms"] = subprocess_ms([sys.executable, "-c", "pass"])
    res["baseline_import_ipykernel_ms"] = subprocess_ms([sys.executable, "-c", "import ipykernel.kernelapp"])

    checks = Checks(res)
    workdir = Path(tempfile.mkdtemp(prefix="ipybox-bench-")).resolve()
    os.chdir(workdir)  # CodeExecutor() defaults (cwd, images/) land in the temp dir

    cold = []
    for i in range(args.cold_runs):
        waited = wait_no_children()
        if waited > 0.5:
            log(f"waited {waited:.1f} s for the previous executor's processes to exit")
        try:
            cold.append(asyncio.run(cold_start_once(CodeExecutor, checks)))
        except Exception as e:
            checks.error("cold_start", e)
            continue
        log(f"cold start {i + 1}: {ms(cold[-1]['total']):.0f} ms "
            f"(enter {ms(cold[-1]['enter']):.0f}, first execute {ms(cold[-1]['first_execute']):.0f}, "
            f"exit {ms(cold[-1]['exit']):.0f})")
    if cold:
        res["cold_start"] = summary([c["total"] for c in cold])
        res["cold_start_enter"] = summary([c["enter"] for c in cold])
        res["cold_start_first_execute"] = summary([c["first_execute"] for c in cold])
        res["cold_start_exit"] = summary([c["exit"] for c in cold])
    wait_no_children()

    try:
        asyncio.run(steady(args, workdir, ipybox, res, checks))
    except Exception as e:
        checks.error("steady", e)
    res["leftover_processes_after_stop"] = len(descendants(os.getpid()))
    wait_no_children()
    res["load_end"] = loadavg()
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
