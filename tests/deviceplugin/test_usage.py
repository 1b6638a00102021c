"""Table tests for what a GPU carries: only believed pods count, on the GPU they are pinned to; a pod that cannot
be read is left out and reported once; pins rebuilt from the plugin's own allocation records."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import IDX, POD, Contract, signing
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import Refusal
from deviceplugin.judge import Accepted
from deviceplugin.kubelet import Holding
from deviceplugin.pins import Pin
from deviceplugin.service import Service
from deviceplugin.trust import Context
from deviceplugin.usage import node_usage, recorded_pin
from tests.harness.plugin.fakes import NODE, FakeApiServer, FakeHoldings, plugin_settings
from tests.harness.plugin.judged import judged
from tests.harness.pods import admitted, assigned, unit_pod

IDS = [f"GPU-x-_-{n}" for n in range(4)]


def ctx_for(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> Context:
    return Context(contract, NODE, signer.public_key(), {g.index: g for g in inventory.gpus}, inventory.healthy)


def bound(pod: dict[str, Any], uid: str, node: str = NODE, phase: str = "Running") -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    out["metadata"].update(uid=uid, resourceVersion="7")
    out["status"] = {"phase": phase}
    return out


def believed(name: str, units: int, index: int | None, contract: Contract, signer: Ed25519PrivateKey,
             **where: str) -> dict[str, Any]:
    pod = admitted(unit_pod(name, {"m": units}), contract, signer)
    return bound(assigned(pod, index, 8) if index is not None else pod, uid=name, **where)


def forged(name: str, index: str, units: str, contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    """A pod that asks for no GPU memory, given placement keys by someone who can write annotations."""
    pod = bound(admitted(unit_pod(name, {"m": 0}), contract, signer), uid=name)
    pod["metadata"].setdefault("annotations", {}).update({IDX: index, POD: units, "ALIYUN_COM_GPU_MEM_DEV": "8"})
    return pod


def copied_intent(name: str, contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    """A valid intent and signature from another pod of the namespace, on a pod that asks for nothing."""
    source = believed("source", 8, 1, contract, signer)
    pod = forged(name, "1", "8", contract, signer)
    pod["metadata"]["annotations"].update(
        {k: v for k, v in source["metadata"]["annotations"].items() if k.startswith("gpushare.io/")}
    )
    return pod


def resigned(name: str, contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    pod = believed(name, 2, 1, contract, signer)
    text = pod["metadata"]["annotations"][contract.intent_key]
    pod["metadata"]["annotations"][contract.signature_key] = signing.sign(Ed25519PrivateKey.generate(), text, "team")
    return pod


def huge_index(name: str, contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    pod = believed(name, 2, 1, contract, signer)
    pod["metadata"]["annotations"][IDX] = "9" * 5000  # int() refuses more than 4300 digits
    return pod


def raised_total(name: str, contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    pod = believed(name, 2, 1, contract, signer)
    pod["metadata"]["annotations"][POD] = "8"  # counted for its signed total, not its annotation
    return pod


Maker = Callable[[str, Contract, Ed25519PrivateKey], dict[str, Any]]

# (what the extra pod is, its maker, the usage of GPU 1 beside the believed pod "ok" with 3 units there)
CASES: list[tuple[str, Maker, int]] = [
    ("believed", lambda n, c, s: believed(n, 2, 1, c, s), 5),
    ("not placed", lambda n, c, s: believed(n, 2, None, c, s), 3),
    ("other node", lambda n, c, s: believed(n, 2, 1, c, s, node="node-b"), 3),
    ("finished", lambda n, c, s: believed(n, 2, 1, c, s, phase="Succeeded"), 3),
    ("no intent", lambda n, c, s: bound(assigned(unit_pod(n, {"m": 8}), 1, 8), uid=n), 3),
    ("forged keys on a pod without GPU memory", forged_keys := (lambda n, c, s: forged(n, "1", "8", c, s)), 3),
    ("an intent copied from another pod", copied_intent, 3),
    ("a signature by another key", resigned, 3),
    ("an index of 5000 digits", huge_index, 3),
    ("a POD above its signed total", raised_total, 5),
]


@pytest.mark.parametrize(("extra", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_only_believed_pods_count(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, extra: str, make: Maker, expected: int
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    pods = [believed("ok", 3, 1, contract, signer), make("extra", contract, signer)]
    assert node_usage(pods, ctx).on(1)[0] == expected
    assert node_usage(pods, ctx, exclude_uid="ok").on(1)[0] == expected - 3


@pytest.mark.parametrize("make", [forged_keys, copied_intent, resigned, huge_index])
def test_unbelieved_pods_are_reported_once(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, make: Maker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    pods = [believed("ok", 3, 1, contract, signer), make("bad", contract, signer)]
    with caplog.at_level(logging.WARNING, logger="deviceplugin"):
        for _ in range(3):
            node_usage(pods, ctx)
    reports = [r.getMessage() for r in caplog.records]
    assert len(reports) == 1 and reports[0].startswith("Pod team/bad ") and "not counted" in reports[0]


def test_a_gpu_filled_by_forged_pods_still_takes_a_believed_one(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    others = [forged("f1", "0", "8", contract, signer), huge_index("f2", contract, signer),
              copied_intent("f3", contract, signer)]
    pod = believed("p", 4, 0, contract, signer)
    assert isinstance(judged(pod, ["m"], IDS, ctx, others), Accepted)
    with pytest.raises(Refusal, match="already promised to team/q \\(6\\)"):
        judged(pod, ["m"], IDS, ctx, [*others, believed("q", 6, 0, contract, signer)])


def test_a_pinned_pod_counts_where_it_runs(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    pod = believed("p", 3, 0, contract, signer)
    ctx.pins.hold("p", Pin(0, inventory.gpus[0].uuid))
    pod["metadata"]["annotations"][IDX] = "1"
    usage = node_usage([pod], ctx)
    assert (usage.on(0)[0], usage.on(1)[0]) == (3, 0)


def record(pod: dict[str, Any], ctx: Context, **change: Any) -> dict[str, Any]:
    verdict = judged(pod, ["m"], IDS, ctx, [])
    assert isinstance(verdict, Accepted)
    out = copy.deepcopy(pod)
    out["metadata"]["annotations"].update(verdict.patch)
    key = ctx.contract.allocation_key
    if change:
        text = out["metadata"]["annotations"][key]
        for old, new in change.items():
            text = text.replace(old, new)
        out["metadata"]["annotations"][key] = text
    return out


@pytest.mark.parametrize(
    ("change", "pinned"),
    [
        ({}, True),
        ({'"node":"node-a"': '"node":"node-b"'}, False),
        ({'"allocationId":"': '"allocationId":"x'}, False),
        ({'"uuid":"GPU-': '"uuid":"GPU-other-'}, False),
        ({'"index":0': '"index":' + "9" * 5000}, False),
        ({'"version":1': '"version":2'}, False),
    ],
)
def test_pins_are_rebuilt_from_sound_records(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, change: dict[str, str], pinned: bool
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    pod = record(believed("p", 4, 0, contract, signer), ctx, **change)
    expected = Pin(0, inventory.gpus[0].uuid) if pinned else None
    assert recorded_pin(pod, ctx) == expected
    assert recorded_pin(believed("q", 3, 0, contract, signer), ctx) is None  # no record: pinned at its start


def test_a_pod_that_cannot_be_read_fails_no_other_start(
    tmp_path: Path, inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeApiServer()
    for name, maker in (("huge", huge_index), ("forged", forged_keys)):
        pod = maker(name, contract, signer)
        del pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
        api.add(pod, phase="Running")
    api.add(assigned(admitted(unit_pod("p", {"main": 8}), contract, signer), 1, 8))
    ids = [device for device, _ in inventory.devices()[:8]]
    service = Service(plugin_settings(str(tmp_path)), inventory, api, FakeHoldings([Holding("team", "p", "main",
                      tuple(ids))]), signer.public_key())
    with caplog.at_level(logging.WARNING, logger="deviceplugin"):
        for _ in range(3):
            assert service.prestart(ids).gpu.index == 1
    reports = sorted(r.getMessage()[:16] for r in caplog.records)
    assert reports == ["Pod team/forged ", "Pod team/huge is"]


def deleting(pod: dict[str, Any], phase: str = "Pending", **states: str) -> dict[str, Any]:
    """The pod once deleted (a deletionTimestamp), its app containers in the given states."""
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    out["metadata"]["resourceVersion"] = "8"
    out["status"] = {"phase": phase, "containerStatuses": [{"name": n, "state": {s: {}}} for n, s in states.items()]}
    return out


Edit = Callable[[dict[str, Any], Context], dict[str, Any]]


def pinned(pod: dict[str, Any], ctx: Context) -> dict[str, Any]:
    ctx.pins.hold(pod["metadata"]["uid"], Pin(1, ctx.gpus[1].uuid))
    return pod


# (what happened to the pod "extra" of 4 units on GPU 1, beside "ok" with 3 there: units on GPU 1, extra's share
# of them held by a pod being deleted). The scheduler extender frees a deleted pod's memory at once, so a pod being
# deleted counts only while a GPU-share container of it may still run.
DELETIONS: list[tuple[str, Edit, int, int]] = [
    ("pulling its image", lambda p, c: p, 7, 0),
    ("running", record, 7, 0),
    ("deleted while its image pulls", lambda p, c: deleting(p), 3, 0),
    ("deleted while it runs", lambda p, c: deleting(record(p, c), "Running", m="running"), 7, 4),
    ("deleted while running, not started by this plugin", lambda p, c: deleting(p, "Running", m="running"), 7, 4),
    ("deleted just after this plugin started it", lambda p, c: deleting(record(p, c)), 7, 4),
    ("deleted while its container is being created", lambda p, c: deleting(record(p, c), m="waiting"), 7, 4),
    ("deleted, its container stopped", lambda p, c: deleting(record(p, c), "Running", m="terminated"), 3, 0),
    ("deleted, pinned before its record is seen", lambda p, c: deleting(pinned(p, c)), 7, 4),
    ("deleted and finished", lambda p, c: deleting(record(p, c), "Succeeded", m="running"), 3, 0),
]


@pytest.mark.parametrize(("case", "edit", "units", "leaving"), DELETIONS, ids=[c[0] for c in DELETIONS])
def test_a_pod_being_deleted_holds_units_only_while_it_may_run(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, case: str, edit: Edit, units: int,
    leaving: int,
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    pods = [believed("ok", 3, 1, contract, signer), edit(believed("extra", 4, 1, contract, signer), ctx)]
    used, holders = node_usage(pods, ctx).on(1)
    assert used == units
    assert sum(h.units for h in holders if h.leaving) == leaving
