"""A pod never moves to another GPU: the first GPU recorded for its UID is pinned, kept across plugin restarts
through the plugin's own allocation record, and a later change of IDX or the record is refused."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import DEV, IDX, Contract, parse_allocation
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import PluginError
from deviceplugin.judge import moved
from deviceplugin.kubelet import Holding
from deviceplugin.pins import Pin, Pins
from deviceplugin.service import Service
from tests.harness.plugin.fakes import FakeApiServer, FakeHoldings, plugin_settings
from tests.harness.pods import admitted, assigned, unit_pod

PIN = Pin(0, "GPU-a")


@pytest.mark.parametrize(
    ("index", "uuid", "problem"),
    [
        (0, None, None),
        (0, "GPU-a", None),
        (1, None, "now names GPU 1;"),
        (1, "GPU-b", "now names GPU 1;"),
        (None, None, "now names no GPU;"),
        (0, "GPU-b", "now names GPU 0, which is now GPU-b;"),
    ],
)
def test_moved(index: int | None, uuid: str | None, problem: str | None) -> None:
    message = moved(PIN, index, uuid, "pod team/p", "node-a")
    if problem is None:
        assert message is None
    else:
        assert message is not None and problem in message
        assert message.startswith("pod team/p was allocated GPU 0 (GPU-a) of node node-a")
        assert message.endswith(f"set {IDX} and the allocation record back to GPU 0, or delete the pod and create it "
                                "again")


def test_the_first_pin_stays_and_gone_pods_are_forgotten() -> None:
    pins = Pins()
    assert pins.hold("u1", PIN) == PIN
    assert pins.hold("u1", Pin(1, "GPU-b")) == PIN
    pins.hold("u2", Pin(1, "GPU-b"))
    pins.keep_only({"u2"})
    assert (pins.get("u1"), pins.indices()) == (None, {"u2": 1})


# ---------------------------------------------------------------------------------------------------------
# The service: a pod is allocated, someone moves its IDX and record together (a pods/status update can), and the
# restarted container is refused, also by a plugin that restarted in between.


@pytest.fixture
def node(tmp_path: Path, inventory: UnitInventory, signer: Ed25519PrivateKey) -> Iterator[tuple[FakeApiServer, Any]]:
    api = FakeApiServer()
    ids = tuple(device for device, _ in inventory.devices()[:2])
    holdings = FakeHoldings([Holding("team", "p", "main", ids)])
    settings = plugin_settings(str(tmp_path))

    made: list[Service] = []

    def service() -> Service:
        for before in made:  # its Events are posted before the next service posts any: they come in call order
            before.events.flush()
        made.append(Service(settings, inventory, api, holdings, signer.public_key()))
        api.settle = lambda: [m.events.flush() for m in made]
        return made[-1]

    yield api, (service, list(ids))


def start_pod(api: FakeApiServer, contract: Contract, signer: Ed25519PrivateKey) -> None:
    api.add(assigned(admitted(unit_pod("p", {"main": 2}), contract, signer), 0, 8))


def move_to_gpu_1(api: FakeApiServer, inventory: UnitInventory, contract: Contract) -> None:
    """IDX and a consistent allocation record, both rewritten to GPU 1."""
    pod = api.pod("team", "p")
    annotations = pod["metadata"]["annotations"]
    key = contract.allocation_key
    text = annotations[key].replace(inventory.gpus[0].uuid, inventory.gpus[1].uuid).replace('"index":0', '"index":1')
    api.patch_pod_annotations("team", "p", {IDX: "1", DEV: "8", key: text}, pod["metadata"]["resourceVersion"])


@pytest.mark.parametrize("restarted", [False, True], ids=["running plugin", "restarted plugin"])
def test_a_moved_pod_is_refused(
    node: tuple[FakeApiServer, Any], inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
    restarted: bool,
) -> None:
    api, (make_service, ids) = node
    service = make_service()
    start_pod(api, contract, signer)
    assert service.prestart(ids).gpu.index == 0
    if restarted:
        service = make_service()
        service.records.remember_pins()
    move_to_gpu_1(api, inventory, contract)
    assert parse_allocation(api.pod("team", "p")["metadata"]["annotations"][contract.allocation_key]).gpu_index == 1
    with pytest.raises(PluginError) as caught:
        service.prestart(ids)
    assert caught.value.code == "FAILED_PRECONDITION"
    gpu = inventory.gpus[0]
    assert caught.value.message.startswith(f"pod team/p (container 'main') was allocated GPU 0 ({gpu.uuid})")
    assert api.events[-1][:3] == ("team/p", "Warning", "GpuShareMoved")


def test_a_pod_moved_back_starts_again_and_a_gone_pod_is_unpinned(
    node: tuple[FakeApiServer, Any], inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
) -> None:
    api, (make_service, ids) = node
    service = make_service()
    start_pod(api, contract, signer)
    uid = api.pod("team", "p")["metadata"]["uid"]
    assert service.prestart(ids).gpu.index == 0
    before = api.pod("team", "p")["metadata"]["annotations"]
    move_to_gpu_1(api, inventory, contract)
    with pytest.raises(PluginError, match="was allocated GPU 0"):
        service.prestart(ids)
    api.patch_pod_annotations("team", "p", before, api.pod("team", "p")["metadata"]["resourceVersion"])
    assert service.prestart(ids).gpu.index == 0
    assert service.pins.get(uid) == Pin(0, inventory.gpus[0].uuid)
    api.delete("team", "p")
    service.records.remember_pins()
    assert service.pins.get(uid) is None


def test_a_restarted_plugin_that_cannot_list_pods_pins_at_the_next_start(
    node: tuple[FakeApiServer, Any], inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, (make_service, ids) = node
    start_pod(api, contract, signer)
    make_service().prestart(ids)
    service = make_service()
    api.fail = True
    with caplog.at_level(logging.INFO, logger="deviceplugin"):
        service.records.remember_pins()
    assert "pins not refreshed" in caplog.text
    api.fail = False
    assert service.prestart(ids).gpu.index == 0
    move_to_gpu_1(api, inventory, contract)
    with pytest.raises(PluginError, match="was allocated GPU 0"):
        service.prestart(ids)
