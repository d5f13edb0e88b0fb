"""The kernel factory's template process (host side: ``src/kernel/factory/``): it imports what
every kernel needs once, then forks a new kernel per request from the host.

The host starts it like a kernel, with the kernel environment, the workspace as working directory
and, under ``--sandbox``, inside the sandbox wrapper, so every kernel it forks is confined exactly
as a kernel started on its own::

    python -c "from ipybox_runtime.factory import main; main()" SOCKET TOKEN [MODULES]

After its imports it connects to the host's factory socket ``SOCKET`` and says
``ipybox-factory TOKEN``. That connection is its request channel (JSON lines) and its lifeline: on
EOF (the host is gone) it kills the kernels it forked that still run, and exits.

    host:     {"op": "fork", "id": ID, "argv": [kernel app arguments], "cwd": DIR}
              (a template shared by several executors also gets "env": {the kernel's
              environment} and, for confined executors, "confine": PLAN: the child confines
              itself first, see ``confine_child`` and ``_become_confined_kernel``)
              {"op": "kill", "id": ID}                     (a kernel the host gave up on before
                                                            it connected, with its process group,
                                                            if not reaped yet)
    template: {"op": "forked", "id": ID, "pid": PID}      (PID in the template's pid namespace)
              {"op": "preloading", "module": M} ... {"op": "preloaded", "module": M}
                                                           (around the import of one of MODULES:
                                                            a request sent meanwhile waits)
              {"op": "refused", "id": ID, "reason": TEXT}  (nothing was forked)
              {"op": "exit", "id": ID, "code": N}          (os.waitstatus_to_exitcode: -9 = SIGKILL)

The forked child becomes the kernel: a session and process group of its own; the environment
the template started with (the kernel environment, plus what a sandbox wrapper added; whatever the
template's imports changed is undone), the requested working directory; fresh random state; it
connects to ``SOCKET`` and says ``ipybox-factory ID``, and that connection becomes its stdin (a
thread exits the process on EOF: the host is gone or let go of the kernel) and its stderr (the
host keeps a tail for diagnostics); stdout is ``/dev/null``; every other inherited descriptor is
pointed at ``/dev/null`` (not closed: objects of the template that own one close it later). Then it runs the kernel app with the requested arguments, as a plainly launched kernel
does.

Why forking here is safe: ``fork()`` copies the calling thread only, so a lock another thread held
stays held forever in the child, and state shared with the outside (sockets, a database
connection, an event loop's selector) would be shared by two processes. The template therefore
runs no thread but its main one, no event loop (asyncio and tornado are imported, never started),
creates no zmq Context (the kernel app creates its own after the fork), opens no sqlite database
(IPython's HistoryManager only exists with a shell, and the template creates none), and holds no
socket but its channel, which the child closes. It waits in ``select()`` on that channel and a
wakeup pipe for SIGCHLD, so it holds no lock when it forks. ``_unsafe_to_fork`` checks the parts
an import could break (threads, also those of C extensions; a zmq Context; an event loop; an
IPython shell) before every fork and refuses with the reason; the host then starts that kernel
plainly and builds a new template.

The template is the only process that can tell when a forked kernel's pid (and process group id)
becomes free: when it reaps the kernel. So it never signals a kernel it has reaped. When a kernel
exits, the template sees it with ``waitid(WNOWAIT)`` (the kernel stays a zombie, its pid and group id
still its own), SIGKILLs what is left of the kernel's process group, and only then reaps it and
reports its status. The host kills a kernel through a pidfd and leaves its group to this.

``MODULES`` (comma-separated, may be empty) are data libraries the template imports too, but only
once it is idle (no request for ``IDLE_BEFORE_PRELOAD`` seconds after connecting or after its last
request), one module at a time, each only if it is installed: a kernel's own ``import pandas``
and a snapshot restore's re-import of it are then free, and the library's pages are shared by
every kernel forked later. The first kernels are not kept waiting for them; a fork request that
comes while one of them is being imported waits for that import. BLAS libraries start their
thread pools when loaded, and a template with a thread cannot fork: the template imports them with
``OPENBLAS_NUM_THREADS=1`` (and the ``OMP``/``MKL`` equivalents), and each forked kernel sets the
OpenBLAS thread count its own environment asks for (``_blas_threads``). A module whose import
leaves a thread running anyway is reported on stderr and the template stops preloading; its forks
are then refused (``_unsafe_to_fork``) and the host builds the next template (the module stays in
the list: name such a module in ``IPYBOX_KERNEL_PRELOAD`` and the factory turns itself off).

Shared by every kernel of one template: the imported modules (copy-on-write pages; ``gc.freeze``
keeps the collector from writing to them) and Python's string-hash seed (``PYTHONHASHSEED`` is
fixed when the interpreter starts). Not shared: anything a kernel creates or changes afterwards.

Standard library only at import time; ipykernel is imported by ``main()``.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback

__all__ = ["main"]

# Imported once in the template so that a forked kernel does not import them: the kernel app and
# what its initialisation imports (tornado's queues only then; not debugpy: ``debugger_off``), and
# ipybox's own kernel-side modules. A module missing from this ipykernel version is skipped.
PRELOAD = (
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.iostream",
    "ipykernel.debugger",
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.wildcard",
    "tornado.gen",
    "tornado.locks",
    "tornado.queues",
    "tornado.platform.asyncio",
    "pdb",
    "pydoc",
    "faulthandler",
    "unicodedata",
    "encodings.idna",
    "IPython.core.logger",
    "ipybox_runtime",
    "ipybox_runtime.import_path",
    "ipybox_runtime.output_flush",
    "ipybox_runtime.working_dir",
    "ipybox_runtime.shell_guard",
    "ipybox_runtime.workspace_trust",
)

# Imported by the template at its first fork request that needs them, not at start (a template
# of one stdio session never does): a shared template's sessions (requests with "env": ``serve
# --http``) hibernate and restore (snapshots, cloudpickle) and bridge to the egress proxy; a
# confined one's forked processes confine themselves. Imported in each forked process instead,
# they were written into its private pages: a confined session's two processes outside its kernel
# held 2.9 and 2.8 MB private, 1.6 and 1.7 MB with these here (issue 40). Standard library and
# cloudpickle only, no thread.
_SESSION_PRELOAD = ("ipybox_runtime.snapshot", "ipybox_runtime.net_bridge", "cloudpickle")
_CONFINED_PRELOAD = ("ipybox_runtime.confine_child", "ipybox_runtime.confine_identity")

_HELLO = "ipybox-factory"

# Seconds without a request before the template imports the next of its ``MODULES``.
IDLE_BEFORE_PRELOAD = 0.5
# Imported with these at 1, so that their BLAS starts no thread in the template.
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def main() -> None:
    """Runs the template: ``sys.argv`` is ``[-c, SOCKET, TOKEN, MODULES]`` (``MODULES`` optional)."""
    socket_path, token = sys.argv[1], sys.argv[2]
    modules = [m for m in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if m]
    # The environment as started, before any import can change it: what every kernel gets.
    env = dict(os.environ)
    __import__("ipybox_runtime.debugger_off", fromlist=["install"]).install()
    from ipykernel import kernelapp  # noqa: F401  (a template without it is no use)

    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as e:  # another ipykernel version: the kernel imports what it needs
            print(f"ipybox kernel factory: not preloading {name}: {e}", file=sys.stderr)
    __import__("ipybox_runtime.output_flush", fromlist=["install"]).install()
    _warm_up()
    gc.collect()
    gc.freeze()

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so the wakeup fd is used
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    chan.connect(socket_path)
    chan.sendall(f"{_HELLO} {token}\n".encode())
    _Template(chan, (wake_r, wake_w), socket_path, env, modules).serve()


def _warm_up() -> None:
    """Does once, in the template, work every kernel's start would repeat: IPython's input
    transformers compile their regular expressions on first use (``re``'s cache), and every
    kernel's ``exec_lines`` go through them. Compiled here, forked kernels find them compiled:
    a kernel's start (fork to ready) took ~30% less (170 -> 120 ms median under load 4-5, issue
    40). Pure Python: no thread, no descriptor is left behind."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        TransformerManager().transform_cell("x = 1\n%time y = x\n!true\nx?\n")
    except Exception as e:  # another IPython: kernels compile what they need
        print(f"ipybox kernel factory: no warm-up: {e}", file=sys.stderr)


