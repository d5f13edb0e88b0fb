"""Drives trampoline kernels (kernel_main.py) with jupyter_client's BlockingKernelClient.

  python driver.py basic [rewire|reinit] [fifo|sigstop]
  python driver.py mem MB NFORKS            (MB of namespace: half numpy, half small dicts)
  python driver.py bench MB REPS [rewire|reinit]
"""
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = f"{HERE}/run"
PY = f"{HERE}/venv/bin/python"


def fresh_run():
    shutil.rmtree(RUN, ignore_errors=True)
    os.makedirs(RUN)


def conn_file(name):
    fn = f"{RUN}/{name}.json"
    write_connection_file(fn, transport="ipc", ip=f"{RUN}/{name}", key=secrets.token_hex(16).encode())
    return fn


def client(fn):
    c = BlockingKernelClient()
    c.load_connection_file(fn)
    c.start_channels()
    return c


def run(c, code, timeout=120):
    out = []

    def hook(msg):
        t = msg["msg_type"]
        if t == "stream":
            out.append(msg["content"]["text"])
        elif t == "execute_result":
            out.append(msg["content"]["data"]["text/plain"])
        elif t == "error":
            out.append("ERR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])

    r = c.execute_interactive(code, timeout=timeout, output_hook=hook)
    return r["content"]["status"], "".join(out).strip()


def start_kernel(name="k0"):
    fn = conn_file(name)
    env = dict(os.environ, SPIKE_RUN=RUN)
    p = subprocess.Popen(
        ["nice", PY, f"{HERE}/kernel_main.py", "-f", fn, "--IPKernelApp.quiet=True",
         "--HistoryManager.enabled=False"],
        env=env, stdout=open(f"{RUN}/{name}.out", "w"), stderr=subprocess.STDOUT)
    time.sleep(1.0)  # jupyter_client's wait_for_ready says "died" if the heartbeat is not up yet
    c = client(fn)
    for _ in range(20):
        try:
            c.wait_for_ready(timeout=60)
            break
        except RuntimeError:
            assert p.poll() is None, "kernel died"
            time.sleep(0.5)
    return p, c


def fork(c, name, mode="rewire", freeze="fifo"):
    st, out = run(c, f"__import__('spikefork').request_fork({name!r}, {mode!r}, {freeze!r})")
    assert st == "ok", out
    t0 = time.time()
    while not os.path.exists(f"{RUN}/{name}.forked"):
        time.sleep(0.0005)
        if time.time() - t0 > 30:
            raise TimeoutError("no fork")
    time.sleep(0.001)
    info = json.load(open(f"{RUN}/{name}.forked"))
    return info


def activate(name, pid=None, freeze="fifo"):
    """Makes frozen fork NAME live on a new connection file; returns (client, ms to first reply)."""
    fn = conn_file(name + "-live")
    t0 = time.perf_counter()
    if freeze == "sigstop":
        os.kill(pid, signal.SIGCONT)
    while not os.path.exists(f"{RUN}/{name}.fifo"):
        time.sleep(0.0002)
    with open(f"{RUN}/{name}.fifo", "w") as f:
        f.write(fn)
    while not os.path.exists(f"{RUN}/{name}.ready"):  # sockets bound: connect now (zmq's
        time.sleep(0.0002)                            # reconnect interval is 100 ms)
    t_ready = time.perf_counter()
    c = client(fn)
    st, out = run(c, "1+1", timeout=60)
    ms = (time.perf_counter() - t0) * 1e3
    assert st == "ok" and out == "2", (st, out)
    tj = json.load(open(f"{RUN}/{name}.ready"))
    inner = tj["activate_to_ready_ms"]
    print(f"  [{name}] child activate->ready {inner:.1f} ms (cpu {tj['cpu_ms']:.0f} ms, {tj['minflt']} minor faults) (host saw ready at "
          f"{(t_ready - t0) * 1e3:.1f} ms), connect+1+1 {(time.perf_counter() - t_ready) * 1e3:.1f} ms")
    return c, ms


def pss_kb(pid):
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1])


def priv_kb(pid):
    v = 0
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            v += int(line.split()[1])
    return v


def rss_kb(pid):
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Rss:"):
            return int(line.split()[1])


