//! The seccomp filter of every confined kernel: system calls a Python kernel never needs, which
//! would let code in it attack the host's kernel or other processes, return `EPERM` (or
//! `ENOSYS` for `clone3`, see below). Everything else is allowed: this is a denylist of the
//! dangerous, like Docker's and systemd's defaults, not an allowlist (what a kernel's packages
//! call is open-ended).
//!
//! The filter is built here with `seccompiler` (Firecracker's crate) for the host's
//! architecture (x86_64 or aarch64) and written into the executor's runtime directory
//! ([`FILE_NAME`], read-only for the kernel); the kernel-side Python
//! (`python/ipybox_runtime/confine_identity.py`) loads it with `seccomp(2)` after
//! `no_new_privs` and before any other code runs, in both the forked and the bwrap path. A
//! filter cannot be removed, and every process the kernel starts inherits it.
//!
//! What is refused, and why (docs/http.md "Who a session's kernel is"):
//! - `ptrace`, `process_vm_readv`/`process_vm_writev`, `kcmp`: reading or steering other
//!   processes (the kernel's own init, another process of the same uid);
//! - `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`, `lookup_dcookie`: large kernel
//!   attack surfaces behind most container escapes of recent years; `io_uring` also performs
//!   operations that this filter would never see;
//! - `keyctl`, `add_key`, `request_key`: the kernel keyring is not namespaced (keys of the host
//!   and other sessions);
//! - `mount`, `umount2`, `pivot_root`, `move_mount`, `open_tree`, `fsopen`, `fsmount`,
//!   `fsconfig`, `fspick`, `mount_setattr`; `setns`; `unshare` and `clone` with a namespace
//!   flag: changing the view a session is confined to, or making a user namespace (where a
//!   process has every capability again, and reaches kernel code unprivileged users cannot);
//!   `clone3` cannot be filtered by its flags (they are in memory) and returns `ENOSYS`, so that
//!   glibc and others fall back to `clone`, which is filtered (as Docker and systemd do);
//! - `kexec_load`, `kexec_file_load`, `init_module`, `finit_module`, `delete_module`, `reboot`,
//!   `swapon`, `swapoff`, `acct`, `quotactl`, `syslog`, `iopl`, `ioperm`: administering the
//!   host;
//! - `open_by_handle_at`, `name_to_handle_at`: opening files by handle goes around the mount
//!   view (the "shocker" escape);
//! - `personality` other than the standard values (Linux, 32-bit Linux, their query): some
//!   personalities weaken address-space randomisation or map page 0;
//! - `socket` and `socketpair` of any family but those a kernel needs ([`SOCKET_FAMILIES`]),
//!   and netlink sockets of any protocol but `NETLINK_ROUTE`, return `EAFNOSUPPORT` (the answer
//!   of a kernel built without the family, which programs already handle as "not here", where
//!   `EPERM` reads as a fault): `AF_VSOCK` ignores network namespaces (it reaches the
//!   hypervisor and the host's vsock services), and the other families (`AF_PACKET`, `AF_ALG`,
//!   `AF_BLUETOOTH`, `AF_CAN`, `AF_TIPC`, `AF_RDS`, `AF_XDP`, ...) are kernel code, often
//!   loaded as a module on first use, that a Python kernel never calls.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The filter's file in an executor's runtime directory.
pub(crate) const FILE_NAME: &str = "seccomp.bpf";

/// Why the filter cannot be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SeccompError {
    #[error(
        "cannot build the seccomp filter of confined kernels: {0}\n  help: confinement supports x86_64 and aarch64 Linux"
    )]
    Build(String),
}

/// The namespace flags of `clone` and `unshare` that are refused.
const NAMESPACE_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// `personality` values a program may use: Linux, 32-bit Linux (`linux32`), with
/// `UNAME26`-less `ADDR_NO_RANDOMIZE`-less flags, and the query `0xffffffff` (Docker's list).
const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The socket families a confined kernel may open, and why each:
/// - `AF_UNIX`: the kernel's ZMQ IPC sockets, the tool socket, the egress proxy's socket (the
///   bridge), multiprocessing and zmq's own signalling pairs;
/// - `AF_INET`, `AF_INET6`: the bridge's `127.0.0.1:3128` and every client of it (pip, urllib,
///   requests), the kernel's own loopback, and the network itself under
///   `--session-network host`; `socket.getaddrinfo` opens UDP sockets of both to sort answers;
/// - `AF_NETLINK` (`NETLINK_ROUTE` only): glibc's `getaddrinfo` asks the kernel which address
///   families have addresses (`AI_ADDRCONFIG`), and `if_nameindex` lists interfaces, over it;
///   the network namespace is the kernel's own, so it lists only `lo` unless the network is the
///   host's.
pub(crate) const SOCKET_FAMILIES: [u64; 4] = [
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// The system calls refused outright.
fn refused() -> Vec<libc::c_long> {
    #[allow(unused_mut)]
    let mut calls = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_kcmp,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_lookup_dcookie,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_setns,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    calls
}

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError::Build(e.to_string()))
}