class _Template:
    def __init__(self, chan: socket.socket, wake: tuple[int, int], socket_path: str, env: dict, modules: list[str]):
        self.chan = chan
        # Data libraries still to import once idle (see the module docstring).
        self.preload = list(modules)
        self.wake = wake
        self.socket_path = socket_path
        self.env = env
        # pid -> request id of every kernel forked and not reaped yet: only these pids (and
        # process group ids) are certainly still the kernels'.
        self.children: dict[int, str] = {}

    def send(self, msg: dict) -> None:
        try:
            self.chan.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass  # the host is gone: the next recv sees EOF

    def serve(self) -> None:
        buf = b""
        while True:
            timeout = IDLE_BEFORE_PRELOAD if self.preload else None
            ready, _, _ = select.select([self.chan, self.wake[0]], [], [], timeout)
            if not ready:
                self.preload_next()
                continue
            if self.wake[0] in ready:
                try:
                    while os.read(self.wake[0], 4096):
                        pass
                except BlockingIOError:
                    pass
                self.reap()
            if self.chan in ready:
                try:
                    data = self.chan.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.host_gone()
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        req = json.loads(line)
                    except ValueError:
                        print(f"ipybox kernel factory: unreadable request {line[:200]!r}", file=sys.stderr)
                        continue
                    self.handle(req)

    def preload_next(self) -> None:
        """Imports the next module of ``MODULES``, if installed (idle time only)."""
        import importlib.util

        name = self.preload.pop(0)
        try:
            if importlib.util.find_spec(name) is None:
                return
        except (ImportError, ValueError):
            return
        # The host then waits longer for the answer to a fork request sent meanwhile.
        self.send({"op": "preloading", "module": name})
        saved = {k: os.environ.get(k) for k in _BLAS_THREAD_VARS}
        os.environ.update({k: "1" for k in _BLAS_THREAD_VARS})
        try:
            __import__(name)
        except Exception as e:  # the kernel imports it itself, and sees the error then
            print(f"ipybox kernel factory: not preloading {name}: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.send({"op": "preloaded", "module": name})
        reason = _unsafe_to_fork()
        if reason is not None:
            print(f"ipybox kernel factory: importing {name} left the template unable to fork ({reason}); preloading stops", file=sys.stderr)
            self.preload = []
        gc.collect()
        gc.freeze()

    def reap(self) -> None:
        while True:
            # Look without reaping: the kernel stays a zombie, so its pid and process group id
            # cannot have gone to another process yet.
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            kid = self.children.pop(pid, None)
            if kid is not None:
                # What the kernel started and left in its group dies with it, now, while the
                # group id is certainly its own.
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                continue
            if kid is not None:
                self.send({"op": "exit", "id": kid, "code": os.waitstatus_to_exitcode(status)})

    def host_gone(self) -> None:
        # ipybox is gone: so must its kernels be (their own lifelines would notice too, unless
        # their code holds the GIL).
        for pid in self.children:
            _kill(pid)
        os._exit(0)

    def handle(self, req: dict) -> None:
        if not isinstance(req, dict):
            return
        kid = str(req.get("id", ""))
        if req.get("op") == "kill":
            # Only a kernel not reaped yet: a reaped one's group was killed when it was reaped,
            # and its pid may be another process's by now.
            for pid, child in self.children.items():
                if child == kid:
                    _kill(pid)
            return
        if req.get("op") != "fork":
            return
        if "env" in req:
            _import_once(_SESSION_PRELOAD)
        if req.get("confine"):
            _import_once(_CONFINED_PRELOAD)
        reason = _unsafe_to_fork()
        if reason is not None:
            self.send({"op": "refused", "id": kid, "reason": reason})
            return
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            self.send({"op": "refused", "id": kid, "reason": f"fork failed: {e}"})
            return
        if pid == 0:
            if req.get("confine"):
                _become_confined_kernel(self, req)  # never returns
            _become_kernel(self, req)  # never returns
        self.children[pid] = kid
        self.send({"op": "forked", "id": kid, "pid": pid})


_tried: set[str] = set()


def _import_once(modules: tuple[str, ...]) -> None:
    """Imports those of ``modules`` not tried yet, into the pages every later fork shares."""
    missing = [m for m in modules if m not in _tried]
    if not missing:
        return
    _tried.update(missing)
    for name in missing:
        try:
            __import__(name)
        except Exception as e:  # each forked process imports what it needs, and sees the error
            print(f"ipybox kernel factory: not preloading {name}: {type(e).__name__}: {e}", file=sys.stderr)
    gc.collect()
    gc.freeze()


def _kill(pid: int) -> None:
    """SIGKILL to a forked kernel's process group (and to it, if it has not called setsid yet).
    Only for a kernel not reaped yet (in ``children``): its pid and group id are its own."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _unsafe_to_fork() -> str | None:
    """Why forking now would not be safe, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads run in the template"
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        tasks = 1
    if tasks != 1:
        return f"{tasks} threads run in the template"
    zmq = sys.modules.get("zmq")
    if zmq is not None and getattr(zmq.Context, "_instance", None) is not None:
        return "a zmq Context exists in the template"
    aio = sys.modules.get("asyncio")
    if aio is not None:
        if aio.events._get_running_loop() is not None:
            return "an asyncio event loop runs in the template"
        policy = getattr(aio.events, "_event_loop_policy", None)
        local = getattr(policy, "_local", None)
        if getattr(local, "_loop", None) is not None:
            return "an asyncio event loop exists in the template"
    shell = sys.modules.get("IPython.core.interactiveshell")
    if shell is not None and shell.InteractiveShell.initialized():
        return "an IPython shell (with its history database) exists in the template"
    return None


def _become_kernel(template: _Template, req: dict) -> None:
    """The forked child: becomes the kernel and never returns."""
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        template.chan.close()
        for fd in template.wake:
            os.close(fd)
        os.environ.clear()
        os.environ.update(_kernel_env(template, req))
        os.chdir(req["cwd"])
        _fresh_state()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30)
        conn.connect(template.socket_path)
        conn.sendall(f"{_HELLO} {req['id']}\n".encode())
        conn.settimeout(None)
        fd = conn.detach()
    except BaseException:
        _died()
    _run_kernel_app(req, fd)


