"""Settings of the real-cluster tier: one frozen dataclass from GPUSHARE_E2E_* variables, read here only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.settings import SettingsError
from e2e import versions
from e2e.versions import Release

CERT_MANAGER_VERSION = "v1.21.2"  # the newest cert-manager release the Go module proxy serves


@dataclass(frozen=True)
class E2eSettings:
    cache_dir: Path  # built binaries, keyed by version; outside the repository
    run_dir: Path  # certificates, configurations and logs of the running cluster
    port_base: int  # every server listens on 127.0.0.1 at port_base + a fixed offset
    node_name: str = "localhost"  # see control.apiserver: the API server dials the kubelet by this name
    kubernetes_version: str = versions.DEFAULT  # a row of e2e/versions.py (GPUSHARE_E2E_KUBERNETES)
    cert_manager_version: str = CERT_MANAGER_VERSION
    fake_gpus: str = "4x64GiB"
    # Holds gpushare-scheduler-extender/ and gpushare-device-plugin/ (the reference programs' sources); None: the
    # tier has no reference programs.
    reference_src: Path | None = None
    # Holds nvidia-device-plugin/ (NVIDIA's chart, unmodified); None: the tier installs no peer beside ours.
    peers_src: Path | None = None

    @property
    def release(self) -> Release:
        """What the tier runs with this Kubernetes version: etcd, containerd, runc, gates (e2e/versions.py)."""
        return versions.release(self.kubernetes_version)

    def port(self, offset: int) -> int:
        return self.port_base + offset


# Offsets from the port base, one per server.
(ETCD, ETCD_PEER, API_SERVER, REGISTRY, EXTENDER, WEBHOOK, KUBELET, KUBELET_HEALTHZ, SCHEDULER,
 CONTROLLERS, CERT_MANAGER_WEBHOOK, CERT_MANAGER_WEBHOOK_HEALTHZ, WEBHOOK_METRICS, PLUGIN_METRICS,
 KUBE_PROXY_HEALTHZ, KUBE_PROXY_METRICS, DRA_METRICS) = range(1, 18)


def from_environ(environ: Mapping[str, str] | None = None) -> E2eSettings:
    env = os.environ if environ is None else environ
    cache = env.get("GPUSHARE_E2E_CACHE") or str(Path(env.get("HOME", "/root")) / ".cache" / "gpushare-e2e")
    run = env.get("GPUSHARE_E2E_RUN") or "/tmp/gpushare-e2e"
    raw_base = env.get("GPUSHARE_E2E_PORT_BASE", "24000")
    try:
        base = int(raw_base)
    except ValueError:
        raise SettingsError(f"GPUSHARE_E2E_PORT_BASE={raw_base!r} is not a port number") from None
    if not 1024 <= base <= 65000:
        raise SettingsError(f"GPUSHARE_E2E_PORT_BASE={base} must be between 1024 and 65000")
    reference = env.get("GPUSHARE_E2E_REFERENCE_SRC")
    peers = env.get("GPUSHARE_E2E_PEERS_SRC")
    kubernetes = env.get("GPUSHARE_E2E_KUBERNETES") or versions.DEFAULT
    try:
        kubernetes = versions.release(kubernetes).kubernetes
    except versions.UnknownRelease as exc:
        raise SettingsError(f"GPUSHARE_E2E_KUBERNETES: {exc}") from None
    return E2eSettings(kubernetes_version=kubernetes, cache_dir=Path(cache), run_dir=Path(run), port_base=base,
                       fake_gpus=env.get("GPUSHARE_E2E_FAKE_GPUS", "4x64GiB"),
                       reference_src=Path(reference).absolute() if reference else None,
                       peers_src=Path(peers).absolute() if peers else None)


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the real-cluster tier was asked for (`./dev e2e` sets GPUSHARE_E2E=1); the unit run skips it."""
    env = os.environ if environ is None else environ
    return env.get("GPUSHARE_E2E") == "1"
