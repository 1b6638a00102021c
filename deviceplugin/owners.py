"""Which pod owns a device-ID set, exactly, from what the kubelet says of it (holders.py): one pod holding exactly
those IDs, named from the suspects or the API server, and that pod read fresh; never a guess."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deviceplugin.apiserver import ApiServer
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.holders import Held, Suspect
from deviceplugin.kubelet import Holding
from node.apiclient import ApiServerError


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


def refused(refusal: Refusal) -> PluginError:
    """A refusal of devices whose pod is not known (the service logs it and counts it as unattributed)."""
    return PluginError("FAILED_PRECONDITION", refusal.message, refusal.reason)


class Owners:
    """Decides the exact owner of the devices a PreStartContainer names from what the kubelet says; never a guess."""

    def __init__(self, api: ApiServer, node_name: str) -> None:
        self.api = api
        self.node_name = node_name

    def owner(self, device_ids: Sequence[str], held: Held, suspects: Sequence[Suspect] | None) -> Owner:
        """The one pod of `held` holding exactly these devices; a checkpoint entry only while no pod PodResources
        lists holds any of them. `suspects` name a pod the checkpoint knows by UID only."""
        try:
            owner = self._named(find_owner(held.holdings, device_ids), suspects)
        except Refusal as refusal:
            raise refused(refusal) from refusal
        others = other_holders(held.listed, device_ids, owner) if held.source == "checkpoint" else []
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
