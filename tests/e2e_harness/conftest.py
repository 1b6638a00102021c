"""Fixtures shared by the harness tests: the reference programs built from GPUSHARE_E2E_REFERENCE_SRC, and the
tier's registry serving on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import toolchain
from e2e.registry import Registry, Store
from e2e.settings import from_environ


@contextlib.contextmanager
def serving(store: Store) -> Iterator[str]:
    """The registry on a free port of 127.0.0.1 while the block runs; its base URL."""
    server = Registry(0, store)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


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