def _died() -> None:
    """A forked child failed before its kernel ran: the traceback goes to its stderr (the
    host's tail of it), and it exits 70. Never returns."""
    try:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(70)


def _run_kernel_app(req: dict, fd: int) -> None:
    """Runs the kernel app in this forked child, its connection to ipybox `fd` as stdin and
    stderr, stdout discarded; exits with the app's status. Never returns."""
    code = 0
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 0)
        os.dup2(null, 1)
        os.dup2(fd, 2)
        for extra in (fd, null):
            if extra > 2:
                os.close(extra)
        _close_inherited()
        sys.argv = ["-c", *req["argv"]]
        threading.Thread(target=_watch_host, name="ipybox-parent-watch", daemon=True).start()
        from ipykernel import kernelapp

        try:
            kernelapp.launch_new_instance()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        _died()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _kernel_env(template: _Template, req: dict) -> dict:
    """The kernel's environment: the request's (a template shared by several executors gets each
    kernel's own), else the one the template started with."""
    env = req.get("env")
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    return template.env


def _become_confined_kernel(template: _Template, req: dict) -> None:
    """The forked child of a template shared by confined executors (``req["confine"]``, see
    ``confine_child``). This process connects to ``SOCKET`` and greets as any forked kernel does
    (its pid is the one the host learns and its process group the one the host kills), then
    makes the kernel's namespaces and view, forks the namespace's pid 1, which forks the kernel
    (pid 2, no capabilities), and stays outside the namespace: it waits for pid 1 and ends as
    the kernel ended. The connection is made before the view changes (the factory socket is not
    in the kernel's view). Never returns."""
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        template.chan.close()
        for fd in template.wake:
            os.close(fd)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30)
        conn.connect(template.socket_path)
        conn.sendall(f"{_HELLO} {req['id']}\n".encode())
        if req.get("hold"):
            # The host places this process in the session's cgroup (its limits), then says go
            # on: what it forks from here on (pid 1, the kernel) is in that cgroup.
            if conn.recv(1) != b"\x01":
                _died()
        _set_rlimits(req.get("rlimits"))
        conn.settimeout(None)
        # What goes wrong from here on is in the host's tail of this kernel's stderr.
        os.dup2(conn.fileno(), 2)
        from ipybox_runtime import confine_child

        confine_child.enter(req["confine"])
        report_r, report_w = os.pipe()
        init = confine_child.become_init(report_w, req["confine"])
    except BaseException:
        _died()
    if init == 0:
        os.close(report_r)
        _run_confined_kernel(template, req, conn)  # never returns
    try:
        os.close(report_w)
        conn.close()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        confine_child.drop_capabilities()
    except BaseException:
        pass  # outside the kernel's namespaces: nothing the kernel can reach
    confine_child.exit_like(report_r, init)


