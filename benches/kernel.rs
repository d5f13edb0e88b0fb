//! Kernel engine benchmark: prints a table of medians (run with `cargo bench --bench kernel`).
//!
//! - cold start -> first result: `CodeExecutor::start` + `execute("1")` (environment provisioned)
//! - trivial execution round trip
//! - reset -> next result (warm spare)
//! - three resets in a row, back to back (each followed by a result), with 1 and 3 spares
//! - 1 MB output round trip
//! - peak RSS of one kernel

use std::time::{Duration, Instant};

use ipybox::CodeExecutor;

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

fn main() {
    common::run(|| async {
        let ws = tempfile::tempdir().unwrap();

        let mut cold = Vec::new();
        for _ in 0..5 {
            let ex = CodeExecutor::builder().workspace(ws.path()).build();
            let t = Instant::now();
            ex.start().await.unwrap();
            ex.execute("1", None).await.unwrap();
            cold.push(t.elapsed());
            ex.stop().await;
        }

        let ex = CodeExecutor::builder().workspace(ws.path()).build();
        ex.start().await.unwrap();
        // Steady state, as in real use: let the warm spare finish starting before timing.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..20 {
            ex.execute("1", None).await.unwrap();
        }
        let mut trivial = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            ex.execute("1", None).await.unwrap();
            trivial.push(t.elapsed());
        }

        let mut reset = Vec::new();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(1500)).await; // spare ready, as in real use
            let t = Instant::now();
            ex.reset().await.unwrap();
            ex.execute("1", None).await.unwrap();
            reset.push(t.elapsed());
        }

        ex.execute("payload = 'x' * 1_000_000", None).await.unwrap();
        let mut mb = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let out = ex.execute("print(payload)", None).await.unwrap();
            assert_eq!(out.text.len(), 1_000_000);
            mb.push(t.elapsed());
        }
        let pid = ex.kernel_pid().await.unwrap();
        let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
            .unwrap_or_else(|| "?".into());
        ex.stop().await;

        let burst = |spares: usize| {
            let ws = ws.path().to_path_buf();
            async move {
                let ex = CodeExecutor::builder()
                    .workspace(ws)
                    .spare_kernels(spares)
                    .build();
                ex.start().await.unwrap();
                let mut runs = Vec::new();
                for _ in 0..3 {
                    // All spares ready, then three resets with nothing in between.
                    tokio::time::sleep(Duration::from_millis(1500 * spares as u64 + 500)).await;
                    let t = Instant::now();
                    for _ in 0..3 {
                        ex.reset().await.unwrap();
                        ex.execute("1", None).await.unwrap();
                    }
                    runs.push(t.elapsed());
                }
                ex.stop().await;
                median(runs)
            }
        };
        let burst_default = burst(1).await;
        let burst_three = burst(3).await;

        println!("| measurement | median | target | Python ipybox |");
        println!("|---|---|---|---|");
        println!(
            "| cold start -> first result (n=5) | {} | <= 900 ms | 4300 ms |",
            ms(median(cold))
        );
        println!(
            "| trivial execution round trip (n=200) | {} | <= 3 ms | 52 ms |",
            ms(median(trivial))
        );
        println!(
            "| reset -> next result (n=5) | {} | <= 200 ms | 3300 ms |",
            ms(median(reset))
        );
        println!(
            "| three resets in a row, 1 spare (default) (n=3) | {} | <= 100 ms | - |",
            ms(burst_default)
        );
        println!(
            "| three resets in a row, 3 spares (n=3) | {} | <= 100 ms | - |",
            ms(burst_three)
        );
        println!(
            "| 1 MB output round trip (n=20) | {} | - | - |",
            ms(median(mb))
        );
        println!("| kernel peak RSS | {rss} kB | - | - |");
    });
}