fn build(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, SeccompError> {
    let err = |e: seccompiler::BackendError| SeccompError::Build(e.to_string());
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch()?,
    )
    .map_err(err)?;
    filter.try_into().map_err(err)
}

/// A rule that matches when argument `arg` has `flag` set.
fn has_flag(arg: u8, flag: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(flag),
        flag,
    )?])
}

fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in refused() {
        rules.insert(call, Vec::new());
    }
    let namespaces = || -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        NAMESPACE_FLAGS.iter().map(|f| has_flag(0, *f)).collect()
    };
    // clone's flags are its first argument on x86_64 and aarch64 alike.
    rules.insert(libc::SYS_clone, namespaces()?);
    rules.insert(libc::SYS_unshare, namespaces()?);
    let mut not_standard = Vec::new();
    for p in PERSONALITIES {
        not_standard.push(SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            p,
        )?);
    }
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(not_standard)?]);
    Ok(rules)
}

/// `socket` and `socketpair` (domain first, protocol third on every architecture) of a family
/// not in [`SOCKET_FAMILIES`], or netlink of a protocol other than `NETLINK_ROUTE`.
fn socket_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let other_family = || -> Result<SeccompRule, seccompiler::BackendError> {
        SeccompRule::new(
            SOCKET_FAMILIES
                .iter()
                .map(|f| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f))
                .collect::<Result<Vec<_>, _>>()?,
        )
    };
    let netlink_not_route = || -> Result<SeccompRule, seccompiler::BackendError> {
        SeccompRule::new(vec![
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::AF_NETLINK as u64,
            )?,
            SeccompCondition::new(
                2,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                libc::NETLINK_ROUTE as u64,
            )?,
        ])
    };
    let mut rules = BTreeMap::new();
    for call in [libc::SYS_socket, libc::SYS_socketpair] {
        rules.insert(call, vec![other_family()?, netlink_not_route()?]);
    }
    Ok(rules)
}

/// The filter's programs in the order to load them, each as its instructions (8 bytes each, in
/// the host's byte order) after a 4-byte count: the `EPERM` program, the one that answers
/// `clone3` with `ENOSYS`, then the one that answers sockets of other families with
/// `EAFNOSUPPORT`.
pub(crate) fn program_bytes() -> Result<Vec<u8>, SeccompError> {
    let main = build(
        rules().map_err(|e| SeccompError::Build(e.to_string()))?,
        libc::EPERM,
    )?;
    let clone3 = build(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        libc::ENOSYS,
    )?;
    let sockets = build(
        socket_rules().map_err(|e| SeccompError::Build(e.to_string()))?,
        libc::EAFNOSUPPORT,
    )?;
    let mut out = Vec::new();
    for program in [main, clone3, sockets] {
        let count = u32::try_from(program.len())
            .map_err(|_| SeccompError::Build("the filter is too long".into()))?;
        out.extend(count.to_ne_bytes());
        for insn in program {
            out.extend(insn.code.to_ne_bytes());
            out.push(insn.jt);
            out.push(insn.jf);
            out.extend(insn.k.to_ne_bytes());
        }
    }
    Ok(out)
}

/// Writes the filter into `runtime_dir` ([`FILE_NAME`], readable by everyone: the kernel may
/// run as a uid of its own).
pub(crate) fn write(runtime_dir: &std::path::Path) -> Result<std::path::PathBuf, std::io::Error> {
    let bytes = program_bytes().map_err(std::io::Error::other)?;
    let path = runtime_dir.join(FILE_NAME);
    std::fs::write(&path, bytes)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_builds_for_this_host_as_three_programs() {
        let bytes = program_bytes().expect("filter");
        let first = u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        assert!(first > 40, "{first} instructions");
        let rest = &bytes[4 + first * 8..];
        let second = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let rest = &rest[4 + second * 8..];
        let third = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        assert!(third > 8, "{third} instructions");
        assert_eq!(rest.len(), 4 + third * 8);
    }
}
