"""A kernel forked from the shared kernel template confines itself here, before it runs anyone's
code (host side: ``src/confine/layout.rs``, ``fork_plan``; the template: ``factory.py``).

The shared template of ``ipybox serve --http`` runs in a bubblewrap of its own that gives every
kernel's common view (an allowlist, ``src/confine/layout.rs``: the system directories and a
minimal ``/etc`` read-only on an empty, read-only root; ``$HOME``, ``/run``, ipybox's data
directory empty; the kernel environment and the workspace read-only) and can see the directory
that holds every session's runtime directory. Every path of a kernel's plan exists in that view
(the root is read-only: no mount point can be made in it). It keeps ``CAP_SYS_ADMIN`` (in bubblewrap's user namespace when
ipybox is not root) so that each kernel it forks can make a view of its own:

1. :func:`enter` (the forked process, still in the template's pid namespace): new mount, pid, IPC
   and UTS namespaces, and, when the plan says ``"net": true`` (``--session-network none`` or
   ``proxy``), a network namespace with only ``lo`` (brought up here: ``CAP_NET_ADMIN``); every mount private; an ``O_PATH`` descriptor to each directory that the
   plan shows again (taken before anything covers it); the mounts below the directories it
   covers that it does not show again detached (other sessions' work directories: nothing of
   them stays in its ``/proc/self/mountinfo``); then the plan's mounts in order: an empty
   tmpfs over each directory the kernel must not see (where runtime directories live, ``/tmp``,
   ``$HOME``, ...), an empty file over each hidden file, and the directories it may see bound back
   from their descriptors, read-only except its own ``box/`` and ``work/``; a private ``/dev``
   (its own ``devpts``, ``/dev/shm``); working directory ``/``.
2. :func:`become_init` (the first child, pid 1 of the new pid namespace): mounts a ``/proc`` of
   that namespace (``/proc/sys`` and friends read-only, as bubblewrap does), becomes the
   session's uid and gid if the plan has an ``identity``, drops every capability (bounding set,
   ambient, ``capset``), sets ``no_new_privs`` and loads the plan's ``seccomp`` filter
   (``confine_identity``), forks the kernel,
   then reaps orphans until the kernel exits, and exits with its status (every process left in
   the namespace is killed by the kernel when pid 1 ends).
3. The kernel process returns from :func:`become_init` without capabilities and runs the kernel
   app (``factory.py``).

What the kernel cannot undo: it has no capabilities, so ``umount`` and ``mount`` fail (EPERM);
in a user namespace of its own (``unshare(CLONE_NEWUSER|CLONE_NEWNS)`` works) the mounts it
inherited are locked together, so a covering tmpfs cannot be taken away (EINVAL) and what it
hides stays hidden. Its init is not dumpable (no ``/proc/1/mem``, ``cwd``, ``fd``), and nothing
outside its pid namespace (the template, other kernels) has a pid it can name.

Standard library and ctypes only. Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal

__all__ = ["enter", "become_init", "drop_capabilities"]

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

# statvfs f_flag bits and the mount flags they stand for (a read-only remount must keep them:
# in a user namespace, dropping a locked one is refused).
_KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# bubblewrap's /dev, rebuilt per kernel (the template's is shared by every kernel it forks).
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("core", "/proc/kcore"),
    ("ptmx", "pts/ptmx"),
)
# Parts of /proc that would let root change the host (sysctls, sysrq): read-only, as bubblewrap
# mounts them.
_PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class ConfineError(OSError):
    """A step of the confinement failed; the kernel must not start."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise ConfineError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def _prctl(option: int, arg: int = 0) -> int:
    return _libc.prctl(option, arg, 0, 0, 0)


def _bind(fd: int, target: str, read_only: bool) -> None:
    """Binds what ``fd`` (an ``O_PATH`` descriptor) names onto ``target``, with its submounts,
    ``nosuid`` and ``nodev`` (so a device node bound over a hidden file cannot be opened, as
    with bubblewrap's binds), read-only if asked."""
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    kept = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    for st, ms in _KEPT_FLAGS:
        if kept & st:
            flags |= ms
    _mount(None, target, None, flags)


def _make_dirs(path: str, scratch: tuple[str, ...] = ()) -> None:
    """Makes ``path`` and its missing parents: mode 1777 inside a ``scratch`` directory (the
    kernel, whatever its uid, writes there: ``~/.local`` when the interpreter is shown below
    ``$HOME``), else 0755."""
    missing = []
    p = path
    while p and p != "/" and not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
            if any(d.startswith(s.rstrip("/") + "/") for s in scratch):
                os.chmod(d, 0o1777)
        except FileExistsError:
            pass
        except OSError as e:
            raise ConfineError(e.errno, f"cannot create mount point {path}: {e.strerror}") from None


