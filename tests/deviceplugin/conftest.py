"""Fixtures for the device plugin tests: keys, contract, a fake inventory and an in-memory API server."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deviceplugin.inventory import Inventory, fake_gpus
from tests.deviceplugin.fakes import NODE, FakeApiServer
from webhook.protocol import Contract


@pytest.fixture
def signer() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def contract() -> Contract:
    return Contract(delivery="env")


@pytest.fixture
def inventory() -> Inventory:
    """Two fake GPUs of 8 GiB each on node-a."""
    return Inventory(fake_gpus("2x8GiB", NODE, "GiB"), "GiB", 4096)


@pytest.fixture
def api() -> FakeApiServer:
    return FakeApiServer()
