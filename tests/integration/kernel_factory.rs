//! The kernel factory against real kernels: a forked kernel sees nothing of its template or of
//! the kernel before it (variables, imports, environment, cwd, random state, descriptors);
//! forks under load (16 resets in a row, 8 executors at once); a template killed while idle or
//! in the middle of a fork, and one that is not safe to fork from (rebuilt, or kernels start
//! plainly, with a log line); what a dead forked kernel started is killed (through its
//! template); the plain launch when the factory is turned off; the spare started at the first
//! reset with the factory and at once without it; no kernel loading debugpy (issue 40). (Packages
//! installed with `install_package` reaching new kernels: `mcp_server`; the sandbox: `sandbox`.)

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::host_env::HostEnv;
use serde_json::json;

use crate::support::{connect_ipybox_with, ok_text, run, wait_gone};

/// The parent of `pid` (from /proc).
fn ppid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

/// The template `pid` was forked from, if its parent is one.
fn template_of(pid: u32) -> Option<u32> {
    let parent = ppid(pid);
    cmdline(parent)
        .contains("ipybox_runtime.factory")
        .then_some(parent)
}

/// The targets of `pid`'s open descriptors that name one pipe or socket (`pipe:[123]`).
fn pipes_and_sockets(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let t = target.display().to_string();
            if t.starts_with("pipe:") || t.starts_with("socket:") {
                out.push(t);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_kernel_sees_nothing_of_the_kernel_before_it() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    let workspace = ex.workspace().unwrap();
    let first = ex.kernel_pid().await.unwrap();
    let template = template_of(first).expect("the kernel is forked from a template");
    // The kernel holds none of the template's pipes and sockets (its stdin and stderr pipes
    // from ipybox, its request channel): only descriptors of its own.
    let shared: Vec<String> = pipes_and_sockets(first)
        .into_iter()
        .filter(|t| pipes_and_sockets(template).contains(t))
        .collect();
    assert_eq!(shared, Vec::<String>::new(), "inherited from the template");

    let draws = "import random, uuid\nprint(random.random(), uuid.uuid4())";
    let out = run(
        &ex,
        &format!(
            "import os, sys, colorsys\nsecret = 42\nos.environ['IPYBOX_LEAK'] = '1'\nos.chdir('sub')\n{draws}"
        ),
    )
    .await;
    let mut seen = vec![out];
    for _ in 0..2 {
        ex.reset().await.unwrap();
        let pid = ex.kernel_pid().await.unwrap();
        assert_eq!(
            template_of(pid),
            Some(template),
            "forked from the same template"
        );
        let isolated = run(
            &ex,
            "import os, sys\nprint('secret' in globals(), 'colorsys' in sys.modules, 'IPYBOX_LEAK' in os.environ, os.getcwd())",
        )
        .await;
        assert_eq!(
            isolated,
            format!("False False False {}", workspace.display())
        );
        seen.push(run(&ex, draws).await);
    }
    // Every kernel draws its own random numbers and UUIDs (Python's `random` was reseeded, not
    // copied from the template).
    let words: Vec<Vec<&str>> = seen.iter().map(|s| s.split(' ').collect()).collect();
    for i in 0..words.len() {
        for j in i + 1..words.len() {
            assert_ne!(words[i][0], words[j][0], "random.random(): {seen:?}");
            assert_ne!(words[i][1], words[j][1], "uuid.uuid4(): {seen:?}");
        }
    }
    // stdin is the kernel's lifeline to ipybox: a socket.
    assert_eq!(
        run(
            &ex,
            "import os, stat\nprint(stat.S_ISSOCK(os.fstat(0).st_mode))"
        )
        .await,
        "True"
    );
    ex.stop().await;
    assert!(wait_gone(template, Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_resets_in_a_row_each_fork_a_fresh_kernel() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    let template = template_of(ex.kernel_pid().await.unwrap()).expect("forked");
    let mut pids = Vec::new();
    let mut took = Vec::new();
    for i in 0..16 {
        run(&ex, &format!("mark = {i}")).await;
        let t = Instant::now();
        ex.reset().await.unwrap();
        assert_eq!(run(&ex, "'mark' in globals()").await, "False");
        took.push(t.elapsed());
        let pid = ex.kernel_pid().await.unwrap();
        assert_eq!(template_of(pid), Some(template), "reset {i}: not forked");
        pids.push(pid);
    }
    eprintln!("16 resets in a row, reset -> result: {took:?}");
    let mut distinct = pids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 16, "{pids:?}");
    for old in &pids[..15] {
        assert!(wait_gone(*old, Duration::from_secs(3)).await, "{old} left");
    }
    ex.stop().await;
    assert!(wait_gone(pids[15], Duration::from_secs(3)).await);
    assert!(wait_gone(template, Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_executors_fork_their_kernels_at_once() {
    let dirs: Vec<_> = (0..8).map(|_| tempfile::tempdir().unwrap()).collect();
    let executors: Vec<CodeExecutor> = dirs
        .iter()
        .map(|d| CodeExecutor::builder().workspace(d.path()).build())
        .collect();
    let outs = futures::future::join_all(executors.iter().enumerate().map(|(i, ex)| async move {
        ex.start().await.unwrap();
        run(ex, &format!("import os\nprint({i}, os.getpid())")).await
    }))
    .await;
    let mut templates = Vec::new();
    let mut kernels = Vec::new();
    for (i, out) in outs.iter().enumerate() {
        let (n, pid) = out.split_once(' ').unwrap();
        assert_eq!(n, i.to_string());
        let pid: u32 = pid.parse().unwrap();
        assert_eq!(executors[i].kernel_pid().await, Some(pid));
        templates.push(template_of(pid).expect("forked"));
        kernels.push(pid);
    }
    templates.sort();
    templates.dedup();
    assert_eq!(templates.len(), 8, "one template per executor");
    futures::future::join_all(executors.iter().map(CodeExecutor::stop)).await;
    for pid in kernels.into_iter().chain(templates) {
        assert!(wait_gone(pid, Duration::from_secs(3)).await, "{pid} left");
    }
}

/// `(pid, parent pid)` of the kernel, asked through the MCP server.
async fn kernel_and_parent(s: &ipybox::tools::McpSession) -> (u32, u32) {
    let out = ok_text(
        s,
        "execute_ipython_cell",
        json!({"code": "import os\nprint(os.getpid(), os.getppid())"}),
    )
    .await;
    let (a, b) = out.trim().split_once(' ').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

/// Waits until the server's log (its stderr) holds `needle`.
async fn log_shows(s: &ipybox::tools::McpSession, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let log = s.stderr_tail().unwrap_or_default();
        if log.contains(needle) || start.elapsed() > Duration::from_secs(5) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_template_is_replaced_even_in_the_middle_of_a_fork() {
    let ws = tempfile::tempdir().unwrap();
    let s = connect_ipybox_with(ws.path(), &["--spare-kernels", "0"], &[]).await;
    let server = s.pid().unwrap();
    let (k1, t1) = kernel_and_parent(&s).await;
    assert!(cmdline(t1).contains("ipybox_runtime.factory"), "forked");
    let kill = |pid: u32, sig: i32| unsafe {
        libc::kill(pid as i32, sig);
    };

    // Killed while idle: the kernels it forked live on; the next kernel comes from a new one.
    kill(t1, libc::SIGKILL);
    assert!(wait_gone(t1, Duration::from_secs(3)).await);
    assert_eq!(
        kernel_and_parent(&s).await.0,
        k1,
        "the kernel outlives its template"
    );
    ok_text(&s, "reset", json!({})).await;
    let (k2, t2) = kernel_and_parent(&s).await;
    assert_ne!(k2, k1);
    assert_ne!(t2, t1);
    assert!(cmdline(t2).contains("ipybox_runtime.factory"), "rebuilt");
    let log = log_shows(&s, "the template process exited").await;
    assert!(
        log.contains("kernel factory: the template process exited (killed by signal 9 (SIGKILL))"),
        "{log}"
    );

    // Killed while a fork waits for it (stopped, so the request cannot be answered): the kernel
    // starts without the factory, and the one after comes from a new template.
    kill(t2, libc::SIGSTOP);
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        kill(t2, libc::SIGKILL);
    });
    ok_text(&s, "reset", json!({})).await;
    killer.await.unwrap();
    let (k3, parent) = kernel_and_parent(&s).await;
    assert_eq!(parent, server, "started without the factory");
    assert_ne!(k3, k2);
    let log = log_shows(&s, "the template was lost while forking").await;
    // (Who notices first that the template is gone decides which line says a new one is built:
    // the fork's failure, or the factory letting go of the dead template.)
    assert!(
        log.contains("kernel factory: the template was lost while forking")
            && log.contains("starting the kernel without it"),
        "{log}"
    );
    ok_text(&s, "reset", json!({})).await;
    let (k4, t4) = kernel_and_parent(&s).await;
    assert_ne!(k4, k3);
    assert!(
        cmdline(t4).contains("ipybox_runtime.factory") && t4 != t2,
        "forked from a new template: parent {t4}"
    );
    s.close().await;
    for pid in [k1, k2, k3, k4, t4] {
        assert!(wait_gone(pid, Duration::from_secs(3)).await, "{pid} left");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_that_cannot_fork_safely_is_not_used() {
    let ws = tempfile::tempdir().unwrap();
    // A user's module that starts a thread when Python starts (sitecustomize on the kernel's
    // PYTHONPATH, outside the workspace: entries inside it are only imported from once the
    // kernel is up): forking the template would copy a process with two threads.
    let libs = tempfile::tempdir().unwrap();
    let lib = libs.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::fs::write(
        lib.join("sitecustomize.py"),
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
    )
    .unwrap();
    std::fs::write(
        ws.path().join(".env"),
        format!("KERNEL_ENV_PYTHONPATH={}\n", lib.display()),
    )
    .unwrap();
    let s = connect_ipybox_with(ws.path(), &["--spare-kernels", "0"], &[]).await;
    let server = s.pid().unwrap();
    for _ in 0..4 {
        let (_, parent) = kernel_and_parent(&s).await;
        assert_eq!(parent, server, "started without the factory");
        ok_text(&s, "reset", json!({})).await;
    }
    let log = log_shows(&s, "from now on").await;
    assert!(
        log.contains(
            "kernel factory: the template refused to fork: 2 Python threads run in the template"
        ),
        "{log}"
    );
    assert!(
        log.contains("kernels start without the factory from now on (3 failures in a row)"),
        "{log}"
    );
    s.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plain_launch_stays_selectable() {
    let me = std::process::id();
    let ws = tempfile::tempdir().unwrap();
    let check = |ex: CodeExecutor| async move {
        ex.start().await.unwrap();
        let pid = ex.kernel_pid().await.unwrap();
        assert_eq!(ppid(pid), me, "a child of ipybox, not forked");
        let rt = ex.runtime_dir().await.unwrap();
        assert!(!rt.join("factory/sock").exists(), "no factory");
        assert_eq!(run(&ex, "6 * 7").await, "42");
        ex.stop().await;
    };
    check(
        CodeExecutor::builder()
            .workspace(ws.path())
            .kernel_factory(false)
            .build(),
    )
    .await;
    let mut vars: HashMap<String, String> = std::env::vars().collect();
    vars.insert("IPYBOX_KERNEL_FACTORY".into(), "0".into());
    check(
        CodeExecutor::builder()
            .workspace(ws.path())
            .host_env(HostEnv::from_vars(vars))
            .build(),
    )
    .await;
    // On is the default.
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    assert!(template_of(ex.kernel_pid().await.unwrap()).is_some());
    assert!(Path::new(&ex.runtime_dir().await.unwrap().join("factory/sock")).exists());
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_dead_forked_kernel_started_is_killed_through_its_template() {
    // ipybox signals a forked kernel's group only while the kernel lives (its pid may name
    // another process once the template reaped it); after that, the template kills the group.
    let ws = tempfile::tempdir().unwrap();
    let s = connect_ipybox_with(ws.path(), &["--spare-kernels", "0"], &[]).await;
    let (k1, t1) = kernel_and_parent(&s).await;
    assert!(cmdline(t1).contains("ipybox_runtime.factory"), "forked");
    let out = ok_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "import subprocess\nprint(subprocess.Popen(['sleep', '600']).pid)"}),
    )
    .await;
    let sleep: u32 = out.trim().parse().unwrap();
    assert!(crate::support::pid_alive(sleep), "sleep runs");
    unsafe {
        libc::kill(k1 as i32, libc::SIGKILL);
    }
    assert!(wait_gone(k1, Duration::from_secs(3)).await);
    ok_text(&s, "reset", json!({})).await;
    assert!(
        wait_gone(sleep, Duration::from_secs(5)).await,
        "what the dead kernel started was left running"
    );
    s.close().await;
}

/// The kernel interpreter with numpy and pandas (`scripts/test-env.sh`).
fn data_python() -> std::path::PathBuf {
    crate::support::root().join("target/test-env/kernel-data/bin/python")
}

/// The process environment with `IPYBOX_KERNEL_PRELOAD` set to `preload`.
fn preload_env(preload: &str) -> HostEnv {
    let mut vars = HostEnv::from_process().vars().clone();
    vars.insert("IPYBOX_KERNEL_PRELOAD".into(), preload.into());
    HostEnv::from_vars(vars)
}

/// In the kernel: which of numpy and pandas were imported before any code ran, whether the
/// user namespace has them, and OpenBLAS's thread count against what the kernel's environment
/// asks for (`OPENBLAS_NUM_THREADS`, else the CPUs it may run on).
const PRELOADED: &str = r#"
import sys
print(sorted(m for m in ("numpy", "pandas") if m in sys.modules), "np" in dir(), "pandas" in dir())
"#;

const BLAS: &str = r#"
import ctypes, glob, os
import numpy
lib = ctypes.CDLL(glob.glob(os.path.dirname(numpy.__file__) + ".libs/libscipy_openblas64_*.so")[0])
want = int(os.environ.get("OPENBLAS_NUM_THREADS") or len(os.sched_getaffinity(0)))
print(lib.scipy_openblas_get_num_threads64_() == want, want)
"#;

/// Resets `ex` until its fresh kernel was forked from a template that had preloaded numpy and
/// pandas (the template imports them once idle), and returns what [`PRELOADED`] printed then.
async fn reset_until_preloaded(ex: &CodeExecutor) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        ex.reset().await.unwrap();
        let out = run(ex, PRELOADED).await;
        if out.starts_with("['numpy', 'pandas']") || Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_template_preloads_numpy_and_pandas_for_the_kernels_it_forks() {
    crate::support::require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .python(data_python())
        .without_spare_kernel()
        .host_env(preload_env("numpy,pandas"))
        .build();
    ex.start().await.unwrap();
    // Imported in the template, not in the user namespace.
    assert_eq!(
        reset_until_preloaded(&ex).await,
        "['numpy', 'pandas'] False False"
    );
    // The user's imports work, and the libraries behave as in a kernel that imported them itself.
    let out = run(
        &ex,
        "import numpy as np, pandas as pd\nprint(pd.DataFrame({'a': np.arange(4)}).a.sum(), pd.__name__)",
    )
    .await;
    assert_eq!(out, "6 pandas");
    // BLAS was loaded with one thread (a template with threads cannot fork); the kernel has
    // the thread count its own environment asks for.
    let out = run(&ex, BLAS).await;
    assert!(out.starts_with("True "), "{out}");
    // Two kernels forked from the template do not share numpy's random state.
    let a = run(&ex, "import numpy as np\nprint(np.random.randint(1 << 30))").await;
    ex.reset().await.unwrap();
    let b = run(&ex, "import numpy as np\nprint(np.random.randint(1 << 30))").await;
    assert_ne!(a, b);
    ex.stop().await;

    // A kernel environment that asks for one BLAS thread gets one.
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .python(data_python())
        .without_spare_kernel()
        .host_env(preload_env("numpy"))
        .kernel_env([("OPENBLAS_NUM_THREADS", "1")])
        .build();
    ex.start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        ex.reset().await.unwrap();
        if run(&ex, PRELOADED).await == "['numpy'] False False" || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(run(&ex, PRELOADED).await, "['numpy'] False False");
    assert_eq!(run(&ex, BLAS).await, "True 1");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_preload_off_a_template_imports_no_data_library() {
    crate::support::require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .python(data_python())
        .without_spare_kernel()
        .host_env(preload_env("none"))
        .build();
    ex.start().await.unwrap();
    // Long past the idle time after which a template preloads.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ex.reset().await.unwrap();
    assert_eq!(run(&ex, PRELOADED).await, "[] False False");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_asked_for_while_the_template_preloads_waits_for_the_import() {
    let ws = tempfile::tempdir().unwrap();
    // A preloaded module whose import takes longer than the template may take to answer a
    // fork request otherwise (10 s), as pandas can on a loaded machine. In a library directory
    // of the kernel's PYTHONPATH: the template imports nothing from the workspace.
    let lib = tempfile::tempdir().unwrap();
    std::fs::write(
        lib.path().join("slow_import.py"),
        "import time\ntime.sleep(12)\nREADY = True\n",
    )
    .unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_env([("PYTHONPATH", lib.path().display().to_string())])
        .without_spare_kernel()
        .host_env(preload_env("slow_import"))
        .build();
    ex.start().await.unwrap();
    let first = ex.kernel_pid().await.unwrap();
    let template = template_of(first).expect("forked");
    // The template is idle now: it starts importing slow_import after 0.5 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    ex.reset().await.unwrap();
    let waited = t.elapsed();
    let second = ex.kernel_pid().await.unwrap();
    assert_eq!(
        template_of(second),
        Some(template),
        "forked by the same template, after the import"
    );
    assert!(waited >= Duration::from_secs(8), "{waited:?}");
    assert_eq!(
        run(
            &ex,
            "import sys\nprint('slow_import' in sys.modules, 'slow_import' in dir())"
        )
        .await,
        "True False"
    );
    ex.stop().await;
}

/// The processes of an executor: everything below this test process that runs with its runtime
/// directory in the command line (the template and plain kernels), plus the template's children
/// (forked kernels).
fn executor_processes(runtime: &Path) -> Vec<u32> {
    let marker = runtime.to_string_lossy().into_owned();
    let mut out: Vec<u32> = crate::proc_tree::descendants(std::process::id())
        .into_iter()
        .filter(|pid| cmdline(*pid).contains(&marker))
        .collect();
    out.sort();
    out
}

/// Issue 40: with the kernel factory a spare only pays for a session that resets (a fork is
/// ready in tens of milliseconds), so it is started at the first reset; until then the executor
/// is the template and its kernel. Without the factory (a plain launch takes ~0.4 s) the spare
/// starts with the first kernel, as before.
#[tokio::test(flavor = "multi_thread")]
async fn the_spare_starts_at_the_first_reset_with_the_factory_and_at_once_without() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    for i in 0..5 {
        assert_eq!(run(&ex, &format!("x{i} = {i}; x{i}")).await, i.to_string());
    }
    let rt = ex.runtime_dir().await.unwrap();
    let kernel = ex.kernel_pid().await.unwrap();
    let template = template_of(kernel).expect("a forked kernel");
    // Give a spare that would start every chance to: 3 s (a fork takes ~0.1 s).
    let procs = processes_beyond(&rt, 2, Duration::from_secs(3)).await;
    assert_eq!(
        procs,
        sorted(vec![template, kernel]),
        "template and kernel, no spare"
    );
    ex.reset().await.unwrap();
    assert_eq!(run(&ex, "'x0' in globals()").await, "False");
    let current = ex.kernel_pid().await.unwrap();
    assert_ne!(current, kernel);
    let procs = processes_beyond(&rt, 2, Duration::from_secs(15)).await;
    assert_eq!(
        procs.len(),
        3,
        "template, current kernel and a spare: {procs:?}"
    );
    assert!(
        procs.contains(&template) && procs.contains(&current),
        "{procs:?}"
    );
    let spare = *procs
        .iter()
        .find(|p| **p != template && **p != current)
        .unwrap();
    assert_eq!(
        template_of(spare),
        Some(template),
        "the spare is forked too"
    );
    // The next reset swaps the spare in.
    ex.reset().await.unwrap();
    assert_eq!(ex.kernel_pid().await.unwrap(), spare);
    ex.stop().await;

    // Without the factory: the spare comes up with the first kernel.
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_factory(false)
        .build();
    ex.start().await.unwrap();
    let rt = ex.runtime_dir().await.unwrap();
    let procs = processes_beyond(&rt, 1, Duration::from_secs(15)).await;
    assert_eq!(
        procs.len(),
        2,
        "kernel and spare, launched plainly: {procs:?}"
    );
    ex.stop().await;
}

/// Issue 40: resets that come faster than a forked kernel starts keep a second spare, so two
/// kernels start side by side; the burst ends when a reset finds every spare left ready, or after
/// 3 s without a reset (at the next execution). Launched plainly, kernels keep one spare however
/// fast resets come (the control: the same back-to-back resets add no spare there).
#[tokio::test(flavor = "multi_thread")]
async fn resets_faster_than_a_fork_keep_a_second_spare_until_they_stop() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    let rt = ex.runtime_dir().await.unwrap();
    // The first reset forks its kernel and starts the spare; the second comes while that spare
    // is still starting (a fork takes ~0.1 s).
    let mut old = vec![ex.kernel_pid().await.unwrap()];
    ex.reset().await.unwrap();
    old.push(ex.kernel_pid().await.unwrap());
    ex.reset().await.unwrap();
    let current = ex.kernel_pid().await.unwrap();
    let template = template_of(current).expect("a forked kernel");
    // Once the replaced kernels are gone: the template, the kernel and two spares.
    let procs = settled(&rt, &old, 4).await;
    assert_eq!(procs.len(), 4, "template, kernel and two spares: {procs:?}");
    for pid in procs.iter().filter(|p| ![template, current].contains(p)) {
        assert_eq!(template_of(*pid), Some(template), "a forked spare");
    }
    // Both spares ready: the next reset ends the burst and starts none.
    tokio::time::sleep(Duration::from_secs(1)).await;
    old.push(current);
    ex.reset().await.unwrap();
    assert_eq!(run(&ex, "1 + 1").await, "2");
    let procs = settled(&rt, &old, 3).await;
    assert_eq!(procs.len(), 3, "template, kernel and one spare: {procs:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(executor_processes(&rt), procs, "no spare came back");

    // Another burst, then 3 s without a reset: the next execution stops the extra spare.
    old.push(ex.kernel_pid().await.unwrap());
    ex.reset().await.unwrap();
    old.push(ex.kernel_pid().await.unwrap());
    ex.reset().await.unwrap();
    let procs = settled(&rt, &old, 4).await;
    assert_eq!(procs.len(), 4, "two spares again: {procs:?}");
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(executor_processes(&rt), procs, "kept until the next call");
    assert_eq!(run(&ex, "2 + 2").await, "4");
    let procs = settled(&rt, &old, 3).await;
    assert_eq!(procs.len(), 3, "template, kernel and one spare: {procs:?}");
    ex.stop().await;

    // Launched plainly: one spare, however fast the resets.
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_factory(false)
        .build();
    ex.start().await.unwrap();
    let rt = ex.runtime_dir().await.unwrap();
    processes_beyond(&rt, 1, Duration::from_secs(15)).await;
    let mut old = vec![ex.kernel_pid().await.unwrap()];
    ex.reset().await.unwrap();
    old.push(ex.kernel_pid().await.unwrap());
    ex.reset().await.unwrap();
    settled(&rt, &old, 2).await;
    // Time for a second spare to start, if one were started (a plain launch takes ~0.4 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let procs = executor_processes(&rt);
    assert_eq!(procs.len(), 2, "kernel and one spare: {procs:?}");
    ex.stop().await;
}

/// The executor's processes once those in `gone` have ended and `count` run, or after 15 s.
async fn settled(runtime: &Path, gone: &[u32], count: usize) -> Vec<u32> {
    poll_processes(runtime, Duration::from_secs(15), |procs| {
        procs.len() == count && !procs.iter().any(|p| gone.contains(p))
    })
    .await
}

/// The executor's processes once there are more than `count`, or after `within`.
async fn processes_beyond(runtime: &Path, count: usize, within: Duration) -> Vec<u32> {
    poll_processes(runtime, within, |procs| procs.len() > count).await
}

/// The executor's processes once `done` holds for them, or after `within`.
async fn poll_processes(
    runtime: &Path,
    within: Duration,
    done: impl Fn(&[u32]) -> bool,
) -> Vec<u32> {
    let until = Instant::now() + within;
    let mut procs = executor_processes(runtime);
    while !done(&procs) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        procs = executor_processes(runtime);
    }
    procs
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort();
    v
}

/// Issue 40: no local kernel loads debugpy (pydevd: ~29 MB per process) for the Jupyter debug
/// protocol no ipybox client speaks, forked or launched plainly, and a cell can still import it.
/// The control: the same kernel environment's Python, importing ipykernel's debugger without
/// ipybox's runtime, loads debugpy.
#[tokio::test(flavor = "multi_thread")]
async fn no_kernel_loads_the_debugger_but_a_cell_may_import_it() {
    let ws = tempfile::tempdir().unwrap();
    let probe = "import sys, ipykernel.debugger as d\nprint(d._is_debugpy_available, 'debugpy' in sys.modules, any(m.startswith('pydevd') or m.startswith('_pydevd') for m in sys.modules))";
    for factory in [true, false] {
        let ex = CodeExecutor::builder()
            .workspace(ws.path())
            .kernel_factory(factory)
            .without_spare_kernel()
            .build();
        ex.start().await.unwrap();
        assert_eq!(
            template_of(ex.kernel_pid().await.unwrap()).is_some(),
            factory
        );
        assert_eq!(
            run(&ex, probe).await,
            "False False False",
            "factory {factory}"
        );
        assert_eq!(
            run(
                &ex,
                "import debugpy\nprint(debugpy.__name__, 'debugpy' in sys.modules)"
            )
            .await,
            "debugpy True",
            "factory {factory}"
        );
        ex.stop().await;
    }
    // The control: ipykernel on its own loads it.
    let python = ipybox::pyenv::managed_env_dir(&HostEnv::from_process())
        .unwrap()
        .join("bin/python");
    let out = std::process::Command::new(python)
        .args(["-c", probe])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "True True True"
    );
}
