//! The confinement a snapshot was taken in, and the rule for where it may be restored.
//!
//! Code in a sandboxed (or confined, or remote) kernel may leave an object in its namespace
//! whose unpickling runs a command (`__reduce__` returning `os.system`): restoring that snapshot
//! into a less confined kernel would run the command there. So the seal covers the confinement
//! of the kernel that wrote the snapshot ([`KernelConfinement`], recorded in `seal.json` and fed
//! to the HMAC), and a restore compares it with the confinement of the kernel it loads into
//! ([`KernelConfinement::restores_into`]):
//!
//! - **unconfined** (a local kernel as the user): restores into any kernel;
//! - **confined** (a bubblewrap of its own: `ipybox serve --http` sessions): only into a confined
//!   kernel;
//! - **sandboxed** with policy digest D (srt, `--sandbox`): only into a sandboxed kernel whose
//!   policy has the same digest (policies are not ordered: one may allow a network host the
//!   other denies, the other a directory the first cannot write);
//! - **remote** on the Jupyter server U (`--kernel-gateway`): only into kernels on U.
//!
//! "The same policy" ([`KernelConfinement::sandbox`]): the policy ipybox was given (the
//! `--sandbox-config` file, a policy set in code, or the default), with the sections it leaves
//! out taken from the default policy, serialized as JSON (keys of the known sections in a fixed
//! order, lists and keys ipybox does not interpret in the order written), plus whether the
//! workspace is isolated (HTTP sessions). What ipybox adds for each kernel start (the runtime
//! directory, the interpreter's directories, the data directory, the host's upstream proxy) is
//! not part of it: those are ipybox's own rules at per-start paths, and a snapshot's owner
//! already binds it to its workspace. Any change to the policy's content (a list reordered
//! included) makes it another policy; reformatting the file or reordering its sections does not.
//!
//! Not here: the seal itself (`seal`), what the executor runs under (`crate::executor`).

use sha2::{Digest, Sha256};

use crate::sandbox::SandboxPolicy;

/// How a kernel is confined, as far as restoring a snapshot into it is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KernelConfinement {
    /// A local kernel running as the user (no sandbox, no bubblewrap).
    Unconfined,
    /// A local kernel in a bubblewrap of its own ([`crate::confine`]; HTTP sessions).
    Confined,
    /// A local kernel in srt's sandbox under the policy with this digest
    /// ([`KernelConfinement::sandbox`]).
    Sandbox { policy: [u8; 32] },
    /// A kernel on the Jupyter server at this base URL (scheme, host, port, path; no
    /// credentials, no query).
    Remote { server: String },
}

impl KernelConfinement {
    /// The confinement of a kernel sandboxed under `policy` (the policy as given, before
    /// ipybox's per-start additions), with the workspace isolated or not.
    pub fn sandbox(policy: &SandboxPolicy, isolate_workspace: bool) -> Self {
        let mut digest = Sha256::new();
        digest.update(b"ipybox sandbox policy v1\0");
        digest.update([u8::from(isolate_workspace)]);
        // A policy always serializes (its maps hold JSON values).
        digest.update(serde_json::to_vec(&policy.clone().with_defaults()).unwrap_or_default());
        Self::Sandbox {
            policy: digest.finalize().into(),
        }
    }

    /// Whether a snapshot taken under `self` may be loaded into a kernel under `here`: `here`
    /// is at least as confined (see the module docs).
    pub fn restores_into(&self, here: &KernelConfinement) -> bool {
        matches!(self, Self::Unconfined) || self == here
    }

    /// The canonical text recorded in `seal.json` and covered by the seal.
    pub(crate) fn record(&self) -> String {
        match self {
            Self::Unconfined => "unconfined".into(),
            Self::Confined => "confined".into(),
            Self::Sandbox { policy } => format!("sandbox sha256:{}", super::seal::hex(policy)),
            Self::Remote { server } => format!("remote {server}"),
        }
    }

    /// Parses [`Self::record`]'s text; `None` if it is not one.
    pub(crate) fn parse_record(text: &str) -> Option<Self> {
        match text {
            "unconfined" => Some(Self::Unconfined),
            "confined" => Some(Self::Confined),
            _ => {
                if let Some(hex) = text.strip_prefix("sandbox sha256:") {
                    let bytes = super::seal::unhex(hex)?;
                    Some(Self::Sandbox {
                        policy: bytes.try_into().ok()?,
                    })
                } else {
                    let server = text.strip_prefix("remote ")?;
                    (!server.is_empty()).then(|| Self::Remote {
                        server: server.to_string(),
                    })
                }
            }
        }
    }