def _set_rlimits(limits: dict | None) -> None:
    """Without cgroups: the session's limits as resource limits of this process and what it
    forks (0: not set)."""
    if not limits:
        return
    import resource

    for name, value in (("RLIMIT_AS", limits.get("address_space")), ("RLIMIT_NPROC", limits.get("nproc"))):
        if value:
            resource.setrlimit(getattr(resource, name), (value, value))


def _run_confined_kernel(template: _Template, req: dict, conn: socket.socket) -> None:
    """The confined kernel process (pid 2 of its namespace): what ``_become_kernel`` does once
    its connection is made. Never returns."""
    try:
        os.environ.clear()
        os.environ.update(_kernel_env(template, req))
        os.chdir(req["cwd"])
        _fresh_state()
        fd = conn.detach()
    except BaseException:
        _died()
    _run_kernel_app(req, fd)


def _fresh_state() -> None:
    """What a new interpreter would have but a fork copies: random state, cached temp dir, TZ."""
    import random

    random.seed()  # os.urandom; Python also reseeds its global instance after fork
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None
    import time

    time.tzset()
    _blas_threads()


def _blas_threads() -> None:
    """Gives OpenBLAS (loaded by a preloaded numpy with one thread, see the module docstring) the
    thread count the kernel's own environment asks for, as if the kernel had loaded it."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split(None, 5)[5].strip() for line in f if "openblas" in line and len(line.split(None, 5)) == 6}
    except OSError:
        return
    if not libs:
        return
    want = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    try:
        n = int(want.split(",")[0]) if want else len(os.sched_getaffinity(0))
    except ValueError:
        n = len(os.sched_getaffinity(0))
    import ctypes

    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = getattr(lib, sym, None)
            if setter is not None:
                setter(max(1, n))
                break


def _close_inherited() -> None:
    """Points every inherited descriptor above stderr at ``/dev/null``: the kernel keeps nothing
    of the template's. Not closed, because Python objects of the template may still own them (a
    file, a socket, ``random``'s urandom descriptor): their finalizers close them later, and a
    number closed now could by then belong to something of the kernel's (a zmq socket). Each
    stays taken, by ``/dev/null``, until its owner closes it."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in fds:
        if fd <= 2 or fd == null:
            continue
        try:
            os.fstat(fd)  # open? (listdir's own descriptor is closed by now)
        except OSError:
            continue
        try:
            os.dup2(null, fd, inheritable=False)
        except OSError:
            pass
    os.close(null)


def _watch_host() -> None:
    """Exits the kernel when the host closes its end of stdin (or goes away)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(0)
