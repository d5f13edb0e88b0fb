import asyncio
import os
from pathlib import Path

import pytest

from sdk_support import FIXTURE_PYTHON, SERVER_NAME, is_ipybox_rs, stdio_params

# IPYBOX_TEST_STRICT: every skip is a failure (strict_skips.py).
from strict_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402, F401

# Against the Python reference (not ipybox-rs), work around 0.9.2's shell/IOPub ordering race
# (see reference_shim.py) unless IPYBOX_REFERENCE_SHIM=0.
REFERENCE_SHIM = not is_ipybox_rs() and os.environ.get("IPYBOX_REFERENCE_SHIM", "1") != "0"
if REFERENCE_SHIM:
    import reference_shim

    reference_shim.install()


def pytest_report_header(config):
    import importlib.metadata

    dist = "ipybox-rs" if is_ipybox_rs() else "ipybox"
    lines = [f"ipybox under test: {dist} {importlib.metadata.version(dist)}; fixture server python: {FIXTURE_PYTHON}"]
    if REFERENCE_SHIM:
        lines.append("reference run: execute_reply/IOPub ordering shim installed (tests/python_sdk/reference_shim.py)")
    return lines


def generate_fixture_api(directory: Path) -> Path:
    """`directory/mcptools/fixture`, generated (and, with ipybox-rs, registered for
    `directory/mcptools`: kernels only call servers registered for a directory they import from,
    so generated code is not copied between workspaces)."""
    from ipybox import generate_mcp_sources

    root = directory / "mcptools"
    asyncio.run(generate_mcp_sources(SERVER_NAME, stdio_params(), root))
    return root


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A fresh directory holding the generated `mcptools/` and made the test process's cwd, so the
    kernel (which shares the parent's working directory) imports `mcptools.fixture`, as in the docs."""
    generate_fixture_api(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path
