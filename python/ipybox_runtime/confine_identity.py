"""Who a confined kernel is: its uid and gid (when ipybox runs as root, a session's own, from
``--session-uids``), no supplementary groups, no capabilities, ``no_new_privs``, and the seccomp
filter ipybox built for it (host side: ``src/confine/identity.rs``, ``src/confine/seccomp.rs``).

:func:`confine` runs before any code but ipybox's: in a forked kernel in its namespace's pid 1
(``confine_child.become_init``, before it forks the kernel), in a kernel started in bubblewrap as
the first statement of the launcher. Every step is checked; a failure ends the kernel's start.

Standard library and ctypes only. Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

__all__ = ["confine", "load_seccomp", "become"]

PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class IdentityError(OSError):
    """A step of the kernel's identity failed; the kernel must not start."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise IdentityError(e, f"{what}: {os.strerror(e)}")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def load_seccomp(path: str) -> None:
    """Loads every program in ``path`` (a 4-byte instruction count, then the instructions; see
    ``seccomp.rs``) for this thread and what it starts. Needs ``no_new_privs``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise IdentityError(e.errno, f"cannot read the seccomp filter {path}: {e.strerror}") from None
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise IdentityError(errno.EINVAL, f"truncated seccomp filter {path}")
        (count,) = struct.unpack_from("=I", data, offset)
        offset += 4
        end = offset + 8 * count
        if count == 0 or count > 4096 or end > len(data):
            raise IdentityError(errno.EINVAL, f"bad seccomp filter {path}")
        insns = (_SockFilter * count).from_buffer_copy(data[offset:end])
        offset = end
        prog = _SockFprog(count, ctypes.cast(insns, ctypes.POINTER(_SockFilter)))
        _check(
            _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
            f"loading the seccomp filter {path}",
        )


def become(uid: int | None, gid: int | None) -> None:
    """Drops the capability bounding and ambient sets (while ``CAP_SETPCAP`` is there), switches
    to ``uid``/``gid`` with no supplementary groups (if given: needs ``CAP_SETUID``/``CAP_SETGID``),
    drops every capability left and sets ``no_new_privs``; checks ``/proc/self/status``."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    dropped = False
    for cap in range(last + 1):
        # Without CAP_SETPCAP (bubblewrap dropped every capability already) this fails with
        # EPERM, and there is nothing in the bounding set to drop.
        dropped = _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 or dropped
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if uid is not None and gid is not None:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as e:
            raise IdentityError(e.errno, f"cannot become uid {uid}, gid {gid}: {e.strerror}") from None
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    fields = ("CapPrm", "CapEff", "CapAmb", "CapInh") + (("CapBnd",) if dropped else ())
    for field in fields:
        if int(status.get(field, "0").strip() or "0", 16) != 0:
            raise IdentityError(errno.EPERM, f"capabilities left: {field} {status[field].strip()}")
    if uid is not None:
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
            raise IdentityError(errno.EPERM, f"not uid {uid}, gid {gid} alone after switching")


def confine(plan: dict) -> None:
    """``plan``: ``{"identity": {"uid": .., "gid": ..} or None, "seccomp": path}``: becomes that
    identity (:func:`become`), then loads the filter. Raises :class:`IdentityError`."""
    ident = plan.get("identity") or {}
    uid, gid = ident.get("uid"), ident.get("gid")
    if (uid is None) != (gid is None):
        raise IdentityError(errno.EINVAL, "an identity needs both uid and gid")
    become(None if uid is None else int(uid), None if gid is None else int(gid))
    path = plan.get("seccomp")
    if path:
        load_seccomp(str(path))


def confine_or_exit(plan: dict) -> None:
    """:func:`confine`, or a message on stderr and exit status 70 (a kernel launcher's first
    statement)."""
    try:
        confine(plan)
    except BaseException as e:
        try:
            os.write(2, f"ipybox: cannot confine the kernel: {e}\n".encode(errors="replace"))
        finally:
            os._exit(70)
