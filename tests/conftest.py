"""Settings for every test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (./dev test runs two or more workers) each worker's temporary folders live in
    # <basetemp>/popen-gwN. Tests put unix sockets there, whose paths may hold 107 bytes, so a worker's folder is
    # <basetemp>/gwN: still inside the numbered folder pytest rotates, six bytes shorter.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    basetemp = config.option.basetemp
    if worker and basetemp and Path(basetemp).name == f"popen-{worker}":
        config.option.basetemp = str(Path(basetemp).with_name(worker))
