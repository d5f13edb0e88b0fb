"""Strict mode for the Python SDK suite: with `IPYBOX_TEST_STRICT` set (as in the Rust suite, any
value; `scripts/python-sdk-check.sh` sets it for ipybox-rs), a skipped test (`pytest.skip`, a
`skipif` mark, a module skipped at import) is reported as a failure naming the skip's reason: a
component the suite needs is missing, and a run that skips proves nothing about it.

Loaded by `conftest.py` (`pytest_plugins`).
"""

import os

import pytest

STRICT = "IPYBOX_TEST_STRICT" in os.environ


def _fail(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under IPYBOX_TEST_STRICT (a skip is a failure): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        _fail(report)
