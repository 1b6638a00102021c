"""Which pod holds a device-ID set, exactly: PodResources (Get about the pods the node index names, then List) first,
then the kubelet's checkpoint, names from those pods or the API server, and that pod read fresh."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deviceplugin.apiserver import ApiServer
from deviceplugin.checkpoint import Checkpoint
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.kubelet import Holding, KubeletUnavailable
from node.apiclient import ApiServerError

log = logging.getLogger(__name__)

# Pods asked about one by one (PodResources Get) before listing the whole node instead: a container starts soon after
# its pod is admitted, so few pods wait for devices of one size at a time.
GET_LIMIT = 4

# (namespace, name, uid) of a pod that may hold the devices: the node index's likely holders.
Suspect = tuple[str, str, str]


@dataclass(frozen=True)
class Owner:
    namespace: str
    name: str
    pod_uid: str
    containers: tuple[str, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"with UID {self.pod_uid}"


def find_owner(holdings: Sequence[Holding], device_ids: Sequence[str]) -> Owner:
    """The one pod whose containers hold exactly these IDs (an init container's IDs reused by an app
    container of the same pod map to that same pod)."""
    wanted = frozenset(device_ids)
    matches = [h for h in holdings if frozenset(h.device_ids) == wanted]
    pods = sorted({(h.namespace, h.pod, h.pod_uid) for h in matches})
    if not pods:
        raise Refusal(
            f"no pod on this node holds exactly the devices {_short(device_ids)} in the kubelet's pod resources or "
            "its device checkpoint; the container is not started; if this repeats, restart the pod so the kubelet "
            "allocates it again",
            reason="GpuShareUnknownDevices",
        )
    if len(pods) > 1:
        names = ", ".join(f"{ns}/{name}" if name else uid for ns, name, uid in pods)
        raise Refusal(
            f"the devices {_short(device_ids)} are held by several pods ({names}), which the kubelet never does; "
            "the container is not started; restart the kubelet so it rebuilds its device assignments"
        )
    namespace, name, uid = pods[0]
    containers = tuple(dict.fromkeys(h.container for h in matches))
    return Owner(namespace, name, uid, containers)


def other_holders(holdings: Sequence[Holding], device_ids: Sequence[str], owner: Owner) -> list[str]:
    """Pods other than the owner that hold any of these IDs: then the owner's checkpoint entry is out of date."""
    wanted = set(device_ids)
    out = set()
    for h in holdings:
        same = (h.namespace, h.pod) == (owner.namespace, owner.name) if h.pod else h.pod_uid == owner.pod_uid
        if not same and wanted.intersection(h.device_ids):
            out.add(f"{h.namespace}/{h.pod}" if h.pod else f"the pod with UID {h.pod_uid}")
    return sorted(out)


class Holdings(Protocol):
    def holdings(self) -> list[Holding]: ...  # PodResources List (app and sidecar containers), else the checkpoint

    def from_checkpoint(self) -> list[Holding]: ...  # every container, init containers included

    def pod_holdings(self, namespace: str, name: str) -> list[Holding] | None: ...  # PodResources Get; None: no Get

    def checkpoint(self) -> Checkpoint: ...  # the checkpoint with each container's stored answer, or why it is unread


def refused(refusal: Refusal) -> PluginError:
    """A refusal of devices whose pod is not known (the service logs it and counts it as unattributed)."""
    return PluginError("FAILED_PRECONDITION", refusal.message, refusal.reason)


