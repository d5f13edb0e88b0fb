#!/usr/bin/env bash
# ipybox-rs's Python SDK against Python ipybox 0.9.2, side by side (benches/python_sdk.py).
#
#   scripts/bench-python.sh [WHEEL]     # default: the newest target/wheels/ipybox_rs-*.whl
#
# Under target/bench-python/ it builds, with uv:
#   rs/       the ipybox-rs wheel (copied first: target/wheels gets rebuilt);
#   py/       ipybox==0.9.2 from PyPI. With mcp==2.3.0 it does not import (mcpygen 0.1.4 imports
#             mcp.client.streamable_http.streamablehttp_client, which mcp 2 removed), so that is
#             tried, reported, and mcp<2 installed instead;
#   fixture/  mcp==2.3.0 for the fixture MCP server (tests/fixtures/mcp_fixture.py needs mcp 2's
#             MCPServer): both benchmarks call the very same server process type.
# It times the install of each package into a fresh venv (warm uv cache, and a cold one: an
# empty cache, i.e. downloads included), reports the wheel's size, runs the benchmark in both
# venvs (bytecode compiled first, untimed, so no run pays for it) and prints a markdown table.
# The load (uptime) is noted; when it is high (load1 > BENCH_LOAD_HIGH, default 1.5 on this
# 2-core machine) as a benchmark of round 1 starts, both are run once more at the end.
#
# Env: BENCH_QUICK=1 (fewer iterations), BENCH_PYTHON (default 3.11), BENCH_COLD_INSTALL=0 (skip
# the cold-cache install timing), BENCH_LOAD_HIGH.
# Results: target/bench-python/results/*.json, the table in target/bench-python/results/table.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export PATH="$HOME/.local/bin:$PATH"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$root/target/uv-cache}"
dir="$root/target/bench-python"
res="$dir/results"
pyver="${BENCH_PYTHON:-3.11}"
load_high="${BENCH_LOAD_HIGH:-1.5}"
mkdir -p "$dir" "$res"

src_wheel="${1:-}"
if [ -z "$src_wheel" ]; then
  src_wheel=$(ls -t target/wheels/ipybox_rs-*.whl 2>/dev/null | head -1 || true)
  [ -n "$src_wheel" ] || { echo "bench-python: no target/wheels/ipybox_rs-*.whl: build one (scripts/build-wheel.sh) or pass WHEEL" >&2; exit 2; }
