//! Snapshot tests of generated code: the exact text `apigen` writes for a small hand-made schema
//! (in both API styles) and for three servers of the vendored corpus (`tests/corpus/mcp-tools/`),
//! compared file by file with `tests/snapshots/apigen/<case>/`. No Python runs here; the tests that run generated code
//! are `apigen`, `apigen_corpus` and `tool_calls`.
//!
//! After an intended change of the generated code, rewrite the snapshots with
//! `IPYBOX_UPDATE_SNAPSHOTS=1 cargo test apigen_snapshots` and review the diff.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ipybox::apigen::{ApiStyle, ToolSpec, generate_package};
use serde_json::{Value, json};

use crate::apigen::tool;
use crate::apigen_corpus::load_corpus_file;
use crate::support::root;

/// The small schema of the `search_repos` case: an enum with a keyword value, a nullable
/// required `from`, constraints, a pattern inside an array, a closed nested object, a result.
pub(crate) fn search_repos_tool() -> ToolSpec {
    let mut t = tool(
        "search-repos",
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "description": "Search query"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
                "sort": {"type": "string", "enum": ["stars", "help-wanted", "class"], "default": "stars"},
                "from": {"type": ["string", "null"]},
                "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
                "owner": {"type": "object", "title": "Owner", "properties": {"login": {"type": "string"}},
                          "required": ["login"], "additionalProperties": false}
            },
            "required": ["query", "from"]
        }),
    );
    t.output_schema = Some(
        json!({"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"]}),
    );
    t
}

/// Every file of a generated package, by relative path.
fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_file() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            out.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// Generates `server` from `tools` and compares the package with its snapshot directory.
fn check(case: &str, server: &str, params: &Value, tools: &[ToolSpec], style: ApiStyle) {
    let tmp = tempfile::tempdir().unwrap();
    let mcptools = tmp.path().join("mcptools");
    generate_package(server, params, tools, &mcptools, style).unwrap();
    let generated = files(&mcptools.join(server));
    let snap_dir: PathBuf = root().join("tests/snapshots/apigen").join(case);
    if std::env::var_os("IPYBOX_UPDATE_SNAPSHOTS").is_some() {
        let _ = std::fs::remove_dir_all(&snap_dir);
        std::fs::create_dir_all(&snap_dir).unwrap();
        for (name, text) in &generated {
            std::fs::write(snap_dir.join(name), text).unwrap();
        }
        return;
    }
    assert!(
        snap_dir.is_dir(),
        "no snapshot at {}: run `IPYBOX_UPDATE_SNAPSHOTS=1 cargo test apigen_snapshots` and review it",
        snap_dir.display()
    );
    let expected = files(&snap_dir);
    assert_eq!(
        generated.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{case}: generated modules differ from the snapshot's"
    );
    for (name, text) in &generated {
        assert!(
            *text == expected[name],
            "{case}/{name} differs from tests/snapshots/apigen/{case}/{name} \
             (intended? rerun with IPYBOX_UPDATE_SNAPSHOTS=1 and review the diff); generated:\n{text}"
        );
    }
}

#[test]
fn small_schema() {
    let params = json!({"command": "srv", "env": {"TOKEN": "${TOKEN}"}});
    check(
        "search_repos",
        "srv",
        &params,
        &[search_repos_tool()],
        ApiStyle::Sync,
    );
}

/// The same schema with `async def run` (`await runner.run_async`), next to a text-only tool.
#[test]
fn small_schema_async() {
    let params = json!({"command": "srv", "env": {"TOKEN": "${TOKEN}"}});
    let sleep = tool(
        "sleep",
        json!({"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}),
    );
    check(
        "search_repos_async",
        "srv",
        &params,
        &[search_repos_tool(), sleep],
        ApiStyle::Async,
    );
}

#[test]
fn corpus_servers() {
    for server in ["time", "fetch", "sequential_thinking"] {
        let (name, tools) = load_corpus_file(&format!("{server}.json"));
        let params = json!({"command": "uvx", "args": [format!("mcp-server-{name}")]});
        check(server, &name, &params, &tools, ApiStyle::Sync);
    }
}
