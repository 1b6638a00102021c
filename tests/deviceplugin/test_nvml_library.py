"""The plugin's real NVML path (nvidia-ml-py) against the fake libnvidia-ml.so.1: the inventory it reads, and an
XID event that turns a GPU's devices Unhealthy in ListAndWatch on the plugin's real gRPC socket."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deviceplugin.devices import HEALTHY, UNHEALTHY, UnitInventory
from deviceplugin.main import Plugin
from e2e import fakenvml
from node.inventory import load_inventory
from tests.harness.kubelet.scripted import TestKubelet
from tests.harness.nvml import library_dir
from tests.harness.plugin.fakes import NODE, FakeApiServer, plugin_settings

pytestmark = pytest.mark.timeout(60)
U0 = "GPU-0c6f1e2a-3b4d-4e5f-8a9b-1c2d3e4f5a6b"
U1 = "GPU-9d8c7b6a-5f4e-4d3c-9b2a-0f1e2d3c4b5a"
GPUS = fakenvml.gpu_list([(16384, U0, 0), (143771, U1, None)])  # an H200's 143771 MiB: 140 whole GiB


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake library in place of the real one for this process, with GPUS; the file that injects XIDs."""
    # Loaded by path first: nvidia-ml-py's dlopen("libnvidia-ml.so.1") then finds it by its soname.
    ctypes.CDLL(str(library_dir() / fakenvml.LIBRARY))
    import pynvml

    path = tmp_path / "events"
    for name, value in fakenvml.environment(library_dir(), GPUS, path).items():
        if name != "LD_LIBRARY_PATH":
            monkeypatch.setenv(name, value)
    yield path
    while pynvml._nvmlLib_refcount > 0:  # the next test's init reads its own GPUs
        pynvml.nvmlShutdown()


def test_the_inventory_reads_the_gpus_through_nvidia_ml_py(events: Path) -> None:
    inventory = UnitInventory.of(load_inventory("", NODE, "GiB"), 4096)
    assert inventory.real
    assert [(g.index, g.uuid, g.memory_units, g.minor) for g in inventory.gpus] == [(0, U0, 16, 0), (1, U1, 140, None)]
    assert len(inventory.devices()) == 156


def test_a_critical_xid_makes_the_gpu_unhealthy_in_list_and_watch(tmp_path: Path, events: Path) -> None:
    settings = dataclasses.replace(plugin_settings(str(tmp_path), GPUSHARE_FAKE_GPUS=""), watch_interval_seconds=3600.0)
    kubelet = TestKubelet(settings.device_plugin_dir, settings.pod_resources_socket)
    kubelet.start()
    plugin = Plugin(settings, api=FakeApiServer(), public_key=Ed25519PrivateKey.generate().public_key())
    try:
        plugin.start()
        assert kubelet.wait_registrations(1)
        kubelet.plugin()
        first = kubelet.wait_lists(1)
        assert len(first) == 156 and set(first.values()) == {HEALTHY}
        fakenvml.inject_xid(events, 0, 13)  # an application's fault: the GPU stays healthy
        fakenvml.inject_xid(events, U1, 79)  # fallen off the bus
        second = kubelet.wait_lists(2)
        assert second == {d: (UNHEALTHY if d.startswith(U1) else HEALTHY) for d in first}
        assert kubelet.lists_seen == 2  # the application XID sent nothing
    finally:
        plugin.stop()
        kubelet.stop()
