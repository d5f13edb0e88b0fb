//! Benchmark of `apigen`: time to render and write the 117-tool GitHub MCP server package from
//! the vendored corpus (`tests/corpus/mcp-tools/github.json`). Median of 20 runs; target
//! <= 50 ms. Run with `cargo bench --bench apigen`.

use ipybox::apigen::{ApiStyle, ToolSpec, generate_package, render_package};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;
use common::median;

fn main() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/mcp-tools/github.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "corpus file {} missing ({e}); see tests/corpus/README.md",
            path.display()
        )
    });
    let v: Value = serde_json::from_str(&text).expect("corpus json");
    let tools: Vec<ToolSpec> = serde_json::from_value(v["tools"].clone()).expect("tools");
    let params = json!({"command": "github-mcp-server", "args": ["stdio"], "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}});
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("mcptools");
    const RUNS: usize = 20;
    let mut render = Vec::new();
    let mut full = Vec::new();
    let mut bytes = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let files = render_package("github", &params, &tools, ApiStyle::Sync)
            .expect("render")
            .files;
        render.push(t.elapsed());
        bytes = files.iter().map(|(_, s)| s.len()).sum::<usize>();
        let t = Instant::now();
        generate_package("github", &params, &tools, &root, ApiStyle::Sync).expect("generate");
        full.push(t.elapsed());
    }
    let (r, f) = (median(render), median(full));
    println!(
        "apigen: {} tools, {} KiB of Python, median of {RUNS} runs",
        tools.len(),
        bytes / 1024
    );
    println!("| step                                     | median    |");
    println!("|------------------------------------------|-----------|");
    println!(
        "| render in memory (render_package)        | {:>6.2} ms |",
        r.as_secs_f64() * 1e3
    );
    println!(
        "| render + write + swap (generate_package) | {:>6.2} ms |",
        f.as_secs_f64() * 1e3
    );
    println!(
        "target: <= 50 ms for generate_package: {}",
        if f <= Duration::from_millis(50) {
            "OK"
        } else {
            "MISSED"
        }
    );
}
