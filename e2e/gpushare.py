"""gpushare on the real cluster, from the repository's own manifests.

The webhook configurations, RBAC, ServiceAccounts and ConfigMap come from rendering manifests/self-signed.
The webhook and the device plugin run as host processes with the settings of the Deployment and DaemonSet
(their plain `env` values plus the ConfigMap, with paths moved to the run directory). The one swap: each
webhook's `clientConfig.service` becomes a `url` on 127.0.0.1, since nothing routes Service addresses here;
the serving certificate therefore also names 127.0.0.1 (`gpushare-certs install --extra-host 127.0.0.1`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from charts import kustomize
from e2e import volumes
from e2e.kube import Kubectl

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "gpushare-system"
HOST_RUN_KINDS = {"Deployment", "DaemonSet", "PodDisruptionBudget"}
EXTENDER_SA = ("kube-system", "gpushare-schd-extender")
PLUGIN_SA = (NAMESPACE, "gpushare-device-plugin")
DRA_SA = (NAMESPACE, "gpushare-dra-plugin")  # manifests/dra: the component must be applied first
IN_PROCESS = "in-process"
# The in-process component's policy: it adds NVIDIA_VISIBLE_DEVICES=void in env delivery only (the chart leaves it out
# in cdi delivery; docs/deploy.md says to delete it in a cdi overlay).
NEUTRALISE_KINDS = ("MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy")

# The scheduler extender's ServiceAccount and RBAC, as users apply them (see that file for where they come from).
EXTENDER_RBAC = (REPO / "manifests" / "extender" / "rbac.yaml").read_text()


def render(kubectl: Kubectl, overlay: str = "self-signed", components: Sequence[str] = ()) -> list[dict[str, Any]]:
    """manifests/<overlay>, with the kustomize components added as docs/deploy.md says to add them, rendered by the
    tier's kubectl."""
    return kustomize.render(overlay, components, binary=kubectl.binary)


def serves_mutating_policies(kubectl: Kubectl) -> bool:
    """Whether the API server serves MutatingAdmissionPolicy at admissionregistration.k8s.io/v1 (Kubernetes 1.36 and
    later), where the chart renders the in-process path for ordinary pods (manifests/in-process) in place of the two
    fail-open webhook entries."""
    resources = json.loads(kubectl.ok(["get", "--raw", "/apis/admissionregistration.k8s.io/v1"]))["resources"]
    return any(r["name"] == "mutatingadmissionpolicies" for r in resources)


def path_components(kubectl: Kubectl) -> tuple[str, ...]:
    """The components a user adds on this cluster: manifests/in-process where MutatingAdmissionPolicy v1 is served
    (docs/deploy.md, "Ordinary pods inside the API server"), as the chart's inProcess.enabled=auto picks."""
    return (IN_PROCESS,) if serves_mutating_policies(kubectl) else ()


def for_cluster(docs: list[dict[str, Any]], webhook_port: int) -> list[dict[str, Any]]:
    """What the tier applies: everything but the workloads it runs on the host, with URL clientConfigs."""
    out = []
    for doc in docs:
        if doc.get("kind") in HOST_RUN_KINDS:
            continue
        if doc.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in doc.get("webhooks") or []:
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"]["url"] = f"https://127.0.0.1:{webhook_port}{service.get('path', '/')}"
        out.append(doc)
    return out


def workload_env(docs: list[dict[str, Any]], kind: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """The settings a workload's container gets in the cluster: ConfigMap envFrom, then plain env values."""
    configmaps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d.get("kind") == "ConfigMap"}
    workload = next(d for d in docs if d.get("kind") == kind)
    container = workload["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(configmaps.get((source.get("configMapRef") or {}).get("name", ""), {}))
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
    env.update(overrides)
    return env


def apply(kubectl: Kubectl, docs: list[dict[str, Any]]) -> None:
    kubectl.ok(["apply", "-f", "-"], stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))


def token(kubectl: Kubectl, namespace: str, name: str, *, node: str | None = None) -> str:
    """A bound ServiceAccount token from the TokenRequest API (bound to the node when one is named, which
    puts the node's name in the token's `userInfo.extra`)."""
    args = ["create", "token", name, "-n", namespace, "--duration=24h"]
    if node is not None:
        uid = kubectl.ok(["get", "node", node, "-o", "jsonpath={.metadata.uid}"]).strip()
        args += ["--bound-object-kind=Node", f"--bound-object-name={node}", f"--bound-object-uid={uid}"]
    return kubectl.ok(args).strip()


def secret_files(kubectl: Kubectl, kind: str, name: str, directory: Path) -> dict[str, Path]:
    """Write a Secret's or ConfigMap's keys (`kind`: secret or configmap) as files, laid out as the kubelet's
    volume writer does (see e2e.volumes); returns key -> path."""
    payload = volumes.fetch(kubectl, kind, name, NAMESPACE)
    volumes.write(directory, payload)
    return {key: directory / key for key in payload}
