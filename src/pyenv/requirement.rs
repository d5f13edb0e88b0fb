//! What `install_package` accepts, decided by a real PEP 508 parser (`pep508_rs`, uv's) rather
//! than a string test, and the text handed to the installer (the parser's own rendering of what
//! it understood, so the installer never reads the spec differently from this check).
//!
//! For a sandboxed kernel ([`Checked::sandboxed`]) a spec is a name, optional extras, an optional
//! version specifier and optional markers. Refused: installer options (`-e .`,
//! `--index-url …`), paths, `file:` URLs (whatever the operator allows: the kernel writes local
//! files), and any other URL unless the operator allowed URLs (then only `https://` and
//! `git+https://`). For an unsandboxed kernel (the user's own, trusted) the spec goes to the
//! installer as before: anything but an option.
//!
//! Not here: running the installer (`super::install`).

use std::str::FromStr;

use pep508_rs::{Requirement, VersionOrUrl};
use url::Url;

use super::PyEnvError;

/// URL schemes a sandboxed install may name when the operator allowed URLs.
const REMOTE_SCHEMES: &[&str] = &["https", "git+https"];

/// A spec `install_package` may hand to the installer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// What the installer gets.
    pub spec: String,
    /// The host of the URL the spec names (a sandboxed install's network policy must reach it).
    pub url_host: Option<String>,
}

fn refused(spec: &str, what: &str, why: &str, help: &str) -> PyEnvError {
    PyEnvError::InstallRefused {
        spec: spec.to_string(),
        what: what.to_string(),
        why: why.to_string(),
        help: help.to_string(),
    }
}

const NAME_HELP: &str = "pass a package name with optional extras, version and markers (`six`, `numpy>=2`, `pandas[excel]~=2.2`); the package comes from the package index";

impl Checked {
    /// What an unsandboxed kernel's `install_package` passes on: the spec as given (a name,
    /// a URL, a path: the user's own kernel is trusted), but never an installer option.
    pub fn unsandboxed(spec: &str) -> Result<Self, PyEnvError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(PyEnvError::InvalidRequirement {
                spec: spec.to_string(),
                reason: "it is empty".into(),
            });
        }
        if spec.starts_with('-') {
            return Err(refused(
                spec,
                "it is an installer option, not a package",
                "options change what the installer does (its index, an editable local source, its configuration), which is not a package to install",
                NAME_HELP,
            ));
        }
        Ok(Self {
            spec: spec.to_string(),
            url_host: None,
        })
    }

    /// What a sandboxed kernel's `install_package` passes on (see the module docs);
    /// `allow_urls`: the operator allowed remote URLs.
    pub fn sandboxed(spec: &str, allow_urls: bool) -> Result<Self, PyEnvError> {
        let given = spec.trim();
        Self::unsandboxed(given)?;
        let req = Requirement::<Url>::from_str(given).map_err(|e| {
            let first = e.to_string();
            PyEnvError::InvalidRequirement {
                spec: given.to_string(),
                reason: if looks_like_path(given) {
                    "it is a path; a sandboxed kernel installs packages from the package index only, since it can write local files".into()
                } else {
                    format!("not a PEP 508 requirement: {first}")
                },
            }
        })?;
        let mut url_host = None;
        if let Some(VersionOrUrl::Url(url)) = &req.version_or_url {
            let scheme = url.scheme().to_ascii_lowercase();
            let local = scheme == "file" || scheme.ends_with("+file") || url.host_str().is_none();
            if local {
                return Err(refused(
                    given,
                    "it names a local source",
                    "the kernel is sandboxed and can write local files: installing them would install (and build) code it chose, whatever the operator allows",
                    "install from the package index (`name`, `name>=1.2`); to install local code, run your installer yourself outside ipybox",
                ));
            }
            if !allow_urls {
                return Err(refused(
                    given,
                    &format!("it names a URL ({scheme}://…)"),
                    "the kernel is sandboxed, and installs from URLs are off unless the operator allows them",
                    "install from the package index (`name`, `name>=1.2`), or ask the operator to start ipybox with --allow-install-urls (SDK: `allow_install_urls(true)`)",
                ));
            }
            if !REMOTE_SCHEMES.contains(&scheme.as_str()) {
                return Err(refused(
                    given,
                    &format!("its URL scheme `{scheme}` is not allowed"),
                    "a sandboxed kernel installs from URLs over https only",
                    "use an `https://` or `git+https://` URL",
                ));
            }
            url_host = url.host_str().map(str::to_string);
        }
        Ok(Self {
            spec: req.to_string(),
            url_host,
        })
    }
}

