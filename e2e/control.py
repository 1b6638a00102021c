"""The control plane's command lines: etcd, kube-apiserver (Node,RBAC + NodeRestriction), controller manager,
and kube-scheduler with the gpushare extender configured as a real scheduler extender."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import yaml

from contract.keys import DEFAULT_RESOURCE
from e2e import settings as ports
from e2e.settings import E2eSettings

SERVICE_RANGE = "198.51.100.0/24"  # TEST-NET-2: never routed, and nothing here sends to it (no kube-proxy)
RESOURCE = DEFAULT_RESOURCE
EXTENDER_CONFIG = Path(__file__).resolve().parents[1] / "manifests" / "extender" / "scheduler-config.yaml"
EXTENDER_USER = "system:serviceaccount:kube-system:gpushare-schd-extender"
# Feature gates come from the release's row (e2e/versions.py): consumable capacity for the DRA driver (docs/dra.md) is
# alpha in 1.35, so off unless the API server (which else drops the devices' capacity and allowMultipleAllocations),
# the scheduler (which allocates shares) and the controller manager turn it on; beta and on by default from 1.36,
# where the tier passes no gate at all.


def etcd(settings: E2eSettings, binary: Path, data: Path) -> list[str]:
    client = f"http://127.0.0.1:{settings.port(ports.ETCD)}"
    peer = f"http://127.0.0.1:{settings.port(ports.ETCD_PEER)}"
    return [str(binary), "--name", "gpushare-e2e", "--data-dir", str(data), "--listen-client-urls", client,
            "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"gpushare-e2e={peer}", "--log-level", "warn", "--quota-backend-bytes", "2147483648"]


def apiserver(settings: E2eSettings, binary: Path, pki: Path, audit: tuple[Path, Path]) -> list[str]:
    """`audit`: (policy file, log file)."""
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{settings.port(ports.ETCD)}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
        f"--secure-port={settings.port(ports.API_SERVER)}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        # The kubelet refuses a loopback node IP (kubelet_node_status.go, validateNodeIP), so the node is named
        # localhost and the API server reaches the kubelet (logs, exec) by that name, on 127.0.0.1.
        "--kubelet-preferred-address-types=Hostname",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        f"--audit-policy-file={audit[0]}", f"--audit-log-path={audit[1]}", "--audit-log-format=json",
        *settings.release.feature_gates_flag(),
        "--v=1",
    ]


def controller_manager(settings: E2eSettings, binary: Path, pki: Path, kubeconfig: Path) -> list[str]:
    return [
        str(binary), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=true", "--leader-elect=false",
        "--bind-address=127.0.0.1", f"--secure-port={settings.port(ports.CONTROLLERS)}",
        settings.release.controllers_flag(),  # nothing cloud-like here (e2e/versions.py)
        "--node-monitor-grace-period=40s", *settings.release.feature_gates_flag(), "--v=1",
    ]


def scheduler_config(settings: E2eSettings, kubeconfig: Path, path: Path) -> Path:
    """The users' KubeSchedulerConfiguration (manifests/extender/scheduler-config.yaml), pointed at this tier:
    its kubeconfig, the port where the tier forwards to the reference extender (e2e.extender), and no leader
    election (one scheduler)."""
    config = yaml.safe_load(EXTENDER_CONFIG.read_text())
    config["clientConnection"]["kubeconfig"] = str(kubeconfig)
    config["leaderElection"] = {"leaderElect": False}
    for extender in config["extenders"]:
        url = urllib.parse.urlsplit(extender["urlPrefix"])
        extender["urlPrefix"] = url._replace(netloc=f"127.0.0.1:{settings.port(ports.EXTENDER)}").geturl()
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def audit_policy(path: Path) -> Path:
    """Record the scheduler extender's writes (pods update/patch, bindings) with their request bodies, so the
    compatibility test can list them with the answer they got; nothing else is recorded."""
    path.write_text(f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    users: ["{EXTENDER_USER}"]
    verbs: ["create", "update", "patch"]
    resources:
      - group: ""
        resources: ["pods", "pods/binding", "pods/status", "bindings"]
  - level: None
""")
    return path


def scheduler(settings: E2eSettings, binary: Path, config: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={settings.port(ports.SCHEDULER)}", *settings.release.feature_gates_flag(), "--v=1"]


def kubelet(binary: Path, settings: E2eSettings, config: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={settings.node_name}",
            "--node-labels=gpushare.io/gpu-memory=device-plugin", "--v=1"]
