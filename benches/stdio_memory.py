"""Issue 40's stdio figures with the Python `mcp` client: memory of the server's process tree and
the reset path, for several ipybox executables side by side (interleaved rounds, one run).

    python benches/stdio_memory.py [--rounds N] LABEL=COMMAND [LABEL=COMMAND ...]

COMMAND is an executable with arguments (ipybox, or Python ipybox's `ipybox` for the reference
column), run as `COMMAND --workspace WS` over stdio, each session in a fresh workspace. Runs with the python
of a venv that has `mcp` 1.x (`ClientSession`, the handshake era: `target/mcp1/venv`, made by
`scripts/test-env.sh`). `cargo bench --bench mcp_server` runs it against `target/release/ipybox`
and `$IPYBOX_BENCH_BASELINE` when set.

Per executable and round:
- cold start: spawn -> initialize -> first `execute_ipython_cell("print(1)")` result;
- `print(1)` round trip (median of 50);
- tree PSS after five cells, at rest (2 s after the fifth): the server, its template, its
  kernels (ipybox's `smaps_rollup` of every descendant), and per process;
- reset -> next result after a 1 s pause (median of 5);
- resets back to back: `reset` then `print(1)`, 10 in a row (median, max);
- the tree's peak PSS, sampled every 50 ms over the resets.
Prints a markdown table (medians over rounds) and the load average; one JSON line per round to
stderr. Nothing is asserted: it is a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(pid: int) -> list[int]:
    kids = children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def roles(root: int) -> list[tuple[int, str]]:
    """The server's process tree with each process's role: the server, the kernel factory's
    template (a child running ``ipybox_runtime.factory``), kernels (its children, or ipykernel
    processes the server started), other (MCP servers, helpers)."""
    kids = children_map()
    out = [(root, "server")]
    for p in kids.get(root, []):
        cmd = cmdline(p)
        if "ipybox_runtime.factory" in cmd:
            out.append((p, "template"))
            out.extend((k, "kernel") for k in kids.get(p, []))
        elif "kernel" in cmd:
            out.append((p, "kernel"))
        else:
            out.append((p, "other"))
    seen = {p for p, _ in out}
    out.extend((p, "other") for p in tree(root) if p not in seen)
    return out


def server_pid(before: set[int]) -> int:
    """The server: our child that was not there before the session started."""
    me = os.getpid()
    new = [p for p in children_map().get(me, []) if p not in before]
    return new[0] if new else 0


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session: ClientSession, name: str, args: dict) -> str:
    r = await session.call_tool(name, args)
    if r.isError:
        raise RuntimeError(f"{name} failed: {text_of(r)}")
    return text_of(r)


async def run_one(label: str, command: str) -> dict:
    out: dict = {"label": label}
    with tempfile.TemporaryDirectory() as ws:
        # cold start
        firsts = []
        for _ in range(3):
            before = set(children_map().get(os.getpid(), []))
            t = time.perf_counter()
            argv = shlex.split(command)
            params = StdioServerParameters(command=argv[0], args=[*argv[1:], "--workspace", ws])
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    got = await call(s, "execute_ipython_cell", {"code": "print(1)"})
                    firsts.append(time.perf_counter() - t)
                    out.setdefault("first_outputs", []).append(got.strip()[:40])
        out["cold_start_ms"] = statistics.median(firsts) * 1000
        before = set(children_map().get(os.getpid(), []))
        argv = shlex.split(command)
        params = StdioServerParameters(command=argv[0], args=[*argv[1:], "--workspace", ws])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                root = server_pid(before)
                for i in range(5):
                    await call(s, "execute_ipython_cell", {"code": f"x{i} = list(range(1000)); print({i})"})
                await asyncio.sleep(2.0)
                procs = [(p, r_, pss_kb(p)) for p, r_ in roles(root)]
                out["rest_pss_mb"] = sum(k for _, _, k in procs) / 1024
                out["rest_procs"] = [(r_, round(k / 1024, 1)) for _, r_, k in procs]
                rts = []
                for _ in range(50):
                    t = time.perf_counter()
                    await call(s, "execute_ipython_cell", {"code": "print(1)"})
                    rts.append(time.perf_counter() - t)
                out["print1_ms"] = statistics.median(rts) * 1000
                # peak sampler over the resets
                stop = threading.Event()
                peak = [0]

                def sample():
                    while not stop.is_set():
                        peak[0] = max(peak[0], sum(pss_kb(p) for p in tree(root)))
                        time.sleep(0.05)

                th = threading.Thread(target=sample, daemon=True)
                th.start()
                spaced = []
                for _ in range(5):
                    await asyncio.sleep(1.0)
                    t = time.perf_counter()
                    await call(s, "reset", {})
                    await call(s, "execute_ipython_cell", {"code": "print(1)"})
                    spaced.append(time.perf_counter() - t)
                out["reset_ms"] = statistics.median(spaced) * 1000
                await asyncio.sleep(1.0)
                b2b = []
                for _ in range(10):
                    t = time.perf_counter()
                    await call(s, "reset", {})
                    await call(s, "execute_ipython_cell", {"code": "print(1)"})
                    b2b.append(time.perf_counter() - t)
                out["reset_b2b_ms"] = statistics.median(b2b) * 1000
                out["reset_b2b_max_ms"] = max(b2b) * 1000
                stop.set()
                th.join()
                out["peak_pss_mb"] = peak[0] / 1024
    return out


def load1() -> float:
    return os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("servers", nargs="+", help="LABEL=COMMAND")
    a = ap.parse_args()
    servers = [s.split("=", 1) for s in a.servers]
    results: dict[str, list[dict]] = {label: [] for label, _ in servers}
    loads = [load1()]
    for rnd in range(a.rounds):
        order = servers if rnd % 2 == 0 else list(reversed(servers))
        for label, command in order:
            res = asyncio.run(run_one(label, command))
            res["round"] = rnd + 1
            res["load1"] = round(load1(), 2)
            print(json.dumps(res), file=sys.stderr, flush=True)
            results[label].append(res)
    loads.append(load1())

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    rows = [
        ("cold start -> first result (ms)", "cold_start_ms", 0),
        ("`print(1)` round trip (ms)", "print1_ms", 2),
        ("reset -> next result, 1 s apart (ms)", "reset_ms", 1),
        ("resets back to back (ms, median of 10)", "reset_b2b_ms", 1),
        ("resets back to back, max (ms)", "reset_b2b_max_ms", 1),
        ("server tree PSS after five cells, at rest (MB)", "rest_pss_mb", 1),
        ("server tree PSS, peak over the resets (MB)", "peak_pss_mb", 1),
    ]
    labels = [label for label, _ in servers]
    print(f"| stdio, Python `mcp` client (median of {a.rounds} rounds) | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name, key, nd in rows:
        print(f"| {name} | " + " | ".join(f"{med(l, key):.{nd}f}" for l in labels) + " |")
    for label in labels:
        last = results[label][-1]["rest_procs"]
        print(f"- {label}, processes at rest (last round, PSS MB): " + ", ".join(f"{r} {m}" for r, m in last))
    print(f"- load average (1 min): {loads[0]:.2f} at start, {loads[1]:.2f} at end")


if __name__ == "__main__":
    main()
