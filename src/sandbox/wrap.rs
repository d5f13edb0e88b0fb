//! The kernel command under srt: `srt --settings FILE -c '. ENV_FILE && exec COMMAND'` with
//! srt's own environment ([`super::env`]), the interpreter directories the policy must keep
//! readable, and the sweeper that removes the mount points srt's bubblewrap
//! backend leaves in the workspace when a kernel is killed.
//!
//! Not here: the policy itself ([`super::policy`]) and the platform checks ([`super::platform`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::child_process::{ChildCommand, CommandWrapper};
use crate::host_env::HostEnv;

use super::platform::find_in_path;
use super::shell::{shell_join, shell_quote};

/// Workspace entries srt (on Linux) creates as mount points so the sandbox cannot create them.
/// srt removes them when its command exits normally; a killed kernel leaves them behind.
const SRT_MOUNT_POINTS: &[&str] = &[
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".zshrc",
    ".zprofile",
    ".profile",
    ".ripgreprc",
    ".mcp.json",
    ".vscode",
    ".idea",
    ".claude/commands",
    ".claude/agents",
    ".claude",
    // ipybox's own denyWrite of the workspace `.env` (see policy.rs), when it did not exist.
    ".env",
];

/// The name of the kernel's environment file in its host-only directory.
pub(crate) const ENV_FILE: &str = "kernel-env.sh";

/// The wrapper that runs a kernel command under srt with the settings at `settings`. srt runs
/// with `outer` as its whole environment ([`super::env::outer`]); the kernel's own environment,
/// plus `inner_extra` (its private IPython and Jupyter directories), is written to
/// [`ENV_FILE`] in the kernel's host-only directory and sourced inside the sandbox. srt starts
/// in `workspace` (it anchors the policy's relative paths there); a kernel that works elsewhere
/// changes directory inside. The sweeper lives as long as the wrapper (the executor's running
/// state).
pub(crate) fn wrapper(
    srt: &Path,
    workspace: &Path,
    settings: &Path,
    outer: Vec<(String, String)>,
    inner_extra: Vec<(String, String)>,
    sweeper: ArtifactSweeper,
) -> CommandWrapper {
    let prefix = vec![
        srt.display().to_string(),
        "--settings".into(),
        settings.display().to_string(),
        "-c".into(),
    ];
    let sweeper = Arc::new(sweeper);
    let workspace = workspace.to_path_buf();
    CommandWrapper(Arc::new(move |cmd: ChildCommand| {
        let _keep = &sweeper;
        let mut env = cmd.env;
        for (k, v) in &inner_extra {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.clone()));
        }
        let text = super::env::file_text(&env, &outer);
        crate::safe_fs::NoFollowDir::open(&cmd.private_dir, None)?.create_new(
            ENV_FILE,
            text.as_bytes(),
            0o600,
        )?;
        let file = cmd.private_dir.join(ENV_FILE);
        let mut argv = prefix.clone();
        let cd = if cmd.cwd == workspace {
            String::new()
        } else {
            format!("cd {} && ", shell_quote(&cmd.cwd.display().to_string()))
        };
        argv.push(format!(
            ". {} && {cd}exec {}",
            shell_quote(&file.display().to_string()),
            shell_join(&cmd.argv)
        ));
        Ok(ChildCommand {
            argv,
            env: outer.clone(),
            cwd: workspace.clone(),
            private_dir: cmd.private_dir,
        })
    }))
}

