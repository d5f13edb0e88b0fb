//! Corpus test for `apigen`: generates the packages of every MCP server in the vendored corpus
//! (`tests/corpus/mcp-tools/*.json`), then has real Python import every module and
//! property-test `Params`/`Result` against the schemas with hypothesis-jsonschema
//! (`tests/python/apigen_corpus_check.py`). Not a unit test of naming or rendering details.

use ipybox::apigen::{ApiStyle, ToolSpec, generate_package};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{self, require, root};

/// The vendored copy of the corpus (see `tests/corpus/README.md`).
fn corpus_dir() -> PathBuf {
    root().join("tests/corpus/mcp-tools")
}

/// (server name, tools) of one corpus file.
pub(crate) fn load_corpus_file(file: &str) -> (String, Vec<ToolSpec>) {
    let f = corpus_dir().join(file);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).expect("read corpus file"))
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    let server = v["server"].as_str().expect("server name").to_string();
    let tools: Vec<ToolSpec> = serde_json::from_value(v["tools"].clone()).expect("tools");
    (server, tools)
}

/// (server name, tools) for every corpus file, sorted by file name.
fn load_corpus() -> Vec<(String, Vec<ToolSpec>)> {
    let mut files: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("read corpus dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".json"))
        .collect();
    files.sort();
    files.iter().map(|f| load_corpus_file(f)).collect()
}

#[test]
fn corpus_generates_importable_modules_that_round_trip() {
    require!(TestEnv);
    let corpus = load_corpus();
    let total: usize = corpus.iter().map(|(_, t)| t.len()).sum();
    assert_eq!(corpus.len(), 14, "expected 14 corpus files");
    // APIGEN_CORPUS_OUT=dir keeps the generated packages for inspection.
    let tmp = tempfile::tempdir().expect("tempdir");
    let keep = std::env::var_os("APIGEN_CORPUS_OUT").map(PathBuf::from);
    let base = keep.as_deref().unwrap_or(tmp.path());
    let root = base.join("mcptools");
    let mut manifest = Vec::new();
    for (server, tools) in &corpus {
        let params = json!({"command": "npx", "args": ["-y", format!("{server}-mcp")], "env": {"TOKEN": "${TOKEN}"}});
        let modules = generate_package(server, &params, tools, &root, ApiStyle::Sync)
            .unwrap_or_else(|e| panic!("{server}: {e}"));
        assert_eq!(modules.len(), tools.len());
        for (tool, module) in tools.iter().zip(&modules) {
            manifest.push(json!({
                "server": server, "module": module, "tool": tool.name,
                "input_schema": tool.input_schema, "output_schema": tool.output_schema,
            }));
        }
    }
    assert_eq!(manifest.len(), total);
    let manifest_path = base.join("manifest.json");
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let out = run_check(base, &manifest_path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "corpus check crashed:\n{stdout}\n{stderr}"
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("no summary ({e}):\n{stdout}\n{stderr}"));
    assert_eq!(
        summary["imported"],
        json!(total),
        "every module must import:\n{stdout}"
    );
    assert_eq!(
        summary["failures"],
        json!([]),
        "round-trip failures:\n{stdout}"
    );
    let skipped = summary["skipped"].as_array().map_or(0, Vec::len);
    let models = total
        + corpus
            .iter()
            .flat_map(|(_, t)| t)
            .filter(|t| t.output_schema.is_some())
            .count();
    println!(
        "checked {} of {models} models, skipped {skipped}",
        summary["checked_models"]
    );
    assert!(
        skipped <= 10,
        "too many schemas skipped by hypothesis-jsonschema ({skipped}):\n{stdout}"
    );
}

fn run_check(root: &Path, manifest: &Path) -> std::process::Output {
    let python_dir = support::root().join("python");
    Command::new(support::python())
        .arg(support::root().join("tests/python/apigen_corpus_check.py"))
        .arg(manifest)
        .env(
            "PYTHONPATH",
            format!("{}:{}", root.display(), python_dir.display()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python")
}
