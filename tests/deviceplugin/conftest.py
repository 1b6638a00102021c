"""Fixtures for the device plugin tests: keys, contract, a fake inventory, an in-memory API server, a rig."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import Contract
from deviceplugin.devices import UnitInventory
from node.inventory import fake_gpus
from tests.harness.plugin.fakes import NODE, FakeApiServer
from tests.harness.plugin.rig import Rig, make_rig


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short folder in place of pytest's: the plugin's sockets live under it, and a unix socket path holds 107
    bytes, which pytest's folders (/tmp/pytest-of-<user>/pytest-<n>/<worker>/<test name>0/) and a socket name with
    its token would pass."""
    folder = Path(tempfile.mkdtemp(prefix="dp-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def signer() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def contract() -> Contract:
    return Contract(delivery="env")


@pytest.fixture
def inventory() -> UnitInventory:
    """Two fake GPUs of 8 GiB each on node-a."""
    return UnitInventory(fake_gpus("2x8GiB", NODE, "GiB"), "GiB", 4096)


@pytest.fixture
def api() -> FakeApiServer:
    return FakeApiServer()


@pytest.fixture
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """The plugin wired to the test kubelet, env delivery; a short directory, since unix socket paths are limited
    to about 107 bytes."""
    yield from make_rig(tmp_path_factory.mktemp("k"))
