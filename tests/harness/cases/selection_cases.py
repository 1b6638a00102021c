"""GPU selection in containers without GPU memory: one table for the webhook's rules and the policy's CEL.

Each case is a container that requests no GPU memory, placed as an app container of a plain pod, a sidecar of a
GPU-share pod, an init container, or an ephemeral container a pods/ephemeralcontainers update adds; and each
placement is judged in three forms: as created while the webhook is down (not mutated: the policy alone sees it),
and as the mutation of each delivery mode leaves it (env adds NVIDIA_VISIBLE_DEVICES=void, cdi adds nothing).
`refused` names the forms in which both the webhook and the policy refuse it; `fragment` is in both messages.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import jsonpatch

from contract import Contract
from tests.harness.pods import KEY, NS, Pod, container, counter, pod
from webhook.rules.envrules import VOID
from webhook.rules.mutate import mutate, mutate_update

ENV, CDI = Contract(), Contract(delivery="cdi")
CONTRACTS = {"env": ENV, "cdi": CDI}
FORMS = ("down", "env", "cdi")
PLACES = ("app", "sidecar", "init", "ephemeral")
WHOLE = ("nvidia.com/gpu",)
ALWAYS: frozenset[str] = frozenset(FORMS)
UNVOIDED: frozenset[str] = frozenset({"down", "cdi"})  # wherever no void was added: the webhook down, cdi delivery
NEVER: frozenset[str] = frozenset()
VOIDED = {"name": "NVIDIA_VISIBLE_DEVICES", "value": VOID}
UNVOIDED_WHY = "but it requests no aliyun.com/gpu-mem and its env does not set NVIDIA_VISIBLE_DEVICES=void"


def config_ref(name: str, key: str = "v") -> dict[str, Any]:
    return {"valueFrom": {"configMapKeyRef": {"name": name, "key": key}}}


def secret_ref(name: str, key: str = "v") -> dict[str, Any]:
    return {"valueFrom": {"secretKeyRef": {"name": name, "key": key}}}


def target(env: list[dict[str, Any]] | None = None, env_from: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The container under test, named `x`, on a plain image (busybox sets no CUDA_VERSION of its own)."""
    c: dict[str, Any] = {"name": "x", "image": "busybox:1.36"}
    if env is not None:
        c["env"] = env
    if env_from is not None:
        c["envFrom"] = env_from
    return c


@dataclass(frozen=True)
class Case:
    name: str
    container: dict[str, Any]
    refused: frozenset[str]
    fragment: str = ""


