//! Session snapshots (`CodeExecutor::snapshot` / `restore`) with real kernels: what comes back
//! (numbers, strings, dicts, numpy arrays, pandas frames, functions, classes, instances,
//! closures, lambdas, pydantic models, modules under aliases, the working directory), what is
//! named as not saved, and what is refused: a snapshot changed by one byte, another session's or
//! another owner's (never unpickled: the test's snapshot runs code when it loads), and links,
//! FIFOs and swapped directories planted by hostile kernel code. Also under `--sandbox`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipybox::CodeExecutor;
use ipybox::sandbox::SandboxOptions;
use ipybox::snapshot::{SnapshotBinding, SnapshotError, SnapshotStore};

use crate::support::{require, root, run};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(120));

fn store(dir: &Path) -> SnapshotStore {
    SnapshotStore::open(dir.join("snapshots"), &dir.join("keys/snapshot.key")).unwrap()
}

fn binding(session: &str) -> SnapshotBinding {
    SnapshotBinding::new(session, b"owner-1".to_vec())
}

/// The kernel interpreter with numpy and pandas (`scripts/test-env.sh`).
fn data_python() -> PathBuf {
    root().join("target/test-env/kernel-data/bin/python")
}

async fn started(
    ws: &Path,
    python: Option<&Path>,
    sandbox: Option<SandboxOptions>,
) -> CodeExecutor {
    let mut b = CodeExecutor::builder().workspace(ws).without_spare_kernel();
    if let Some(p) = python {
        b = b.python(p);
    }
    if let Some(s) = sandbox {
        b = b.sandbox(s);
    }
    let ex = b.build();
    ex.start().await.expect("executor starts");
    ex
}

fn sandbox_options() -> SandboxOptions {
    SandboxOptions {
        srt: Some(root().join("target/sandbox-deps/node_modules/.bin/srt")),
        ..Default::default()
    }
}

/// Cells that define one of everything a model builds, in a workspace with `sub/`.
const BUILD: &str = r#"
import collections as col
import xml.etree.ElementTree
from pydantic import BaseModel
import os
x = 42
pi = 3.25
s = "héllo"
d = {"a": [1, 2, {"b": None}], "t": (1, "two")}
alias = d
big = list(range(1000))
class Point:
    scale = 2
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return (self.x ** 2 + self.y ** 2) * Point.scale
    def __repr__(self):
        return f"Point({self.x}, {self.y})"
p = Point(3, 4)
points = [p, Point(1, 1)]
def make_adder(n):
    def add(v):
        return v + n
    return add
add5 = make_adder(5)
square = lambda v: v * v
def twice_x():
    return x * 2
class Item(BaseModel):
    name: str
    qty: int = 1
item = Item(name="bolt", qty=3)
counter = col.Counter("abracadabra")
os.makedirs("sub", exist_ok=True)
os.chdir("sub")
"#;

/// Checks, in the restored kernel, that everything [`BUILD`] made came back and behaves.
const CHECK: &str = r#"
import os
assert x == 42 and pi == 3.25 and s == "héllo"
assert d == {"a": [1, 2, {"b": None}], "t": (1, "two")}
assert alias is d, "one object under two names stays one object"
assert big == list(range(1000))
assert isinstance(p, Point) and points[0] is p and type(points[1]) is Point
assert p.norm2() == 50, p.norm2()
Point.scale = 3
assert p.norm2() == 75, "instances use the restored class itself"
assert add5(1) == 6 and square(7) == 49
assert twice_x() == 84
x = 10
assert twice_x() == 20, "a cell's function reads the live namespace"
assert item == Item(name="bolt", qty=3) and type(item) is Item
assert Item(name="nut").qty == 1
try:
    Item(name="bad", qty="many")
    raise AssertionError("the model validates")
except Exception as e:
    assert type(e).__name__ == "ValidationError", e
assert counter.most_common(1) == [("a", 5)] and col.Counter is type(counter)
assert xml.etree.ElementTree.fromstring("<r/>").tag == "r"
assert os.getcwd().endswith("/sub"), os.getcwd()
print("all back")
"#;