def _make_file(path: str) -> None:
    if os.path.lexists(path):
        return
    _make_dirs(os.path.dirname(path))
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def enter(plan: dict) -> None:
    """New namespaces and the plan's view for this process and everything it forks.

    ``plan["mounts"]`` is a list of ``[kind, path]`` in the order to mount them (shallower first):
    ``tmpfs`` (an empty directory), ``scratch`` (an empty directory any uid may write: mode
    1777, private to this kernel), ``file`` (an empty, read-only file), ``ro`` and ``rw`` (the
    path as the template sees it, bound back read-only or writable). ``plan["users"]``, if set,
    maps ``/etc/passwd`` and ``/etc/group`` to the session's own files (bound over the
    template's, read-only).
    """
    mounts = [(str(kind), str(path)) for kind, path in plan["mounts"]]
    for kind, path in mounts:
        if kind not in ("tmpfs", "scratch", "file", "ro", "rw") or not os.path.isabs(path):
            raise ConfineError(errno.EINVAL, f"bad mount in the confinement plan: {kind} {path!r}")
    users = {str(k): str(v) for k, v in (plan.get("users") or {}).items()}
    for target, source in users.items():
        if target not in ("/etc/passwd", "/etc/group") or not os.path.isabs(source):
            raise ConfineError(errno.EINVAL, f"bad users file in the confinement plan: {target} {source!r}")
    net = bool(plan.get("net"))
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWNET if net else 0)
    _check(_libc.unshare(flags), "unshare")
    if net:
        _loopback_up()
    # Nothing mounted here reaches the template's view, nor the other way round.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Descriptors are taken in the new mount namespace (a bind's source must be in the caller's)
    # and before any tmpfs covers them.
    opened: list[int] = []

    def open_path(path: str) -> int:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            raise ConfineError(e.errno, f"cannot open {path}: {e.strerror}") from None
        opened.append(fd)
        return fd

    # The directories made below are 0755 whatever ipybox's umask (a kernel with a uid of its
    # own must traverse them).
    umask = os.umask(0o022)
    try:
        sources = {path: open_path(path) for kind, path in mounts if kind in ("ro", "rw")}
        user_files = {target: open_path(source) for target, source in users.items()}
        null = open_path("/dev/null")
        nodes = {n: open_path(f"/dev/{n}") for n in _DEV_NODES if os.path.exists(f"/dev/{n}")}
        scratch = tuple(path for kind, path in mounts if kind == "scratch")
        _detach_hidden_mounts(
            [path for kind, path in mounts if kind in ("tmpfs", "scratch")],
            [path for kind, path in mounts if kind in ("ro", "rw")] + list(users),
        )
        for kind, path in mounts:
            if kind in ("tmpfs", "scratch"):
                _make_dirs(path, scratch)
                mode = "mode=1777" if kind == "scratch" else "mode=0755"
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, mode)
            elif kind == "file":
                _make_file(path)
                _bind(null, path, read_only=True)
            else:
                # A shown file (``--session-show``) is in the template's view already.
                if not os.path.isfile(path):
                    _make_dirs(path, scratch)
                _bind(sources[path], path, read_only=kind == "ro")
        for target, fd in user_files.items():
            _bind(fd, target, read_only=True)
        _private_dev(nodes)
    finally:
        os.umask(umask)
        for fd in opened:
            os.close(fd)
    # The old working directory may be covered now; a process's cwd would still reach it.
    os.chdir("/")


MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8


def _mount_points() -> list[str]:
    """The mount points of this process's mount namespace (``/proc/self/mountinfo``'s fifth
    field, its octal escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            if len(fields) > 4:
                raw = fields[4]
                out = bytearray()
                i = 0
                while i < len(raw):
                    if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
                        out.append(int(raw[i + 1 : i + 4], 8))
                        i += 4
                    else:
                        out.append(raw[i])
                        i += 1
                points.append(os.fsdecode(bytes(out)))
    return points


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _detach_hidden_mounts(covered: list[str], shown: list[str]) -> None:
    """Unmounts (detached) every mount below a directory the plan covers with an empty tmpfs,
    except what the plan shows again (a shown path, what is below it, or what holds it): the
    other sessions' work directories' tmpfs, mounted below the directory of runtime directories
    while this kernel's template ran, would otherwise stay in this kernel's mount table, covered
    but listed in ``/proc/self/mountinfo`` with their runtime directory's name and their uid
    (``uid=`` of their tmpfs), and their memory held by this namespace after their session
    ends. Deepest first; a mount gone with its parent is no error."""
    targets = []
    for point in _mount_points():
        if not any(_under(point, c) and point != c for c in covered):
            continue
        if any(_under(point, s) or _under(s, point) for s in shown):
            continue
        targets.append(point)
    for point in sorted(set(targets), key=lambda p: p.count("/"), reverse=True):
        if _libc.umount2(os.fsencode(point), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            e = ctypes.get_errno()
            if e not in (errno.EINVAL, errno.ENOENT):
                raise ConfineError(e, f"cannot unmount {point} (another session's mount): {os.strerror(e)}")


SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def _loopback_up() -> None:
    """Brings up ``lo`` of this process's new network namespace (as bubblewrap's
    ``--unshare-net`` does): the namespace has nothing else, and this needs ``CAP_NET_ADMIN``,
    which the template keeps for this only (dropped with every other capability before the
    kernel runs)."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("16sH22x", b"lo", 0)
            flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    except OSError as e:
        raise ConfineError(e.errno or errno.EIO, f"bringing up lo in the kernel's network namespace: {e.strerror}") from None