CASES = [
    # The legacy-image rule: CUDA_VERSION without NVIDIA_VISIBLE_DEVICES gets every GPU (kubectl run --env).
    Case("CUDA_VERSION value", target([{"name": "CUDA_VERSION", "value": "12.4"}]), UNVOIDED,
         f"sets CUDA_VERSION, {UNVOIDED_WHY}"),
    Case("CUDA_VERSION from a ConfigMap key", target([{"name": "CUDA_VERSION", **config_ref("cuda")}]), UNVOIDED,
         f"sets CUDA_VERSION, {UNVOIDED_WHY}"),
    Case("CUDA_VERSION from a Secret key", target([{"name": "CUDA_VERSION", **secret_ref("cuda")}]), UNVOIDED,
         f"sets CUDA_VERSION, {UNVOIDED_WHY}"),
    Case("CUDA_VERSION beside its own void", target([{"name": "CUDA_VERSION", "value": "12.4"}, VOIDED]), NEVER),
    # envFrom: a prefix that can form a selecting name.
    Case("ConfigMap with prefix NVIDIA_", target(env_from=[{"prefix": "NVIDIA_", "configMapRef": {"name": "gpu"}}]),
         UNVOIDED, f"which can form NVIDIA_VISIBLE_DEVICES, {UNVOIDED_WHY}"),
    Case("Secret with prefix CUDA_", target(env_from=[{"prefix": "CUDA_", "secretRef": {"name": "gpu"}}]),
         UNVOIDED, f"which can form CUDA_VERSION, {UNVOIDED_WHY}"),
    Case("ConfigMap with prefix N", target(env_from=[{"prefix": "N", "configMapRef": {"name": "gpu"}}]),
         UNVOIDED, f"which can form NVIDIA_VISIBLE_DEVICES, {UNVOIDED_WHY}"),
    Case("ConfigMap with prefix NVIDIA_MIG_", target(env_from=[
        {"configMapRef": {"name": "app"}}, {"prefix": "NVIDIA_MIG_", "configMapRef": {"name": "gpu"}}]),
         UNVOIDED, f"which can form NVIDIA_MIG_CONFIG_DEVICES, {UNVOIDED_WHY}"),
    Case("prefix NVIDIA_ beside its own void", target([VOIDED], [{"prefix": "NVIDIA_", "configMapRef": {"name": "g"}}]),
         NEVER),
    Case("ConfigMap without prefix", target(env_from=[{"configMapRef": {"name": "gpu"}}]), NEVER),
    Case("Secret with an empty prefix", target(env_from=[{"prefix": "", "secretRef": {"name": "gpu"}}]), NEVER),
    Case("ConfigMap with prefix APP_", target(env_from=[{"prefix": "APP_", "configMapRef": {"name": "gpu"}}]), NEVER),
    Case("prefix NVIDIA_DRIVER_", target(env_from=[{"prefix": "NVIDIA_DRIVER_", "configMapRef": {"name": "g"}}]),
         NEVER),
    # Variables that select devices whatever else the container sets: refused in every form, void or not.
    Case("NVIDIA_VISIBLE_DEVICES from a Secret key", target([{"name": "NVIDIA_VISIBLE_DEVICES", **secret_ref("g")}]),
         ALWAYS, "sets NVIDIA_VISIBLE_DEVICES, but it requests no aliyun.com/gpu-mem"),
    Case("NVIDIA_MIG_CONFIG_DEVICES", target([{"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"}]), ALWAYS,
         "sets NVIDIA_MIG_CONFIG_DEVICES, but it requests no aliyun.com/gpu-mem"),
    Case("NVIDIA_MIG_MONITOR_DEVICES from a ConfigMap key", target([
        {"name": "NVIDIA_MIG_MONITOR_DEVICES", **config_ref("mig")}]), ALWAYS,
         "sets NVIDIA_MIG_MONITOR_DEVICES, but it requests no aliyun.com/gpu-mem"),
    Case("NVIDIA_IMEX_CHANNELS beside void", target([VOIDED, {"name": "NVIDIA_IMEX_CHANNELS", "value": "0"}]),
         ALWAYS, "sets NVIDIA_IMEX_CHANNELS, but it requests no aliyun.com/gpu-mem"),
    # Variables that select nothing.
    Case("driver capabilities and requirements", target([
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}, {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12"},
        {"name": "NVIDIA_DISABLE_REQUIRE", "value": "1"}, {"name": "CUDA_HOME", "value": "/usr/local/cuda"}]), NEVER),
]


def mutated(p: Pod, contract: Contract = ENV) -> Pod:
    """The pod as the mutation of that delivery leaves it (another plugin's whole GPUs: nvidia.com/gpu)."""
    out: Pod = jsonpatch.apply_patch(copy.deepcopy(p), mutate(p, NS, contract, KEY, counter(), other_gpu=WHOLE))
    return out


def with_ephemeral(p: Pod, added: dict[str, Any]) -> Pod:
    out = copy.deepcopy(p)
    out["spec"]["ephemeralContainers"] = [*out["spec"].get("ephemeralContainers", []), copy.deepcopy(added)]
    return out


def placed(place: str, added: dict[str, Any]) -> Pod:
    """The pod that carries the container at `place` (without it for `ephemeral`: the update adds it)."""
    if place == "app":
        return pod(copy.deepcopy(added))
    if place == "sidecar":
        return pod(container("gpu", 2), copy.deepcopy(added))
    if place == "init":
        return pod(container("main"), inits=[copy.deepcopy(added)])
    return pod(container("gpu", 2))


def request(place: str, form: str, added: dict[str, Any]) -> tuple[str, Pod | None, Pod]:
    """(operation, old pod, new pod) as the validators see them in `form`."""
    spec = placed(place, added)
    if place != "ephemeral":
        return "CREATE", None, spec if form == "down" else mutated(spec, CONTRACTS[form])
    old = mutated(spec, ENV if form == "down" else CONTRACTS[form])
    new = with_ephemeral(old, added)
    if form != "down":
        new = jsonpatch.apply_patch(new, mutate_update(old, new, CONTRACTS[form]))
    return "UPDATE", old, new
