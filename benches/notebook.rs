//! Session notebook benchmark: what recording adds to a cell (run with
//! `cargo bench --bench notebook`). Prints a table of medians:
//!
//! - the `print(1)` round trip (`execute`) without a notebook and with one, the two executors
//!   taking turns so that load on the machine hits both alike;
//! - the same round trip once the notebook file holds ~1, ~4 and ~15 MiB (cells of 100 kB of
//!   output): every cell rewrites the whole file, in the background (the figures say how much
//!   of that still reaches the round trip, e.g. through CPU on a small machine); past 16 MiB a
//!   session goes on in a new file, which bounds it.

use std::time::{Duration, Instant};

use ipybox::CodeExecutor;

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

const ROUNDS: usize = 300;

async fn round_trip(ex: &CodeExecutor) -> Duration {
    let t = Instant::now();
    ex.execute("print(1)", None).await.unwrap();
    t.elapsed()
}

/// Medians of `ROUNDS` round trips on `plain` and `recorded`, taking turns.
async fn paired(plain: &CodeExecutor, recorded: &CodeExecutor) -> (Duration, Duration) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        if i % 2 == 0 {
            a.push(round_trip(plain).await);
            b.push(round_trip(recorded).await);
        } else {
            b.push(round_trip(recorded).await);
            a.push(round_trip(plain).await);
        }
    }
    (median(a), median(b))
}

fn added(plain: Duration, recorded: Duration) -> String {
    let diff = recorded.as_secs_f64() - plain.as_secs_f64();
    format!("{:+.3} ms", diff * 1000.0)
}

fn main() {
    common::run(|| async {
        let ws = tempfile::tempdir().unwrap();
        let builder = || {
            CodeExecutor::builder()
                .workspace(ws.path())
                .without_spare_kernel()
        };
        let plain = builder().build();
        let recorded = builder().notebook("notebooks").build();
        plain.start().await.unwrap();
        recorded.start().await.unwrap();
        for _ in 0..20 {
            round_trip(&plain).await;
            round_trip(&recorded).await;
        }
        println!("| print(1) round trip | without notebook | with notebook | added |");
        println!("|---|---|---|---|");
        let (a, b) = paired(&plain, &recorded).await;
        println!(
            "| notebook ~{} kB | {} | {} | {} |",
            size(&recorded) / 1024,
            ms(a),
            ms(b),
            added(a, b)
        );
        for target in [1usize << 20, 4 << 20, 15 << 20] {
            while size(&recorded) < target {
                recorded
                    .execute("print('x' * 100_000)", None)
                    .await
                    .unwrap();
            }
            let (a, b) = paired(&plain, &recorded).await;
            println!(
                "| notebook ~{:.1} MiB | {} | {} | {} |",
                size(&recorded) as f64 / (1 << 20) as f64,
                ms(a),
                ms(b),
                added(a, b)
            );
        }
        plain.stop().await;
        recorded.stop().await;
    });
}

fn size(ex: &CodeExecutor) -> usize {
    ex.notebook().map_or(0, |n| n.read().map_or(0, |b| b.len()))
}
