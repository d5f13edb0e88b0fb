"""Per-call cost of the session notebook over stdio (issue 38): two ipybox servers, one with the
notebook (default) and one with --no-notebook, driven with raw JSON-RPC (newline-delimited) and
measured paired and interleaved: rounds of N `print(1)` calls on one, then N on the other, in
alternating order, so that the machine's load falls on both alike. Prints the median round-trip
of each and their difference per round, and the load average.

Usage: python3 benches/notebook_cost.py IPYBOX_BIN [ROUNDS=3] [N=450]
"""
import json, os, statistics, subprocess, sys, tempfile, time

bin_, rounds, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3, int(sys.argv[3]) if len(sys.argv) > 3 else 450


class Server:
    def __init__(self, flags):
        self.ws = tempfile.mkdtemp(prefix="nbcost-")
        self.p = subprocess.Popen([bin_, "--workspace", self.ws, "--log-level", "error", *flags],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.id = 0
        self.req("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.call("print(1)")

    def send(self, msg):
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def req(self, method, params):
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        while True:
            msg = json.loads(self.p.stdout.readline())
            if msg.get("id") == self.id:
                return msg

    def call(self, code):
        r = self.req("tools/call", {"name": "execute_ipython_cell", "arguments": {"code": code}})
        assert r["result"]["content"][0]["text"] == "1", r

    def round(self):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            self.call("print(1)")
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


on, off = Server([]), Server(["--no-notebook"])
diffs = []
for r in range(rounds):
    order = [(on, "on"), (off, "off")] if r % 2 == 0 else [(off, "off"), (on, "on")]
    got = {name: s.round() for s, name in order}
    diffs.append(got["on"] - got["off"])
    print(f"round {r + 1}: notebook on {got['on']:.3f} ms, off {got['off']:.3f} ms, +{diffs[-1]:.3f} ms; load {os.getloadavg()}", flush=True)
print(f"median difference over {rounds} rounds of {n}: {statistics.median(diffs):+.3f} ms per call")
on.close(); off.close()