def basic(mode="rewire", freeze="fifo"):
    fresh_run()
    p, c = start_kernel()
    print(run(c, "import os, threading; x = [1, 2, 3]; y = 'before'; os.getpid()"))
    print(run(c, f"f = open({os.path.join(HERE, 'run', 'userfile')!r}, 'w'); f.fileno()"))
    info = fork(c, "f1", mode, freeze)
    print("forked", info)
    print("parent after fork:", run(c, "x.append(4); del y; x, 'y' in dir()"))
    time.sleep(0.2)
    st = open(f"/proc/{info['pid']}/stat").read().split()[2]
    print("frozen child state:", st, "threads:", os.listdir(f"/proc/{info['pid']}/task"))
    c2, ms = activate("f1", info["pid"], freeze)
    print(f"child live, first reply {ms:.1f} ms")
    print("child:", run(c2, "x, y, os.getpid(), os.getppid()"))
    print("child threads:", run(c2, "sorted(t.name for t in threading.enumerate())"))
    print("child print/stderr/fd1:", run(c2, "import sys; print('out'); print('err', file=sys.stderr); os.write(1, b'fd1\\n'); x.append(5)"))
    print("fds parent/child:", len(os.listdir(f"/proc/{p.pid}/fd")) if False else run(c, "len(os.listdir('/proc/self/fd'))")[1],
          run(c2, "len(os.listdir('/proc/self/fd'))")[1])
    print("parent unaffected:", run(c, "x, sorted(t.name for t in threading.enumerate())"))
    print("user file still usable in child:", run(c2, "os.readlink(f'/proc/self/fd/{f.fileno()}')"), run(c2, "f.write('child\\n'); f.flush(); f.closed"))
    print("child async cell:", run(c2, "import asyncio; await asyncio.sleep(0.01); 'awaited'"))
    print("child display:", run(c2, "from IPython.display import display; display('shown'); x"))
    print("child input exec count:", c2.execute_interactive("x", timeout=10)["content"]["execution_count"])
    # fork of a fork (the child forks again), then interrupt/shutdown checks
    info2 = fork(c2, "f2", mode, freeze)
    c3, ms3 = activate("f2", info2["pid"], freeze)
    print(f"grandchild first reply {ms3:.1f} ms:", run(c3, "x, len(__import__('inspect').stack())"))
    print("parent still:", run(c, "x"), "child still:", run(c2, "x"))
    print("fds parent/child/grandchild:", [run(cc, "len(os.listdir('/proc/self/fd'))")[1] for cc in (c, c2, c3)])
    # interrupt the live child with SIGINT during a sleep
    c2.execute("import time; time.sleep(30)")
    time.sleep(0.5)
    os.kill(info["pid"], signal.SIGINT)
    r = c2.get_shell_msg(timeout=10)
    print("child interrupted:", r["content"]["status"], r["content"].get("ename"))
    c3.shutdown()
    time.sleep(0.5)
    print("grandchild after shutdown_request alive?", os.path.exists(f"/proc/{info2['pid']}") and
          open(f"/proc/{info2['pid']}/stat").read().split()[2])
    for pid in (info["pid"], info2["pid"]):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    c.shutdown()
    p.wait(10)
    print("parent exit", p.returncode)


def fill(c, mb):
    # half numpy, half small dicts (2M dicts ~ 500 MB)
    ndicts = int(mb * 1e6 / 2 / 250)
    code = (f"import numpy as np; a = np.random.rand({int(mb * 1e6 / 2 / 8)}); "
            f"d = [{{'i': i, 'v': float(i)}} for i in range({ndicts})]; len(d)")
    if os.environ.get("FILL_TRACKED") == "1":
        # dicts holding only atomic values are untracked by CPython's GC; these are tracked
        code = code.replace("'v': float(i)", "'v': [i]")
    return run(c, code, timeout=600)


def mem(mb, n):
    fresh_run()
    p, c = start_kernel()
    try:
        _mem(p, c, mb, n)
    finally:
        for f in os.listdir(RUN):
            if f.endswith(".forked"):
                try:
                    os.kill(json.load(open(f"{RUN}/{f}"))["pid"], 9)
                except (ProcessLookupError, ValueError):
                    pass
        p.kill()


def _mem(p, c, mb, n):
    print("fill", fill(c, mb))
    kpid = p.pid
    time.sleep(0.5)
    kpid = int(run(c, "os.getpid()" if False else "__import__('os').getpid()")[1])
    pss_before = pss_kb(kpid)
    print(f"kernel pid {kpid} RSS {rss_kb(kpid)/1024:.0f} MB PSS {pss_before/1024:.0f} MB")
    pids, fms = [], []
    for i in range(n):
        info = fork(c, f"m{i}")
        pids.append(info["pid"])
        fms.append(info["fork_ms"])
        # the parent keeps working between cells (each cell dirties a little)
        run(c, "a[:1000] += 1")
    time.sleep(0.5)
    pss = [pss_kb(x) for x in pids]
    print("fork_ms", [round(x, 1) for x in fms])
    print("frozen private (USS) MB each", [round(priv_kb(x) / 1024, 1) for x in pids])
    tot0 = sum(pss) + pss_kb(kpid)
    print(f"total PSS kernel+{n} frozen forks {tot0/1024:.0f} MB (kernel alone before: {pss_before/1024:.0f} MB)")
    print("frozen PSS MB each", [round(x / 1024, 1) for x in pss], "sum", round(sum(pss) / 1024), "parent PSS",
          round(pss_kb(kpid) / 1024))
    # activate one, have it change 10 MB, measure
    c2, ms = activate("m0", pids[0])
    run(c2, "a[:1_250_000] += 1")
    time.sleep(0.2)
    print(f"activated m0 first reply {ms:.1f} ms; its USS after writing 10 MB {priv_kb(pids[0])/1024:.1f} MB")
    t = time.perf_counter()
    run(c2, "import gc; gc.collect()")
    print(f"m0 gc.collect() {(time.perf_counter()-t)*1e3:.0f} ms; USS after {priv_kb(pids[0])/1024:.1f} MB")
    t = time.perf_counter()
    run(c, "import gc; gc.collect()")
    time.sleep(0.2)
    print(f"PARENT gc.collect() {(time.perf_counter()-t)*1e3:.0f} ms; frozen USS after:",
          [round(priv_kb(x) / 1024, 1) for x in pids[1:]])
    tot = sum(pss_kb(x) for x in pids) + pss_kb(kpid)
    print(f"total PSS kernel+{n} forks {tot/1024:.0f} MB")
    for x in pids:
        os.kill(x, 9)
    c.shutdown()
    p.wait(30)


