"""The DRA driver's API server in memory for its tests: claims (reads counted, failures and hangs on demand) and the
node's ResourceSlice."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from deviceplugin.apiserver import Conflict
from deviceplugin.dra.slice import without_consumable_capacity


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
    """The DRA driver's API server (deviceplugin.dra.main.DraApi): claims as FakeClaims, and ResourceSlices by name
    with a resourceVersion each, a write carrying a stale one refused as the API server does (409);
    `slice_failure` fails slice calls; `consumable_capacity` False stores slices as an API server with
    DRAConsumableCapacity off does (the fields dropped unless the stored slice already has them)."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        super().__init__(*claims)
        self.slices: dict[str, dict[str, Any]] = {}
        self.slice_writes = 0
        self.slice_failure: Exception | None = None
        self.consumable_capacity = True
        self._versions = 0

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        if self.slice_failure is not None:
            raise self.slice_failure
        return [copy.deepcopy(s) for s in self.slices.values() if s["spec"]["nodeName"] == node]

    def write_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.slice_failure is not None:
            raise self.slice_failure
        name = str(body["metadata"]["name"])
        stored = self.slices.get(name)
        version = body["metadata"].get("resourceVersion")
        if (stored is None) != (version is None) or (stored and stored["metadata"]["resourceVersion"] != version):
            raise Conflict(f"ResourceSlice {name} was written meanwhile")
        self._versions += 1
        self.slice_writes += 1
        spec = copy.deepcopy(dict(body["spec"]))
        if not self.consumable_capacity and not (stored and _uses_consumable_capacity(stored)):
            spec["devices"] = [without_consumable_capacity(d) for d in spec["devices"]]
        self.slices[name] = {**copy.deepcopy(dict(body)), "spec": spec,
                             "metadata": {**body["metadata"], "resourceVersion": str(self._versions)}}
        return copy.deepcopy(self.slices[name])

    def delete_slice(self, name: str) -> None:
        if self.slice_failure is not None:
            raise self.slice_failure
        self.slices.pop(name, None)


def _uses_consumable_capacity(slice_: Mapping[str, Any]) -> bool:
    """k8s.io/kubernetes v1.35.4 pkg/registry/resource/resourceslice/strategy.go draConsumableCapacityFeatureInUse."""
    return any("allowMultipleAllocations" in d or any("requestPolicy" in c for c in (d.get("capacity") or {}).values())
               for d in slice_["spec"]["devices"])