    /// The policy digest as shown to people: `sha256:` and its first 12 hex digits.
    fn short_policy(policy: &[u8; 32]) -> String {
        format!("sha256:{}", &super::seal::hex(policy)[..12])
    }

    /// How a kernel under this confinement is described in messages ("a sandboxed kernel
    /// (--sandbox, policy sha256:…)").
    pub fn describe(&self) -> String {
        match self {
            Self::Unconfined => "an unconfined kernel (no --sandbox)".into(),
            Self::Confined => {
                "a confined kernel (a bubblewrap of its own: an `ipybox serve --http` session)"
                    .into()
            }
            Self::Sandbox { policy } => format!(
                "a sandboxed kernel (--sandbox, policy {})",
                Self::short_policy(policy)
            ),
            Self::Remote { server } => {
                format!("a kernel on the Jupyter server {server} (--kernel-gateway)")
            }
        }
    }

    /// What a person does to restore a snapshot taken under this confinement.
    fn how_to_resume(&self) -> String {
        match self {
            Self::Unconfined => "it can be restored anywhere".into(),
            Self::Confined => "resume it in a confined session: start `ipybox serve --http` without --unconfined-sessions (and without --sandbox or --kernel-gateway)".into(),
            Self::Sandbox { policy } => format!(
                "resume it in the sandbox: start ipybox with --sandbox and the same policy ({}: the same --sandbox-config file, unchanged, or none if it had none) in this workspace",
                Self::short_policy(policy)
            ),
            Self::Remote { server } => format!(
                "resume it with kernels on the same Jupyter server: start ipybox with --kernel-gateway {server}"
            ),
        }
    }

    /// The error for a snapshot taken under `self` that may not be loaded under `here`.
    pub(crate) fn refusal(&self, here: &KernelConfinement) -> super::SnapshotError {
        let reason = match (self, here) {
            (Self::Sandbox { .. }, Self::Sandbox { .. }) => format!(
                "it was taken in {}, and this is {}: another policy, which may allow what that one denied",
                self.describe(),
                here.describe()
            ),
            _ => format!(
                "it was taken in {}, and this is {}: what that kernel left in it would run with less confinement here",
                self.describe(),
                here.describe()
            ),
        };
        super::SnapshotError::Confinement {
            reason,
            help: self.how_to_resume(),
        }
    }
}

impl std::fmt::Display for KernelConfinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unconfined_snapshot_crosses_confinements() {
        let default = KernelConfinement::sandbox(&SandboxPolicy::default_policy(), false);
        let other = KernelConfinement::sandbox(
            &SandboxPolicy::from_value(
                serde_json::json!({"network": {"allowedDomains": ["pypi.org"]}}),
            )
            .unwrap(),
            false,
        );
        let remote = KernelConfinement::Remote {
            server: "http://gw:8888/".into(),
        };
        let all = [
            KernelConfinement::Unconfined,
            KernelConfinement::Confined,
            default.clone(),
            other.clone(),
            remote.clone(),
        ];
        for saved in &all {
            for here in &all {
                let expected = *saved == KernelConfinement::Unconfined || saved == here;
                assert_eq!(saved.restores_into(here), expected, "{saved} -> {here}");
            }
            assert_eq!(
                KernelConfinement::parse_record(&saved.record()).as_ref(),
                Some(saved)
            );
        }
        // Sections in another order, or another layout: the same policy.
        let path = std::path::Path::new("p.json");
        let a = SandboxPolicy::parse(
            r#"{"network": {"allowedDomains": ["a.org", "b.org"]}, "filesystem": {"allowWrite": ["."]}}"#,
            path,
        )
        .unwrap();
        let b = SandboxPolicy::parse(
            r#"{"filesystem": {"allowWrite": ["."]},
                "network": {"allowedDomains": ["a.org", "b.org"]}}"#,
            path,
        )
        .unwrap();
        assert_eq!(
            KernelConfinement::sandbox(&a, false),
            KernelConfinement::sandbox(&b, false)
        );
        // The same policy: the default policy given explicitly or left out; isolation counts.
        assert_eq!(
            KernelConfinement::sandbox(&SandboxPolicy::default(), false),
            default
        );
        assert_ne!(
            KernelConfinement::sandbox(&SandboxPolicy::default(), true),
            default
        );
        for bad in ["", "sandbox", "sandbox sha256:abc", "remote ", "Unconfined"] {
            assert_eq!(KernelConfinement::parse_record(bad), None, "{bad}");
        }
        let err = default.refusal(&KernelConfinement::Unconfined).to_string();
        assert!(
            err.contains("a sandboxed kernel (--sandbox, policy sha256:"),
            "{err}"
        );
        assert!(err.contains("start ipybox with --sandbox"), "{err}");
        assert!(err.contains("it is kept"), "{err}");
    }
}