def _private_dev(nodes: dict[str, int]) -> None:
    """A ``/dev`` of this kernel's own: the usual device nodes, a private ``/dev/shm`` and a new
    ``devpts`` instance (the template's would show other kernels' terminals)."""
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for name, fd in nodes.items():
        path = f"/dev/{name}"
        _make_file(path)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
    for name, target in _DEV_LINKS:
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm", 0o1777)
    os.chmod("/dev/shm", 0o1777)
    os.mkdir("/dev/pts", 0o755)
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def _mount_proc() -> None:
    """A ``/proc`` of this pid namespace (call as its pid 1), its dangerous parts read-only."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in _PROC_COVERED:
        path = f"/proc/{name}"
        if not os.path.exists(path):
            continue
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            _bind(fd, path, read_only=True)
        finally:
            os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Drops every capability for good (bounding set, ambient set, then effective, permitted and
    inheritable) and sets ``no_new_privs``; checks ``/proc/self/status`` afterwards."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, f"dropping capability {cap} from the bounding set")
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status.get(field, "0").strip() or "0", 16) != 0:
            raise ConfineError(errno.EPERM, f"capabilities left after dropping them: {field} {status[field].strip()}")


def become_init(report_fd: int, plan: dict | None = None) -> int:
    """Forks into the new pid namespace. Returns in the kernel process (no capabilities, pid 2);
    the namespace's pid 1 never returns: it reaps orphans until the kernel exits, writes the
    kernel's wait status to ``report_fd`` and exits (which ends every process left in the
    namespace). The caller's process (outside the namespace) gets pid 1 back and should wait for
    it; it never returns in pid 1."""
    init = os.fork()
    if init != 0:
        return init
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _mount_proc()
        if plan is not None and ("identity" in plan or "seccomp" in plan):
            # Its uid and gid, no capabilities, no_new_privs, the seccomp filter
            # (confine_identity): inherited by the kernel forked next.
            from ipybox_runtime import confine_identity

            confine_identity.confine(plan)
        else:
            drop_capabilities()
        # Not dumpable: the kernel (same user) can neither ptrace pid 1 nor read its /proc
        # entries (memory, cwd, descriptors).
        _prctl(PR_SET_DUMPABLE, 0)
        kernel = os.fork()
    except BaseException as e:
        _init_failed(report_fd, e)
    if kernel == 0:
        os.close(report_fd)
        return 0
    _be_init(kernel, report_fd)


def _init_failed(report_fd: int, error: BaseException) -> None:
    try:
        os.write(2, f"ipybox: cannot confine the kernel: {error}\n".encode(errors="replace"))
        os.write(report_fd, b"70:exit\n")
    finally:
        os._exit(70)


def _be_init(kernel: int, report_fd: int) -> None:
    """pid 1 of the kernel's namespace: no descriptor but the report pipe, every signal that may
    be sent left to the kernel."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, report_fd)
        os.closerange(report_fd + 1, 1 << 16)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                os._exit(0)
            except InterruptedError:
                continue
            if pid == kernel:
                os.write(report_fd, f"{status}:status\n".encode())
                os._exit(0)
    except BaseException:
        os._exit(70)


def exit_like(report_fd: int, init: int) -> None:
    """In the process outside the namespace: waits for pid 1 and ends the way the kernel did
    (its exit code, or killed by its signal). Never returns."""
    try:
        while True:
            try:
                _, status = os.waitpid(init, 0)
                break
            except InterruptedError:
                continue
        report = b""
        while True:
            chunk = os.read(report_fd, 64)
            if not chunk:
                break
            report += chunk
        code = 70
        text = report.decode(errors="replace").strip()
        if text.endswith(":status"):
            code = os.waitstatus_to_exitcode(int(text.split(":", 1)[0]))
        elif text.endswith(":exit"):
            code = int(text.split(":", 1)[0])
        elif os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)
    except BaseException:
        os._exit(70)
