//! The kernel engine against a real ipykernel: state, output assembly, errors, timeouts,
//! kernel death, environment isolation, reset, serialization, cleanup.

use std::path::Path;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::executor::{ExecutionEvent, ExecutorError};
use ipybox::kernel::KernelError;

use crate::support::{executor, run, thousand_random_sizes_arrive_intact, wait_gone};

#[tokio::test(flavor = "multi_thread")]
async fn state_expressions_stdout_and_stderr() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    assert_eq!(run(&ex, "x = 6 * 7").await, "");
    assert_eq!(run(&ex, "x").await, "42");
    assert_eq!(run(&ex, "print(x + 1)\nx * 2").await, "43\n84");
    assert_eq!(
        run(
            &ex,
            "import sys\nprint('out')\nprint('err', file=sys.stderr)"
        )
        .await,
        "out\nerr"
    );
    assert_eq!(run(&ex, "'  padded  '").await, "'  padded  '");
    assert_eq!(
        run(
            &ex,
            "print('  leading and trailing whitespace is stripped  \\n\\n')"
        )
        .await,
        "leading and trailing whitespace is stripped"
    );
    // cwd is the workspace and the workspace is importable
    std::fs::write(ws.path().join("helper_mod.py"), "VALUE = 'imported'\n").unwrap();
    assert_eq!(
        run(
            &ex,
            "import os, helper_mod\nprint(os.getcwd())\nprint(helper_mod.VALUE)"
        )
        .await,
        format!("{}\nimported", ws.path().canonicalize().unwrap().display())
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_carry_traceback_and_prior_output_without_colour() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    let err = ex
        .execute(
            "print('before')\ndef f():\n    raise ValueError('boom')\nf()",
            None,
        )
        .await
        .unwrap_err();
    match &err {
        ExecutorError::Kernel(KernelError::Failed {
            ename,
            evalue,
            traceback,
            output,
        }) => {
            assert_eq!(ename, "ValueError");
            assert_eq!(evalue, "boom");
            assert_eq!(output, "before");
            assert!(traceback.ends_with("ValueError: boom"), "{traceback}");
            assert!(traceback.contains("----> 4 f()"), "{traceback}");
            assert!(
                !traceback.contains('\u{1b}'),
                "colour codes in {traceback:?}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(err.output(), "before");
    assert!(!err.to_string().contains('\u{1b}'));
    // A syntax error is an error too, and the kernel keeps going.
    let err = ex.execute("def (", None).await.unwrap_err();
    assert!(
        matches!(&err, ExecutorError::Kernel(KernelError::Failed { ename, .. }) if ename == "SyntaxError"),
        "{err:?}"
    );
    // input() does not hang: stdin is not available to agent code.
    let err = ex
        .execute("input('name? ')", Some(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ExecutorError::Kernel(KernelError::Failed { ename, .. }) if ename == "StdinNotImplementedError"),
        "{err:?}"
    );
    assert_eq!(run(&ex, "1 + 1").await, "2");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn thousand_executions_with_random_sizes_arrive_intact() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    thousand_random_sizes_arrive_intact(&ex, "local kernel").await;
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_megabytes_arrive_intact() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    crate::support::ten_megabytes_arrive_intact(&ex, "local kernel").await;
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn png_display_data_becomes_an_image_file() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    let code = r#"
import struct, zlib
from IPython.display import Image, display
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
raw = b''.join(b'\x00' + b'\xff\x00\x00' * 4 for _ in range(4))
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 4, 4, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')
open('expected.png', 'wb').write(png)
print('shown:')
display(Image(data=png))
"#;
    let result = ex.execute(code, None).await.unwrap();
    assert_eq!(result.text, "shown:");
    assert_eq!(result.images.len(), 1);
    let image = &result.images[0];
    assert_eq!(
        image.parent().unwrap(),
        ws.path().canonicalize().unwrap().join("images")
    );
    let name = image.file_name().unwrap().to_str().unwrap();
    assert!(
        name.len() == 12
            && name.ends_with(".png")
            && name[..8].chars().all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );
    assert_eq!(
        std::fs::read(image).unwrap(),
        std::fs::read(ws.path().join("expected.png")).unwrap()
    );
    ex.stop().await;
}

/// Runs `code` (which prints `started`, then waits 30 s) with a 1 s timeout: it must time out
/// within `within`, keep the prior output, the kernel and its state.
async fn times_out_keeping_state(code: &str, within: Duration) {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    run(&ex, "kept = 'still here'").await;
    let pid = ex.kernel_pid().await;
    let start = Instant::now();
    let err = ex
        .execute(code, Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(start.elapsed() < within, "took {:?}", start.elapsed());
    match &err {
        ExecutorError::Kernel(KernelError::Timeout {
            seconds,
            state_kept,
            output,
        }) => {
            assert_eq!(*seconds, 1.0);
            assert!(*state_kept);
            assert_eq!(output, "started");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "execution timed out after 1 s and was interrupted; kernel state was kept"
    );
    assert_eq!(run(&ex, "kept").await, "'still here'");
    assert_eq!(ex.kernel_pid().await, pid);
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_interrupts_and_keeps_state() {
    times_out_keeping_state(
        "import time\nprint('started')\ntime.sleep(30)",
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_proof_code_restarts_the_kernel() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build(); // with a warm spare
    ex.start().await.unwrap();
    run(&ex, "lost = 1").await;
    let old = ex.kernel_pid().await.unwrap();
    let code = "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass";
    let err = ex
        .execute(code, Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExecutorError::Kernel(KernelError::Timeout {
                state_kept: false,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("kernel restarted, state lost"),
        "{err}"
    );
    assert!(
        wait_gone(old, Duration::from_secs(3)).await,
        "old kernel {old} still running"
    );
    let err = ex.execute("lost", None).await.unwrap_err();
    assert!(
        matches!(&err, ExecutorError::Kernel(KernelError::Failed { ename, .. }) if ename == "NameError")
    );
    assert_eq!(run(&ex, "'fresh'").await, "'fresh'");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn os_exit_and_sigkill_are_noticed_and_recovered() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    let start = Instant::now();
    let err = ex
        .execute(
            "import os\nprint('bye', flush=True)\nos._exit(3)",
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
    // Noticed at once, not at the 30 s timeout (5 s leaves room for a loaded machine).
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "noticed after {:?}",
        start.elapsed()
    );
    assert_eq!(
        err.to_string(),
        "kernel died (exit code 3) — restarted, state lost"
    );
    assert_eq!(run(&ex, "'next runs'").await, "'next runs'");

    // SIGKILL from outside while code runs
    let pid = ex.kernel_pid().await.unwrap();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        Instant::now()
    });
    let err = ex
        .execute("import time\ntime.sleep(20)", Some(Duration::from_secs(30)))
        .await
        .unwrap_err();
    let killed_at = killer.await.unwrap();
    assert!(
        killed_at.elapsed() < Duration::from_secs(5),
        "noticed {:?} after the kill",
        killed_at.elapsed()
    );
    assert_eq!(
        err.to_string(),
        "kernel died (killed by signal 9 (SIGKILL)) — restarted, state lost"
    );
    assert_eq!(run(&ex, "'recovered'").await, "'recovered'");

    // SIGKILL while idle: the next execution reports it (the code did not run), then all is well.
    let pid = ex.kernel_pid().await.unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(wait_gone(pid, Duration::from_secs(2)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = ex.execute("'not run'", None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel died (killed by signal 9 (SIGKILL)) — restarted, state lost; the code was not run"
    );
    assert_eq!(run(&ex, "'again'").await, "'again'");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kernel_env_is_minimal_plus_what_the_caller_adds() {
    let ws = tempfile::tempdir().unwrap();
    // CARGO_MANIFEST_DIR is in this test process's environment; it must not reach the kernel.
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .kernel_env([("IPYBOX_TEST_VAR", "from kernel_env"), ("LANG", "C.UTF-8")])
        .build();
    ex.start().await.unwrap();
    let out = run(&ex, "import os\nprint(os.environ.get('CARGO_MANIFEST_DIR'))\nprint(os.environ['IPYBOX_TEST_VAR'])\nprint(os.environ['LANG'])\nprint(bool(os.environ.get('HOME')), bool(os.environ.get('PATH')), bool(os.environ.get('TMPDIR')))").await;
    assert_eq!(out, "None\nfrom kernel_env\nC.UTF-8\nTrue True True");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_gives_a_fresh_kernel_quickly() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    run(&ex, "gone = True").await;
    let old = ex.kernel_pid().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // let the spare come up
    let start = Instant::now();
    ex.reset().await.unwrap();
    let out = ex.execute("'gone' in globals()", None).await.unwrap().text;
    let took = start.elapsed();
    assert_eq!(out, "False");
    assert_ne!(ex.kernel_pid().await.unwrap(), old);
    assert!(
        took < Duration::from_millis(500),
        "reset -> next result took {took:?} (warm spare not used?)"
    );
    assert!(wait_gone(old, Duration::from_secs(3)).await);
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn three_spares_cover_three_resets_in_a_row() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .spare_kernels(3)
        .build();
    ex.start().await.unwrap();
    // With the kernel factory, the spares start at the first reset (that one forks its kernel).
    let runtime = ex.runtime_dir().await.unwrap();
    let mut pids = vec![ex.kernel_pid().await.unwrap()];
    for i in 0..3 {
        run(&ex, &format!("mark = {i}")).await;
        ex.reset().await.unwrap();
        assert_eq!(run(&ex, "'mark' in globals()").await, "False");
        pids.push(ex.kernel_pid().await.unwrap());
    }
    let mut distinct = pids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        4,
        "every reset gives another kernel: {pids:?}"
    );
    for old in &pids[..3] {
        assert!(
            wait_gone(*old, Duration::from_secs(3)).await,
            "kernel {old} left running"
        );
    }
    ex.stop().await;
    assert!(wait_gone(pids[3], Duration::from_secs(3)).await);
    // Spares went with the executor: no process runs a connection file from its directory.
    assert!(!runtime.exists());
    let marker = runtime.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker))
        .collect();
    assert!(left.is_empty(), "kernels left running: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn diagnostics_answer_while_a_cell_runs() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    let pid = ex.kernel_pid().await.unwrap();
    let runtime = ex.runtime_dir().await.unwrap();
    let cell = {
        let ex = ex.clone();
        tokio::spawn(async move { ex.execute("import time; time.sleep(5); 'done'", None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // None of these waits for the 5 s cell (they used to wait for the execution lock).
    let quick = Duration::from_secs(1);
    assert_eq!(
        tokio::time::timeout(quick, ex.kernel_pid()).await,
        Ok(Some(pid))
    );
    assert_eq!(
        tokio::time::timeout(quick, ex.runtime_dir()).await,
        Ok(Some(runtime))
    );
    assert_eq!(tokio::time::timeout(quick, ex.mcp_sessions()).await, Ok(0));
    assert!(!cell.is_finished());
    assert_eq!(cell.await.unwrap().unwrap().text, "'done'");
    ex.stop().await;
    assert_eq!(ex.kernel_pid().await, None);
    assert_eq!(ex.runtime_dir().await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_callers_are_serialized() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    run(&ex, "log = []").await;
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let ex = ex.clone();
            tokio::spawn(async move {
                ex.execute(&format!("import time\nlog.append(('start', {i}))\ntime.sleep(0.2)\nlog.append(('end', {i}))\n{i}"), None).await
            })
        })
        .collect();
    let mut outs = Vec::new();
    for t in tasks {
        outs.push(t.await.unwrap().unwrap().text);
    }
    outs.sort();
    assert_eq!(outs, ["0", "1", "2", "3"]);
    // Never two at once: every start is followed by its own end.
    let out = run(
        &ex,
        "all(log[k][0] == 'start' and log[k + 1] == ('end', log[k][1]) for k in range(0, 8, 2))",
    )
    .await;
    assert_eq!(out, "True");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_yields_chunks_as_they_come() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    let mut execution = ex.stream(
        "import time\nprint('one', flush=True)\ntime.sleep(0.5)\nprint('two')",
        None,
    );
    let start = Instant::now();
    let mut chunks = Vec::new();
    let mut result = None;
    while let Some(ev) = execution.next().await {
        match ev {
            ExecutionEvent::Chunk(c) => chunks.push((c, start.elapsed())),
            ExecutionEvent::Image(_) | ExecutionEvent::Approval(_) => panic!("only text expected"),
            ExecutionEvent::Result(r) => result = Some(r.unwrap()),
        }
    }
    assert_eq!(
        chunks.iter().map(|c| c.0.as_str()).collect::<String>(),
        "one\ntwo\n"
    );
    assert_eq!(chunks[0].0, "one\n");
    assert!(
        chunks[0].1 < Duration::from_millis(400),
        "first chunk came late: {:?}",
        chunks[0].1
    );
    assert_eq!(result.unwrap().text, "one\ntwo");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_leaves_no_processes_or_sockets() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder().workspace(ws.path()).build();
    ex.start().await.unwrap();
    // With the kernel factory, the spare starts at the first reset.
    ex.reset().await.unwrap();
    let child = run(
        &ex,
        "import subprocess\np = subprocess.Popen(['sleep', '60'])\np.pid",
    )
    .await;
    let child: u32 = child.parse().unwrap();
    let pid = ex.kernel_pid().await.unwrap();
    let dir = ex.runtime_dir().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // let the spare start too
    let sockets: Vec<_> = walk(&dir)
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("k-"))
        .collect();
    assert!(
        sockets.len() >= 5,
        "expected IPC sockets in {}: {sockets:?}",
        dir.display()
    );
    // The kernel factory's template, the current kernel and the spare (forked from the
    // template, so its descendants, not our children).
    let mut procs = executor_processes(&dir);
    let waiting = Instant::now();
    while procs.len() < 3 && waiting.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        procs = executor_processes(&dir);
    }
    assert_eq!(
        procs.len(),
        3,
        "template, current and spare kernel expected: {procs:?}"
    );
    assert!(procs.contains(&pid), "{pid} not among {procs:?}");
    ex.stop().await;
    assert!(
        wait_gone(pid, Duration::from_secs(2)).await,
        "kernel {pid} survived stop"
    );
    assert!(
        wait_gone(child, Duration::from_secs(2)).await,
        "kernel's child {child} survived stop"
    );
    for p in procs {
        assert!(
            wait_gone(p, Duration::from_secs(2)).await,
            "process {p} survived stop"
        );
    }
    assert!(!dir.exists(), "runtime dir {} left behind", dir.display());
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// Pids of the processes this test process started (children and their descendants, so forked
/// kernels too) whose command line mentions `dir` (the runtime directory: the kernel factory's
/// template and every kernel it forks carry the template's command line, which names
/// `dir/factory/sock`).
fn executor_processes(dir: &Path) -> Vec<u32> {
    crate::proc_tree::descendants(std::process::id())
        .into_iter()
        .filter(|pid| {
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmd.contains(&*dir.to_string_lossy())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn stopped_executor_says_to_start() {
    let ex = CodeExecutor::builder()
        .workspace(tempfile::tempdir().unwrap().path())
        .build();
    let err = ex.execute("1", None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the code executor is stopped\n  help: call start() before executing code"
    );
}

/// ipykernel sends buffered output from a timer 0.2 s after the first write; a timer left over
/// from one execution can fire while the next one writes and ends. That output must still arrive
/// before the next execution counts as complete.
#[tokio::test(flavor = "multi_thread")]
async fn output_racing_the_background_flush_is_not_lost() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    for i in 0..80u64 {
        run(&ex, "print('.', end='')").await; // arms the 0.2 s flush timer
        tokio::time::sleep(Duration::from_micros(190_000 + (i % 21) * 1_000)).await;
        let n = 50_000 + (i as usize * 7919) % 50_000;
        let out = run(&ex, &format!("print('{i}:' + 'y' * {n}, end='')")).await;
        assert_eq!(
            out.len(),
            n + format!("{i}:").len(),
            "execution {i} lost output"
        );
    }
    ex.stop().await;
}

/// A caller that drops `execute()` (here through `tokio::time::timeout`) does not leave the code
/// running: it is interrupted at once, state is kept, and the next execution runs right away.
#[tokio::test(flavor = "multi_thread")]
async fn dropping_an_execution_interrupts_it() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    run(&ex, "kept = 'yes'\nimport time").await;
    let dropped = tokio::time::timeout(
        Duration::from_millis(500),
        ex.execute("time.sleep(30)\nkept = 'overwritten'", None),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the execution should still be running when dropped"
    );
    let start = Instant::now();
    assert_eq!(run(&ex, "kept").await, "'yes'");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "next execution waited {:?}",
        start.elapsed()
    );
    ex.stop().await;
}

/// `Canceller::cancel` interrupts a streamed execution from another task: the stream ends with
/// `Cancelled` (no result), the kernel keeps its state and the next execution runs at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_stream_ends_without_a_result_and_keeps_state() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    run(&ex, "kept = 'yes'\nimport time").await;
    let mut stream = ex.stream(
        "print('started', flush=True)\ntime.sleep(30)\nkept = 'no'",
        None,
    );
    let canceller = stream.canceller();
    let start = Instant::now();
    let mut chunks = String::new();
    let result = loop {
        match stream.next().await.expect("a result") {
            ExecutionEvent::Chunk(text) => {
                chunks.push_str(&text);
                canceller.cancel();
            }
            ExecutionEvent::Result(r) => break r,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(chunks, "started\n");
    assert!(
        matches!(result, Err(ExecutorError::Cancelled)),
        "{result:?}"
    );
    assert!(stream.next().await.is_none());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(run(&ex, "kept").await, "'yes'");
    // Cancelling after the end does nothing.
    canceller.cancel();
    assert_eq!(run(&ex, "print('after')").await, "after");
    ex.stop().await;
}

/// `restore_working_dir(true)`: a cell that leaves the workspace is followed by a change back,
/// announced in that cell's output; cells that stay print nothing extra. Reset keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn restore_working_dir_changes_back_after_each_cell() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().canonicalize().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(&dir)
        .restore_working_dir(true)
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    assert_eq!(
        run(&ex, "import os\nprint(os.getcwd())").await,
        dir.display().to_string()
    );
    assert_eq!(
        run(&ex, "os.chdir('/')\nprint(os.getcwd())").await,
        format!("/\n[ipybox] cwd reset to {}", dir.display())
    );
    assert_eq!(
        run(&ex, "print(os.getcwd())").await,
        dir.display().to_string()
    );
    ex.reset().await.unwrap();
    assert_eq!(
        run(&ex, "import os\nos.chdir('/tmp')").await,
        format!("[ipybox] cwd reset to {}", dir.display())
    );
    ex.stop().await;

    // Off (the default): a cd persists.
    let ex = executor(&dir).await;
    assert_eq!(run(&ex, "import os\nos.chdir('/')").await, "");
    assert_eq!(run(&ex, "print(os.getcwd())").await, "/");
    ex.stop().await;
}

/// A runtime base (`$XDG_RUNTIME_DIR`) too long for the Unix sockets below it is refused at
/// start with the limit, the socket path and the variable named (issue 49: a bare "path must be
/// shorter than SUN_LEN" with "help: choose a writable directory", from the tool server's
/// bind). Control: a base one byte shorter, the longest that fits with this process's id,
/// starts and runs a cell, its sockets in that base.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_base_too_long_for_its_sockets_is_named_at_start() {
    use ipybox::kernel::SOCKET_PATH_MAX;
    let ws = tempfile::tempdir().unwrap();
    let t = tempfile::tempdir().unwrap();
    // `<base>/ipybox-<pid>-<6 hex>/box/k<up to 6 digits>/k-5`, a kernel's IPC socket.
    let below = format!("/ipybox-{}-000000/box/k999999/k-5", std::process::id());
    let longest_base = SOCKET_PATH_MAX - below.len();
    let base_of = |len: usize| {
        let pad = len - t.path().as_os_str().len() - 1;
        let base = t
            .path()
            .join(format!("{len}{}", "b".repeat(pad - len.to_string().len())));
        std::fs::create_dir_all(&base).unwrap();
        assert_eq!(base.as_os_str().len(), len);
        base
    };
    let start = |base: &Path| {
        let mut vars = crate::support::process_env();
        vars.insert("XDG_RUNTIME_DIR".into(), base.display().to_string());
        CodeExecutor::builder()
            .host_env(ipybox::host_env::HostEnv::from_vars(vars))
            .workspace(ws.path())
            .without_spare_kernel()
            .build()
    };

    let too_long = base_of(longest_base + 1);
    let ex = start(&too_long);
    let err = ex.start().await.expect_err("a base too long is refused");
    let text = err.to_string();
    assert!(matches!(err, ExecutorError::SocketPath(_)), "{err:?}");
    for part in [
        format!("cannot make a runtime directory in {}", too_long.display()),
        format!("would be {} bytes", SOCKET_PATH_MAX + 1),
        format!("a socket path has at most {SOCKET_PATH_MAX}"),
        format!("help: set XDG_RUNTIME_DIR to a directory of at most {longest_base} bytes"),
    ] {
        assert!(text.contains(&part), "{part:?} in {text}");
    }
    assert_eq!(
        std::fs::read_dir(&too_long).unwrap().count(),
        0,
        "nothing made"
    );

    let fits = base_of(longest_base);
    let ex = start(&fits);
    ex.start().await.expect("the longest base that fits starts");
    assert_eq!(run(&ex, "6 * 7").await, "42");
    let runtime: Vec<_> = std::fs::read_dir(&fits).unwrap().flatten().collect();
    assert_eq!(runtime.len(), 1, "{runtime:?}");
    assert!(runtime[0].path().join("tools.sock").exists());
    ex.stop().await;
}
