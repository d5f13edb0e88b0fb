"""Kernel-side fork machinery for the issue-55 spike (ipykernel 7.4, Linux).

Mechanism: the kernel runs under a trampoline (kernel_main.py): `app.start()` returns when the
main asyncio loop is stopped; a cell calls `request_fork(name)`; a callback waits until the shell
lock is free (the execute_reply and idle are sent), stops the main loop; the trampoline forks at
top level (no loop running, stack depth ~3). Parent: restarts its loop. Child: blocks on a FIFO
read (frozen); on activation it abandons the parent's zmq context/threads/loop and rewires the
*existing* IPKernelApp/IPythonKernel/shell onto a new context, sockets, threads and a new asyncio
loop (mode "rewire"), or clears the app/kernel singletons and re-runs IPKernelApp.initialize
(mode "reinit"), then runs the new loop.
"""
import asyncio
import gc
import json
import os
import sys
import time

RUN = os.environ.get("SPIKE_RUN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "run"))
_pending = None  # (name, mode, freeze)
_times = {}


def request_fork(name, mode="rewire", freeze="fifo"):
    """Called from a cell: fork after this cell's reply is sent."""
    global _pending
    from ipykernel.kernelapp import IPKernelApp

    k = IPKernelApp.instance().kernel
    _pending = (name, mode, freeze)
    loop = k.io_loop

    def stop_when_idle():
        if k._main_asyncio_lock.locked():
            loop.call_later(0.0005, stop_when_idle)
        else:
            loop.stop()

    loop.add_callback(stop_when_idle)
    return name


def take_pending():
    global _pending
    p, _pending = _pending, None
    return p


def do_fork(app, req):
    """At top level, loop stopped. Returns in the parent (loop to be restarted) and in the
    activated child (with a new live kernel on a new loop, to be started)."""
    name, mode, freeze = req
    sys.stdout.flush()
    sys.stderr.flush()
    old_loop = asyncio.get_event_loop()
    freeze_gc = os.environ.get("SPIKE_GCFREEZE", "1") == "1"
    if freeze_gc:
        # the child's collector would otherwise write to the header of every tracked object
        # (2M dicts: every page of them) on its first full collection: COW copies everything
        gc.freeze()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid:
        dt = (time.perf_counter() - t0) * 1e3
        if freeze_gc and os.environ.get("SPIKE_GCUNFREEZE", "1") == "1":
            gc.unfreeze()
        with open(f"{RUN}/{name}.forked.tmp", "w") as f:
            json.dump({"pid": pid, "fork_ms": dt, "parent": os.getpid()}, f)
        os.rename(f"{RUN}/{name}.forked.tmp", f"{RUN}/{name}.forked")
        # reap exited fork children without SIGCHLD games
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        return "parent"
    # ---- child: frozen until activated ----
    os.setpgid(0, 0)  # own process group: killing the parent's group spares the frozen fork
    fifo = f"{RUN}/{name}.fifo"
    os.mkfifo(fifo)
    if freeze == "sigstop":
        os.kill(os.getpid(), 19)  # SIGSTOP; host SIGCONTs, then writes the fifo
    while True:
        with open(fifo) as f:  # blocks until the host opens it for writing
            conn = f.read().strip()
        t_act = time.perf_counter()
        if freeze != "keep":
            break
        # "keep": the frozen copy stays frozen and forks the live kernel from itself (a
        # single-threaded process blocked in read(): the safest possible fork point)
        if os.fork() == 0:
            os.setpgid(0, 0)
            pass
            break
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
    t_act = time.perf_counter()
    import resource
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    if freeze != "keep":
        os.unlink(fifo)
    _become_live(app, old_loop, conn, mode)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    _times["activate_to_ready_ms"] = (time.perf_counter() - t_act) * 1e3
    _times["minflt"] = ru1.ru_minflt - ru0.ru_minflt
    _times["cpu_ms"] = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) * 1e3
    _times["pid"] = os.getpid()
    with open(f"{RUN}/{name}.ready.tmp", "w") as f:
        json.dump(_times, f)
    os.rename(f"{RUN}/{name}.ready.tmp", f"{RUN}/{name}.ready")
    return "child"


def _isolate_inherited(old_loop):
    # The old asyncio loop's epoll fd is the SAME epoll instance as the parent's: any
    # epoll_ctl from the child (remove_reader, loop.close) would edit the parent's interest
    # list. Point the fd at /dev/null so nothing can, and never close the loop object.
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, old_loop._selector._selector.fileno())
    except Exception:
        pass
    os.close(null)
    _keep.append(old_loop)


