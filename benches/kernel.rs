//! Kernel engine benchmark: prints a table of medians (run with `cargo bench --bench kernel`).
//!
//! Each kernel measurement is taken with the kernel factory (the default) and with plain
//! launches (`kernel_factory(false)`, how ipybox started kernels before), in the same run:
//! - cold start -> first result: `CodeExecutor::start` + `execute("1")` (environment provisioned)
//! - trivial execution round trip
//! - reset -> next result with a warm spare (1.5 s apart)
//! - ten resets back to back (each followed by a result), default settings (one spare)
//! - a new kernel: reset -> next result without a spare (the fork or launch itself)
//! - three resets in a row, with 1 and 3 spares (the earlier benchmark, kept for comparison)
//! - 1 MB output round trip
//! - PSS and RSS (from /proc/PID/smaps_rollup) of the executor's processes (template + kernels)
//!   with 1, 8 and 32 kernels (one executor with 0, 7 and 31 spares)

use std::path::Path;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

#[path = "../tests/integration/proc_tree.rs"]
mod proc_tree;

fn builder(ws: &Path, factory: bool) -> ipybox::executor::CodeExecutorBuilder {
    CodeExecutor::builder()
        .workspace(ws)
        .kernel_factory(factory)
}

/// The executor's processes: this process's descendants whose command line names its runtime
/// directory (kernels, and the factory's template).
fn executor_processes(runtime: &Path) -> Vec<u32> {
    let needle = runtime.display().to_string();
    proc_tree::descendants(std::process::id())
        .into_iter()
        .filter(|pid| {
            String::from_utf8_lossy(
                &std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default(),
            )
            .contains(&needle)
        })
        .collect()
}

fn mb(kb: u64) -> String {
    format!("{:.0} MB", kb as f64 / 1024.0)
}

struct Figures {
    cold: Duration,
    trivial: Duration,
    reset_warm: Duration,
    back_to_back: Vec<Duration>,
    new_kernel: Duration,
    three_resets_1: Duration,
    three_resets_3: Duration,
    one_mb: Duration,
    memory: Vec<(usize, u64, u64, usize)>,
}

async fn measure(ws: &Path, factory: bool) -> Figures {
    let mut cold = Vec::new();
    for _ in 0..5 {
        let ex = builder(ws, factory).build();
        let t = Instant::now();
        ex.start().await.unwrap();
        ex.execute("1", None).await.unwrap();
        cold.push(t.elapsed());
        ex.stop().await;
    }

    let ex = builder(ws, factory).build();
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

    let mut reset_warm = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(1500)).await; // spare ready, as in real use
        let t = Instant::now();
        ex.reset().await.unwrap();
        ex.execute("1", None).await.unwrap();
        reset_warm.push(t.elapsed());
    }

    // Ten resets back to back, three rounds (the spare is ready when each round starts).
    let mut back_to_back = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for _ in 0..10 {
            let t = Instant::now();
            ex.reset().await.unwrap();
            ex.execute("1", None).await.unwrap();
            back_to_back.push(t.elapsed());
        }
    }

    ex.execute("payload = 'x' * 1_000_000", None).await.unwrap();
    let mut one_mb = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let out = ex.execute("print(payload)", None).await.unwrap();
        assert_eq!(out.text.len(), 1_000_000);
        one_mb.push(t.elapsed());
    }
    ex.stop().await;

    // A new kernel, nothing prepared: reset without a spare.
    let ex = builder(ws, factory).without_spare_kernel().build();
    ex.start().await.unwrap();
    let mut new_kernel = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = Instant::now();
        ex.reset().await.unwrap();
        ex.execute("1", None).await.unwrap();
        new_kernel.push(t.elapsed());
    }
    ex.stop().await;

    let burst = |spares: usize| async move {
        let ex = builder(ws, factory).spare_kernels(spares).build();
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
    };
    let three_resets_1 = burst(1).await;
    let three_resets_3 = burst(3).await;

    let mut memory = Vec::new();
    for kernels in [1usize, 8, 32] {
        let ex = builder(ws, factory).spare_kernels(kernels - 1).build();
        ex.start().await.unwrap();
        ex.execute("1", None).await.unwrap();
        let runtime = ex.runtime_dir().await.unwrap();
        // Wait until every spare has bound its sockets, then let them settle.
        let ready = |n: usize| {
            (1..=40)
                .filter(|k| runtime.join(format!("k{k}/k-5")).exists())
                .count()
                >= n
        };
        let t = Instant::now();
        while !ready(kernels) && t.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let procs = executor_processes(&runtime);
        let (pss, rss) = common::pss_rss(&procs);
        memory.push((kernels, pss, rss, procs.len()));
        ex.stop().await;
    }

    Figures {
        cold: median(cold),
        trivial: median(trivial),
        reset_warm: median(reset_warm),
        back_to_back,
        new_kernel: median(new_kernel),
        three_resets_1,
        three_resets_3,
        one_mb: median(one_mb),
        memory,
    }
}