#[tokio::test]
async fn what_the_model_built_comes_back_in_a_new_executor() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    let ex = started(ws.path(), None, None).await;
    run(&ex, BUILD).await;
    let report = ex.snapshot(&store, &binding("s1"), TIMEOUT).await.unwrap();
    let saved: Vec<(&str, &str)> = report
        .manifest
        .saved
        .iter()
        .map(|s| (s.name.as_str(), s.type_name.as_str()))
        .collect();
    assert_eq!(
        saved,
        [
            ("BaseModel", "class"),
            ("x", "int"),
            ("pi", "float"),
            ("s", "str"),
            ("d", "dict"),
            ("alias", "dict"),
            ("big", "list"),
            ("Point", "class"),
            ("p", "Point"),
            ("points", "list"),
            ("make_adder", "function"),
            ("add5", "function"),
            ("square", "lambda"),
            ("twice_x", "function"),
            ("Item", "class"),
            ("item", "Item"),
            ("counter", "Counter"),
        ]
    );
    let modules: Vec<(&str, &str)> = report
        .manifest
        .modules
        .iter()
        .map(|m| (m.name.as_str(), m.module.as_str()))
        .collect();
    assert_eq!(
        modules,
        [("col", "collections"), ("xml", "xml"), ("os", "os")]
    );
    assert!(
        report.manifest.not_saved.is_empty(),
        "{:?}",
        report.manifest.not_saved
    );
    assert!(
        report
            .manifest
            .imports
            .contains(&"xml.etree.ElementTree".to_string()),
        "{:?}",
        report.manifest.imports
    );
    let sub = ws.path().canonicalize().unwrap().join("sub");
    assert_eq!(report.manifest.cwd.as_deref(), Some(sub.to_str().unwrap()));
    // The kernel keeps its state after a snapshot.
    assert_eq!(run(&ex, "print(p)").await, "Point(3, 4)");
    ex.stop().await;

    let ex = started(ws.path(), None, None).await;
    let report = ex.restore(&store, &binding("s1"), TIMEOUT).await.unwrap();
    assert!(report.complete(), "{}", report.text());
    assert_eq!(report.restored.len(), 17);
    let text = report.text();
    assert!(
        text.starts_with("[ipybox] This session's kernel was restored from a snapshot taken "),
        "{text}"
    );
    assert!(
        text.contains(
            "\nCame back (20): BaseModel (class), x (int), pi (float), s (str), d (dict), alias (dict), big (list), Point (class), p (Point), points (list), make_adder (function), add5 (function), square (lambda), twice_x (function), Item (class), item (Item), counter (Counter), col (module collections), xml (module xml), os (module os).\n"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("\nWorking directory: {}.", sub.display())),
        "{text}"
    );
    assert_eq!(run(&ex, CHECK).await, "all back");
    // A restore leaves nothing in the history: the model's first cell after it is In[1].
    assert_eq!(
        run(&ex, "print(len(In), 'Point.scale = 3' in In[1])").await,
        "3 True"
    );
    ex.stop().await;
}

#[tokio::test]
async fn numpy_arrays_and_pandas_frames_come_back() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    let python = data_python();
    let ex = started(ws.path(), Some(&python), None).await;
    run(
        &ex,
        r#"
import numpy as np
import pandas as pd
a = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)
f = np.asfortranarray(a[:10, :20])
ints = np.array([1, 2, 3], dtype=np.int16)
df = pd.DataFrame({"n": np.arange(5), "name": list("abcde"), "w": np.linspace(0, 1, 5)})
df.index = pd.date_range("2024-01-01", periods=5)
series = df["w"] * 2
same = a
"#,
    )
    .await;
    let report = ex
        .snapshot(&store, &binding("data"), TIMEOUT)
        .await
        .unwrap();
    let a = report
        .manifest
        .saved
        .iter()
        .find(|s| s.name == "a")
        .unwrap();
    assert_eq!(a.type_name, "ndarray");
    assert!(a.bytes >= 8_000_000 && a.bytes < 8_010_000, "{}", a.bytes);
    let same = report
        .manifest
        .saved
        .iter()
        .find(|s| s.name == "same")
        .unwrap();
    assert!(
        same.bytes < 100,
        "an alias is not stored twice: {}",
        same.bytes
    );
    ex.stop().await;

    let ex = started(ws.path(), Some(&python), None).await;
    let report = ex.restore(&store, &binding("data"), TIMEOUT).await.unwrap();
    assert!(report.complete(), "{}", report.text());
    let out = run(
        &ex,
        r#"
assert a.shape == (1000, 1000) and a.dtype == np.float64 and a[999, 999] == 999_999.0
assert a.flags.writeable and a.flags.c_contiguous
a[0, 0] = -1.0
assert same is a and same[0, 0] == -1.0
assert f.flags.f_contiguous and (f == np.arange(1_000_000.0).reshape(1000, 1000)[:10, :20]).all()
assert ints.dtype == np.int16 and ints.tolist() == [1, 2, 3]
assert df.equals(pd.DataFrame({"n": np.arange(5), "name": list("abcde"), "w": np.linspace(0, 1, 5)}, index=pd.date_range("2024-01-01", periods=5)))
assert series.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
print(np.__name__, pd.__name__, df.loc["2024-01-03", "name"])
"#,
    )
    .await;
    assert_eq!(out, "numpy pandas c");
    ex.stop().await;
}

