"""Which env a container may carry: the GPU-share env, the neutral env of every other container, the refusals (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from contract import (
    ENV_CUDA_VISIBLE,
    ENV_VISIBLE,
    Contract,
    ProtocolError,
    container_units,
    is_reserved_annotation,
)

# The NVIDIA container runtime reads NVIDIA_VISIBLE_DEVICES=void as "no GPU and no driver" (nvidia-container-toolkit,
# internal/config/image/cuda_image.go). An explicit `env` entry wins over `envFrom` and over the image's own env:
# kubelet appends the spec's env after both (pkg/kubelet/kubelet_pods.go, makeEnvironmentVariables).
VOID: Final = "void"
NEUTRAL_ENV: Final = {"name": ENV_VISIBLE, "value": VOID}
# The variables through which a container's environment selects devices (nvidia-container-toolkit,
# internal/config/image/cuda_image.go: IsLegacy, devicesFromEnvvars, ImexChannelRequests; and
# cmd/nvidia-container-runtime-hook/container_config.go: getMigDevices):
# - CUDA_VERSION, set and non-empty while NVIDIA_VISIBLE_DEVICES is absent (and NVIDIA_REQUIRE_CUDA empty), marks a
#   "legacy" CUDA image, which gets every GPU. Any NVIDIA_VISIBLE_DEVICES entry, void included, turns that off.
# - NVIDIA_MIG_CONFIG_DEVICES and NVIDIA_MIG_MONITOR_DEVICES hand a container the MIG management devices of the GPUs
#   it has; NVIDIA_IMEX_CHANNELS hands it IMEX channel devices. The toolkit reads all three only for a container
#   that already has devices, so void makes them inert too.
# - CUDA_VISIBLE_DEVICES is CUDA's own choice among the GPUs a container has.
# NVIDIA_DRIVER_CAPABILITIES, NVIDIA_REQUIRE_* and NVIDIA_DISABLE_REQUIRE select no device.
# The toolkit's swarm-resource setting (off by default) makes other names select devices, ahead of
# NVIDIA_VISIBLE_DEVICES and of void; the docs say to leave it off.
ENV_LEGACY: Final = "CUDA_VERSION"
ENV_SELECTING: Final = (ENV_CUDA_VISIBLE, "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES",
                        "NVIDIA_IMEX_CHANNELS")
# NVIDIA_VISIBLE_DEVICES and every name above: an `envFrom` prefix that could form one of them is refused in a
# container without void. manifests/base/policy.yaml (gpushare-container-env) lists the same names; a test holds
# them equal.
DEVICE_ENV: Final = (ENV_VISIBLE, ENV_LEGACY, *ENV_SELECTING)
# The toolkit's volume-mount device list: a mount whose destination starts with this directory names a GPU
# (nvidia-container-toolkit, internal/config/image/cuda_image.go, DeviceListAsVolumeMountsRoot).
DEVICE_LIST_ROOT: Final = "/var/run/nvidia-container-devices"
DEVICE_LIST_DIR: Final = "nvidia-container-devices"
# Kinds of containers in spec order; ephemeral containers can have no resources (pkg/apis/core/validation), so
# they are never GPU-share containers.
KINDS: Final = ("initContainers", "containers", "ephemeralContainers")
_KIND_WORD: Final = {"initContainers": "init container", "containers": "container",
                     "ephemeralContainers": "ephemeral container"}


@dataclass(frozen=True)
class Slot:
    """One container of a pod and where it sits: spec.<kind>[index]."""

    kind: str
    index: int
    container: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.container.get("name"))

    @property
    def path(self) -> str:
        return f"/spec/{self.kind}/{self.index}"

    def describe(self) -> str:
        return f"{_KIND_WORD[self.kind]} {self.name!r}"


def slots(pod: Mapping[str, Any], kinds: Sequence[str] = KINDS) -> Iterator[Slot]:
    spec = pod.get("spec") or {}
    for kind in kinds:
        for index, container in enumerate(spec.get(kind) or []):
            yield Slot(kind, index, container)


def new_ephemeral(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Slot]:
    """Ephemeral containers of `new` that `old` lacks: the ones a pods/ephemeralcontainers update adds."""
    before = {s.name for s in slots(old, ("ephemeralContainers",))}
    return [s for s in slots(new, ("ephemeralContainers",)) if s.name not in before]


def is_share_container(container: Mapping[str, Any], contract: Contract) -> bool:
    """A positive limit of the shared resource; a malformed limit counts too (the validator refuses it)."""
    try:
        return container_units(container, contract.resource, "container") > 0
    except ProtocolError:
        return True


def is_foreign_gpu(container: Mapping[str, Any], other_resources: Sequence[str]) -> bool:
    """A positive limit of another device plugin's GPU resource (whole GPUs): that plugin sets the env itself."""
    limits = (container.get("resources") or {}).get("limits") or {}
    return any(str(limits[r]).strip() not in ("0", "") for r in other_resources if r in limits)


def is_neutral(container: Mapping[str, Any], contract: Contract, other_resources: Sequence[str]) -> bool:
    """A container that must see no GPU: neither GPU-share nor another device plugin's GPU container."""
    return not is_share_container(container, contract) and not is_foreign_gpu(container, other_resources)


def needs_void(container: Mapping[str, Any]) -> bool:
    """True when the container does not define NVIDIA_VISIBLE_DEVICES in its env (any value: the validator
    judges the value; a second entry would only hide the user's)."""
    return not any(e.get("name") == ENV_VISIBLE for e in container.get("env") or [])


