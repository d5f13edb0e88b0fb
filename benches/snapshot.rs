//! Session snapshot benchmark: prints tables (run with `cargo bench --bench snapshot`; needs
//! `bash scripts/test-env.sh`, which makes `target/test-env/kernel-data`, the kernel interpreter
//! with numpy and pandas; without it the bench says so and skips).
//!
//! Table 1, for namespaces of 1 MB, 10 MB, 100 MB and 1 GB of numpy/pandas objects (half a float
//! array, half a DataFrame of float, int and bool columns, plus a few small variables) and 10 MB
//! of plain Python objects (a list of dicts):
//! - snapshot: `CodeExecutor::snapshot` (the kernel pickles into the runtime directory, the host
//!   copies, hashes, seals and stores, flushed to disk);
//! - restore into a fresh kernel: a new executor whose kernel factory preloads nothing
//!   (`IPYBOX_KERNEL_PRELOAD=none`, as before the preload existed): verify the seal, copy and
//!   check the data, the kernel imports numpy and pandas and loads the names;
//! - restore into a template-forked kernel: a new executor sharing a warm kernel factory
//!   (`SharedKernelFactory`, as the sessions of `ipybox serve --http` do) whose template has
//!   preloaded numpy and pandas (the default `IPYBOX_KERNEL_PRELOAD`);
//! - the first `print(1)` after a restore (into the forked kernel) against a warm session's.
//!
//! Table 2, where a 10 MB restore's time goes: the host's part (read, SHA-256 and copy of the
//! stored data, as `copy_verified` does), and the kernel's (importing the snapshot's modules,
//! unpickling the names), timed inside a fresh kernel and inside a template-forked one.
//!
//! Target (issue 30): restoring a 10 MB namespace <= 100 ms. `IPYBOX_BENCH_SNAPSHOT_MAX_MB`
//! leaves out the larger namespaces (e.g. `100` skips the 1 GB one).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::host_env::HostEnv;
use ipybox::kernel::SharedKernelFactory;
use ipybox::snapshot::{SnapshotBinding, SnapshotStore};
use sha2::Digest;

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

fn python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-env/kernel-data/bin/python")
}

/// The process environment with `IPYBOX_KERNEL_PRELOAD` set to `preload`.
fn host(preload: &str) -> HostEnv {
    let mut vars = HostEnv::from_process().vars().clone();
    vars.insert("IPYBOX_KERNEL_PRELOAD".into(), preload.into());
    HostEnv::from_vars(vars)
}

/// A started executor: with its own kernel factory that preloads nothing (`shared: None`), or
/// forking from `shared`.
async fn executor(ws: &Path, shared: Option<&SharedKernelFactory>) -> CodeExecutor {
    let mut b = CodeExecutor::builder()
        .workspace(ws)
        .python(python())
        .without_spare_kernel();
    b = match shared {
        Some(f) => b
            .shared_kernel_factory(f.clone())
            .host_env(host("numpy,pandas")),
        None => b.host_env(host("none")),
    };
    let ex = b.build();
    ex.start().await.unwrap();
    ex
}

#[derive(Clone, Copy)]
enum Kind {
    Data,
    Plain,
}

