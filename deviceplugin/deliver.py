"""What a container gets at PreStartContainer: in cdi mode its slot's CDI spec, written atomically; in env mode the
gpushare webhook's GPU environment, checked (its Allocate answer: deviceplugin/delivery.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contract import RESERVED_ENV
from contract.env import expected_env, normal_env
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.judge import Accepted
from deviceplugin.settings import PluginSettings
from node.cdi import CdiStore, CdiWriteError
from node.cdiedits import slot_edits


class Deliverer:
    def __init__(self, settings: PluginSettings, cdi: CdiStore) -> None:
        self.settings = settings
        self.cdi = cdi

    def deliver(self, pod: Mapping[str, Any], containers: Sequence[str], accepted: Accepted, units: int) -> None:
        """Give the containers the GPU `accepted` names, or refuse when they would not see it."""
        if self.settings.contract.delivery == "env":
            self._check_env(pod, containers, accepted)
            return
        edits = slot_edits(accepted.slot, accepted.gpu, units, accepted.intent.total, self.settings.fake_gpu_dir)
        try:
            self.cdi.write_edits(edits)
        except CdiWriteError as exc:
            directory, setting = ((self.settings.fake_gpu_dir, "GPUSHARE_FAKE_GPU_DIR") if exc.host_file
                                  else (self.cdi.directory, "GPUSHARE_CDI_DIR"))
            raise Refusal(
                f"the CDI spec for pod {accepted.ref} could not be written in {directory} ({exc.cause}); mount that "
                f"node directory read-write into the plugin ({setting})", reason="GpuShareCdiFailed",
            ) from exc

    def _check_env(self, pod: Mapping[str, Any], containers: Sequence[str], accepted: Accepted) -> None:
        for name in containers:
            container = find_container(pod, name) or {}
            problems = env_problems(container, accepted.intent.units_of(name), accepted.intent.total)
            if problems:
                raise Refusal(
                    f"pod {accepted.ref} container {name!r} lacks the gpushare webhook's GPU environment "
                    f"({'; '.join(problems)}), so it would not see its GPU; run the webhook with "
                    "GPUSHARE_DELIVERY=env like the plugins and recreate the pod", reason="GpuShareNoEnv",
                )

    def forget(self, slot: str) -> None:
        """A spec left by an earlier holder of these IDs must never reach this container: PreStartContainer, which
        the kubelet calls before every start, writes the spec for the pod that holds the slot now."""
        try:
            self.cdi.remove(slot)
        except OSError as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"the old CDI spec of slot {slot} could not be removed from {self.cdi.directory} ({exc}); mount the "
                "node's CDI directory read-write into the plugin (GPUSHARE_CDI_DIR)",
            ) from exc


def find_container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            if isinstance(container, Mapping) and container.get("name") == name:
                return container
    return None


def env_problems(container: Mapping[str, Any], container_units: int, pod_units: int) -> list[str]:
    """Where the container's env differs from what the webhook injects in env mode (empty when it matches)."""
    env = [e for e in container.get("env") or [] if isinstance(e, Mapping)]
    problems: list[str] = []
    for wanted in expected_env(container_units, pod_units):
        name = wanted["name"]
        found = [e for e in env if e.get("name") == name]
        if not found:
            problems.append(f"{name} is missing")
        elif len(found) > 1:
            problems.append(f"{name} is defined {len(found)} times")
        elif normal_env(found[0]) != normal_env(wanted):
            problems.append(f"{name} is not the webhook's definition")
    expected_names = {e["name"] for e in expected_env(container_units, pod_units)}
    for name in RESERVED_ENV:
        if name not in expected_names and any(e.get("name") == name for e in env):
            problems.append(f"{name} is set, which gpushare reserves")
    return problems