#[tokio::test]
async fn what_cannot_be_saved_is_named_and_the_rest_comes_back() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    std::fs::write(ws.path().join("mymod.py"), "class Thing:\n    pass\n").unwrap();
    let ex = started(ws.path(), None, None).await;
    run(
        &ex,
        r#"
import socket, threading, types
fh = open("notes.txt", "w")
sock = socket.socket()
worker = threading.Thread(target=lambda: None, name="worker")
gen = (i for i in range(3))
guarded = {"lock": threading.Lock(), "n": 1}
made = types.ModuleType("made")
import mymod
thing = mymod.Thing()
holder = [thing]
import sqlite3
conn = sqlite3.connect(":memory:")
kept = [1, 2, 3]
"#,
    )
    .await;
    let report = ex.snapshot(&store, &binding("s"), TIMEOUT).await.unwrap();
    let not_saved: Vec<(&str, &str, &str)> = report
        .manifest
        .not_saved
        .iter()
        .map(|n| (n.name.as_str(), n.type_name.as_str(), n.reason.as_str()))
        .collect();
    assert_eq!(
        not_saved,
        [
            (
                "conn",
                "Connection",
                "cannot be pickled: TypeError: cannot pickle 'sqlite3.Connection' object"
            ),
            (
                "fh",
                "TextIOWrapper",
                "an open file ('notes.txt'): a file handle belongs to this process"
            ),
            (
                "gen",
                "generator",
                "a generator: its paused frame cannot be saved"
            ),
            (
                "guarded",
                "dict",
                "holds a lock: synchronisation objects belong to this process"
            ),
            (
                "made",
                "module",
                "a module that cannot be imported by name (it was made in code, not imported)"
            ),
            (
                "sock",
                "socket",
                "a socket: a network connection belongs to this process"
            ),
            (
                "worker",
                "Thread",
                "a thread (worker): a running thread cannot be saved"
            ),
        ]
    );
    let saved: Vec<&str> = report
        .manifest
        .saved
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(saved, ["thing", "holder", "kept"]);
    assert!(
        report
            .text()
            .contains("\nNot saved (7):\n- conn: cannot be pickled"),
        "{}",
        report.text()
    );
    ex.stop().await;

    // The module `thing` needs is gone: it does not load, `holder` (which refers to it) is
    // reported with it, and `kept` comes back.
    std::fs::remove_file(ws.path().join("mymod.py")).unwrap();
    let ex = started(ws.path(), None, None).await;
    let report = ex.restore(&store, &binding("s"), TIMEOUT).await.unwrap();
    let text = report.text();
    assert!(text.contains("\nCame back (5): kept (list), socket (module socket), threading (module threading), types (module types), sqlite3 (module sqlite3).\n"), "{text}");
    for line in [
        "\nNot restored (11); run the code that made them again if you need them:",
        "\n- fh: not saved: an open file ('notes.txt'): a file handle belongs to this process",
        "\n- worker: not saved: a thread (worker): a running thread cannot be saved",
        "\n- mymod: did not load: import mymod failed: ModuleNotFoundError: No module named 'mymod'",
        "\n- thing: did not load: ModuleNotFoundError: No module named 'mymod'",
        "\n- holder: did not load: refers to thing, which did not come back",
        "\n- import mymod: failed: ModuleNotFoundError: No module named 'mymod'",
    ] {
        assert!(text.contains(line), "{line:?} missing in:\n{text}");
    }
    assert_eq!(
        run(
            &ex,
            "print(kept, 'thing' in globals(), 'holder' in globals())"
        )
        .await,
        "[1, 2, 3] False False"
    );
    ex.stop().await;
}

