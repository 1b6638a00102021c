"""Both overlays render with `kubectl kustomize`, and the objects are what the API server and kubelet need."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from charts import kustomize
from tests.harness.manifests.render import (
    MANIFESTS,
    NAMESPACE,
    OVERLAYS,
    Obj,
    container,
    env_of,
    find,
    hardened,
    objects,
    pod_spec,
    render,
    render_with_component,
)

pytestmark = pytest.mark.timeout(60)

SERVICE = "gpushare-webhook"
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}
MUTATING, VALIDATING = "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"
CREATE_AND_EPHEMERAL = [(["CREATE"], "pods"), (["UPDATE"], "pods/ephemeralcontainers")]
# kind, webhook name, path, failure policy, (operations, resource) per rule
WEBHOOKS = [
    (MUTATING, "mutate.gpushare.io", "/mutate", "Fail", CREATE_AND_EPHEMERAL),
    (MUTATING, "neutralise.gpushare.io", "/mutate", "Ignore", CREATE_AND_EPHEMERAL),
    (VALIDATING, "validate.gpushare.io", "/validate", "Fail",
     [(["UPDATE"], "pods"), (["UPDATE"], "pods/ephemeralcontainers")]),
    (VALIDATING, "validate-status.gpushare.io", "/validate", "Fail", [(["UPDATE"], "pods/status")]),
    (VALIDATING, "validate-ordinary.gpushare.io", "/validate", "Ignore", CREATE_AND_EPHEMERAL),
    (VALIDATING, "validate-plugin.gpushare.io", "/validate", "Fail", [(["UPDATE"], ["pods", "pods/*"])]),
    (VALIDATING, "validate-binding.gpushare.io", "/validate", "Fail", [(["CREATE"], ["pods/binding", "bindings"])]),
]
# Selected by who writes (the plugin identity) or by what (a Binding with a reserved annotation), in every namespace.
EVERY_NAMESPACE = ("validate-plugin.gpushare.io", "validate-binding.gpushare.io")


def the_webhook(objs: list[Obj], kind: str, name: str) -> Obj:
    config = find(objs, kind, "gpushare-webhook")
    hooks = [h for h in config["webhooks"] if h["name"] == name]
    assert len(hooks) == 1, f"{kind} gpushare-webhook has no single webhook {name}"
    hook: Obj = hooks[0]
    return hook


def service_port(objs: list[Obj], port: int) -> Obj:
    service = find(objs, "Service", SERVICE)
    matches = [p for p in service["spec"]["ports"] if p["port"] == port]
    assert len(matches) == 1, f"Service {SERVICE} has no port {port}"
    match: Obj = matches[0]
    return match


def container_port(ctr: Obj, port: int | str) -> int:
    for item in ctr["ports"]:
        if port in (item["containerPort"], item.get("name")):
            return int(item["containerPort"])
    raise AssertionError(f"container {ctr['name']} exposes no port {port!r}")


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespaced_object_is_in_the_webhook_namespace(overlay: str) -> None:
    objs = render(overlay)
    for obj in objs:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, where
    namespace = find(objs, "Namespace", NAMESPACE)
    # The device plugin's hostPath mounts need the privileged Pod Security level in its namespace.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize(("kind", "name", "path", "policy", "rules"), WEBHOOKS)
def test_webhook_configuration(
    overlay: str, kind: str, name: str, path: str, policy: str, rules: list[tuple[list[str], str | list[str]]]
) -> None:
    objs = render(overlay)
    assert [h["name"] for h in find(objs, kind, "gpushare-webhook")["webhooks"]] == [
        n for k, n, _, _, _ in WEBHOOKS if k == kind]
    hook = the_webhook(objs, kind, name)
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == policy
    assert 1 <= hook["timeoutSeconds"] <= 10  # the API server allows 1-30 s; stay well under its 30 s budget
    if policy == "Ignore":  # ordinary pods wait at most this long per entry while the webhook is unreachable
        assert hook["timeoutSeconds"] <= 2
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
         "resources": resource if isinstance(resource, list) else [resource], "scope": "Namespaced"}
        for operations, resource in rules
    ]
    ref = hook["clientConfig"]["service"]
    assert ref == {"namespace": NAMESPACE, "name": SERVICE, "path": path, "port": 443}
    assert "url" not in hook["clientConfig"]
    target = service_port(objs, ref["port"])["targetPort"]
    spec = pod_spec(objs, "Deployment", SERVICE)
    assert container_port(container(spec, "webhook"), target) == 8443
    # Ordinary pods in the trusted namespaces (kube-system by default) are not neutralised: GPU agents there select
    # GPUs by env on purpose.
    excluded = [NAMESPACE, "kube-system"] if policy == "Ignore" else [NAMESPACE]
    if name in EVERY_NAMESPACE:
        assert "namespaceSelector" not in hook
    else:
        assert hook["namespaceSelector"] == {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}]
        }
    assert "objectSelector" not in hook
    conditions = hook["matchConditions"]
    assert conditions and all(c["name"] and c["expression"].strip() for c in conditions)
    if kind == "MutatingWebhookConfiguration":
        assert hook["reinvocationPolicy"] == "IfNeeded"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_paths_and_probes_are_routes_of_the_app(overlay: str) -> None:
    app_module = pytest.importorskip("webhook.server.app")
    settings_module = pytest.importorskip("webhook.server.settings")
    ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    app = app_module.create_app(
        settings_module.settings_from({}), private_key=ed25519.Ed25519PrivateKey.generate()
    )
    routes = {(rule.rule, method) for rule in app.url_map.iter_rules() for method in rule.methods or ()}
    objs = render(overlay)
    for kind, name, _, _, _ in WEBHOOKS:
        assert (the_webhook(objs, kind, name)["clientConfig"]["service"]["path"], "POST") in routes
    ctr = container(pod_spec(objs, "Deployment", SERVICE), "webhook")
    probe_module = pytest.importorskip("webhook.server.probe")
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert probe_module.target(env["GPUSHARE_BIND"]) == ("127.0.0.1", 8443)  # from loopback (sourcefilter.LOOPBACK)
    assert container_port(ctr, "https") == 8443
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        command = ctr[probe]["exec"]["command"]
        assert command[:2] == ["gpushare-webhook-probe", path] and command[2] == "--timeout", command
        assert path in probe_module.PATHS
        assert (path, "GET") in routes
        # The probe says why it failed before the kubelet's own timeout, and waits out SYN retries (sent again at
        # 1 s and 3 s) while a connection flood fills the admission port's accept queue.
        assert 3 < float(command[3]) < ctr[probe]["timeoutSeconds"], command


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_selects_the_webhook_pods(overlay: str) -> None:
    objs = render(overlay)
    service = find(objs, "Service", SERVICE)
    deployment = find(objs, "Deployment", SERVICE)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(service["spec"]["selector"], pod_labels)
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod_labels)


def hours(duration: str) -> int:
    assert duration.endswith("h"), duration
    return int(duration[:-1])


def test_cert_manager_chain_and_injection() -> None:
    objs = render("cert-manager")
    issuers = {o["metadata"]["name"]: o for o in objects(objs, "Issuer")}
    certificates = {o["metadata"]["name"]: o for o in objects(objs, "Certificate")}
    serving = certificates["gpushare-webhook"]["spec"]
    assert serving["issuerRef"]["kind"] == "Issuer"

    def issuing_certificate(issuer: str) -> Obj:
        secret = issuers[issuer]["spec"]["ca"]["secretName"]
        return next(c["spec"] for c in certificates.values() if c["spec"]["secretName"] == secret)

    # serving <- issuing CA (new key on every renewal) <- root (same key on renewal: the trust anchor) <- selfSigned
    issuing = issuing_certificate(serving["issuerRef"]["name"])
    root = issuing_certificate(issuing["issuerRef"]["name"])
    assert issuing["isCA"] is root["isCA"] is True
    assert issuing["privateKey"]["rotationPolicy"] == "Always"
    assert root["privateKey"]["rotationPolicy"] == "Never"
    assert "selfSigned" in issuers[root["issuerRef"]["name"]]["spec"]
    # cert-manager does not cut a certificate at its issuer's expiry: the issuing CA must be renewed earlier than
    # the serving certificate's whole lifetime before it expires.
    assert hours(issuing["renewBefore"]) > hours(serving["duration"])
    assert hours(root["renewBefore"]) > hours(issuing["duration"])
    assert "server auth" in serving["usages"]
    svc = f"{SERVICE}.{NAMESPACE}.svc"
    assert serving["dnsNames"] == [SERVICE, f"{SERVICE}.{NAMESPACE}", svc, f"{svc}.cluster.local"]
    build = pytest.importorskip("certs.build")
    assert serving["dnsNames"] == build.service_hosts(SERVICE, NAMESPACE)
    spec = pod_spec(objs, "Deployment", SERVICE)
    tls_volume = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert tls_volume["secret"]["secretName"] == serving["secretName"] == "gpushare-webhook-tls"
    for kind in (MUTATING, VALIDATING):
        config = find(objs, kind, "gpushare-webhook")
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/gpushare-webhook"


def test_self_signed_overlay_has_no_cert_manager_objects_and_leaves_ca_bundle_to_the_cli() -> None:
    objs = render("self-signed")
    assert [o for o in objs if o["apiVersion"].startswith("cert-manager.io/")] == []
    for kind, name, _, _, _ in WEBHOOKS:
        config = find(objs, kind, "gpushare-webhook")
        assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
        # Absent, so `kubectl apply` never overwrites the caBundle that `gpushare-certs install` patched in.
        assert "caBundle" not in the_webhook(objs, kind, name)["clientConfig"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_deployment(overlay: str) -> None:
    objs = render(overlay)
    deployment = find(objs, "Deployment", SERVICE)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = deployment["spec"]["template"]["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = find(objs, "PodDisruptionBudget", SERVICE)
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
               and labels_match(t["podAffinityTerm"]["labelSelector"]["matchLabels"], pod_labels) for t in terms)
    assert spec["serviceAccountName"] == SERVICE
    assert spec["automountServiceAccountToken"] is False
    assert find(objs, "ServiceAccount", SERVICE)["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    ctr = container(spec, "webhook")
    assert ctr["command"] == ["gpushare-webhook"]
    hardened(ctr["securityContext"])
    assert ctr["securityContext"]["runAsNonRoot"] is True
    for kind in ("requests", "limits"):
        assert set(ctr["resources"][kind]) == {"cpu", "memory"}
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name, secret, path in (("tls", "gpushare-webhook-tls", "/etc/gpushare/tls"),
                               ("signing", "gpushare-signing-key", "/etc/gpushare/signing")):
        assert volumes[name]["secret"]["secretName"] == secret
        assert "items" not in volumes[name]["secret"]  # every key, and rotation reaches them
        assert mounts[name]["mountPath"] == path
        assert mounts[name]["readOnly"] is True
    assert all("subPath" not in m and "subPathExpr" not in m for m in ctr["volumeMounts"])
    env = env_of(ctr, objs)
    assert env["GPUSHARE_TLS_CERT"] == "/etc/gpushare/tls/tls.crt"
    assert env["GPUSHARE_TLS_KEY"] == "/etc/gpushare/tls/tls.key"
    assert env["GPUSHARE_SIGNING_KEY"] == "/etc/gpushare/signing/signing.key"
    assert env["GPUSHARE_BIND"] == "0.0.0.0:8443"
    settings = pytest.importorskip("webhook.server.settings").settings_from(env)  # the webhook would start with these
    assert settings.bind == "0.0.0.0:8443"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_device_plugin_daemonset(overlay: str) -> None:
    objs = render(overlay)
    spec = pod_spec(objs, "DaemonSet", "gpushare-device-plugin")
    assert spec["nodeSelector"] == {"gpushare.io/gpu-memory": "device-plugin"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"]
    assert spec["serviceAccountName"] == "gpushare-device-plugin"
    ctr = container(spec, "device-plugin")
    assert ctr["command"] == ["gpushare-device-plugin"]
    hardened(ctr["securityContext"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    assert all("subPath" not in m for m in ctr["volumeMounts"])
    host_paths = {
        mounts[name]: (v["hostPath"]["path"], v["hostPath"]["type"]) for name, v in volumes.items() if "hostPath" in v
    }
    assert host_paths == {
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", "Directory"),
        "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", "Directory"),
        "/var/run/cdi": ("/var/run/cdi", "DirectoryOrCreate"),
    }
    # Written to: the plugin's socket and CDI specs. The PodResources socket is only connected to.
    writable = {m["mountPath"] for m in ctr["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/kubelet/device-plugins", "/var/run/cdi", "/tmp"}
    verify = next(name for name, v in volumes.items() if "configMap" in v)
    assert volumes[verify]["configMap"]["name"] == "gpushare-verify-key"
    assert mounts[verify] == "/etc/gpushare/verify"
    assert [v for v in volumes.values() if "secret" in v] == []  # plugins never see the private key
    env = env_of(ctr, objs)
    assert env["GPUSHARE_NODE_NAME"] == "<fieldRef:spec.nodeName>"
    assert env["GPUSHARE_VERIFY_KEY"] == "/etc/gpushare/verify/signing.pub"
    for key, path in (("GPUSHARE_DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"),
                      ("GPUSHARE_CDI_DIR", "/var/run/cdi")):
        assert env[key] == path
    assert env["GPUSHARE_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert {"GPUSHARE_DELIVERY", "GPUSHARE_UNIT", "GPUSHARE_RESOURCE_NAME"} <= set(env)
    plugin_settings = pytest.importorskip("deviceplugin.settings")
    settings = plugin_settings.settings_from({**env, "GPUSHARE_NODE_NAME": "gpu-node-1"})
    assert settings.node_name == "gpu-node-1"


def rules_of(role: Obj) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_is_least_privilege(overlay: str) -> None:
    objs = render(overlay)
    plugin_role = find(objs, "ClusterRole", "gpushare-system-device-plugin")
    assert rules_of(plugin_role) == {
        ("", "pods"): {"get", "list", "watch", "patch"},
        ("", "events"): {"create"},
        ("", "nodes/status"): {"patch"},
    }
    assert [o["metadata"]["name"] for o in objects(objs, "ClusterRole")] == ["gpushare-system-device-plugin"]
    binding = find(objs, "ClusterRoleBinding", "gpushare-system-device-plugin")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "gpushare-system-device-plugin"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpushare-device-plugin", "namespace": NAMESPACE}]
    bound: list[Any] = [s for kind in ("ClusterRoleBinding", "RoleBinding") for b in objects(objs, kind)
                        for s in b["subjects"]]
    assert all(s["name"] != SERVICE for s in bound), "the webhook is pure and needs no API access"
    assert len(list(objects(objs, "ClusterRoleBinding"))) == 1


def test_signing_key_job_may_only_create_and_read_its_two_objects() -> None:
    objs = render("cert-manager")
    role = find(objs, "Role", "gpushare-certs")
    assert rules_of(role) == {("", "secrets"): {"get", "create"}, ("", "configmaps"): {"get", "create"}}
    names = {r["resources"][0]: r.get("resourceNames") for r in role["rules"] if r["verbs"] == ["get"]}
    assert names == {"secrets": ["gpushare-signing-key"], "configmaps": ["gpushare-verify-key"]}
    spec = pod_spec(objs, "Job", "gpushare-signing-key")
    assert spec["serviceAccountName"] == "gpushare-certs"
    ctr = container(spec, "signing-key")
    assert ctr["command"][:2] == ["gpushare-certs", "signing-key"]
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert render("self-signed") and not [o for o in render("self-signed") if o["kind"] in ("Job", "Role")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_trusted_identities_are_the_service_accounts(overlay: str) -> None:
    objs = render(overlay)
    config = find(objs, "ConfigMap", "gpushare-config")["data"]
    account = pod_spec(objs, "DaemonSet", "gpushare-device-plugin")["serviceAccountName"]
    plugin_sa = find(objs, "ServiceAccount", account)
    identity = f"system:serviceaccount:{plugin_sa['metadata']['namespace']}:{plugin_sa['metadata']['name']}"
    assert config["GPUSHARE_PLUGIN_IDENTITIES"] == identity
    # The extender is deployed with the scheduler in kube-system, under the name its own manifests use.
    assert config["GPUSHARE_EXTENDER_IDENTITIES"] == "system:serviceaccount:kube-system:gpushare-schd-extender"
    settings = pytest.importorskip("webhook.server.settings")
    defaults = (settings.DEFAULT_PLUGIN, settings.DEFAULT_EXTENDER)
    assert defaults == (config["GPUSHARE_PLUGIN_IDENTITIES"], config["GPUSHARE_EXTENDER_IDENTITIES"])
    # Both workloads read the cluster-wide settings from this one ConfigMap.
    workloads = (("Deployment", SERVICE, "webhook"), ("DaemonSet", "gpushare-device-plugin", "device-plugin"))
    for kind, name, ctr in workloads:
        sources = container(pod_spec(objs, kind, name), ctr)["envFrom"]
        assert sources == [{"configMapRef": {"name": "gpushare-config"}}]
        literals = {e["name"] for e in container(pod_spec(objs, kind, name), ctr).get("env", [])}
        assert not literals & set(config), f"{kind} {name} overrides a cluster-wide setting"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_match_conditions_use_the_configured_resource_and_prefix(overlay: str) -> None:
    objs = render(overlay)
    config = find(objs, "ConfigMap", "gpushare-config")["data"]
    for kind, name, _, _, _ in WEBHOOKS:
        expression = the_webhook(objs, kind, name)["matchConditions"][0]["expression"]
        if name == "validate-plugin.gpushare.io":  # selected by who writes
            assert expression == f"request.userInfo.username in ['{config['GPUSHARE_PLUGIN_IDENTITIES']}']"
            continue
        if name not in ("validate-status.gpushare.io", "validate-binding.gpushare.io"):  # annotations only
            assert f"'{config['GPUSHARE_RESOURCE_NAME']}'" in expression
        assert f"'{config['GPUSHARE_ANNOTATION_PREFIX']}'" in expression
        assert "'ALIYUN_COM_GPU_MEM_'" in expression
    # The base's seven, which guard pods; the cert-manager overlay adds the signing-key Job's (on Secrets).
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"] != "gpushare-certs-creates-only-the-key-pair"]
    assert len(policies) == 7
    text = repr(policies)
    for value in (config["GPUSHARE_RESOURCE_NAME"], config["GPUSHARE_ANNOTATION_PREFIX"],
                  config["GPUSHARE_OTHER_GPU_RESOURCES"]):
        assert value in text


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_image_and_real_entry_points(overlay: str) -> None:
    """Every workload of the overlay and of every component runs the one pinned image and a console script the
    project installs."""
    first, *more = kustomize.components()
    objs = render_with_component(overlay, first, MANIFESTS, *more)
    images = set()
    commands = set()
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            for ctr in obj["spec"]["template"]["spec"]["containers"]:
                images.add(ctr["image"])
                commands.add(ctr["command"][0])
    assert len(images) == 1
    image = images.pop()
    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"image {image} is not pinned to a tag"
    scripts = tomllib.loads((MANIFESTS.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert commands <= set(scripts) and "gpushare-dra-plugin" in commands, (commands, scripts)
