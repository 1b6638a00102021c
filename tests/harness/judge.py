"""The one judge of a scenario's outcome, on either tier (pure): a GPU-share container runs on the GPU its pod
records and on no made-up device, no GPU holds more than it has, and every pod that does not run says why. The
simulated tier judges what every container saw (check, summarize); the real-cluster tier counts what each
container reported into an Outcome (tests/harness/realtier/scenarios.py), with the same rules."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contract import DEFAULT_PREFIX, POD, ProtocolError, parse_allocation, parse_assignment, read_annotations
from kubectlplugin.events import PLUGIN_COMPONENT
from node.inventory import Gpu
from tests.harness.apiserver.ports import Pod
from tests.harness.kubelet.node import ContainerRun

K = TypeVar("K")
WRONG_GPU, MADE_UP = "wrong-gpu", "made-up-device"


def gpu_verdict(got: Sequence[int] | None, recorded: int | None) -> str | None:
    """What is wrong with the GPUs a started GPU-share container received (None: what it received names no GPU):
    MADE_UP, WRONG_GPU unless it is exactly the GPU its pod records, or None when it is."""
    if got is None:
        return MADE_UP
    return WRONG_GPU if recorded is None or tuple(got) != (recorded,) else None


def over_capacity(units: Mapping[K, int], capacity: Callable[[K], int]) -> dict[K, int]:
    """The GPUs (by any key) whose units add up to more than they have, in key order."""
    return {key: total for key, total in sorted(units.items()) if total > capacity(key)}


@dataclass(kw_only=True)
class Counts:
    """What the real-cluster tier counts of a run's live pods, whoever gave them their GPUs."""

    pods: int = 0
    started: int = 0
    wrong_gpu: list[str] = field(default_factory=list)
    made_up: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    over_committed: dict[int, int] = field(default_factory=dict)  # GPU index -> what it was given, over capacity
    seconds: float | None = None  # the first ReplicaSet's creation to the last container start (API server clock)
    last_pod: dict[str, Any] = field(default_factory=dict)  # where that time went (workloads.last_start_path)


@dataclass
class Outcome(Counts):
    """The real-cluster tier's count of one scenario on one stack."""

    stack: str
    scenario: str
    namespace: str
    on_recorded_gpu: int = 0
    rejected: list[str] = field(default_factory=list)  # failed admission (UnexpectedAdmissionError), replaced
    promised_per_gpu: dict[int, int] = field(default_factory=dict)
    plugin_refusals: dict[str, int] = field(default_factory=dict)  # our plugin's refusal Events by reason
    plugin_messages: list[str] = field(default_factory=list)  # one refusal message per reason

    @property
    def failed(self) -> bool:
        """The bug report's failure: a container refused or stuck, started on a made-up device or on a GPU its
        pod was not given, or a GPU given more than it has."""
        return bool(self.wrong_gpu or self.made_up or self.stuck or self.over_committed)

    def received(self, where: str, got: int | None, recorded: int | None, shown: str) -> None:
        """Count what one started GPU-share container received (`shown`: what it reported, for a made-up one)."""
        verdict = gpu_verdict(None if got is None else (got,), recorded)
        if verdict == MADE_UP:
            self.made_up.append(f"{where}: {shown}")
        elif verdict == WRONG_GPU:
            self.wrong_gpu.append(f"{where}: got GPU {got}, annotation says {recorded}")

    def as_json(self) -> str:
        return json.dumps(self.__dict__)


@dataclass(frozen=True)
class Violation:
    kind: str  # WRONG_GPU | MADE_UP | unrequested-gpu | overcommit | no-message | not-released
    pod: str
    message: str


