"""Host memory of the session notebook over stdio (issue 38): one ipybox server at a time, with the
notebook (default) and with --no-notebook, driven with raw JSON-RPC (newline-delimited): a fixture
MCP server is registered, then CELLS cells run, half of them with a tool call, each printing 2-5 KB
(a pattern that depends on the cell). The ipybox process's RSS (VmRSS of /proc/PID/status: the
host, not the kernel) is taken after a warm-up of 40 cells and every 1000 cells, and its peak
(VmHWM) at the end; with the notebook, the size of the notebook files too.

Usage: python3 benches/notebook_memory.py IPYBOX_BIN [CELLS=4000] [MODE=both|on|off]
(run from the repository root: the fixture is tests/fixtures/mcp_fixture.py, run by
target/test-env/venv/bin/python, which has the `mcp` package).
"""
import glob, json, os, subprocess, sys, tempfile, time

bin_ = sys.argv[1]
cells = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
mode = sys.argv[3] if len(sys.argv) > 3 else "both"
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
fixture_python = os.path.join(root, "target/test-env/venv/bin/python")
fixture = os.path.join(root, "tests/fixtures/mcp_fixture.py")

EMIT = ("def emit(i, n):\n"
        "    line = ''.join(chr(97 + (i * 7 + j) % 26) for j in range(64))\n"
        "    print((line * (n // 64 + 1))[:n])\n"
        "from mcptools.fx import greet")


def size(i):
    return 2000 + (i * 7919) % 3001


def status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # MB (MiB)
    raise KeyError(key)


class Server:
    def __init__(self, flags):
        self.ws = tempfile.mkdtemp(prefix="nbmem-")
        self.p = subprocess.Popen([bin_, "--workspace", self.ws, "--log-level", "error", *flags],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.id = 0
        self.req("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        r = self.req("tools/call", {"name": "register_mcp_server", "arguments": {
            "server_name": "fx", "server_params": {"command": fixture_python, "args": [fixture, "stdio"]}}})
        assert not r["result"].get("isError"), r
        self.call(EMIT)

    def send(self, msg):
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def req(self, method, params):
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("ipybox exited")
            msg = json.loads(line)
            if msg.get("id") == self.id:
                return msg

    def call(self, code):
        r = self.req("tools/call", {"name": "execute_ipython_cell", "arguments": {"code": code}})
        assert not r["result"].get("isError"), r
        return r["result"]["content"][0]["text"] if r["result"]["content"] else ""

    def cell(self, i):
        n = size(i)
        code = f"emit({i}, {n})"
        if i % 2 == 0:
            code = f"_g = greet.run(greet.Params(name='cell {i}'))\n" + code
        text = self.call(code)
        assert len(text) >= n, (i, len(text))

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def run(flags, label):
    s = Server(flags)
    for i in range(40):
        s.cell(i)
    rss0 = status(s.p.pid, "VmRSS")
    t0 = time.time()
    line = [f"{rss0:.1f}"]
    for i in range(cells):
        s.cell(40 + i)
        if (i + 1) % 1000 == 0:
            line.append(f"{status(s.p.pid, 'VmRSS'):.1f}")
    rss1 = status(s.p.pid, "VmRSS")
    hwm = status(s.p.pid, "VmHWM")
    secs = time.time() - t0
    files = glob.glob(os.path.join(s.ws, "notebooks", "*.ipynb"))
    nb = sum(os.path.getsize(f) for f in files) / 1e6
    s.close()
    print(f"{label}: RSS {rss0:.1f} -> {rss1:.1f} MB (+{rss1 - rss0:.1f}), peak {hwm:.1f} MB; "
          f"RSS every 1000 cells: {' '.join(line)}; notebook {nb:.1f} MB in {len(files)} file(s); "
          f"{cells} cells in {secs:.0f} s; load {os.getloadavg()}", flush=True)


if mode in ("both", "on"):
    run([], "notebook on ")
if mode in ("both", "off"):
    run(["--no-notebook"], "--no-notebook")
