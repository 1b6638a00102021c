"""The DRA driver's API server in memory for its tests: claims (reads counted, failures and hangs on demand) and the
node's ResourceSlice."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Mapping
from typing import Any

from contract.keys import DRA_DRIVER
from dra.slice import without_consumable_capacity
from node.apiclient import ApiServerError, Conflict, KubeClient
from tests.harness.apiserver.status import ApiError
from tests.harness.apiserver.store import Store
from tests.harness.dra.claims import NODE

# k8s.io/apiserver pkg/storage/names/generate.go: the first 58 characters of generateName and five random ones (here
# counted, so that tests read the same names each run).
_GENERATED_BASE = 58
SLICES, GROUP = "resourceslices", "resource.k8s.io"  # the store's key, and what its errors name


class FakeClaims:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads = 0
        self.failure: Exception | None = None
        self.hang: threading.Event | None = None  # reads wait for it to be set

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.hang is not None:
            self.hang.wait()
        if self.failure is not None:
            raise self.failure
        return self.claims[namespace, name]


class FakeDraApi(FakeClaims):
    """The DRA driver's API server (dra.main.DraApi): claims as FakeClaims, and ResourceSlices by name
    with a resourceVersion each, listed by node and driver as the field selector does; a create by generateName gets
    a new name, a create of a taken name or a write carrying a stale resourceVersion is refused as the API server
    does (409); `slice_failure` fails slice calls and the Node read, `refused` the writes of the slices holding the
    named devices; `consumable_capacity` False stores slices as an API server with DRAConsumableCapacity off does
    (the fields dropped unless the stored slice already has them). Nodes by name hold their UID (`NODE` exists);
    delete_node() deletes the Node and, as the garbage collector does, the slices it owns; Events recorded are kept
    in `events`."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        super().__init__(*claims)
        self._store = Store()
        self.slices = self._store.named(SLICES)
        self.slice_writes = 0
        self.slice_failure: Exception | None = None
        self.refused: dict[str, ApiServerError] = {}
        self.consumable_capacity = True
        self.nodes = {NODE: "node-uid-1"}
        self.node_reads = 0
        self.events: list[dict[str, Any]] = []
        self.event_failure: Exception | None = None
        self._suffixes = itertools.count()

    def by_device(self) -> dict[str, dict[str, Any]]:
        """Our driver's slices by the one device each holds (their names are generated)."""
        return {d["name"]: s for s in list(self.slices.values()) if s["spec"].get("driver") == DRA_DRIVER
                for d in s["spec"]["devices"]}

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        if self.slice_failure is not None:
            raise self.slice_failure
        return [copy.deepcopy(s) for s in self.slices.values()
                if s["spec"].get("nodeName") == node and s["spec"].get("driver") == DRA_DRIVER]

    def write_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.slice_failure is not None:
            raise self.slice_failure
        for device in body["spec"]["devices"]:
            if device["name"] in self.refused:
                raise self.refused[device["name"]]
        metadata = dict(body["metadata"])
        if not metadata.get("name"):
            metadata["name"] = self._generated(str(metadata.pop("generateName")))
        name = str(metadata["name"])
        stored = self.slices.get(name)
        version = metadata.get("resourceVersion")
        spec = copy.deepcopy(dict(body["spec"]))
        if not self.consumable_capacity and not (stored and _uses_consumable_capacity(stored)):
            spec["devices"] = [without_consumable_capacity(d) for d in spec["devices"]]
        new = {**copy.deepcopy(dict(body)), "spec": spec, "metadata": metadata}
        try:
            if version is None:
                written = self._store.create(SLICES, new, SLICES, GROUP)
            else:
                written = self._store.replace(SLICES, new, str(version), SLICES, GROUP)
        except ApiError as exc:
            raise Conflict(f"could not write ResourceSlice {name}: it changed meanwhile (409 Conflict)") from exc
        self.slice_writes += 1
        return written

    def node_uid(self, node: str) -> str | None:
        self.node_reads += 1
        if self.slice_failure is not None:
            raise self.slice_failure
        return self.nodes.get(node)

    def delete_node(self, node: str) -> None:
        """The Node deleted, and its dependents with it (the garbage collector, by owner UID)."""
        uid = self.nodes.pop(node)
        for name in [name for name, s in self.slices.items()
                     if any(o.get("uid") == uid for o in s["metadata"].get("ownerReferences") or [])]:
            del self.slices[name]

    def record_event(self, body: Mapping[str, Any]) -> None:
        if self.event_failure is not None:
            raise self.event_failure
        self.events.append(copy.deepcopy(dict(body)))

    def _generated(self, prefix: str) -> str:
        """A name not taken (the API server tries again when the random one is)."""
        while (name := f"{prefix[:_GENERATED_BASE]}{next(self._suffixes):05d}") in self.slices:
            pass
        return name

    def delete_slice(self, name: str) -> None:
        if self.slice_failure is not None:
            raise self.slice_failure
        self.slices.pop(name, None)


def _uses_consumable_capacity(slice_: Mapping[str, Any]) -> bool:
    """k8s.io/kubernetes v1.35.4 pkg/registry/resource/resourceslice/strategy.go draConsumableCapacityFeatureInUse."""
    return any("allowMultipleAllocations" in d or any("requestPolicy" in c for c in (d.get("capacity") or {}).values())
               for d in slice_["spec"]["devices"])


class _Operation:
    """A method of a kubernetes client API class, known by its name."""

    def __init__(self, name: str) -> None:
        self.name = name


class _ApiClass:
    def __getattr__(self, name: str) -> _Operation:
        return _Operation(name)


class RecordingClient(KubeClient):
    """node.apiclient.KubeClient without a server: records each request as (what, client operation, arguments) and
    answers `answer`."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:  # no credentials, no connection
        self.answer = answer
        self.requests: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []

    def api(self, name: str, fix: str) -> Any:
        return _ApiClass()

    def read(self, what: str, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        self.requests.append((what, method.name, args, kwargs))
        return self.answer
