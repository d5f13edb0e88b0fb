//! [bin] ipybox's own secrets out of reach of the code it runs: the bearer token
//! (`IPYBOX_TOKEN`, `--token`) and the key of session handles (`IPYBOX_SESSION_SECRET`).
//!
//! Removing a variable (`remove_var`) is not enough: `/proc/<pid>/environ` and
//! `/proc/<pid>/cmdline` show the bytes the process was started with, wherever its environment
//! and argument vector were copied since. So [`take`] reads the values, removes the variables
//! (no child inherits them), and overwrites the original strings in place through
//! `/proc/self/mem` (the region the kernel names in `/proc/self/stat`): `environ` and `cmdline`
//! no longer hold them. [`no_dumps`] then makes the process non-dumpable (`PR_SET_DUMPABLE 0`):
//! a process of the same user that is not root can no longer open its `environ`, `mem` or
//! attach with ptrace (the heap still holds the values; a root process can read them, see
//! docs/http.md).
//!
//! Not here: how tokens are checked (`http/auth.rs`), which host variables reach kernels and
//! MCP servers (`host_env`).

/// The environment variables that are ipybox's own secrets.
pub(crate) const OWN_SECRETS: [&str; 2] = ["IPYBOX_TOKEN", "IPYBOX_SESSION_SECRET"];

/// The flag whose values are secrets (`--token VALUE` or `--token=VALUE`).
#[cfg(target_os = "linux")]
const TOKEN_FLAG: &str = "--token";

/// The secrets taken from the environment.
#[derive(Default)]
pub(crate) struct OwnSecrets {
    pub(crate) token: Option<String>,
    pub(crate) session_secret: Option<String>,
}

impl std::fmt::Debug for OwnSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnSecrets")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "session_secret",
                &self.session_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Takes ipybox's secrets out of the process: returns the variables' values, removes them from
/// the environment and overwrites their original bytes, and those of `--token` values on the
/// command line. Must run before any other thread starts (it changes the environment).
pub(crate) fn take() -> OwnSecrets {
    let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let secrets = OwnSecrets {
        token: get("IPYBOX_TOKEN"),
        session_secret: get("IPYBOX_SESSION_SECRET"),
    };
    let present: Vec<&str> = OWN_SECRETS
        .into_iter()
        .filter(|name| std::env::var_os(name).is_some())
        .collect();
    for name in &present {
        // SAFETY: called at start-up, before the async runtime or any other thread of
        // ipybox's exists (the `ipybox` console script of the Python package calls the CLI
        // from its main thread before it starts any).
        unsafe { std::env::remove_var(name) };
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = scrub_original(&present) {
        tracing::warn!(
            "cannot overwrite ipybox's secrets in /proc/self/environ and cmdline: {e}; a process that can read this process's /proc entries (the same user, unconfined) may find them there"
        );
    }
    secrets
}

/// Makes this process non-dumpable: another process of the same user (not root) can no longer
/// read its memory, environment or file descriptors through `/proc` or ptrace. Children are not
/// affected (the flag is reset when they exec).
pub(crate) fn no_dumps() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_DUMPABLE takes an integer and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Overwrites, in the original environment block, the entries of `names`, and in the original
/// argument block the values of `--token`.
#[cfg(target_os = "linux")]
fn scrub_original(names: &[&str]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesized command name, from field 3 (the state) on.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| std::io::Error::other("unexpected /proc/self/stat"))?;
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // arg_start, arg_end, env_start, env_end are fields 48-51 (Linux 3.5+).
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    let (arg_start, arg_end, env_start, env_end) = (field(48), field(49), field(50), field(51));
    if env_end <= env_start || arg_end <= arg_start {
        return Err(std::io::Error::other(
            "the kernel does not say where the environment is (/proc/self/stat)",
        ));
    }
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    let read = |start: u64, end: u64| -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(end - start).map_err(std::io::Error::other)?];
        mem.read_exact_at(&mut buf, start)?;
        Ok(buf)
    };
    let env = read(env_start, env_end)?;
    let prefixes: Vec<Vec<u8>> = names.iter().map(|n| format!("{n}=").into_bytes()).collect();
    let mut env_spans = Vec::new();
    for (offset, entry) in entries(&env) {
        if prefixes.iter().any(|p| entry.starts_with(p)) {
            env_spans.push((offset, entry.len()));
        }
    }
    for (offset, len) in env_spans {
        // The whole entry, name included: NUL bytes, empty entries to a reader of environ.
        mem.write_all_at(&vec![0u8; len], env_start + offset as u64)?;
    }
    let args = read(arg_start, arg_end)?;
    let mut arg_spans = Vec::new();
    let mut value_next = false;
    for (offset, arg) in entries(&args) {
        if value_next {
            arg_spans.push((offset, arg.len()));
            value_next = false;
        } else if arg == TOKEN_FLAG.as_bytes() {
            value_next = true;
        } else if let Some(value) = arg
            .strip_prefix(TOKEN_FLAG.as_bytes())
            .and_then(|v| v.strip_prefix(b"="))
        {
            arg_spans.push((offset + arg.len() - value.len(), value.len()));
        }
    }
    for (offset, len) in arg_spans {
        // `*` keeps the command line readable (`--token ****`).
        mem.write_all_at(&vec![b'*'; len], arg_start + offset as u64)?;
    }
    Ok(())
}

/// The NUL-terminated strings of a block, with their offsets.
#[cfg(any(target_os = "linux", test))]
fn entries(block: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut offset = 0;
    block.split(|b| *b == 0).map(move |entry| {
        let at = offset;
        offset += entry.len() + 1;
        (at, entry)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_have_their_offsets() {
        let block = b"A=1\0--token\0secret\0\0B=2\0";
        let got: Vec<(usize, &[u8])> = entries(block).collect();
        assert_eq!(
            got[..5],
            [
                (0, &b"A=1"[..]),
                (4, b"--token"),
                (12, b"secret"),
                (19, b""),
                (20, b"B=2")
            ]
        );
    }
}