/// Code that, when it loads, leaves a file behind: proof of whether a snapshot was unpickled.
fn armed(marker: &Path) -> String {
    format!(
        "class Armed:\n    def __reduce__(self):\n        return (open, ({:?}, 'w'))\narmed = Armed()\nkept = 7",
        marker.display().to_string()
    )
}

#[tokio::test]
async fn a_snapshot_of_another_session_or_owner_or_changed_is_refused_unloaded() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    let marker = ws.path().join("unpickled");
    let ex = started(ws.path(), None, None).await;
    run(&ex, &armed(&marker)).await;
    let a = binding("session-a");
    ex.snapshot(&store, &a, TIMEOUT).await.unwrap();
    run(&ex, "state = 'still here'").await;

    let refused = |r: Result<_, SnapshotError>| match r {
        Err(SnapshotError::Refused { reason }) => reason,
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("restored"),
    };
    // Another session, another owner.
    let other_session = SnapshotBinding::new("session-b", b"owner-1".to_vec());
    let other_owner = SnapshotBinding::new("session-a", b"owner-2".to_vec());
    for b in [&other_session, &other_owner] {
        match ex.restore(&store, b, TIMEOUT).await {
            Err(SnapshotError::NotFound { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    // Session A's snapshot planted where session B's would be.
    let a_dir = store.path(&a);
    let copy = |to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for f in ["data", "manifest.json", "seal.json"] {
            std::fs::copy(a_dir.join(f), to.join(f)).unwrap();
        }
    };
    copy(&store.path(&other_session));
    copy(&store.path(&other_owner));
    for b in [&other_session, &other_owner] {
        let reason = refused(ex.restore(&store, b, TIMEOUT).await);
        assert_eq!(
            reason,
            "its seal does not verify for this session and owner: it was made for another session or owner, or changed since"
        );
    }
    // One byte changed in the data (the part that holds `kept`'s pickle, then the last byte).
    let data = a_dir.join("data");
    let original = std::fs::read(&data).unwrap();
    for i in [original.len() / 2, original.len() - 1] {
        let mut bytes = original.clone();
        bytes[i] ^= 1;
        std::fs::write(&data, &bytes).unwrap();
        let reason = refused(ex.restore(&store, &a, TIMEOUT).await);
        assert_eq!(reason, "its data changed since it was sealed");
    }
    std::fs::write(&data, &original).unwrap();
    // The seal itself changed.
    let seal = a_dir.join("seal.json");
    let sealed = std::fs::read_to_string(&seal).unwrap();
    let hmac_at = sealed.find("\"seal\":\"").unwrap() + 8;
    let mut changed = sealed.clone().into_bytes();
    changed[hmac_at] = if changed[hmac_at] == b'0' { b'1' } else { b'0' };
    std::fs::write(&seal, &changed).unwrap();
    refused(ex.restore(&store, &a, TIMEOUT).await);
    std::fs::write(&seal, &sealed).unwrap();

    assert!(!marker.exists(), "a refused snapshot was unpickled");
    assert_eq!(
        run(&ex, "print(state)").await,
        "still here",
        "a refused restore leaves the kernel as it was"
    );
    // The right session and owner: it loads (and so the marker proves the checks above).
    let report = ex.restore(&store, &a, TIMEOUT).await.unwrap();
    assert!(report.complete(), "{}", report.text());
    assert!(marker.exists());
    assert_eq!(
        run(&ex, "print(kept, 'state' in globals())").await,
        "7 False",
        "a restore replaces a used kernel"
    );
    ex.stop().await;
}

/// Kernel code that replaces ipybox's snapshot writer with `body` (run with the path `p` of the
/// socket the host bound for the save, `frame(sock, kind, bytes)` at hand): a hostile kernel's
/// view of the host.
fn hostile_writer(body: &str) -> String {
    format!(
        "import os, socket, struct, time, ipybox_runtime.snapshot as _s\n\
         def frame(sock, kind, b):\n    sock.sendall(struct.pack('<BQ', kind, len(b)) + b)\n\
         def _evil(p, limit):\n{}\n_s.save_to_socket = _evil\n",
        body.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    )
}

async fn hostile_streams_are_refused(ex: &CodeExecutor, secret: &Path) {
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path()).with_limit(1 << 20);
    let b = binding("hostile");
    let connect = "s = socket.socket(socket.AF_UNIX)\ns.connect(p)";
    let manifest = r#"{"format": 1, "python": "3.11.7", "cwd": null, "imports": [], "modules": [], "saved": [], "not_saved": [], "data_bytes": 6}"#;
    let cases = [
        // More than the store takes, in frames the host accepts one by one.
        (
            format!("{connect}\nfor _ in range(3):\n    frame(s, 0, b'x' * (512 << 10))"),
            "passed the limit of 1048576 bytes",
        ),
        // One frame larger than any the host takes.
        (
            format!("{connect}\ns.sendall(struct.pack('<BQ', 0, 1 << 40))"),
            "a frame of 1099511627776 bytes",
        ),
        (format!("{connect}\nframe(s, 9, b'')"), "unknown kind 9"),
        // A manifest that says more data than was sent.
        (
            format!("{connect}\nframe(s, 0, b'abc')\nframe(s, 2, {manifest:?}.encode())"),
            "it describes 6 bytes of data, and the data has 3",
        ),
        // The connection kept open, nothing sent: the host stops waiting.
        (format!("{connect}\n_s._held = s"), "did not end within"),
        // No connection at all.
        ("pass".to_string(), "did not end within"),
    ];
    for (body, expected) in cases {
        run(ex, &hostile_writer(&body)).await;
        let started = std::time::Instant::now();
        match ex.snapshot(&store, &b, TIMEOUT).await {
            Err(SnapshotError::Invalid { reason, .. }) => {
                assert!(reason.contains(expected), "{expected:?} not in {reason:?}")
            }
            other => panic!("{body}: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(30));
        assert!(!store.contains(&b), "nothing is stored");
    }
    // Nothing of the refused snapshots is left in the store.
    let left: Vec<_> = std::fs::read_dir(store.root()).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
    // The control: the real writer stores a snapshot through the same socket.
    run(
        ex,
        "import importlib, ipybox_runtime.snapshot as _s\nimportlib.reload(_s)\nkept = 7",
    )
    .await;
    ex.snapshot(&store, &b, TIMEOUT).await.unwrap();
    assert!(store.contains(&b));
    // The host's own files were not touched through the links.
    assert_eq!(std::fs::read_to_string(secret).unwrap(), "host secret");
}

#[tokio::test]
async fn hostile_snapshot_streams_store_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "host secret").unwrap();
    let ex = started(ws.path(), None, None).await;
    hostile_streams_are_refused(&ex, &secret).await;
    ex.stop().await;
}

#[tokio::test]
async fn a_sandboxed_kernel_snapshots_and_restores_and_cannot_mislead_the_host() {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    let ex = started(ws.path(), None, Some(sandbox_options())).await;
    run(&ex, BUILD).await;
    ex.snapshot(&store, &binding("boxed"), TIMEOUT)
        .await
        .unwrap();
    ex.stop().await;
    let ex = started(ws.path(), None, Some(sandbox_options())).await;
    let report = ex
        .restore(&store, &binding("boxed"), TIMEOUT)
        .await
        .unwrap();
    assert!(report.complete(), "{}", report.text());
    assert_eq!(run(&ex, CHECK).await, "all back");
    // A secret the sandboxed kernel cannot read, but the host could.
    let secret = ws.path().join(".env");
    std::fs::write(&secret, "host secret").unwrap();
    hostile_streams_are_refused(&ex, &secret).await;
    ex.stop().await;
}

/// A kernel on a Jupyter server shares no filesystem with the host: the snapshot travels over
/// its stdin channel, in several chunks here (a 10 MB value).
#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_on_a_jupyter_server_snapshots_and_restores_over_its_stdin_channel() {
    use crate::jupyter_servers::{JupyterServer, Kind, TOKEN};
    require!(TestEnv);
    let mut vars = crate::support::process_env();
    vars.insert("IPYBOX_GATEWAY_TOKEN".into(), TOKEN.into());
    let host = ipybox::host_env::HostEnv::from_vars(vars);
    for kind in [Kind::KernelGateway, Kind::EnterpriseGateway] {
        let server = JupyterServer::start(kind);
        let ws = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let store = store(home.path());
        let remote = || {
            CodeExecutor::builder()
                .workspace(ws.path())
                .host_env(host.clone())
                .kernel_gateway(server.url())
                .without_spare_kernel()
                .build()
        };
        let ex = remote();
        ex.start()
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}\n{}", server.log()));
        run(
            &ex,
            r#"
import collections as col
blob = bytes(range(256)) * 40_000
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def total(self):
        return self.x + self.y
p = Point(2, 3)
same = p
counts = col.Counter("hello")
fh = open(__import__("os").devnull)
"#,
        )
        .await;
        let report = ex
            .snapshot(&store, &binding("remote"), TIMEOUT)
            .await
            .unwrap();
        assert!(report.manifest.data_bytes > 10_240_000, "{kind:?}");
        let not_saved: Vec<&str> = report
            .manifest
            .not_saved
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(not_saved, ["fh"], "{kind:?}");
        ex.stop().await;

        let ex = remote();
        ex.start().await.unwrap();
        let report = ex
            .restore(&store, &binding("remote"), TIMEOUT)
            .await
            .unwrap();
        let text = report.text();
        assert!(
            text.contains("\nCame back (6): blob (bytes), Point (class), p (Point), same (Point), counts (Counter), col (module collections)."),
            "{kind:?}: {text}"
        );
        assert_eq!(
            run(&ex, "print(blob == bytes(range(256)) * 40_000, p.total(), same is p, type(p) is Point, counts['l'])").await,
            "True 5 True True 2",
            "{kind:?}"
        );
        // Another session's binding finds nothing; nothing was loaded into the kernel.
        assert!(matches!(
            ex.restore(&store, &binding("other"), TIMEOUT).await,
            Err(SnapshotError::NotFound { .. })
        ));
        assert_eq!(run(&ex, "print(p.total())").await, "5");
        ex.stop().await;
        server.assert_empty(&format!("{kind:?}")).await;
    }
}

