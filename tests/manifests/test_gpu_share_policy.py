"""The policy gpushare-gpu-share-pods: after every mutation, a GPU-share pod still carries the webhook's work."""

from __future__ import annotations

import copy

import pytest

from contract import IDX, Contract
from tests.harness.apiserver import policies
from tests.harness.pods import KEY, NS, USER, Pod, annotate, container, pod, stamped
from tests.manifests.test_policy import admit, policy
from tests.webhook.rules.test_admit import ROWS
from webhook.rules.admit import mutate_create, patched
from webhook.rules.validate import validate
from webhook.server.settings import settings_from

NAME = "gpushare-gpu-share-pods"
POLICY = settings_from({})
GPU = stamped(pod(container("a", 2), inits=[container("i", 1)]))


def _admitted_by_the_webhook() -> list[tuple[str, Pod]]:
    """Every pod of the one-call table the webhook admits, as its patch leaves it."""
    out = []
    for case, sent, settings in ROWS:
        patch, verdict = mutate_create(copy.deepcopy(sent), NS, settings, KEY, KEY.public_key(), lambda: "alloc-1")
        if verdict is None or verdict.allowed:
            out.append((case, patched(sent, patch)))
    return out


ADMITTED = _admitted_by_the_webhook()


@pytest.mark.parametrize(("case", "made"), ADMITTED, ids=[a[0] for a in ADMITTED])
def test_nothing_the_webhook_admits_is_refused(case: str, made: Pod) -> None:
    assert admit(NAME, "CREATE", made) in ([], None), case


def test_the_table_holds_gpu_share_pods_of_both_deliveries() -> None:
    judged = [c for c, made in ADMITTED if policies.evaluate(policy(NAME), "CREATE", made) is not None]
    assert "stamped GPU pod" in judged and "stamped pod in cdi mode" in judged


def _env(p: Pod, kind: str, index: int, entries: list[dict[str, object]], *, keep: bool = True) -> Pod:
    out = copy.deepcopy(p)
    ctr = out["spec"][kind][index]
    ctr["env"] = ([*ctr.get("env", [])] if keep else []) + entries
    return out


def _limit(p: Pod, units: str) -> Pod:
    out = copy.deepcopy(p)
    for kind in ("containers", "initContainers"):
        for ctr in out["spec"].get(kind, []):
            ctr["resources"]["limits"]["aliyun.com/gpu-mem"] = units
    return out


def _visible(p: Pod, value: dict[str, object]) -> Pod:
    out = copy.deepcopy(p)
    for entry in out["spec"]["containers"][0]["env"]:
        if entry["name"] == "NVIDIA_VISIBLE_DEVICES":
            entry.clear()
            entry.update({"name": "NVIDIA_VISIBLE_DEVICES", **value})
    return out


# What a mutating admission plugin after ours could do to a stamped pod, and the policy's sentence for it.
LATER_CHANGES = [
    ("the stamp removed", annotate(GPU, {"gpushare.io/intent": None, "gpushare.io/intent-signature": None}),
     "The pod requests aliyun.com/gpu-mem but has no gpushare.io/intent and gpushare.io/intent-signature annotations"),
    ("the signature removed", annotate(GPU, {"gpushare.io/intent-signature": None}),
     "has no annotation gpushare.io/intent-signature, so the gpushare mutating webhook did not stamp it"),
    ("the limits set to 0", _limit(GPU, "0"), "are written by the gpushare mutating webhook for pods that request"),
    ("NVIDIA_VISIBLE_DEVICES=all", _visible(GPU, {"value": "all"}), "Container a defines NVIDIA_VISIBLE_DEVICES"),
    ("NVIDIA_VISIBLE_DEVICES from another annotation",
     _visible(GPU, {"valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['mine']"}}}),
     "Container a defines NVIDIA_VISIBLE_DEVICES other than the gpushare webhook does"),
    ("a second NVIDIA_VISIBLE_DEVICES", _env(GPU, "containers", 0, [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                     "value": "all"}]),
     "Container a defines NVIDIA_VISIBLE_DEVICES"),
    ("an init container's NVIDIA_VISIBLE_DEVICES", _env(GPU, "initContainers", 0, [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}], keep=False), "Container i defines NVIDIA_VISIBLE_DEVICES"),
    ("CUDA_VISIBLE_DEVICES", _env(GPU, "containers", 0, [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]),
     "Container a sets CUDA_VISIBLE_DEVICES, but its GPU comes from the choice of the scheduler"),
]


@pytest.mark.parametrize(("case", "changed", "fragment"), LATER_CHANGES, ids=[c[0] for c in LATER_CHANGES])
def test_a_later_mutation_that_undoes_the_webhooks_work_is_refused(case: str, changed: Pod, fragment: str) -> None:
    messages = admit(NAME, "CREATE", changed)
    assert messages and all(m.startswith(f"gpushare denied pod {NS}/job-0. ") for m in messages), case
    assert any(fragment in m for m in messages), messages
    # The webhook's CREATE rules refuse it too: the policy holds a part of them, never more.
    assert not validate("CREATE", None, changed, USER, NS, POLICY, KEY.public_key()).allowed, case


def test_the_stamped_pod_is_the_reference() -> None:
    """The table's pods differ from an admitted one only by the change named."""
    assert admit(NAME, "CREATE", GPU) == []
    [visible] = [e for e in GPU["spec"]["containers"][0]["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
    assert visible["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{IDX}']"
    assert admit(NAME, "CREATE", stamped(pod(container("a", 2)), Contract(delivery="cdi"))) == []
