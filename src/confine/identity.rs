//! Who a confined kernel is (docs/http.md "Who a session's kernel is"): the uid and gid it runs
//! as, with no supplementary groups, no capabilities and `no_new_privs`, and the seccomp filter
//! it loads ([`super::seccomp`]). The kernel-side half is
//! `python/ipybox_runtime/confine_identity.py`: a forked kernel's init runs it before forking the
//! kernel (the fork plan's `identity` and `seccomp` keys), a kernel started in bubblewrap as the
//! launcher's first statement ([`KernelIdentity::launcher_prelude`]).

use std::path::PathBuf;

/// A uid and the gid of the same number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ids {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// What one confined kernel becomes before any code but ipybox's runs.
#[derive(Debug, Clone)]
pub(crate) struct KernelIdentity {
    /// The session's own uid and gid (ipybox runs as root), else `None`: the kernel keeps
    /// ipybox's (in bubblewrap's user namespace when ipybox is not root).
    pub(crate) ids: Option<Ids>,
    /// The seccomp filter's file ([`super::seccomp::write`]).
    pub(crate) seccomp: PathBuf,
}

impl KernelIdentity {
    fn plan(&self) -> serde_json::Value {
        serde_json::json!({
            "identity": self.ids.map(|i| serde_json::json!({"uid": i.uid, "gid": i.gid})),
            "seccomp": self.seccomp.display().to_string(),
        })
    }

    /// Adds the `identity` and `seccomp` keys to a fork plan (`Layout::fork_plan`'s object).
    pub(crate) fn add_to_plan(&self, plan: &mut serde_json::Value) {
        if let (Some(plan), serde_json::Value::Object(ours)) = (plan.as_object_mut(), self.plan()) {
            plan.extend(ours);
        }
    }

    /// The Python statement a kernel started in bubblewrap runs first (after `CLEAN_PATH`):
    /// becomes this identity and loads the filter, or exits with status 70 and a message on
    /// stderr.
    pub(crate) fn launcher_prelude(&self) -> String {
        // A JSON string is a valid Python string literal.
        let plan = serde_json::to_string(&self.plan().to_string()).unwrap_or_default();
        format!(
            "__import__('ipybox_runtime.confine_identity', fromlist=['confine_or_exit'])\
             .confine_or_exit(__import__('json').loads({plan}))"
        )
    }
}