def _annotation_field(entry: Mapping[str, Any]) -> str | None:
    field_ref = (entry.get("valueFrom") or {}).get("fieldRef") or {}
    path = str(field_ref.get("fieldPath") or "")
    prefix = "metadata.annotations["
    if not path.startswith(prefix) or not path.endswith("]"):
        return None
    return path[len(prefix):-1].strip("'\"")


def under_device_list(mount_path: str) -> bool:
    # The toolkit compares the destination by prefix after cleaning it; any path that names the directory is
    # refused, so no spelling of it (//var/run/..., /var/run/./..., ../) slips past. The policy does the same.
    return DEVICE_LIST_DIR in mount_path


def mount_problems(slot: Slot) -> list[str]:
    """Volume mounts that would hand the container GPUs through the toolkit's volume-mount device list."""
    return [
        f"{slot.describe()} mounts a volume at {m.get('mountPath')}; the NVIDIA container runtime reads mounts "
        f"under {DEVICE_LIST_ROOT}/ as a list of GPUs to give the container, so paths naming {DEVICE_LIST_DIR} "
        "are reserved; mount it elsewhere"
        for m in slot.container.get("volumeMounts") or []
        if under_device_list(str(m.get("mountPath") or ""))
    ]


def is_voided(container: Mapping[str, Any]) -> bool:
    """The container's own env sets NVIDIA_VISIBLE_DEVICES to the literal void: the runtime then gives it no device,
    whatever its envFrom sources, its image or CUDA_VERSION say (the mutation adds this entry in env delivery)."""
    return any(e.get("name") == ENV_VISIBLE and e.get("value") == VOID and "valueFrom" not in e
               for e in container.get("env") or [])


def forming_prefix(entry: Mapping[str, Any]) -> str | None:
    """The first name of DEVICE_ENV an `envFrom` entry's prefix could form with some key, or None.

    Without a prefix the names come from the ConfigMap or Secret alone, which admission cannot read.
    """
    prefix = str(entry.get("prefix") or "")
    return next((name for name in DEVICE_ENV if prefix and name.startswith(prefix)), None)


def _source(entry: Mapping[str, Any]) -> str:
    for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
        ref = entry.get(key)
        if isinstance(ref, Mapping):
            return f"{kind} {ref.get('name')!r}"
    return "an envFrom source"


def _unvoided_problems(slot: Slot, contract: Contract) -> list[str]:
    """What gives GPUs to a container whose env does not set void: CUDA_VERSION, an envFrom prefix forming a name."""
    unvoided = f"it requests no {contract.resource} and its env does not set {ENV_VISIBLE}={VOID}"
    fix = f"add the entry {ENV_VISIBLE}={VOID} to its env, or request {contract.resource} in its resources.limits"
    problems: list[str] = []
    if any(e.get("name") == ENV_LEGACY for e in slot.container.get("env") or []):
        problems.append(
            f"{slot.describe()} sets {ENV_LEGACY}, but {unvoided}: the NVIDIA container runtime would take it for "
            f"a legacy CUDA image and give it every GPU; remove the entry, {fix}"
        )
    for entry in slot.container.get("envFrom") or []:
        formed = forming_prefix(entry)
        if formed is not None:
            problems.append(
                f"{slot.describe()} takes variables from {_source(entry)} with prefix {entry.get('prefix')!r}, "
                f"which can form {formed}, but {unvoided}: the NVIDIA container runtime would read it and could "
                f"give the container GPUs nobody booked; use a prefix that cannot form {formed}, {fix}"
            )
    return problems


def neutral_problems(slot: Slot, contract: Contract) -> list[str]:
    """What a container that must see no GPU may not define: GPU selection env, or the reserved annotations."""
    problems: list[str] = []
    for entry in slot.container.get("env") or []:
        name = str(entry.get("name"))
        if name == ENV_VISIBLE and not (entry.get("value") == VOID and "valueFrom" not in entry):
            problems.append(
                f"{slot.describe()} sets {ENV_VISIBLE}, but it requests no {contract.resource} and the NVIDIA "
                f"container runtime would give it GPUs nobody booked; remove the entry (or set it to {VOID}), or "
                f"request {contract.resource} in its resources.limits"
            )
        elif name in ENV_SELECTING:
            problems.append(
                f"{slot.describe()} sets {name}, but it requests no {contract.resource}; remove the "
                f"entry, or request {contract.resource} in its resources.limits"
            )
        key = _annotation_field(entry)
        if key is not None and is_reserved_annotation(key, contract):
            problems.append(
                f"{slot.describe()} reads annotation {key} into {name}, but that annotation is the GPU placement "
                f"of GPU-share containers and this one requests no {contract.resource}; remove the entry, or "
                f"request {contract.resource} in its resources.limits"
            )
    if not is_voided(slot.container):
        problems.extend(_unvoided_problems(slot, contract))
    return problems


def container_problems(checked: Sequence[Slot], contract: Contract, other_gpu: Sequence[str]) -> list[str]:
    """Every container: no device-list mounts; every container that must see no GPU: no GPU env of its own."""
    problems: list[str] = []
    for slot in checked:
        problems.extend(mount_problems(slot))
        if is_neutral(slot.container, contract, other_gpu):
            problems.extend(neutral_problems(slot, contract))
    return problems
