"""What the workspace-trust finder costs a trusted kernel's imports (docs/benchmarks.md,
"Workspace trust (issue 50)"): a fresh interpreter imports ~160 standard-library modules with
and without ``ipybox_runtime.workspace_trust``'s finder, under ledgers of 0, 1 and 2 000 windows,
interleaved, ROUNDS times each; prints the medians in ms.

    python3 benches/trust_imports.py [ROUNDS]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

RUNTIME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
MODULES = [
    "email.mime.multipart", "http.server", "xml.etree.ElementTree", "asyncio", "decimal",
    "fractions", "statistics", "csv", "sqlite3", "unittest", "argparse", "logging.handlers",
    "zipfile", "tarfile", "difflib", "pprint", "inspect", "dataclasses", "urllib.request",
    "concurrent.futures", "multiprocessing", "shelve", "configparser", "calendar", "gettext",
    "locale", "uuid", "secrets", "hmac",
]
CODE = f"""
import sys, time
sys.path.insert(0, {os.path.abspath(RUNTIME)!r})
import ipybox_runtime, hashlib, json, stat, importlib.abc, importlib.machinery, typing
if sys.argv[1] == "on":
    from ipybox_runtime import workspace_trust
    workspace_trust.install(sys.argv[2])
t = time.perf_counter()
for m in {MODULES!r}:
    __import__(m)
print((time.perf_counter() - t) * 1000)
"""


def ledger(path: str, windows: int) -> None:
    with open(path, "w") as f:
        for i in range(windows):
            f.write(json.dumps({"v": 1, "window": f"w{i}", "start_ns": i, "roots": [f"/work/p{i % 50}"],
                                "who": "x", "pid": 1, "pid_start": 1}) + "\n")
            f.write(json.dumps({"v": 1, "close": f"w{i}", "end_ns": i + 10}) + "\n")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    with tempfile.TemporaryDirectory() as tmp:
        for windows in (0, 1, 2000):
            path = os.path.join(tmp, f"ledger-{windows}.jsonl")
            if windows:
                ledger(path, windows)
            times = {"off": [], "on": []}
            for _ in range(rounds):
                for mode in ("off", "on"):
                    out = subprocess.run([sys.executable, "-c", CODE, mode, path],
                                         capture_output=True, text=True, check=True).stdout
                    times[mode].append(float(out))
            print(f"{windows} windows: without the finder {statistics.median(times['off']):.1f} ms, "
                  f"with it {statistics.median(times['on']):.1f} ms")


if __name__ == "__main__":
    main()
