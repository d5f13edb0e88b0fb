//! Sandbox cost benchmark: prints a table of medians, sandboxed next to unsandboxed (run with
//! `cargo bench --bench sandbox`; needs `bash scripts/sandbox-deps.sh`).
//!
//! - cold start -> first result: `CodeExecutor::start` + `execute("1")`, median of 5
//! - reset -> next result (warm spare), median of 5
//!
//! Not a test: it asserts nothing beyond the executions succeeding.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::sandbox::SandboxOptions;

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

fn builder(ws: &std::path::Path, sandbox: bool) -> CodeExecutor {
    let b = CodeExecutor::builder().workspace(ws);
    let b = if sandbox {
        b.sandbox(SandboxOptions {
            srt: Some(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("target/sandbox-deps/node_modules/.bin/srt"),
            ),
            ..Default::default()
        })
    } else {
        b
    };
    b.build()
}

async fn measure(ws: &std::path::Path, sandbox: bool) -> (Duration, Duration) {
    let mut cold = Vec::new();
    for _ in 0..5 {
        let ex = builder(ws, sandbox);
        let t = Instant::now();
        ex.start().await.expect("executor starts");
        ex.execute("1", None).await.unwrap();
        cold.push(t.elapsed());
        ex.stop().await;
    }
    let ex = builder(ws, sandbox);
    ex.start().await.unwrap();
    ex.execute("1", None).await.unwrap();
    let mut reset = Vec::new();
    for _ in 0..5 {
        // Let the spare finish starting, as between two agent turns.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let t = Instant::now();
        ex.reset().await.unwrap();
        ex.execute("1", None).await.unwrap();
        reset.push(t.elapsed());
    }
    ex.stop().await;
    (median(cold), median(reset))
}

fn main() {
    common::run(|| async {
        let ws = tempfile::tempdir().unwrap();
        let (plain_cold, plain_reset) = measure(ws.path(), false).await;
        let (sb_cold, sb_reset) = measure(ws.path(), true).await;
        println!("| measurement (median of 5) | unsandboxed | sandboxed (srt) |");
        println!("|---|---|---|");
        println!(
            "| cold start -> first result | {} | {} |",
            ms(plain_cold),
            ms(sb_cold)
        );
        println!(
            "| reset -> next result (warm spare) | {} | {} |",
            ms(plain_reset),
            ms(sb_reset)
        );
    });
}
