"""What a started container sees: its environment as kubelet + runtime build it, CDI edits, and its GPUs (pure)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deviceplugin.api import deviceplugin_pb2 as dp
from node.cdiedits import FAKE_GPU_MOUNT
from node.inventory import Gpu

_FIELD_RE = re.compile(r"^metadata\.(annotations|labels)\['([^']*)'\]$")


class CdiError(Exception):
    """A CDI device name the runtime cannot resolve from the spec directory (a container-creation error)."""


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API fieldRef as the kubelet resolves it; a missing annotation or label is an empty string."""
    meta = pod.get("metadata") or {}
    match = _FIELD_RE.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName"),
    }
    return str(simple.get(path) or "")


# Every nvidia/cuda image sets these in its config (the NVIDIA container runtime then gives it every GPU).
CUDA_IMAGE_ENV: dict[str, str] = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}


def image_env(image: str) -> dict[str, str]:
    """The env of an image's config: a repository named `nvidia/cuda` (under any registry) has CUDA_IMAGE_ENV,
    every other image none."""
    head, _, last = image.split("@", 1)[0].rpartition("/")
    repository = f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]  # without tag or digest
    return dict(CUDA_IMAGE_ENV) if repository == "nvidia/cuda" or repository.endswith("/nvidia/cuda") else {}


def container_env(
    container: Mapping[str, Any], pod: Mapping[str, Any], allocate_envs: Sequence[Mapping[str, str]]
) -> list[tuple[str, str]]:
    """The ordered env list handed to the runtime: the image's env first (containerd applies the image config,
    then the CRI config over it), then the device-plugin envs, then the container's own env.

    Simplified: `$(VAR)` expansion and secret/configMap references are not modelled (the latter resolve to "").
    """
    out: list[tuple[str, str]] = list(image_env(str(container.get("image", ""))).items())
    for envs in allocate_envs:
        out.extend(envs.items())
    for entry in container.get("env") or []:
        name = str(entry.get("name"))
        if "value" in entry:
            out.append((name, str(entry.get("value") or "")))
            continue
        field_ref = (entry.get("valueFrom") or {}).get("fieldRef") or {}
        out.append((name, field_value(pod, str(field_ref.get("fieldPath", "")))))
    return out


def last_wins(env: Sequence[tuple[str, str]]) -> dict[str, str]:
    """containerd and runc keep the last value of a repeated name."""
    return dict(env)


@dataclass(frozen=True)
class CdiEdits:
    env: tuple[tuple[str, str], ...]
    device_nodes: tuple[str, ...]
    mounts: tuple[tuple[str, str], ...] = ()  # (container path, host path)


def read_cdi_specs(cdi_dir: str) -> dict[str, dict[str, Any]]:
    """Every device of every JSON spec in the directory, by fully qualified name (`vendor/class=name`).

    Like containerd and CRI-O, the registry is refreshed right before injection; unreadable files are skipped.
    """
    devices: dict[str, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(cdi_dir))
    except FileNotFoundError:
        return devices
    for fname in names:
        if not fname.endswith(".json"):
            continue
        try:
            with open(os.path.join(cdi_dir, fname), encoding="utf-8") as fh:
                spec = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(spec, dict):
            continue
        kind = str(spec.get("kind", ""))
        common = spec.get("containerEdits") or {}
        for device in spec.get("devices") or []:
            edits = device.get("containerEdits") or {}
            devices[f"{kind}={device.get('name')}"] = {"device": edits, "spec": common}
    return devices


def cdi_edits(names: Sequence[str], cdi_dir: str) -> CdiEdits:
    """The env and device nodes the runtime injects for these CDI devices, or CdiError if one is unknown."""
    registry = read_cdi_specs(cdi_dir)
    env: list[tuple[str, str]] = []
    nodes: list[str] = []
    mounts: list[tuple[str, str]] = []
    for name in names:
        found = registry.get(name)
        if found is None:
            raise CdiError(f"failed to inject CDI devices: unresolvable CDI devices {name}")
        for edits in (found["spec"], found["device"]):
            for item in edits.get("env") or []:
                key, _, value = str(item).partition("=")
                env.append((key, value))
            nodes.extend(str(n.get("path")) for n in edits.get("deviceNodes") or [])
            mounts.extend((str(m.get("containerPath")), str(m.get("hostPath"))) for m in edits.get("mounts") or [])
    return CdiEdits(tuple(env), tuple(nodes), tuple(mounts))