/// A kernel whose Python has no cloudpickle (a `--python` interpreter, a Jupyter server's image):
/// its data is saved with plain pickle, and the code defined in its cells, and what holds it,
/// is named as not saved with the install line — never saved by a reference a new kernel
/// could not resolve.
#[tokio::test]
async fn without_cloudpickle_data_is_saved_and_cell_code_is_named() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    let ex = started(ws.path(), None, None).await;
    run(
        &ex,
        r#"
import sys
sys.modules["cloudpickle"] = None  # `import cloudpickle` now fails, as where it is not installed
del sys
kept = {"n": [1, 2.5, "three"]}
def f():
    return 1
class C:
    pass
c = C()
"#,
    )
    .await;
    let report = ex
        .snapshot(&store, &binding("plain"), TIMEOUT)
        .await
        .unwrap();
    let saved: Vec<&str> = report
        .manifest
        .saved
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(saved, ["kept"]);
    let reason = "code defined in a cell: saving it needs cloudpickle 3.x in the kernel's Python (`pip install 'cloudpickle>=3,<4'`; ipybox's managed environment has it)";
    let not_saved: Vec<(&str, String)> = report
        .manifest
        .not_saved
        .iter()
        .map(|n| (n.name.as_str(), n.reason.clone()))
        .collect();
    assert_eq!(
        not_saved,
        [
            ("C", format!("is {reason}")),
            ("c", format!("holds {reason}")),
            ("f", format!("is {reason}")),
        ]
    );
    ex.stop().await;
    let ex = started(ws.path(), None, None).await;
    let report = ex
        .restore(&store, &binding("plain"), TIMEOUT)
        .await
        .unwrap();
    assert!(
        report.text().contains("Came back (1): kept (dict)."),
        "{}",
        report.text()
    );
    assert_eq!(
        run(&ex, "print(kept, 'f' in globals(), 'C' in globals())").await,
        "{'n': [1, 2.5, 'three']} False False"
    );
    ex.stop().await;
}