fi
[ -f "$src_wheel" ] || { echo "bench-python: no such wheel: $src_wheel" >&2; exit 2; }
mkdir -p "$dir/wheel"
rm -f "$dir"/wheel/*.whl
wheel="$dir/wheel/$(basename "$src_wheel")"
cp "$src_wheel" "$wheel"
wheel_bytes=$(stat -c %s "$wheel")
echo "bench-python: wheel $(basename "$wheel"), $wheel_bytes bytes (from $src_wheel)" >&2

now() { date +%s.%N; }
# fresh_install NAME SPEC... -> prints the seconds `uv pip install SPEC...` took into a fresh venv
fresh_install() {
  local venv="$1"; shift
  rm -rf "$venv"
  uv venv -q --python "$pyver" "$venv"
  local t0 t1
  t0=$(now)
  uv pip install -q --python "$venv/bin/python" "$@" >&2
  t1=$(now)
  python3 -c "print(round($t1 - $t0, 2))"
}
cold_install() {  # same, with an empty uv cache (everything downloaded), in a throwaway venv
  local cache venv secs
  cache=$(mktemp -d "$dir/uv-cold.XXXXXX")
  venv="$dir/cold-venv"
  secs=$(export UV_CACHE_DIR="$cache"; fresh_install "$venv" "$@")
  rm -rf "$cache" "$venv"
  echo "$secs"
}

notes="$res/notes.txt"
: >"$notes"

# --- ipybox-rs ---
rs_cold=null
if [ "${BENCH_COLD_INSTALL:-1}" = 1 ]; then
  rs_cold=$(cold_install "$wheel")
fi
fresh_install "$dir/rs" "$wheel" >/dev/null  # fills the warm cache
rs_warm=$(fresh_install "$dir/rs" "$wheel")
echo "bench-python: ipybox-rs install: ${rs_warm} s warm cache, ${rs_cold} s cold cache" >&2

# --- Python ipybox 0.9.2 ---
py_cold=null
uv venv -q --python "$pyver" --allow-existing "$dir/py"
uv pip install -q --python "$dir/py/bin/python" "ipybox==0.9.2" "mcp==2.3.0" >&2
if err=$("$dir/py/bin/python" -c "import ipybox" 2>&1); then
  py_spec=("ipybox==0.9.2" "mcp==2.3.0")
else
  echo "Python ipybox 0.9.2 + mcp==2.3.0 does not import: $(echo "$err" | tail -1). Installed with mcp<2 instead; plain \`pip install ipybox==0.9.2\` resolves mcp 2.x today and is broken the same way." >>"$notes"
  py_spec=("ipybox==0.9.2" "mcp<2")
fi
if [ "${BENCH_COLD_INSTALL:-1}" = 1 ]; then
  py_cold=$(cold_install "${py_spec[@]}")
fi
fresh_install "$dir/py" "${py_spec[@]}" >/dev/null
py_warm=$(fresh_install "$dir/py" "${py_spec[@]}")
py_mcp=$("$dir/py/bin/python" -c "import importlib.metadata as m; print(m.version('mcp'))")
echo "bench-python: ipybox 0.9.2 (mcp $py_mcp) install: ${py_warm} s warm cache, ${py_cold} s cold cache" >&2

# --- the fixture server's venv ---
if ! "$dir/fixture/bin/python" -c "import mcp.server.mcpserver" 2>/dev/null; then
  rm -rf "$dir/fixture"
  uv venv -q --python "$pyver" "$dir/fixture"
  uv pip install -q --python "$dir/fixture/bin/python" "mcp==2.3.0" >&2
fi

# Bytecode, untimed: a package's first import otherwise compiles it (uv doesn't by default).
for v in rs py fixture; do
  "$dir/$v/bin/python" -m compileall -q -j 0 "$("$dir/$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
done

rs_du=$(du -sm "$dir/rs" | cut -f1)
py_du=$(du -sm "$dir/py" | cut -f1)
cat >"$res/install.json" <<EOF
{"wheel": "$(basename "$wheel")", "wheel_bytes": $wheel_bytes, "rs_venv_mb": $rs_du, "py_venv_mb": $py_du,
 "rs_install_warm_s": $rs_warm, "rs_install_cold_s": $rs_cold,
 "py_install_warm_s": $py_warm, "py_install_cold_s": $py_cold, "py_mcp": "$py_mcp"}
EOF

bench_args=()
[ "${BENCH_QUICK:-0}" = 1 ] && bench_args+=(--quick)
export FIXTURE_PYTHON="$dir/fixture/bin/python"

run_bench() {  # run_bench NAME ROUND
  local name="$1" round="$2" out="$res/$1-$2.json" log="$res/$1-$2.log"
  echo "bench-python: round $round: $name (uptime:$(uptime | sed 's/.*load average/ load average/'))" >&2
  if "$dir/$name/bin/python" benches/python_sdk.py "${bench_args[@]}" >"$out" 2>"$log"; then
    grep '^\[python_sdk\]' "$log" | sed 's/^/  /' >&2 || true
  else
    echo "bench-python: $name failed (exit $?); last lines of $log:" >&2
    tail -20 "$log" >&2
    echo "{\"failed\": true, \"log\": \"$log\"}" >"$out"
  fi
}

table() {  # table ROUND
  python3 - "$res" "$1" "$load_high" <<'PY'
import json, sys
res, rnd, load_high = sys.argv[1], sys.argv[2], float(sys.argv[3])
inst = json.load(open(f"{res}/install.json"))
notes = open(f"{res}/notes.txt").read().strip()
def load(name):
    try:
        return json.load(open(f"{res}/{name}-{rnd}.json"))
    except Exception as e:
        return {"failed": True, "log": str(e)}
rs, py = load("rs"), load("py")

def g(d, *path):
    for p in path:
        if isinstance(d, dict) and p in d:
            d = d[p]
        elif isinstance(d, list) and isinstance(p, int) and p < len(d):
            d = d[p]
        else:
            return None
    return d
def f(v, unit="ms", nd=None):
    if v is None:
        return "n/a"
    if nd is None:
        nd = 2 if v < 10 else (1 if v < 100 else 0)
    return f"{v:.{nd}f} {unit}"
def s(v):
    return f(None if v is None else v / 1000, "s", 2)

def cell(d, kind):
    if d.get("failed"):
        return "failed (see log)"
    return kind(d)

rows = [
    ("cold start: `async with CodeExecutor()` → first `print(1)` result, median (min) of 5",
     lambda d: f"{s(g(d,'cold_start','median'))} ({s(g(d,'cold_start','min'))})", "≤ 0.6 s"),
    ("  of which `__aenter__` / first `execute`, median",
     lambda d: f"{f(g(d,'cold_start_enter','median'))} / {f(g(d,'cold_start_first_execute','median'))}", ""),
    ("  `__aexit__` (stop), median", lambda d: f(g(d, 'cold_start_exit', 'median')), ""),
    ("`import ipybox` (first, in-process)", lambda d: f(g(d, 'import_ms')), ""),
    ("`execute(\"print(1)\")` round trip, median / p99 (n=200)",
     lambda d: f"{f(g(d,'execute_print1','median'))} / {f(g(d,'execute_print1','p99'))}", "≤ 4 ms"),
    ("tool call with approval via `stream()`, median / p99 (n=50)",
     lambda d: f"{f(g(d,'tool_call_approval','median'))} / {f(g(d,'tool_call_approval','p99'))}", "≤ 5 ms"),
    ("  first tool call (imports the API, starts the MCP server)", lambda d: f(g(d, 'tool_call_first_ms')), ""),
    ("  same call, `approve_tool_calls=False`, median", lambda d: f(g(d, 'tool_call_no_approval', 'median')), ""),
    ("  same cell without the call (import + `Params` + print), median", lambda d: f(g(d, 'tool_cell_without_call', 'median')), ""),
    ("reset → next result, back-to-back, median (min–max, n=10)",
     lambda d: f"{f(g(d,'reset_back_to_back','median'))} ({f(g(d,'reset_back_to_back','min'))}–{f(g(d,'reset_back_to_back','max'))})", "≤ 50 ms"),
    ("reset → next result, after 1 s pause, median (min–max, n=10)",
     lambda d: f"{f(g(d,'reset_after_1s','median'))} ({f(g(d,'reset_after_1s','min'))}–{f(g(d,'reset_after_1s','max'))})", "≤ 50 ms"),
    ("memory: RSS of process tree, one started executor (PSS)",
     lambda d: f"{f(g(d,'memory_started','rss_mb'),'MB',0)} ({f(g(d,'memory_started','pss_mb'),'MB',0)}), {len(g(d,'memory_started','processes') or [])} processes", ""),
    ("  with the fixture MCP server running too",
     lambda d: f"{f(g(d,'memory_with_mcp_server','rss_mb'),'MB',0)} ({f(g(d,'memory_with_mcp_server','pss_mb'),'MB',0)})", ""),
    ("`generate_mcp_sources` for the fixture (10 tools)", lambda d: f(g(d, 'generate_mcp_sources_ms')), ""),
    ("results with wrong/missing output",
     lambda d: ", ".join(f"{k}: {v['count']}" for k, v in (d.get('wrong_output') or {}).items()) or "none", ""),
    ("errors", lambda d: ", ".join(f"{k}: {len(v)}" for k, v in (d.get('errors') or {}).items()) or "none", ""),
    ("load average (1 min) at start → end",
     lambda d: f"{g(d,'load_start',0)} → {g(d,'load_end',0)}", ""),
]
print(f"| metric | ipybox-rs {g(rs,'version') or ''} | Python ipybox {g(py,'version') or '0.9.2'} | target |")
print("|---|---|---|---|")
for name, fn, target in rows:
    print(f"| {name} | {cell(rs, fn)} | {cell(py, fn)} | {target} |")
mb = inst["wheel_bytes"] / 1e6
print(f"| package size (compressed wheel) | {mb:.1f} MB ({inst['wheel_bytes']/2**20:.1f} MiB) | "
      f"ipybox 0.9.2 wheel is small but pulls jupyter-kernel-gateway, mcpygen, datamodel-code-generator, … | ≤ 15 MB |")
def sec(v):
    return "n/a" if v is None else f"{v:.2f} s"
print(f"| installed venv on disk (du, bytecode compiled) | {inst['rs_venv_mb']} MB | {inst['py_venv_mb']} MB | |")
print(f"| install into a fresh venv, warm uv cache / cold cache (downloads) | {sec(inst['rs_install_warm_s'])} / {sec(inst['rs_install_cold_s'])} "
      f"| {sec(inst['py_install_warm_s'])} / {sec(inst['py_install_cold_s'])} (mcp {inst['py_mcp']}) | |")
print()
print(f"Round {rnd}. Machine: {rs.get('cpus') or py.get('cpus')} CPUs, Python {rs.get('python') or py.get('python')}.")
if notes:
    print("Notes: " + notes)
for name, d in (("ipybox-rs", rs), ("ipybox 0.9.2", py)):
    for k, v in (d.get("errors") or {}).items():
        print(f"- {name} error in {k}: {v[0][:300]}")
    for k, v in (d.get("wrong_output") or {}).items():
        print(f"- {name} wrong output in {k}: {v['count']}× (e.g. {', '.join(v['examples'])})")
# Judged by the load when each benchmark started: at its end the 1-min average includes the
# benchmark's own work.
high = any((g(d, 'load_start', 0) or 0) > load_high for d in (rs, py))
sys.stderr.write(f"HIGH_LOAD={int(high)}\n")
PY
}

run_bench rs 1
run_bench py 1
table 1 >"$res/table-1.md" 2>"$res/table-1.err"
grep -v '^HIGH_LOAD=' "$res/table-1.err" >&2 || true
cp "$res/table-1.md" "$res/table.md"
if grep -q HIGH_LOAD=1 "$res/table-1.err"; then
  echo "bench-python: the load was high (> $load_high) during round 1: running both once more" >&2
  cat "$res/table-1.md" >&2
  sleep 10
  run_bench py 2
  run_bench rs 2
  table 2 >"$res/table-2.md" 2>"$res/table-2.err"
  grep -v '^HIGH_LOAD=' "$res/table-2.err" >&2 || true
  { echo "Round 1 (high load):"; echo; cat "$res/table-1.md"; echo; echo "Round 2 (re-run):"; echo; cat "$res/table-2.md"; } >"$res/table.md"
fi
cat "$res/table.md"
