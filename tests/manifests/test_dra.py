"""The optional DRA component: the driver's DaemonSet and its own least-privilege identity, a DeviceClass selecting
the driver, the policies keeping it to its own node's ResourceSlices and one share per request, its NetworkPolicy
and PodMonitor (each proven on the real tier: tests/e2e/test_dra.py, tests/install/test_install_dra.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from contract.keys import DRA_DRIVER
from dra import settings as dra_settings
from dra.coreapi import CoreV1
from dra.kube import KubeDra
from dra.probe import CHECKS
from dra.probe import TIMEOUT as PROBE_TIMEOUT
from dra.resourceapi import ResourceV1
from dra.slice import pool_slices
from node.inventory import Gpu
from tests.harness.dra.fakes import RecordingClient
from tests.harness.manifests.render import (
    NAMESPACE,
    OVERLAYS,
    Obj,
    container,
    env_of,
    find,
    hardened,
    pod_spec,
    render,
    render_with_component,
)

DRIVER = "gpushare-dra-plugin"


def _by_name(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_component_adds_the_class_the_rbac_and_the_policies(overlay: str, tmp_path: Path) -> None:
    by_kind = _by_name(render_with_component(overlay, "dra", tmp_path))
    device_class = by_kind["DeviceClass", DRA_DRIVER]
    assert device_class["apiVersion"] == "resource.k8s.io/v1"
    assert [s["cel"]["expression"] for s in device_class["spec"]["selectors"]] == [f'device.driver == "{DRA_DRIVER}"']
    account = by_kind["DaemonSet", DRIVER]["spec"]["template"]["spec"]["serviceAccountName"]
    assert account == DRIVER and by_kind["ServiceAccount", DRIVER]["metadata"]["namespace"] == NAMESPACE
    binding = by_kind["ClusterRoleBinding", DRIVER]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    rules = by_kind["ClusterRole", DRIVER]["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {"resourceclaims", "resourceslices", "nodes", "events"}
    assert {g for rule in rules for g in rule["apiGroups"]} == {"resource.k8s.io", ""}, "no pod, nothing else"
    policy = by_kind["ValidatingAdmissionPolicy", "gpushare-dra-own-node-slices"]
    assert f"system:serviceaccount:{NAMESPACE}:{account}" in policy["spec"]["matchConditions"][0]["expression"]
    for name in ("gpushare-dra-own-node-slices", "gpushare-dra-one-share-per-request"):
        assert by_kind["ValidatingAdmissionPolicy", name]["spec"]["failurePolicy"] == "Fail"
        assert by_kind["ValidatingAdmissionPolicyBinding", name]["spec"]["policyName"] == name


_CLIENT_VERBS = {"read": "get", "list": "list", "create": "create", "replace": "update", "patch": "patch",
                 "delete": "delete"}


def _request(operation: str) -> tuple[str, str]:
    """The RBAC resource and verb of a kubernetes client operation (replace_namespaced_resource_claim_status:
    resourceclaims/status, update)."""
    verb, _, rest = operation.partition("_")
    rest = rest.removeprefix("namespaced_")
    subresource = "/status" if rest.endswith("_status") else ""
    return rest.removesuffix("_status").replace("_", "") + "s" + subresource, _CLIENT_VERBS[verb]


def _driver_requests() -> set[tuple[str, str]]:
    """Every request the driver makes, through every method of its API adapter."""
    client = RecordingClient({"items": []})
    kube = KubeDra(ResourceV1(client), CoreV1(client))
    methods = {name for name, _ in inspect.getmembers(KubeDra, inspect.isfunction) if not name.startswith("_")}
    assert methods == {"get_claim", "list_slices", "write_slice", "delete_slice", "node_uid", "record_event"}, (
        "a new call needs its RBAC here")
    [body] = pool_slices("node-a", [Gpu(0, "GPU-a", 16)], set(), "GiB")
    kube.get_claim("team", "claim")
    kube.list_slices("node-a")
    kube.write_slice(body)
    kube.write_slice({**body, "metadata": {"name": "stored", "resourceVersion": "7"}})
    kube.delete_slice("stored")
    kube.node_uid("node-a")
    kube.record_event({"metadata": {"namespace": "default"}})
    return {_request(operation) for _, operation, _, _ in client.requests}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_drivers_role_grants_every_request_it_makes_and_no_claim_status(overlay: str, tmp_path: Path) -> None:
    """The same rules on Kubernetes 1.35, 1.36 and 1.37: the driver reads claims and writes its slices. It writes no
    claim status, so 1.36's granular status authorization (#134947: resourceclaims/binding, and associated-node:
    verbs on resourceclaims/driver) does not apply to it, and the role grants no claim subresource at all."""
    rules = _by_name(render_with_component(overlay, "dra", tmp_path))["ClusterRole", DRIVER]["rules"]
    granted = {(resource, verb) for rule in rules if rule["apiGroups"] in (["resource.k8s.io"], [""])
               for resource in rule["resources"] for verb in rule["verbs"]}
    requests = _driver_requests()
    assert requests == {("resourceclaims", "get"), ("resourceslices", "list"), ("resourceslices", "create"),
                        ("resourceslices", "update"), ("resourceslices", "delete"), ("nodes", "get"),
                        ("events", "create")}
    core = {(resource, verb) for rule in rules if rule["apiGroups"] == [""]
            for resource in rule["resources"] for verb in rule["verbs"]}
    assert core == {("nodes", "get"), ("events", "create")}, "its Node read, its Events created, nothing more"
    assert requests <= granted, requests - granted
    assert {verb for resource, verb in granted if resource == "resourceclaims"} == {"get"}, "claims are only read"
    assert not [r for rule in rules for r in rule["resources"] if "/" in r], "no status, binding or driver rights"
    assert all("resourceNames" not in rule for rule in rules)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_device_plugin_gets_nothing_of_dra(overlay: str, tmp_path: Path) -> None:
    """The DRA rights belong to the driver's ServiceAccount: with the component, the device plugin's role is
    unchanged, and no binding of the component names it."""
    base, with_dra = _by_name(render(overlay)), _by_name(render_with_component(overlay, "dra", tmp_path))
    plugin = ("ClusterRole", "gpushare-system-device-plugin")
    assert with_dra[plugin] == base[plugin]
    added = [o for k, o in with_dra.items() if k not in base and o["kind"].endswith("Binding")]
    assert added and all(s.get("name") != "gpushare-device-plugin" for o in added for s in o.get("subjects", []))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_driver_daemonset(overlay: str, tmp_path: Path) -> None:
    objs = render_with_component(overlay, "dra", tmp_path)
    spec = pod_spec(objs, "DaemonSet", DRIVER)
    plugin = pod_spec(objs, "DaemonSet", "gpushare-device-plugin")
    # One path per node: the same label key with another value, so no node runs both.
    assert spec["nodeSelector"] == {"gpushare.io/gpu-memory": "dra"}
    assert set(spec["nodeSelector"]) == set(plugin["nodeSelector"])
    assert spec["nodeSelector"] != plugin["nodeSelector"]
    assert spec["tolerations"] == plugin["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["automountServiceAccountToken"] is True, "the slice policy reads the node from its projected token"
    ctr = container(spec, "dra-plugin")
    assert ctr["command"] == ["gpushare-dra-plugin"]
    assert ctr["image"] == container(plugin, "device-plugin")["image"], "the overlay's image reaches the component"
    hardened(ctr["securityContext"])
    env = env_of(ctr, objs)
    uid = "6f1f3c1e-4b4e-4d4a-9a7e-1f2e3d4c5b6a"
    settings = dra_settings.dra_settings_from({**env, "GPUSHARE_NODE_NAME": "gpu-node-1", "GPUSHARE_POD_UID": uid})
    assert settings.node.node_name == "gpu-node-1" and env["GPUSHARE_NODE_NAME"] == "<fieldRef:spec.nodeName>"
    # Rolling updates: each pod's sockets carry its UID, so the new pod serves beside the old one.
    assert env["GPUSHARE_POD_UID"] == "<fieldRef:metadata.uid>" and uid in settings.socket_path
    # Its probes ask its health service, on the socket the settings name, within their own timeout.
    for probe, check in (("readinessProbe", "ready"), ("livenessProbe", "alive")):
        assert ctr[probe]["exec"]["command"] == ["gpushare-dra-probe", check] and check in CHECKS
        assert ctr[probe]["timeoutSeconds"] > PROBE_TIMEOUT
    assert settings.health_path == f"{dra_settings.DEFAULT_PLUGIN_DIR}/health-{uid}.sock"
    strategy = {o["metadata"]["name"]: o for o in objs if o["kind"] == "DaemonSet"}[DRIVER]["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # Each node directory the driver uses is mounted from the node at the same path (the kubelet dials the socket
    # path the registration gives, on the node).
    volumes = {v["name"]: v for v in spec["volumes"]}
    host_paths = {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"] for m in ctr["volumeMounts"]
                  if "hostPath" in volumes[m["name"]]}
    assert all("subPath" not in m for m in ctr["volumeMounts"])
    for path in (settings.plugin_dir, settings.registry_dir, settings.state_dir, settings.node.cdi_dir):
        assert host_paths.get(path) == path, (path, host_paths)
    assert (settings.plugin_dir, settings.registry_dir, settings.state_dir) == (
        dra_settings.DEFAULT_PLUGIN_DIR, dra_settings.DEFAULT_REGISTRY_DIR, dra_settings.DEFAULT_STATE_DIR)
    assert not any("secret" in v or "configMap" in v for v in volumes.values()), "it needs no key"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_drivers_metrics_port_admits_the_monitoring_namespace_alone(overlay: str, tmp_path: Path) -> None:
    objs = render_with_component(overlay, "dra", tmp_path)
    policy = find(objs, "NetworkPolicy", DRIVER)
    ctr = container(pod_spec(objs, "DaemonSet", DRIVER), "dra-plugin")
    port = int(env_of(ctr, objs)["GPUSHARE_METRICS_BIND"].rsplit(":", 1)[1])
    assert [p["containerPort"] for p in ctr["ports"]] == [port]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": DRIVER}
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    assert rule["from"] == find(objs, "NetworkPolicy", "gpushare-device-plugin")["spec"]["ingress"][0]["from"]


def test_the_pod_monitor_finds_the_drivers_pods(tmp_path: Path) -> None:
    objs = render_with_component("self-signed", "dra", tmp_path, "monitoring")
    monitor = find(objs, "PodMonitor", DRIVER)
    labels = find(objs, "DaemonSet", DRIVER)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in container(pod_spec(objs, "DaemonSet", DRIVER), "dra-plugin")["ports"]}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"] and "metrics" in ports


@pytest.mark.parametrize("component", ["dra", "monitoring", "in-process"])
def test_every_object_of_a_component_is_labelled_ours(component: str, tmp_path: Path) -> None:
    """As the base's: an operator finds (and the install tier checks the removal of) every object of ours by
    app.kubernetes.io/part-of=gpushare."""
    objs = render_with_component("self-signed", component, tmp_path)
    unlabelled = [(o["kind"], o["metadata"]["name"]) for o in objs
                  if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") != "gpushare"]
    assert unlabelled == []