@dataclass(frozen=True)
class Observation:
    """Everything the checker needs, gathered once the cluster has settled."""

    pods: Sequence[Pod]  # live pods from the API server
    runs: Sequence[ContainerRun]  # every container start attempt on every node
    gpus: Mapping[str, Sequence[Gpu]]  # node -> inventory
    held: Mapping[str, set[str]]  # node -> pod UIDs the kubelet still holds devices for
    deleted: set[str] = field(default_factory=set)  # UIDs the scenario deleted
    unschedulable: Mapping[str, str] = field(default_factory=dict)  # UID -> the scheduler's reason
    events: Sequence[Pod] = ()  # the namespace's Events (the device plugin's refusals among them)

    def refusals(self, reason: str) -> list[str]:
        """The messages of the gpushare device plugin's Events with this reason."""
        return [str(e.get("message", "")) for e in self.events
                if e.get("reason") == reason and (e.get("source") or {}).get("component") == PLUGIN_COMPONENT]


@dataclass(frozen=True)
class Summary:
    pods: int
    started: int
    right_gpu: int
    made_up_ids: int  # containers handed a device id that names no GPU
    failed_clearly: int
    other: int


def _ref(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _index(annotations: Mapping[str, str]) -> int | None:
    try:
        return parse_assignment(annotations).index
    except ProtocolError:
        return None


def _allocation_gpu(annotations: Mapping[str, str]) -> int | None:
    """The GPU of the plugin's allocation record (default prefix), when the pod has one."""
    text = annotations.get(DEFAULT_PREFIX + "allocation")
    if text is None:
        return None
    try:
        return parse_allocation(text).gpu_index
    except ProtocolError:
        return -1  # an unreadable record never matches a GPU


def latest_runs(runs: Sequence[ContainerRun]) -> dict[tuple[str, str], ContainerRun]:
    out: dict[tuple[str, str], ContainerRun] = {}
    for run in runs:
        out[(run.pod_uid, run.container)] = run
    return out


def _phase(pod: Pod) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _blocked_message(pod: Pod) -> str:
    status = pod.get("status") or {}
    for item in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (item.get("state") or {}).get("waiting") or {}
        if waiting.get("message"):
            return str(waiting["message"])
    return ""


def check(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    alive = {(p.get("metadata") or {}).get("uid", ""): p for p in obs.pods}
    reported: set[tuple[str, str]] = set()
    for run in obs.runs:
        ref = f"{run.namespace}/{run.pod}"
        if run.made_up and (run.pod_uid, run.container) not in reported:  # once per container, not per retry
            reported.add((run.pod_uid, run.container))
            out.append(Violation(MADE_UP, ref, f"container {run.container!r} of pod {ref} on {run.node} "
                                 f"was handed NVIDIA_VISIBLE_DEVICES={run.visible!r}, which names no GPU"))
        if run.started and not run.units:
            out += _unrequested(run, ref)
        if not run.started or not run.units:
            continue
        current = alive.get(run.pod_uid)
        recorded = _index(read_annotations(current)) if current is not None else None
        if recorded is None:
            recorded = _index(run.annotations)
        sees = f"container {run.container!r} of pod {ref} on {run.node} sees GPU {list(run.gpus)} but "
        if gpu_verdict(run.gpus, recorded) is not None:
            out.append(Violation(WRONG_GPU, ref, sees + f"its pod records GPU {recorded}"))
        if run.mounted is not None and run.mounted != run.gpus:
            out.append(Violation(WRONG_GPU, ref, sees + f"its CDI-mounted GPU file names {list(run.mounted)}"))
        record = _allocation_gpu(read_annotations(current) if current is not None else run.annotations)
        if record is not None and gpu_verdict(run.gpus, record) is not None:
            out.append(Violation(WRONG_GPU, ref, sees + f"the pod's allocation record names GPU {record}"))
    out += _capacity(obs, alive)
    out += _end_states(obs, alive)
    for node, uids in obs.held.items():
        for uid in uids & obs.deleted:
            out.append(Violation("not-released", uid, f"deleted pod {uid} still holds devices on {node}"))
    for uid in obs.deleted & alive.keys():
        out.append(Violation("not-released", _ref(alive[uid]), f"deleted pod {_ref(alive[uid])} is still there"))
    return out


# What the NVIDIA runtime reads as "no GPU" (nvidia-container-toolkit): the variable unset, or `void`.
_NO_GPU = (None, "void")


def _unrequested(run: ContainerRun, ref: str) -> list[Violation]:
    """A started container that requests no GPU memory must see no GPU: none from the runtime, no gpushare CDI
    device or edit, and where the runtime reads the env, NVIDIA_VISIBLE_DEVICES absent or `void`."""
    what = f"container {run.container!r} of pod {ref} on {run.node} requests no GPU memory but "
    if run.gpus:
        return [Violation("unrequested-gpu", ref, what + f"sees GPU {list(run.gpus)} "
                          f"(NVIDIA_VISIBLE_DEVICES={run.visible!r})")]
    if run.cdi_devices or run.mounted is not None:
        return [Violation("unrequested-gpu", ref, what + f"was given the CDI devices {list(run.cdi_devices)}")]
    value = run.env.get("NVIDIA_VISIBLE_DEVICES")
    if run.env_interface and (value.strip() if value is not None else None) not in _NO_GPU:
        return [Violation("unrequested-gpu", ref, what + f"has NVIDIA_VISIBLE_DEVICES={value!r}, which the "
                          "runtime does not read as no GPU (only an absent variable or 'void' is)")]
    return []


def _capacity(obs: Observation, alive: Mapping[str, Pod]) -> list[Violation]:
    out: list[Violation] = []
    recorded: dict[tuple[str, int], int] = {}
    for pod in alive.values():
        node = (pod.get("spec") or {}).get("nodeName")
        annotations = read_annotations(pod)
        index = _index(annotations)
        if not node or index is None or _phase(pod) in ("Succeeded", "Failed") or POD not in annotations:
            continue
        recorded[(node, index)] = recorded.get((node, index), 0) + int(annotations[POD])
    actual: dict[tuple[str, int], int] = {}
    for (uid, _), run in latest_runs(obs.runs).items():
        if uid in alive and run.started and run.units and not run.init:
            for index in run.gpus:
                actual[(run.node, index)] = actual.get((run.node, index), 0) + run.units
    def memory(key: tuple[str, int]) -> int:
        return next((g.memory_units for g in obs.gpus.get(key[0], ()) if g.index == key[1]), 0)

    for what, table in (("recorded allocations", recorded), ("running containers", actual)):
        for (node, index), units in over_capacity(table, memory).items():
            out.append(Violation("overcommit", f"{node}/gpu{index}", f"the {what} on {node} GPU {index} add up "
                                 f"to {units} units, more than its {memory((node, index))}"))
    return out


def _end_states(obs: Observation, alive: Mapping[str, Pod]) -> list[Violation]:
    out: list[Violation] = []
    for uid, pod in alive.items():
        phase = _phase(pod)
        ref = _ref(pod)
        if phase in ("Running", "Succeeded"):
            continue
        if phase == "Failed" and (pod.get("status") or {}).get("message"):
            continue
        if phase == "Pending" and ((pod.get("spec") or {}).get("nodeName") and _blocked_message(pod)):
            continue
        if phase == "Pending" and uid in obs.unschedulable:
            continue
        out.append(Violation("no-message", ref, f"pod {ref} ended {phase} without a message naming the cause"))
    return out


def summarize(obs: Observation) -> Summary:
    """The demo's columns, over live pods."""
    alive = {(p.get("metadata") or {}).get("uid", ""): p for p in obs.pods}
    latest = latest_runs(obs.runs)
    started = right = clear = other = 0
    for uid, pod in alive.items():
        phase = _phase(pod)
        runs = [r for (u, _), r in latest.items() if u == uid and r.units and not r.init]
        if phase == "Running":
            started += 1
            index = _index(read_annotations(pod))
            if all(r.started and r.gpus == (index,) for r in runs):
                right += 1  # a pod without GPU-share containers has nothing to get wrong
        elif any(r.made_up for r in runs):
            other += 1  # "unknown device id" names no cause a person can act on
        elif ((phase == "Failed" and (pod.get("status") or {}).get("message")) or _blocked_message(pod)
              or uid in obs.unschedulable):
            clear += 1
        else:
            other += 1
    made_up = len({(r.pod_uid, r.container) for r in obs.runs if r.made_up})
    return Summary(len(alive), started, right, made_up, clear, other)