/// Whether `spec` reads as a file system path (for the error message only: the parser decides).
fn looks_like_path(spec: &str) -> bool {
    spec.starts_with(['/', '.', '~']) || spec.contains('/') && !spec.contains("://")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(spec: &str, allow_urls: bool) -> String {
        Checked::sandboxed(spec, allow_urls)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn names_extras_versions_and_markers_pass() {
        for (spec, expected) in [
            ("six", "six"),
            ("  six==1.16.0 ", "six==1.16.0"),
            ("numpy >= 2", "numpy>=2"),
            ("pandas[excel]~=2.2", "pandas[excel]~=2.2"),
            (
                "iniconfig ; python_version >= '3.8'",
                "iniconfig ; python_full_version >= '3.8'",
            ),
        ] {
            let c = Checked::sandboxed(spec, false).unwrap();
            assert_eq!(c.spec, expected, "{spec}");
            assert_eq!(c.url_host, None);
        }
    }

    #[test]
    fn local_sources_are_refused_whatever_the_operator_allows() {
        for allow in [false, true] {
            for spec in [
                "evil @ file:///ws/evil.whl",
                "evil @  file:///ws/evil.whl",
                "evil @\tfile:///ws/evil.whl",
                "evil@file:///ws/evil.whl",
                "evil @ FILE:///ws/evil.whl",
                "evil @ git+file:///ws/repo",
                "evil @ file:evil.whl",
                "evil @ file://localhost/ws/evil.whl",
            ] {
                let msg = message(spec, allow);
                assert!(
                    msg.contains("it names a local source") && msg.contains("help:"),
                    "{spec}: {msg}"
                );
            }
        }
    }

    #[test]
    fn paths_are_refused() {
        for spec in [
            "./pkg",
            "../x",
            "/abs/pkg",
            "~/pkg",
            "pkg/sub",
            "evil.whl",
            "evil @ ./evil.whl",
            "evil @ /ws/evil.whl",
        ] {
            let msg = message(spec, true);
            assert!(
                msg.contains("is not a package requirement") || msg.contains("local source"),
                "{spec}: {msg}"
            );
            assert!(msg.contains("help:"), "{msg}");
        }
        assert!(message("/abs/pkg", true).contains("it is a path"));
    }

    #[test]
    fn options_are_refused() {
        for spec in [
            "-e .",
            "--index-url https://evil.example/simple six",
            "-r req.txt",
        ] {
            let msg = message(spec, true);
            assert!(msg.contains("installer option"), "{spec}: {msg}");
            // Unsandboxed too.
            assert!(Checked::unsandboxed(spec).is_err(), "{spec}");
        }
        // An option after a name is not a requirement either.
        for spec in ["six --index-url https://evil.example/simple", "six -e ."] {
            assert!(
                message(spec, true).contains("is not a package requirement"),
                "{spec}"
            );
        }
    }

    #[test]
    fn urls_need_the_operator_and_https() {
        for spec in [
            "name @ https://example.com/x.whl",
            "name @ git+https://github.com/a/b",
            "name @ http://example.com/x.whl",
        ] {
            let msg = message(spec, false);
            assert!(
                msg.contains("it names a URL") && msg.contains("--allow-install-urls"),
                "{spec}: {msg}"
            );
        }
        let c = Checked::sandboxed("name @ https://example.com/x.whl", true).unwrap();
        assert_eq!(c.spec, "name @ https://example.com/x.whl");
        assert_eq!(c.url_host.as_deref(), Some("example.com"));
        let c = Checked::sandboxed("b @ git+https://github.com/a/b", true).unwrap();
        assert_eq!(c.url_host.as_deref(), Some("github.com"));
        for spec in [
            "name @ http://example.com/x.whl",
            "name @ git+ssh://git@github.com/a/b",
            "name @ ftp://example.com/x.whl",
        ] {
            assert!(
                message(spec, true).contains("is not allowed"),
                "{spec}: {}",
                message(spec, true)
            );
        }
        // No host variable is expanded into a URL (uv's own URL type would).
        let c = Checked::sandboxed("name @ https://example.com/${HOME}.whl", true).unwrap();
        assert!(!c.spec.contains("${HOME}"), "{}", c.spec);
    }

    #[test]
    fn everything_else_is_not_a_requirement() {
        for spec in [
            "",
            "   ",
            "name ; python_version<\"4\" @ file:///ws/evil.whl",
            "git+https://github.com/a/b",
            "six; import os",
            "six==1.16.0 extra",
            "six\nevil @ file:///x.whl",
            "six ; os.system('x')",
        ] {
            let msg = message(spec, true);
            assert!(
                msg.contains("is not a package requirement") && msg.contains("help:"),
                "{spec:?}: {msg}"
            );
        }
        // Unsandboxed, a bare URL stays allowed.
        assert_eq!(
            Checked::unsandboxed(" git+https://github.com/a/b ")
                .unwrap()
                .spec,
            "git+https://github.com/a/b"
        );
    }
}
