"""An in-memory Cluster for the gpushare-certs commands: the same interface as certs.cluster.KubeCluster."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

from certs.cluster import ClusterError
from certs.plan import Stored, WebhookConfiguration


@dataclass
class FakeCluster:
    namespaces: set[str] = field(default_factory=lambda: {"default", "kube-system"})
    secrets: dict[tuple[str, str], tuple[dict[str, bytes], str]] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)
    configurations: dict[str, WebhookConfiguration] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)
    fail_after_writes: int | None = None  # raise ClusterError on the write after this many

    def _write(self, what: str) -> None:
        if self.fail_after_writes is not None and len(self.writes) >= self.fail_after_writes:
            raise ClusterError(f"Could not {what}: the connection was lost (simulated).")
        self.writes.append(what)

    def ensure_namespace(self, name: str) -> bool:
        if name in self.namespaces:
            return False
        self._write(f"create namespace {name}")
        self.namespaces.add(name)
        return True

    def read_secret(self, namespace: str, name: str) -> Stored | None:
        found = self.secrets.get((namespace, name))
        return None if found is None else Stored(copy.deepcopy(found[0]), f"rv-{len(self.writes)}")

    def write_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], secret_type: str, previous: Stored | None
    ) -> None:
        exists = (namespace, name) in self.secrets
        assert exists == (previous is not None), f"secret {name}: create/update mismatch"
        self._write(f"write secret {name}")
        self.secrets[(namespace, name)] = (dict(data), secret_type)

    def read_configmap(self, namespace: str, name: str) -> Stored | None:
        found = self.configmaps.get((namespace, name))
        return None if found is None else Stored(dict(found), f"rv-{len(self.writes)}")

    def write_configmap(self, namespace: str, name: str, data: Mapping[str, bytes], previous: Stored | None) -> None:
        assert ((namespace, name) in self.configmaps) == (previous is not None), f"configmap {name}: mismatch"
        self._write(f"write configmap {name}")
        self.configmaps[(namespace, name)] = dict(data)

    def read_configuration(self, kind: str, name: str) -> WebhookConfiguration | None:
        found = self.configurations.get(kind)
        return found if found is not None and found.name == name else None

    def set_ca_bundle(self, config: WebhookConfiguration, bundle: bytes) -> None:
        self._write(f"set caBundle {config.kind}")
        self.configurations[config.kind] = WebhookConfiguration(
            config.kind, config.name, config.annotations, tuple((n, bundle) for n, _ in config.ca_bundles)
        )

    def add_configurations(self, annotations: Mapping[str, str] | None = None) -> None:
        for kind, hook in (("MutatingWebhookConfiguration", "mutate.gpushare.io"),
                           ("ValidatingWebhookConfiguration", "validate.gpushare.io")):
            self.configurations[kind] = WebhookConfiguration(kind, "gpushare-webhook", dict(annotations or {}),
                                                             ((hook, b""),))
