"""The tier's pod network: a bridge with an address range inside this machine, Services through kube-proxy, and the
API server reachable from pods, so that what users install runs as pods behind real Services.

- A Linux bridge (BRIDGE) holding GATEWAY in POD_CIDR, made before containerd starts; Debian's CNI `bridge` and
  `host-local` plugins give each pod without hostNetwork an address there (only the tier's own pods live there).
- kube-proxy, built from the same k8s.io/kubernetes module, in iptables mode with `masqueradeAll` (a pod reaching a
  Service answered by a pod on the same bridge sees its replies come back through the gateway, so no bridge
  netfilter setting is needed) and without localhost NodePorts (which would change route_localnet).
- The API server listens on 127.0.0.1 only; a relay (`python -m e2e.netns relay`) listens on GATEWAY at the API
  server's port and carries pods' connections to it, and the `kubernetes` Service's Endpoints name that address
  (the API server runs with `--endpoint-reconciler-type=none`), so in-cluster configuration works in pods.
- IPv4 forwarding is switched on while the tier runs (a pod's packet to a Service address is forwarded after its
  DNAT), and put back as it was at `teardown`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

from e2e import settings as ports
from e2e.settings import E2eSettings

BRIDGE = "gpushare-e2e0"
POD_CIDR = "10.244.0.0/16"  # room for every pod a test loop creates (host-local never reuses at once)
GATEWAY = "10.244.0.1"
FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")
# What setup and kube-proxy leave for teardown, in the run folder: the forwarding value before, kube-proxy's binary.
FORWARDING_BEFORE = "ip_forward.before"
KUBE_PROXY_BINARY = "kube-proxy.path"


class PodNetError(Exception):
    """The pod network could not be set up; the text names the command that failed."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise PodNetError(f"`ip {' '.join(args)}` failed (exit {result.returncode}): {result.stderr.strip()}")


def cni_config(conf_dir: Path, ipam_dir: Path) -> Path:
    """The CNI network list containerd reads (it adds the loopback interface itself)."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / "10-gpushare-e2e.conflist"
    path.write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "gpushare-e2e",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(ipam_dir)},
        }],
    }, indent=2) + "\n")
    return path


def setup(state_dir: Path) -> None:
    """The bridge with the gateway address, and forwarding on; the old forwarding value is kept in `state_dir`.
    A bridge of that name left by a run whose state is gone is replaced (the caller has checked that no other
    tier runs on this machine)."""
    teardown(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / FORWARDING_BEFORE).write_text(FORWARDING.read_text().strip())
    FORWARDING.write_text("1")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _ip("link", "delete", BRIDGE)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def remember_kube_proxy(state_dir: Path, binary: Path) -> None:
    """teardown runs `kube-proxy --cleanup` with this binary (down() has no toolchain)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / KUBE_PROXY_BINARY).write_text(str(binary))


def teardown(state_dir: Path) -> None:
    """Everything setup and kube-proxy made for the run whose state is in `state_dir`: the bridge (pods' veths go
    with their sandboxes), kube-proxy's rules, and forwarding as it was. Safe to call at any point; nothing is
    touched where that run made nothing (another run's network stays)."""
    before = state_dir / FORWARDING_BEFORE
    if before.exists() and Path(f"/sys/class/net/{BRIDGE}").exists():
        _ip("link", "delete", BRIDGE)
    binary = state_dir / KUBE_PROXY_BINARY
    if binary.exists():
        kube_proxy = Path(binary.read_text().strip())
        if kube_proxy.exists():
            subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, timeout=60, check=False)
        binary.unlink()
    if before.exists():
        with contextlib.suppress(OSError):
            FORWARDING.write_text(before.read_text().strip() or "0")
        before.unlink()


def kube_proxy_config(settings: E2eSettings, kubeconfig: Path, path: Path) -> Path:
    """KubeProxyConfiguration v1alpha1: iptables, every server on 127.0.0.1, no sysctl or conntrack change."""
    path.write_text(f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {settings.node_name}
mode: iptables
clusterCIDR: {POD_CIDR}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:{settings.port(ports.KUBE_PROXY_HEALTHZ)}
metricsBindAddress: 127.0.0.1:{settings.port(ports.KUBE_PROXY_METRICS)}
nodePortAddresses: ["{GATEWAY}/32"]
iptables:
  masqueradeAll: true
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
""")
    return path


def api_endpoints(settings: E2eSettings) -> list[dict[str, Any]]:
    """The `kubernetes` Service's Endpoints and EndpointSlice: the relay on the gateway, at the API server's port.
    The Endpoints carry skip-mirror, as the API server's own reconciler writes them, so that the mirroring controller
    leaves the slice (what kube-proxy reads) to us."""
    port = settings.port(ports.API_SERVER)
    return [
        {"apiVersion": "v1", "kind": "Endpoints",
         "metadata": {"name": "kubernetes", "namespace": "default",
                      "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
         "subsets": [{"addresses": [{"ip": GATEWAY}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
         "metadata": {"name": "kubernetes", "namespace": "default",
                      "labels": {"kubernetes.io/service-name": "kubernetes"}},
         "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    ]
