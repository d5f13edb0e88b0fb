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

/// (PSS, RSS) in kB summed over `pids`, from smaps_rollup.
pub(crate) fn pss_rss(pids: &[u32]) -> (u64, u64) {
    let mut pss = 0;
    let mut rss = 0;
    for pid in pids {
        let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(key), Some(value)) = (words.next(), words.next()) else {
                continue;
            };
            let value: u64 = value.parse().unwrap_or(0);
            match key {
                "Pss:" => pss += value,
                "Rss:" => rss += value,
                _ => {}
            }
        }
    }
    (pss, rss)
}