class Owners:
    """Resolves the exact owner of the devices a PreStartContainer names; never a guess."""

    def __init__(self, kubelet: Holdings, api: ApiServer, node_name: str) -> None:
        self.kubelet = kubelet
        self.api = api
        self.node_name = node_name

    def owner(self, device_ids: Sequence[str], suspects: Sequence[Suspect] | None = None) -> Owner:
        """The owner of these devices; `suspects` are the pods the node index says may hold them (at most
        GET_LIMIT), None when it cannot say."""
        asked = self._asked(device_ids, suspects)
        if asked is not None:
            return asked
        listed = self._listed()
        try:
            return self._named(find_owner(listed, device_ids), suspects)
        except Refusal as refusal:
            if refusal.reason != "GpuShareUnknownDevices":
                raise refused(refusal) from refusal
        # PodResources List reports app and sidecar containers only (pkg/kubelet/apis/podresources/server_v1.go),
        # so a regular init container is found in the checkpoint, which the kubelet writes in
        # allocateContainerResources right after Allocate, during admission, before it ever calls
        # PreStartContainer for that pod (pkg/kubelet/cm/devicemanager/manager.go).
        try:
            recorded = self.kubelet.from_checkpoint()
        except KubeletUnavailable as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"no container in the kubelet's pod resources holds exactly these devices and {exc}; mount "
                "/var/lib/kubelet/device-plugins into the plugin and check GPUSHARE_KUBELET_CHECKPOINT",
            ) from exc
        try:
            owner = self._named(find_owner(recorded, device_ids), suspects)
        except Refusal as refusal:
            raise refused(refusal) from refusal
        others = other_holders(listed, device_ids, owner)
        if others:
            raise refused(Refusal(
                f"the kubelet's checkpoint says pod {owner.ref} holds the devices {', '.join(sorted(device_ids)[:3])} "
                f"but its pod resources give some of them to {', '.join(others[:3])}; the container is not started; "
                "the kubelet rewrites its checkpoint at its next allocation, and retries the start"
            ))
        return owner

    def pod(self, owner: Owner) -> dict[str, Any]:
        """The owner's pod, read fresh from the API server; refused when it is gone, or is another pod of that name."""
        try:
            pod = self.api.get_pod(owner.namespace, owner.name)
        except ApiServerError as exc:
            raise PluginError("UNAVAILABLE", f"could not read pod {owner.ref} ({exc}); the kubelet retries") from exc
        if pod is None or (owner.pod_uid and pod["metadata"].get("uid") != owner.pod_uid):
            raise PluginError(
                "FAILED_PRECONDITION",
                f"pod {owner.ref}, which holds these devices, no longer exists; its container is not started",
                "GpuSharePodGone",
            )
        return pod

    def _asked(self, device_ids: Sequence[str], suspects: Sequence[Suspect] | None) -> Owner | None:
        """The owner found by asking the kubelet about the suspects (a PodResources Get each), or None: then the
        whole node is listed, as without Get."""
        wanted = frozenset(device_ids)
        for namespace, name, _ in suspects or ():
            try:
                held = self.kubelet.pod_holdings(namespace, name)
            except KubeletUnavailable:
                return None
            if held is None:
                return None
            containers = tuple(dict.fromkeys(h.container for h in held if frozenset(h.device_ids) == wanted))
            if containers:
                return Owner(namespace, name, "", containers)
        return None

    def _listed(self) -> list[Holding]:
        try:
            return self.kubelet.holdings()
        except KubeletUnavailable as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"the gpushare device plugin cannot tell which pod holds these devices ({exc}); mount "
                "/var/lib/kubelet/pod-resources into the plugin (Kubernetes 1.20 or newer) and check "
                "GPUSHARE_POD_RESOURCES_SOCKET",
            ) from exc

    def _named(self, owner: Owner, suspects: Sequence[Suspect] | None) -> Owner:
        """The checkpoint knows pod UIDs only: find the pod's name among the suspects (a pod whose init container
        starts waits for devices of that size), else among this node's pods."""
        if owner.name:
            return owner
        for namespace, name, uid in suspects or ():
            if uid == owner.pod_uid:
                return Owner(namespace, name, uid, owner.containers)
        try:
            match = [p for p in self.api.node_pods() if (p.get("metadata") or {}).get("uid") == owner.pod_uid]
            if not match:
                match = [p for p in self.api.list_node_pods() if p["metadata"].get("uid") == owner.pod_uid]
        except ApiServerError as exc:
            raise PluginError("UNAVAILABLE", f"could not list node {self.node_name}'s pods ({exc})") from exc
        if not match:
            raise PluginError(
                "FAILED_PRECONDITION",
                f"the pod with UID {owner.pod_uid} that holds these devices is not on node {self.node_name} any "
                "more; the container is not started", "GpuSharePodGone",
            )
        meta = match[0]["metadata"]
        return Owner(str(meta.get("namespace")), str(meta.get("name")), owner.pod_uid, owner.containers)


def _short(device_ids: Sequence[str]) -> str:
    shown = sorted(device_ids)[:3]
    more = f" and {len(device_ids) - 3} more" if len(device_ids) > 3 else ""
    return "[" + ", ".join(shown) + "]" + more