/// Cell that builds a namespace of about `bytes` bytes.
fn build(kind: Kind, bytes: u64) -> String {
    match kind {
        Kind::Data => {
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
        // About 48 pickled bytes per row.
        Kind::Plain => format!(
            "rows = [{{'id': i, 'name': f'item-{{i:08d}}', 'score': i * 0.5, 'ok': i % 3 == 0}} for i in range({n})]\n\
             index = {{r['name']: r['id'] for r in rows[:1000]}}\n\
             label = 'namespace'\n\
             def score(v):\n    return v * 0.1\n",
            n = bytes / 58,
        ),
    }
}

struct Row {
    size: String,
    stored: u64,
    snapshot: Duration,
    restore_fresh: Duration,
    restore_forked: Duration,
    first_print: Duration,
    warm_print: Duration,
}

/// A shared factory whose template has preloaded numpy and pandas: waits until a kernel forked
/// from it has them imported before any code ran.
async fn warm_factory(ws: &Path) -> SharedKernelFactory {
    let factory = SharedKernelFactory::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ex = executor(ws, Some(&factory)).await;
        let out = ex
            .execute(
                "import sys; print('numpy' in sys.modules and 'pandas' in sys.modules)",
                None,
            )
            .await
            .unwrap();
        ex.stop().await;
        if out.text == "True" {
            return factory;
        }
        assert!(
            Instant::now() < deadline,
            "the template did not preload numpy and pandas within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn print_time(ex: &CodeExecutor) -> Duration {
    let t = Instant::now();
    let out = ex.execute("print(1)", None).await.unwrap();
    let d = t.elapsed();
    assert_eq!(out.text, "1");
    d
}

async fn measure(
    factory: &SharedKernelFactory,
    kind: Kind,
    size: String,
    bytes: u64,
    runs: usize,
) -> Row {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR").to_string() + "/target").unwrap();
    let store = SnapshotStore::open(home.path().join("snapshots"), &home.path().join("key"))
        .unwrap()
        .with_limit(4 << 30);
    let binding = SnapshotBinding::new("bench", Vec::new());
    let ex = executor(ws.path(), Some(factory)).await;
    ex.execute(&build(kind, bytes), None).await.unwrap();
    let mut warm = Vec::new();
    for _ in 0..20 {
        warm.push(print_time(&ex).await);
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

    let mut fresh = Vec::new();
    let mut forked = Vec::new();
    let mut firsts = Vec::new();
    for _ in 0..runs {
        for shared in [None, Some(factory)] {
            let ex = executor(ws.path(), shared).await;
            let t = Instant::now();
            let report = ex.restore(&store, &binding, None).await.unwrap();
            let took = t.elapsed();
            assert!(report.complete(), "{}", report.text());
            if shared.is_some() {
                forked.push(took);
                firsts.push(print_time(&ex).await);
            } else {
                fresh.push(took);
            }
            ex.stop().await;
        }
    }
    Row {
        size,
        stored,
        snapshot: median(snapshots),
        restore_fresh: median(fresh),
        restore_forked: median(forked),
        first_print: median(firsts),
        warm_print: median(warm),
    }
}

/// The kernel's part of a restore of the snapshot stored at `dir`, timed inside the kernel:
/// (imports, unpickling the names).
async fn kernel_parts(ex: &CodeExecutor, dir: &Path) -> (Duration, Duration) {
    let code = format!(
        "import importlib, json, time\n\
         from ipybox_runtime import snapshot as _s\n\
         _m = json.load(open({dir:?} + '/manifest.json'))\n\
         _t0 = time.perf_counter()\n\
         for _n in _m['imports'] + [m['module'] for m in _m['modules']]: importlib.import_module(_n)\n\
         _t1 = time.perf_counter()\n\
         with open({dir:?} + '/data', 'rb') as _f: _r = _s.restore(_f, _m, {{}})\n\
         _t2 = time.perf_counter()\n\
         assert not _r['failed'], _r\n\
         print(_t1 - _t0, _t2 - _t1)",
        dir = dir.display().to_string()
    );
    let out = ex.execute(&code, None).await.unwrap();
    let parts: Vec<f64> = out
        .text
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    (
        Duration::from_secs_f64(parts[0]),
        Duration::from_secs_f64(parts[1]),
    )
}

/// The host's part: read the stored data, SHA-256 it and copy it to a new file (what
/// `copy_verified` does for the kernel), flushed as the copy is.
fn host_part(data: &Path) -> Duration {
    let t = Instant::now();
    let mut src = std::fs::File::open(data).unwrap();
    let mut dst = tempfile::tempfile_in(data.parent().unwrap()).unwrap();
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n]).unwrap();
    }
    let _ = hasher.finalize();
    t.elapsed()
}

struct Parts {
    what: &'static str,
    host: Duration,
    fresh: (Duration, Duration),
    forked: (Duration, Duration),
}

