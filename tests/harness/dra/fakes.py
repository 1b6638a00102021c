"""The DRA driver's API server in memory for its tests: claims (reads counted, failures and hangs on demand) and the
node's ResourceSlice."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from deviceplugin.apiserver import Conflict


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
    `slice_failure` fails slice calls."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        super().__init__(*claims)
        self.slices: dict[str, dict[str, Any]] = {}
        self.slice_writes = 0
        self.slice_failure: Exception | None = None
        self._versions = 0

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        if self.slice_failure is not None:
            raise self.slice_failure
        return [copy.deepcopy(s) for s in self.slices.values() if s["spec"]["nodeName"] == node]

    def write_slice(self, body: Mapping[str, Any]) -> None:
        if self.slice_failure is not None:
            raise self.slice_failure
        name = str(body["metadata"]["name"])
        stored = self.slices.get(name)
        version = body["metadata"].get("resourceVersion")
        if (stored is None) != (version is None) or (stored and stored["metadata"]["resourceVersion"] != version):
            raise Conflict(f"ResourceSlice {name} was written meanwhile")
        self._versions += 1
        self.slice_writes += 1
        self.slices[name] = {**copy.deepcopy(dict(body)),
                             "metadata": {**body["metadata"], "resourceVersion": str(self._versions)}}

    def delete_slice(self, name: str) -> None:
        if self.slice_failure is not None:
            raise self.slice_failure
        self.slices.pop(name, None)