/// The process environment with `IPYBOX_KERNEL_PRELOAD` set to `preload`.
fn preload_env(preload: &str) -> ipybox::host_env::HostEnv {
    let mut vars = ipybox::host_env::HostEnv::from_process().vars().clone();
    vars.insert("IPYBOX_KERNEL_PRELOAD".into(), preload.into());
    ipybox::host_env::HostEnv::from_vars(vars)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_into_a_kernel_forked_from_a_preloaded_template_reports_the_same_as_into_a_fresh_one()
 {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = store(home.path());
    let python = data_python();
    std::fs::write(ws.path().join("gone_soon.py"), "class Thing:\n    pass\n").unwrap();
    let ex = started(ws.path(), Some(&python), None).await;
    run(
        &ex,
        r#"
import numpy as np
import pandas as pd
import gone_soon
arr = np.arange(10.0)
df = pd.DataFrame({"n": np.arange(3), "s": list("xyz")})
def total():
    return float(arr.sum()) + int(df.n.sum())
thing = gone_soon.Thing()
fh = open("gone_soon.py")
"#,
    )
    .await;
    ex.snapshot(&store, &binding("pre"), TIMEOUT).await.unwrap();
    ex.stop().await;
    std::fs::remove_file(ws.path().join("gone_soon.py")).unwrap();

    // A fresh kernel whose template imports nothing.
    let fresh = CodeExecutor::builder()
        .workspace(ws.path())
        .python(&python)
        .without_spare_kernel()
        .host_env(preload_env("none"))
        .build();
    fresh.start().await.unwrap();
    assert_eq!(
        run(&fresh, "import sys\nprint('pandas' in sys.modules)").await,
        "False"
    );
    fresh.reset().await.unwrap();
    let from_fresh = fresh
        .restore(&store, &binding("pre"), TIMEOUT)
        .await
        .unwrap();

    // A kernel forked from a shared template that has preloaded numpy and pandas.
    let factory = ipybox::kernel::SharedKernelFactory::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let forked = loop {
        let ex = CodeExecutor::builder()
            .workspace(ws.path())
            .python(&python)
            .without_spare_kernel()
            .shared_kernel_factory(factory.clone())
            .host_env(preload_env("numpy,pandas"))
            .build();
        ex.start().await.unwrap();
        let probe = ex
            .execute("import sys\nprint('pandas' in sys.modules)", TIMEOUT)
            .await
            .unwrap();
        if probe.text == "True" {
            // The probe ran code: reset so the restore loads into an untouched kernel.
            ex.reset().await.unwrap();
            break ex;
        }
        ex.stop().await;
        assert!(
            std::time::Instant::now() < deadline,
            "the shared template did not preload pandas within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let from_forked = forked
        .restore(&store, &binding("pre"), TIMEOUT)
        .await
        .unwrap();

    assert_eq!(from_forked, from_fresh);
    let restored: Vec<&str> = from_forked
        .restored
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(restored, ["arr", "df", "total"]);
    let failed: Vec<(&str, &str)> = from_forked
        .failed
        .iter()
        .map(|f| (f.name.as_str(), f.reason.as_str()))
        .collect();
    assert_eq!(
        failed,
        [
            (
                "gone_soon",
                "import gone_soon failed: ModuleNotFoundError: No module named 'gone_soon'"
            ),
            ("thing", "ModuleNotFoundError: No module named 'gone_soon'")
        ]
    );
    for ex in [&fresh, &forked] {
        assert_eq!(
            run(
                ex,
                "print(total(), df.s.tolist(), np.__name__, pd.__name__)"
            )
            .await,
            "48.0 ['x', 'y', 'z'] numpy pandas"
        );
    }
    fresh.stop().await;
    forked.stop().await;
    factory.shutdown().await;
}