/// Directories the interpreter needs to be readable: its environment (a venv's root), the
/// installation it links to (`home` in `pyvenv.cfg`), and the real interpreter's prefix.
pub(crate) fn python_dirs(python: &Path, host: &HostEnv) -> Vec<PathBuf> {
    let mut dirs = BTreeSet::new();
    let prefix = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    let abs = if python.is_absolute() {
        Some(python.to_path_buf())
    } else {
        find_in_path(host, &python.display().to_string())
    };
    let Some(python) = abs else {
        return Vec::new();
    };
    if let Some(root) = prefix(&python) {
        if let Ok(cfg) = std::fs::read_to_string(root.join("pyvenv.cfg")) {
            for line in cfg.lines() {
                if let Some((k, v)) = line.split_once('=')
                    && k.trim() == "home"
                    && let Some(home) = Path::new(v.trim()).parent()
                {
                    dirs.insert(home.to_path_buf());
                }
            }
        }
        dirs.insert(root);
    }
    if let Some(real) = std::fs::canonicalize(&python).ok().and_then(|p| prefix(&p)) {
        dirs.insert(real);
    }
    // "/" or "/usr" would re-open everything the policy hides.
    dirs.retain(|d| d.components().count() > 2);
    dirs.into_iter().collect()
}

/// Removes, when dropped (the executor stopped), the mount points srt's bubblewrap backend left
/// in the workspace. Only entries that did not exist when the sandbox was prepared are
/// candidates, and of those only what srt makes:
/// - a file: empty, no write permission bits, one link — bubblewrap's mount-point file, the
///   same test srt itself uses (`isStaleBwrapMountPoint`); a file the user created (`touch`,
///   an editor) has write bits and is kept, empty or not;
/// - a directory (`.claude`, the parent of srt's `.claude/commands`): only while empty.
pub(crate) struct ArtifactSweeper {
    /// Absent when the sandbox was prepared, deepest first.
    absent: Vec<PathBuf>,
}

impl ArtifactSweeper {
    /// Watches srt's mount points in `workspace` and `extra` (other paths ipybox denies writing
    /// whether or not they exist: the policy file).
    pub(crate) fn new(workspace: &Path, extra: &[PathBuf]) -> Self {
        let absent = extra
            .iter()
            .cloned()
            .chain(SRT_MOUNT_POINTS.iter().map(|name| workspace.join(name)))
            .filter(|path| std::fs::symlink_metadata(path).is_err())
            .collect();
        Self { absent }
    }
}

/// bubblewrap's mount-point file: regular, empty, no write bits, one link.
fn is_mount_point_file(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    m.is_file() && m.len() == 0 && m.mode() & 0o222 == 0 && m.nlink() == 1
}

impl Drop for ArtifactSweeper {
    fn drop(&mut self) {
        // Deepest first, so `.claude` is empty once its children are gone.
        for path in &self.absent {
            match std::fs::symlink_metadata(path) {
                Ok(m) if is_mount_point_file(&m) => {
                    let _ = std::fs::remove_file(path);
                }
                // remove_dir only removes empty directories.
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir(path);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeper_removes_only_what_bubblewrap_made() {
        use std::os::unix::fs::PermissionsExt;
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path();
        std::fs::write(w.join(".profile"), "mine").unwrap(); // existed before: never touched
        let sweeper = ArtifactSweeper::new(w, &[w.join("policy.json")]);
        // What bubblewrap leaves after a killed kernel: 0444 empty files and an empty .claude.
        for name in [".bashrc", ".gitconfig", ".env", "policy.json"] {
            std::fs::write(w.join(name), "").unwrap();
            std::fs::set_permissions(w.join(name), std::fs::Permissions::from_mode(0o444)).unwrap();
        }
        std::fs::create_dir(w.join(".claude")).unwrap();
        // What the user made during the session: an empty .mcp.json, an empty .vscode file,
        // a read-only but non-empty .zshrc.
        std::fs::write(w.join(".mcp.json"), "").unwrap();
        std::fs::write(w.join(".vscode"), "").unwrap();
        std::fs::write(w.join(".zshrc"), "x").unwrap();
        std::fs::set_permissions(w.join(".zshrc"), std::fs::Permissions::from_mode(0o444)).unwrap();
        drop(sweeper);
        let left: BTreeSet<String> = std::fs::read_dir(w)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            left,
            [".mcp.json", ".profile", ".vscode", ".zshrc"]
                .map(String::from)
                .into()
        );
    }
}