def bench(mb, reps, mode="rewire"):
    fresh_run()
    p, c = start_kernel()
    if mb:
        print("fill", fill(c, mb))
    # round trip cost without/with fork
    def rt():
        t = time.perf_counter()
        run(c, "print(1)")
        return (time.perf_counter() - t) * 1e3
    base = [rt() for _ in range(20)]
    fms, ams, cyc, after, b2b = [], [], [], [], []
    b2b_base = []
    for _ in range(10):
        t = time.perf_counter()
        run(c, "pass")
        run(c, "print(1)")
        b2b_base.append((time.perf_counter() - t) * 1e3)
    pids = []
    for i in range(reps):
        t = time.perf_counter()
        info = fork(c, f"b{i}", mode)
        cyc.append((time.perf_counter() - t) * 1e3)  # cell with fork, incl. driver polling
        fms.append(info["fork_ms"])
        pids.append(info["pid"])
        time.sleep(0.1)
        after.append(rt())  # a print(1) 100 ms after a state was kept
        t = time.perf_counter()
        run(c, f"__import__('spikefork').request_fork('bb{i}')")
        run(c, "print(1)")  # back to back: fork cell then print(1)
        b2b.append((time.perf_counter() - t) * 1e3)
        while not os.path.exists(f"{RUN}/bb{i}.forked"):
            time.sleep(0.001)
        time.sleep(0.002)
        os.kill(json.load(open(f"{RUN}/bb{i}.forked"))["pid"], 9)
        c2, ms = activate(f"b{i}", info["pid"])
        ams.append(ms)
        c2.stop_channels()
        os.kill(info["pid"], 9)
    med = statistics.median
    print(f"mode={mode} MB={mb}: fork_ms p50 {med(fms):.1f} max {max(fms):.1f}; "
          f"activate->first reply p50 {med(ams):.1f} max {max(ams):.1f} ms; "
          f"print(1) rt p50 {med(base):.1f} ms, 100 ms after a fork {med(after):.1f} ms; "
          f"two cells back to back {med(b2b_base):.1f} ms, fork cell + print(1) {med(b2b):.1f} ms")
    c.shutdown()
    p.wait(30)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "basic":
        basic(*args)
    elif cmd == "mem":
        mem(int(args[0]), int(args[1]))
    elif cmd == "bench":
        bench(int(args[0]), int(args[1]), *(args[2:]))


def keep():
    """A frozen copy that stays: each activation forks a new live kernel from it; the parent
    kernel is killed before the last activation (the frozen copy is then an orphan)."""
    fresh_run()
    p, c = start_kernel()
    kpid = int(run(c, "import os; x = ['A']; os.getpid()")[1])
    info = fork(c, "s", freeze="keep")
    run(c, "x.append('parent-later')")
    lives = []
    for i in range(3):
        if i == 2:
            c.stop_channels()
            os.kill(kpid, 9)
            time.sleep(0.3)
            print("parent kernel killed; frozen copy ppid now",
                  open(f"/proc/{info['pid']}/stat").read().split()[3])
        if os.path.exists(f"{RUN}/s.ready"):
            os.unlink(f"{RUN}/s.ready")
        c2, ms = activate("s")
        lpid = json.load(open(f"{RUN}/s.ready"))["pid"]
        print(f"activation {i}: live pid {lpid}, first reply {ms:.1f} ms:", run(c2, f"x.append('live{i}'); x"))
        lives.append((c2, lpid))
    print("each live kept its own:", [run(cc, "x")[1] for cc, _ in lives])
    print("frozen copy still frozen:", open(f"/proc/{info['pid']}/stat").read().split()[2],
          "threads", len(os.listdir(f"/proc/{info['pid']}/task")))
    for cc, lpid in lives:
        os.kill(lpid, 9)
    os.kill(info["pid"], 9)


if __name__ == "__main__" and sys.argv[1] == "keep":
    keep()
