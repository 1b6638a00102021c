"""Fixtures shared by the harness tests: the reference programs built from GPUSHARE_E2E_REFERENCE_SRC."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import toolchain
from e2e.settings import from_environ


@pytest.fixture(scope="session")
def reference() -> Path:
    """The folder with the reference extender and device plugin, built once per source and Go version (cached);
    the test is skipped, with the reason, where the sources or Go are missing."""
    settings = from_environ()
    missing = toolchain.reference_missing(settings)
    if missing:
        pytest.skip(missing)
    built = toolchain.build_reference(settings)
    assert built is not None
    return built
