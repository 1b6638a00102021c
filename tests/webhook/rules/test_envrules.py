"""Containers that request no GPU memory: neutralised by the mutation, refused when they ask for GPUs anyway."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from contract import IDX
from contract.env import annotation_ref
from tests.harness.cases.selection_cases import CASES, CDI, ENV, FORMS, PLACES, Case, mutated, request
from tests.harness.pods import EXTENDER, KEY, NS, USER, Pod, annotate, container, pod, stamped
from webhook.rules.envrules import VOID, under_device_list
from webhook.rules.mutate import mutate_update
from webhook.rules.validate import validate
from webhook.server.settings import settings_from

POLICY, CDI_POLICY = settings_from({}), settings_from({"GPUSHARE_DELIVERY": "cdi"})
NEUTRAL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": VOID}


def limited(name: str, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "cuda:12", "resources": {"limits": limits}, **extra}


@pytest.mark.parametrize(
    ("case", "spec", "kind", "index", "env"),
    [
        ("sidecar of a GPU-share pod", pod(container("a", 2), container("log")), "containers", 1, [NEUTRAL]),
        ("regular init container", pod(container("a", 2), inits=[container("fetch")]), "initContainers", 0,
         [NEUTRAL]),
        ("limit of 0", pod(container("a", "0")), "containers", 0, [NEUTRAL]),
        ("existing env is appended to", pod(container("a", env=[{"name": "HOME", "value": "/"}])), "containers", 0,
         [{"name": "HOME", "value": "/"}, NEUTRAL]),
        ("a void of its own is not doubled", pod(container("a", env=[NEUTRAL])), "containers", 0, [NEUTRAL]),
        ("a user value is left for the validator", pod(container("a", env=[{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                           "value": "all"}])),
         "containers", 0, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        ("whole-GPU container of another plugin is left alone", pod(limited("w", {"nvidia.com/gpu": "1"})),
         "containers", 0, None),
        ("whole-GPU limit of 0 is neutralised", pod(limited("w", {"nvidia.com/gpu": "0"})), "containers", 0,
         [NEUTRAL]),
    ],
)
def test_env_mode_neutralises_every_container_that_requests_no_gpu(
    case: str, spec: Pod, kind: str, index: int, env: list[dict[str, Any]] | None
) -> None:
    out = mutated(spec)
    assert out["spec"][kind][index].get("env") == env, case
    assert mutated(spec, CDI)["spec"][kind][index].get("env") == spec["spec"][kind][index].get("env"), case


def ephemeral(p: Pod, *containers: dict[str, Any]) -> Pod:
    out = copy.deepcopy(p)
    out["spec"]["ephemeralContainers"] = [*out["spec"].get("ephemeralContainers", []), *containers]
    return out


def test_only_added_ephemeral_containers_are_neutralised() -> None:
    first = ephemeral(pod(container("a", 2)), {"name": "debug-1", "image": "cuda:12"})
    second = ephemeral(first, {"name": "debug-2", "image": "cuda:12"})
    ops = mutate_update(first, second, ENV)
    assert ops == [{"op": "add", "path": "/spec/ephemeralContainers/1/env", "value": [NEUTRAL]}]
    assert mutate_update(first, second, CDI) == []
    assert mutate_update(first, first, ENV) == []


NVD = "NVIDIA_VISIBLE_DEVICES"
CVD = "CUDA_VISIBLE_DEVICES"
MOUNT = {"name": "devs", "mountPath": "/var/run/nvidia-container-devices/all"}


ATTACKS = [
    ("plain pod sets all", pod(container("cpu", env=[{"name": NVD, "value": "all"}])),
     ["container 'cpu' sets NVIDIA_VISIBLE_DEVICES", "remove the entry (or set it to void)"]),
    ("sidecar lists indices", pod(container("a", 2), container("log", env=[{"name": NVD, "value": "0,1,2,3"}])),
     ["container 'log' sets NVIDIA_VISIBLE_DEVICES"]),
    ("init container", pod(container("a"), inits=[container("i", env=[{"name": NVD, "value": "all"}])]),
     ["init container 'i' sets NVIDIA_VISIBLE_DEVICES"]),
    ("limit of 0", pod(container("z", "0", env=[{"name": NVD, "value": "1"}])),
     ["container 'z' sets NVIDIA_VISIBLE_DEVICES"]),
    ("empty value", pod(container("cpu", env=[{"name": NVD, "value": ""}])),
     ["container 'cpu' sets NVIDIA_VISIBLE_DEVICES"]),
    ("CUDA_VISIBLE_DEVICES", pod(container("cpu", env=[{"name": CVD, "value": "0"}])),
     ["container 'cpu' sets CUDA_VISIBLE_DEVICES"]),
    ("copy of the webhook's fieldRef", pod(container("cpu", env=[{"name": NVD, **annotation_ref(IDX)}])),
     ["container 'cpu' sets NVIDIA_VISIBLE_DEVICES", f"reads annotation {IDX} into NVIDIA_VISIBLE_DEVICES"]),
    ("fieldRef under another name", pod(container("cpu", env=[{"name": "X", **annotation_ref(IDX)}])),
     [f"container 'cpu' reads annotation {IDX} into X"]),
    ("fieldRef to an own key", pod(container("cpu", env=[{"name": "X", **annotation_ref("gpushare.io/intent")}])),
     ["container 'cpu' reads annotation gpushare.io/intent into X"]),
    ("device-list mount", pod(container("cpu", volumeMounts=[MOUNT])),
     ["container 'cpu' mounts a volume at /var/run/nvidia-container-devices/all", "mount it elsewhere"]),
    ("device-list mount spelled oddly", pod(container("cpu", volumeMounts=[
        {"name": "d", "mountPath": "//var/run/./nvidia-container-devices/0"}])),
     ["container 'cpu' mounts a volume"]),
    ("device-list mount in a GPU-share container", pod(container("a", 2, volumeMounts=[MOUNT])),
     ["container 'a' mounts a volume"]),
]


@pytest.mark.parametrize(("case", "spec", "fragments"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_containers_without_gpu_share_cannot_ask_for_gpus(case: str, spec: Pod, fragments: list[str]) -> None:
    for policy, contract in ((POLICY, ENV), (CDI_POLICY, CDI)):
        verdict = validate("CREATE", None, stamped(spec, contract), USER, NS, policy, KEY.public_key())
        assert not verdict.allowed, case
        assert verdict.message.startswith(f"gpushare denied pod {NS}/job-0. "), case
        for fragment in fragments:
            assert fragment[0].upper() + fragment[1:] in verdict.message or fragment in verdict.message, case


HARMLESS = [
    ("void of its own", pod(container("cpu", env=[NEUTRAL]))),
    ("the mutation's own result", mutated(pod(container("a", 2), container("log"), inits=[container("i")]))),
    ("whole-GPU container of another plugin", pod(limited("w", {"nvidia.com/gpu": "1"},
                                                          env=[{"name": CVD, "value": "0"}]))),
    ("unrelated fieldRef", pod(container("cpu", env=[{"name": "N", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.name"}}}]))),
    ("other mounts", pod(container("cpu", volumeMounts=[{"name": "d", "mountPath": "/var/run/secrets"}]))),
]


@pytest.mark.parametrize(("case", "spec"), HARMLESS, ids=[h[0] for h in HARMLESS])
def test_harmless_containers_are_allowed(case: str, spec: Pod) -> None:
    verdict = validate("CREATE", None, spec, USER, NS, POLICY, KEY.public_key())
    assert verdict.allowed, f"{case}: {verdict.message}"


@pytest.mark.parametrize(
    ("case", "added", "allowed"),
    [
        ("debug container with all GPUs", {"name": "dbg", "image": "cuda", "env": [{"name": NVD, "value": "all"}]},
         False),
        ("debug container with a device-list mount", {"name": "dbg", "image": "cuda", "volumeMounts": [MOUNT]}, False),
        ("neutralised debug container", {"name": "dbg", "image": "cuda", "env": [NEUTRAL]}, True),
    ],
)
def test_ephemeral_containers_are_checked_when_added(case: str, added: dict[str, Any], allowed: bool) -> None:
    old = stamped(pod(container("a", 2)))
    verdict = validate("UPDATE", old, ephemeral(old, added), USER, NS, POLICY, KEY.public_key())
    assert verdict.allowed is allowed, case
    if not allowed:
        assert "Ephemeral container 'dbg'" in verdict.message


def test_a_status_update_cannot_move_the_gpu_of_a_bound_pod() -> None:
    old = annotate(stamped(pod(container("a", 2))), {IDX: "0", "ALIYUN_COM_GPU_MEM_DEV": "16",
                                                     "ALIYUN_COM_GPU_MEM_POD": "2"})
    old["spec"]["nodeName"] = "n1"
    moved = annotate(old, {IDX: "1"})
    for user in ("system:node:n1", USER, EXTENDER):
        verdict = validate("UPDATE", old, moved, user, NS, POLICY, KEY.public_key())
        assert not verdict.allowed, user
        assert IDX in verdict.message


@pytest.mark.parametrize(
    ("path", "reserved"),
    [
        ("/var/run/nvidia-container-devices", True),
        ("/var/run/nvidia-container-devices/GPU-1234", True),
        ("/run/../var/run/nvidia-container-devices/0", True),
        ("/var/run/secrets/kubernetes.io", False),
        ("/data", False),
    ],
)
def test_device_list_paths(path: str, reserved: bool) -> None:
    assert under_device_list(path) is reserved


WORD = {"app": "container", "sidecar": "container", "init": "init container", "ephemeral": "ephemeral container"}


def webhook_refusal(place: str, form: str, case: Case) -> str | None:
    """The validating webhook's container-env denial of the case in that form, or None when it has none."""
    operation, old, new = request(place, form, case.container)
    verdict = validate(operation, old, new, USER, NS, CDI_POLICY if form == "cdi" else POLICY, KEY.public_key(),
                       subresource="ephemeralcontainers" if operation == "UPDATE" else "")
    return verdict.message if "container_env" in verdict.reasons else None


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gpu_selection_beside_nvidia_visible_devices(case: Case, place: str, form: str) -> None:
    # Down: as created while the webhook is down (no mutation); env and cdi: through that delivery's mutation.
    message = webhook_refusal(place, form, case)
    if form not in case.refused:
        assert message is None, message
        return
    assert message is not None, "allowed"
    word = WORD[place][0].upper() + WORD[place][1:]
    assert re.search(f"{word} 'x' [^;:]*{re.escape(case.fragment)}", message), message
