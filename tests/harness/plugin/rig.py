"""A running plugin wired to the test kubelet and the in-memory API server."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import Contract
from deviceplugin.devices import UnitInventory
from deviceplugin.main import Plugin
from node.inventory import fake_gpus
from tests.harness.kubelet.scripted import TestKubelet
from tests.harness.plugin.fakes import NODE, FakeApiServer, plugin_settings
from tests.harness.pods import admitted, assigned, unit_pod


@dataclass
class Rig:
    kubelet: TestKubelet
    plugin: Plugin
    api: FakeApiServer
    inventory: UnitInventory
    signer: Ed25519PrivateKey
    contract: Contract
    tmp: Path

    def pod(self, name: str, containers: dict[str, int], index: int | None = 0,
            init: dict[str, int] | None = None, sidecars: tuple[str, ...] = ()) -> dict[str, Any]:
        pod = admitted(unit_pod(name, containers, init, sidecars=sidecars), self.contract, self.signer)
        if index is not None:
            pod = assigned(pod, index, 8)
        return self.api.add(pod)


def make_rig(tmp: Path, gpus: str = "2x8GiB", kubelet_class: type[TestKubelet] = TestKubelet, minor: int = 34,
             **env: str) -> Generator[Rig, None, None]:
    # A poll of an hour: re-registration after a kubelet restart must come from the directory watch.
    settings = dataclasses.replace(plugin_settings(str(tmp), **env), watch_interval_seconds=3600.0)
    inventory = UnitInventory(fake_gpus(gpus, NODE, "GiB"), "GiB", 4096)
    api = FakeApiServer()
    signer = Ed25519PrivateKey.generate()
    kubelet = kubelet_class(settings.device_plugin_dir, settings.pod_resources_socket,
                          lambda namespace, name: str(api.pod(namespace, name)["metadata"]["uid"]), minor)
    kubelet.start()
    plugin = Plugin(settings, api=api, inventory=inventory, public_key=signer.public_key())
    plugin.start()
    api.settle = plugin.service.events.flush
    try:
        yield Rig(kubelet, plugin, api, inventory, signer, settings.contract, tmp)
    finally:
        plugin.stop()
        kubelet.stop()