async fn breakdown(
    factory: &SharedKernelFactory,
    what: &'static str,
    kind: Kind,
    runs: usize,
) -> Parts {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR").to_string() + "/target").unwrap();
    let store = SnapshotStore::open(home.path().join("snapshots"), &home.path().join("key"))
        .unwrap()
        .with_limit(4 << 30);
    let binding = SnapshotBinding::new("bench", Vec::new());
    let ex = executor(ws.path(), Some(factory)).await;
    ex.execute(&build(kind, 10_000_000), None).await.unwrap();
    ex.snapshot(&store, &binding, None).await.unwrap();
    ex.stop().await;
    let dir = store.path(&binding);
    let mut host = Vec::new();
    let (mut fi, mut fl, mut ki, mut kl) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        host.push(host_part(&dir.join("data")));
        for shared in [None, Some(factory)] {
            let ex = executor(ws.path(), shared).await;
            let (imports, load) = kernel_parts(&ex, &dir).await;
            if shared.is_some() {
                ki.push(imports);
                kl.push(load);
            } else {
                fi.push(imports);
                fl.push(load);
            }
            ex.stop().await;
        }
    }
    Parts {
        what,
        host: median(host),
        fresh: (median(fi), median(fl)),
        forked: (median(ki), median(kl)),
    }
}

fn main() {
    if !python().exists() {
        println!(
            "skipped: {} is missing (run `bash scripts/test-env.sh`: it makes the kernel interpreter with numpy and pandas)",
            python().display()
        );
        return;
    }
    common::run(|| async {
        let max_mb: u64 = std::env::var("IPYBOX_BENCH_SNAPSHOT_MAX_MB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        let ws = tempfile::tempdir().unwrap();
        eprintln!("warming the shared kernel factory (numpy, pandas preloaded) ...");
        let t = Instant::now();
        let factory = warm_factory(ws.path()).await;
        eprintln!("  ready after {}", ms(t.elapsed()));

        eprintln!("measuring where a 10 MB restore's time goes ...");
        let parts = vec![
            breakdown(&factory, "numpy/pandas", Kind::Data, 5).await,
            breakdown(&factory, "plain Python objects", Kind::Plain, 5).await,
        ];

        let sizes: [(Kind, &str, u64, usize); 5] = [
            (Kind::Data, "1 MB", 1_000_000, 7),
            (Kind::Data, "10 MB", 10_000_000, 7),
            (Kind::Plain, "10 MB plain", 10_000_000, 7),
            (Kind::Data, "100 MB", 100_000_000, 3),
            (Kind::Data, "1 GB", 1_000_000_000, 2),
        ];
        let mut rows = Vec::new();
        for (kind, size, bytes, runs) in sizes {
            if bytes / 1_000_000 > max_mb {
                continue;
            }
            eprintln!("measuring {size} ...");
            rows.push(measure(&factory, kind, size.to_string(), bytes, runs).await);
        }
        factory.shutdown().await;

        println!(
            "| namespace | stored | snapshot | restore, fresh kernel | restore, template-forked kernel (numpy, pandas preloaded) | first `print(1)` after restore | `print(1)`, warm session |"
        );
        println!("|---|---|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {:.1} MB | {} | {} | **{}** | {} | {} |",
                r.size,
                r.stored as f64 / 1e6,
                ms(r.snapshot),
                ms(r.restore_fresh),
                ms(r.restore_forked),
                ms(r.first_print),
                ms(r.warm_print)
            );
        }
        println!();
        println!(
            "| 10 MB namespace | host: read + SHA-256 + copy | fresh kernel: imports | fresh kernel: unpickling | forked kernel: imports | forked kernel: unpickling |"
        );
        println!("|---|---|---|---|---|---|");
        for p in parts {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                p.what,
                ms(p.host),
                ms(p.fresh.0),
                ms(p.fresh.1),
                ms(p.forked.0),
                ms(p.forked.1)
            );
        }
    });
}
