import asyncio
import os
import shutil
from pathlib import Path

import pytest

from sdk_support import FIXTURE_PYTHON, SERVER_NAME, is_ipybox_rs, stdio_params

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


@pytest.fixture(scope="session")
def generated_mcptools(tmp_path_factory) -> Path:
    """A `mcptools/fixture` package generated once per session (the tests that are about
    generation call generate_mcp_sources themselves)."""
    from ipybox import generate_mcp_sources

    root = tmp_path_factory.mktemp("generated") / "mcptools"
    asyncio.run(generate_mcp_sources(SERVER_NAME, stdio_params(), root))
    return root


@pytest.fixture
def workspace(tmp_path, monkeypatch, generated_mcptools) -> Path:
    """A fresh directory holding the generated `mcptools/` and made the test process's cwd, so the
    kernel (which shares the parent's working directory) imports `mcptools.fixture`, as in the docs."""
    shutil.copytree(generated_mcptools, tmp_path / "mcptools")
    monkeypatch.chdir(tmp_path)
    return tmp_path
