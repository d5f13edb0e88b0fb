//! Helpers shared by the benchmarks (included with `#[path]`).
#![allow(dead_code)]

use std::time::Duration;

pub(crate) fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Runs `bench` on a multi-thread runtime once the kernel environment exists (provisioning it
/// first if needed, so it is never part of a measurement).
pub(crate) fn run<F: std::future::Future<Output = ()>>(bench: impl FnOnce() -> F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::task::spawn_blocking(|| {
            let host = ipybox::host_env::HostEnv::from_process();
            ipybox::pyenv::resolve(None, &host, &ipybox::pyenv::log_progress())
                .expect("kernel environment")
        })
        .await
        .unwrap();
        bench().await
    });
}
