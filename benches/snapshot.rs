//! Session snapshot benchmark: prints a table (run with `cargo bench --bench snapshot`; needs
//! `scripts/test-env.sh` for the kernel interpreter with numpy and pandas).
//!
//! For namespaces of 1 MB, 10 MB, 100 MB and 1 GB of numpy/pandas objects (half a float array,
//! half a DataFrame of float, int and bool columns, plus a few small variables):
//! - snapshot: `CodeExecutor::snapshot` (the kernel pickles into the runtime directory, the host
//!   copies, hashes, seals and stores, flushed to disk);
//! - restore: `CodeExecutor::restore` into a freshly started executor (verify the seal, copy and
//!   check the data, the kernel loads it name by name);
//! - the first call after a restore (`float(arr[-1] + df['f'].iloc[-1])`) against the same call
//!   in the warm session that took the snapshot (median of 20).
//!
//! - a fresh kernel's `import numpy, pandas`: the part of every restore of such a namespace that
//!   is the modules' own import time, not the snapshot's (the restore imports them again).
//!
//! Target (issue 30): restoring a 10 MB namespace <= 100 ms. `IPYBOX_BENCH_SNAPSHOT_MAX_MB`
//! leaves out the larger namespaces (e.g. `100` skips the 1 GB one).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::snapshot::{SnapshotBinding, SnapshotStore};

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

fn python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-env/kernel-data/bin/python")
}

async fn executor(ws: &Path) -> CodeExecutor {
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .python(python())
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    ex
}

/// Cell that builds a namespace of about `bytes` bytes.
fn build(bytes: u64) -> String {
    let half = bytes / 2;
    // DataFrame rows: float64 + int64 + bool = 17 bytes.
    format!(
        "import numpy as np, pandas as pd\n\
         rng = np.random.default_rng(1)\n\
         arr = rng.random({arr})\n\
         df = pd.DataFrame({{'f': rng.random({rows}), 'i': np.arange({rows}), 'b': np.arange({rows}) % 2 == 0}})\n\
         label = 'namespace'\nparams = {{'alpha': 0.1, 'n': 3}}\n\
         def score(v):\n    return float(v) * params['alpha']\n",
        arr = half / 8,
        rows = half / 17,
    )
}

const CALL: &str = "float(arr[-1] + df['f'].iloc[-1])";

struct Row {
    size: &'static str,
    imports: Duration,
    stored: u64,
    snapshot: Duration,
    restore: Duration,
    first_call: Duration,
    warm_call: Duration,
}

async fn measure(size: &'static str, bytes: u64, runs: usize) -> Row {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR").to_string() + "/target").unwrap();
    let store = SnapshotStore::open(home.path().join("snapshots"), &home.path().join("key"))
        .unwrap()
        .with_limit(4 << 30);
    let binding = SnapshotBinding::new("bench", Vec::new());
    let ex = executor(ws.path()).await;
    ex.execute(&build(bytes), None).await.unwrap();
    let mut warm = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        ex.execute(CALL, None).await.unwrap();
        warm.push(t.elapsed());
    }
    let mut snapshots = Vec::new();
    let mut stored = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let report = ex.snapshot(&store, &binding, None).await.unwrap();
        snapshots.push(t.elapsed());
        stored = report.manifest.data_bytes;
    }
    ex.stop().await;

    let mut imports = Vec::new();
    for _ in 0..runs {
        let ex = executor(ws.path()).await;
        let t = Instant::now();
        ex.execute("import numpy, pandas", None).await.unwrap();
        imports.push(t.elapsed());
        ex.stop().await;
    }
    let mut restores = Vec::new();
    let mut firsts = Vec::new();
    for _ in 0..runs {
        let ex = executor(ws.path()).await;
        let t = Instant::now();
        let report = ex.restore(&store, &binding, None).await.unwrap();
        restores.push(t.elapsed());
        assert!(report.complete(), "{}", report.text());
        let t = Instant::now();
        ex.execute(CALL, None).await.unwrap();
        firsts.push(t.elapsed());
        ex.stop().await;
    }
    Row {
        size,
        imports: median(imports),
        stored,
        snapshot: median(snapshots),
        restore: median(restores),
        first_call: median(firsts),
        warm_call: median(warm),
    }
}

fn main() {
    if !python().exists() {
        println!(
            "skipped: {} is missing (run `bash scripts/test-env.sh`)",
            python().display()
        );
        return;
    }
    common::run(|| async {
        let sizes: [(&str, u64, usize); 4] = [
            ("1 MB", 1_000_000, 7),
            ("10 MB", 10_000_000, 7),
            ("100 MB", 100_000_000, 3),
            ("1 GB", 1_000_000_000, 2),
        ];
        let max_mb: u64 = std::env::var("IPYBOX_BENCH_SNAPSHOT_MAX_MB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        let mut rows = Vec::new();
        for (size, bytes, runs) in sizes {
            if bytes / 1_000_000 > max_mb {
                continue;
            }
            eprintln!("measuring {size} ...");
            rows.push(measure(size, bytes, runs).await);
        }
        println!(
            "| namespace | stored | snapshot | restore | of which `import numpy, pandas` (fresh kernel) | restore less imports | first call after restore | same call, warm session |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {:.1} MB | {} | {} | {} | {} | {} | {} |",
                r.size,
                r.stored as f64 / 1e6,
                ms(r.snapshot),
                ms(r.restore),
                ms(r.imports),
                ms(r.restore.saturating_sub(r.imports)),
                ms(r.first_call),
                ms(r.warm_call)
            );
        }
    });
}