_keep = []
# fds of the kernel's own machinery (zmq contexts, loops, OutStream pipes): closed in an
# activated fork, whose copies would otherwise keep the parent's sockets/pipes open and pile up
# (~58 per generation). Their owning objects are kept alive in _keep, so nothing closes a
# reused fd number later.
_machinery = {}


def _fds():
    return {int(x) for x in os.listdir("/proc/self/fd")}


def record_machinery(before=frozenset()):
    global _machinery
    # fd -> identity: an fd closed later and reused (say by the user's open()) is not closed
    _machinery = {}
    for fd in _fds() - set(before):
        if fd > 2:
            try:
                st = os.fstat(fd)
                _machinery[fd] = (st.st_dev, st.st_ino)
            except OSError:
                pass
    with open(f"{RUN}/machinery-{os.getpid()}", "w") as f:
        f.write(repr(sorted(_machinery)))


def _close_machinery():
    for fd, ident in _machinery.items():
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == ident:
                os.close(fd)
        except OSError:
            pass


def _restore_std_fds():
    # ipykernel's OutStream dup2'd a pipe over fd 1/2 whose reader is the PARENT's watcher
    # thread: restore the original fds before making new OutStreams.
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        orig = getattr(stream, "_original_stdstream_copy", None)
        if orig is not None:
            os.dup2(orig, fd)
    sys.stdout, sys.stderr, sys.displayhook = sys.__stdout__, sys.__stderr__, sys.__displayhook__


def _new_loop():
    asyncio.events._set_running_loop(None)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from tornado.ioloop import IOLoop

    return IOLoop.current()


def _become_live(app, old_loop, conn, mode):
    _isolate_inherited(old_loop)
    # jupyter_client's Session refuses to send from a fork (Session.pid check): it is ours now
    app.session.pid = os.getpid()
    _restore_std_fds()
    _close_machinery()
    before = _fds()
    _new_loop()
    if mode == "rewire":
        _rewire(app, conn)
    else:
        _reinit(app, conn)
    record_machinery(before)


def _rewire(app, conn):
    from zmq.eventloop.zmqstream import ZMQStream

    k = app.kernel
    shell = k.shell
    _keep.append((app.context, app.heartbeat, app.iopub_thread, app.control_thread,
                  app.shell_channel_thread, k.shell_stream, k.control_stream))
    app.context = None
    app.heartbeat = None
    app.connection_file = conn
    for p in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
        setattr(app, p, 0)
    app.init_connection_file()  # loads transport/ip/key (ports 0 = pick new)
    app.init_sockets()  # new zmq.Context, sockets, control/shell-channel thread objects, iopub thread
    app.init_heartbeat()
    app.write_connection_file()
    app.init_io()  # new OutStreams on the new iopub thread, new sys.displayhook
    # the kernel's transport, as init_kernel would pass it
    shell_stream = ZMQStream(app.shell_socket, app.shell_channel_thread.io_loop)
    app.shell_channel_thread.shell_stream = shell_stream
    control_stream = ZMQStream(app.control_socket, app.control_thread.io_loop)
    debugpy_stream = ZMQStream(app.debugpy_socket, app.control_thread.io_loop)
    app.control_thread.start()
    app.shell_channel_thread.start()
    k.session = app.session
    k.shell_stream = shell_stream
    k.control_stream = control_stream
    k.debugpy_stream = debugpy_stream
    k.debug_shell_socket = app.debug_shell_socket
    k.control_thread = app.control_thread
    k.shell_channel_thread = app.shell_channel_thread
    k.iopub_thread = app.iopub_thread
    k.iopub_socket = app.iopub_socket
    k.stdin_socket = app.stdin_socket
    k._main_asyncio_lock = asyncio.Lock()
    if getattr(k, "debugger", None) is not None:
        k.debugger = None  # debugpy: not rewired in the spike (ipybox runs with it off)
    k.record_ports({n + "_port": p for n, p in app._ports.items()})
    shell.displayhook.session = app.session
    shell.displayhook.pub_socket = app.iopub_socket
    shell.display_pub.session = app.session
    shell.display_pub.pub_socket = app.iopub_socket
    app.displayhook.get_execution_count = lambda: k.execution_count
    k.start()


def _reinit(app, conn):
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelapp import IPKernelApp

    shell = app.shell
    ns = shell.user_ns
    _keep.append((app, app.kernel))
    IPKernelApp.clear_instance()
    IPythonKernel.clear_instance()
    new = IPKernelApp.instance(user_ns=ns)
    new.initialize(["-f", conn, "--IPKernelApp.quiet=True", "--HistoryManager.enabled=False"])
    # the shell singleton survived: point it at the new kernel
    shell.kernel = new.kernel
    new.kernel.start()
    _keep.append(new)