def mounted_gpu(mounts: Sequence[tuple[str, str]]) -> tuple[int, ...] | None:
    """The GPU index named by the file mounted at /run/gpushare/gpu (a fake GPU's CDI mount), read as the container
    would at its start; None without that mount, () when the file is missing or names no index."""
    hosts = [host for path, host in mounts if path == FAKE_GPU_MOUNT]
    if not hosts:
        return None
    try:
        with open(hosts[-1], encoding="utf-8") as fh:
            fields = dict(line.partition("=")[::2] for line in fh.read().splitlines())
        return (int(fields["index"]),)
    except (OSError, KeyError, ValueError):
        return ()


@dataclass(frozen=True)
class Visible:
    """What NVIDIA_VISIBLE_DEVICES gives the container: GPU indexes, and tokens no GPU answers to."""

    gpus: tuple[int, ...]
    made_up: tuple[str, ...]


def visible_gpus(value: str | None, gpus: Sequence[Gpu]) -> Visible:
    """Resolve NVIDIA_VISIBLE_DEVICES the way nvidia-container-cli does: indexes or UUIDs, or all/none/void."""
    if value is None or value.strip() in ("", "none", "void"):
        return Visible((), ())
    if value.strip() == "all":
        return Visible(tuple(g.index for g in gpus), ())
    by_index = {str(g.index): g.index for g in gpus}
    by_uuid = {g.uuid: g.index for g in gpus}
    found: list[int] = []
    made_up: list[str] = []
    for token in (t.strip() for t in value.split(",")):
        if token in by_index:
            found.append(by_index[token])
        elif token in by_uuid:
            found.append(by_uuid[token])
        else:
            made_up.append(token)
    return Visible(tuple(found), tuple(made_up))


@dataclass(frozen=True)
class ContainerRun:
    """One container start attempt and what the container saw: the evidence the invariants judge."""

    node: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    init: bool
    units: int
    env: dict[str, str]
    visible: str | None
    gpus: tuple[int, ...]
    made_up: tuple[str, ...]
    started: bool
    error: str | None
    annotations: dict[str, str]
    reason: str = ""  # the waiting reason when the start failed
    mounted: tuple[int, ...] | None = None  # the GPU a CDI-mounted file names (fake GPUs in cdi mode)
    cdi_devices: tuple[str, ...] = ()  # the CDI device names the runtime injected
    env_interface: bool = True  # whether the runtime read the container's own NVIDIA_VISIBLE_DEVICES


def create_container(
    node: str, gpus: Sequence[Gpu], cdi_dir: str, pod: Mapping[str, Any], container: Mapping[str, Any], init: bool,
    units: int, response: dp.ContainerAllocateResponse | None, env_interface: bool = True,
) -> ContainerRun:
    """What the runtime does with one container of `pod` (as it is now): env, CDI edits, the NVIDIA hook.

    Without `env_interface` the runtime is set to ignore NVIDIA_VISIBLE_DEVICES of unprivileged containers
    (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`, docs/security.md's setting for cdi delivery): the
    container's GPUs then come from its CDI devices' edits alone.
    """
    meta = pod.get("metadata") or {}
    env = container_env(container, pod, [dict(response.envs)] if response is not None else [])
    reason, error = "", None
    names = [d.name for d in response.cdi_devices] if response is not None else []
    try:
        edits = cdi_edits(names, cdi_dir) if names else CdiEdits((), ())
    except CdiError as exc:
        edits = CdiEdits((), ())
        reason, error = "CreateContainerError", str(exc)
    final = last_wins([*env, *edits.env])
    value = (final if env_interface else last_wins(edits.env)).get("NVIDIA_VISIBLE_DEVICES")
    visible = visible_gpus(value, gpus)
    if error is None and visible.made_up:
        reason, error = "RunContainerError", (
            "OCI runtime create failed: running prestart hook 0 caused: nvidia-container-cli: device error: "
            f"unknown device id: {visible.made_up[0]}")
    return ContainerRun(
        node, str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")),
        str(container.get("name")), init, units, final, value, visible.gpus, visible.made_up, error is None, error,
        {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}, reason, mounted_gpu(edits.mounts),
        tuple(names), env_interface)