fn main() {
    common::run(|| async {
        let ws = tempfile::tempdir().unwrap();
        let forked = measure(ws.path(), true).await;
        let plain = measure(ws.path(), false).await;
        let max = |v: &[Duration]| v.iter().copied().max().unwrap_or_default();

        println!("| measurement | kernel factory (default) | plain launch | target |");
        println!("|---|---|---|---|");
        let row = |what: &str, f: String, p: String, target: &str| {
            println!("| {what} | {f} | {p} | {target} |");
        };
        row(
            "cold start -> first result (median of 5)",
            ms(forked.cold),
            ms(plain.cold),
            "<= 900 ms",
        );
        row(
            "trivial execution round trip (median of 200)",
            ms(forked.trivial),
            ms(plain.trivial),
            "<= 3 ms",
        );
        row(
            "reset -> next result, warm spare, 1.5 s apart (median of 5)",
            ms(forked.reset_warm),
            ms(plain.reset_warm),
            "<= 200 ms",
        );
        row(
            "10 resets back to back, 1 spare: median (3 rounds of 10)",
            ms(median(forked.back_to_back.clone())),
            ms(median(plain.back_to_back.clone())),
            "<= 50 ms",
        );
        row(
            "10 resets back to back, 1 spare: max (3 rounds of 10)",
            ms(max(&forked.back_to_back)),
            ms(max(&plain.back_to_back)),
            "<= 50 ms",
        );
        row(
            "a new kernel: reset -> next result without a spare (median of 10)",
            ms(forked.new_kernel),
            ms(plain.new_kernel),
            "tens of ms",
        );
        row(
            "three resets in a row, 1 spare (median of 3)",
            ms(forked.three_resets_1),
            ms(plain.three_resets_1),
            "<= 100 ms",
        );
        row(
            "three resets in a row, 3 spares (median of 3)",
            ms(forked.three_resets_3),
            ms(plain.three_resets_3),
            "<= 100 ms",
        );
        row(
            "1 MB output round trip (median of 20)",
            ms(forked.one_mb),
            ms(plain.one_mb),
            "-",
        );
        for (f, p) in forked.memory.iter().zip(&plain.memory) {
            row(
                &format!(
                    "{} kernel(s) idle: PSS / RSS of the executor's processes (factory: {} incl. the template)",
                    f.0, f.3
                ),
                format!("{} / {}", mb(f.1), mb(f.2)),
                format!("{} / {}", mb(p.1), mb(p.2)),
                "-",
            );
        }
        println!();
        println!(
            "back to back, factory: {:?}",
            forked
                .back_to_back
                .iter()
                .map(|d| d.as_millis())
                .collect::<Vec<_>>()
        );
        println!(
            "back to back, plain:   {:?}",
            plain
                .back_to_back
                .iter()
                .map(|d| d.as_millis())
                .collect::<Vec<_>>()
        );
    });
}
