"""The Helm chart renders the kustomize overlays' objects for the same values, lints clean, and is generated."""

from __future__ import annotations

import copy
import difflib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from charts import generate, kustomize
from charts.knobs import AUTO, CAPABILITIES, CONFIG_CHECKSUM, HELM_LABELS, KNOBS, MODE_VALUE, SWITCHES, component_value
from charts.release import pod_template
from charts.values import DEFAULT_MODE
from tests.harness.manifests import helm
from tests.harness.manifests.helm import CHART, Obj
from tests.harness.manifests.render import kubectl

# A cold build of helm (once per machine) happens in the first test that needs it.
pytestmark = pytest.mark.timeout(helm.BUILD_TIMEOUT)

IMAGE = {"repository": "registry.example/team/gpushare", "tag": "1.2.3", "pullPolicy": "Always"}
DIGEST = "sha256:" + "0123456789abcdef" * 4
PULL_SECRETS = [{"name": "registry-credentials"}]
PRIORITY = "gpushare-critical"
POD_LABELS = {"example.com/team": "gpu"}
POD_ANNOTATIONS = {"example.com/owner": "gpu-team"}
ARCH_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}
WEBHOOK_NODES = {"node-role.example.com/infra": "true"}
WEBHOOK_RESOURCES = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}}
PLUGIN_RESOURCES = {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
DRA_NODE_SELECTOR = {"gpu-memory-path": "dra"}
TOLERATIONS = [{"operator": "Exists"}]
PEERS = [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "10.0.1.0/28"}}]
EXTRA_ENV = [{"name": "LD_LIBRARY_PATH", "value": "/opt/nvml"}]
EXTRA_MOUNTS = [{"name": "nvml", "mountPath": "/opt/nvml", "readOnly": True}]
EXTRA_VOLUMES = [{"name": "nvml", "hostPath": {"path": "/opt/nvml", "type": "Directory"}}]
SCRAPERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
# kube-system dropped, two others trusted; the lists they go into, after gpushare-system (neutralise.gpushare.io,
# validate-ordinary.gpushare.io, the policy gpushare-container-env; in-process the policy gpushare-neutralise instead
# of the two entries: docs/deploy.md, Trusted GPU infrastructure).
TRUSTED = ["nvidia-device-plugin", "gpu-operator"]
EXEMPT = "namespaceSelector/matchExpressions/0/values"
WEBHOOK_EXEMPT_LISTS = (("MutatingWebhookConfiguration", "gpushare-webhook", f"/webhooks/1/{EXEMPT}"),
                        ("ValidatingWebhookConfiguration", "gpushare-webhook", f"/webhooks/2/{EXEMPT}"))
POLICY_EXEMPT_LIST = ("ValidatingAdmissionPolicy", "gpushare-container-env", f"/spec/matchConstraints/{EXEMPT}")
IN_PROCESS_EXEMPT_LIST = ("MutatingAdmissionPolicy", "gpushare-neutralise", f"/spec/matchConstraints/{EXEMPT}")
IN_PROCESS_API = CAPABILITIES["in-process"]

# Every value of the chart set away from its default ...
CUSTOM_VALUES: Obj = {
    "trustedNamespaces": TRUSTED,
    "image": {**IMAGE, "digest": DIGEST},
    "imagePullSecrets": PULL_SECRETS,
    "config": {"delivery": "cdi", "placement": "node", "unit": "MiB", "logLevel": "DEBUG"},
    "webhook": {"replicas": 3, "resources": WEBHOOK_RESOURCES, "priorityClassName": PRIORITY,
                "podAnnotations": POD_ANNOTATIONS, "podLabels": POD_LABELS, "affinity": ARCH_AFFINITY,
                "nodeSelector": WEBHOOK_NODES, "tolerations": TOLERATIONS},
    "devicePlugin": {"nodeSelector": NODE_SELECTOR, "tolerations": TOLERATIONS,
                     "resources": PLUGIN_RESOURCES, "extraEnv": EXTRA_ENV, "extraVolumeMounts": EXTRA_MOUNTS,
                     "extraVolumes": EXTRA_VOLUMES, "priorityClassName": PRIORITY, "podAnnotations": POD_ANNOTATIONS,
                     "podLabels": POD_LABELS, "affinity": ARCH_AFFINITY},
    "networkPolicy": {"enabled": True, "apiServer": PEERS, "metrics": SCRAPERS},
    # and every optional component switched on
    **{component_value(folder): {"enabled": True} for folder in kustomize.components()},
    "dra": {"enabled": True, "nodeSelector": DRA_NODE_SELECTOR, "tolerations": TOLERATIONS,
            "resources": PLUGIN_RESOURCES, "extraEnv": EXTRA_ENV, "extraVolumeMounts": EXTRA_MOUNTS,
            "extraVolumes": EXTRA_VOLUMES, "priorityClassName": PRIORITY, "podAnnotations": POD_ANNOTATIONS,
            "podLabels": POD_LABELS, "affinity": ARCH_AFFINITY},
}


def _replace(kind: str, name: str, path: str, value: Any) -> Obj:
    return {"target": {"kind": kind, "name": name},
            "patch": yaml.safe_dump([{"op": "replace", "path": path, "value": value}])}


def _add(kind: str, name: str, path: str, value: Any) -> Obj:
    return {"target": {"kind": kind, "name": name},
            "patch": yaml.safe_dump([{"op": "add", "path": path, "value": value}])}


def _template_patch(kind: str, name: str, spec: Obj, metadata: Obj | None = None) -> Obj:
    """A strategic-merge patch of a workload's pod template: maps merge into what is there, as Helm merges a map
    value into its default."""
    template = {"spec": spec, **({"metadata": metadata} if metadata else {})}
    return {"patch": yaml.safe_dump({
        "apiVersion": "batch/v1" if kind == "Job" else "apps/v1", "kind": kind,
        "metadata": {"name": name, "namespace": "gpushare-system"},
        "spec": {"template": template}})}


def _pod_patches(kind: str, name: str) -> list[Obj]:
    """Every workload's pod-template values: priority class replaced, labels and annotations added, the affinity
    merged into the webhook's own (a map value merges into its default)."""
    return [_template_patch(kind, name, {"priorityClassName": PRIORITY, "affinity": ARCH_AFFINITY},
                            {"labels": POD_LABELS, "annotations": POD_ANNOTATIONS})]


def _node_plugin_patches(name: str, container: str, node_selector: Obj) -> list[Obj]:
    """The device plugin's or the DRA driver's values: node selector and resources merged, tolerations replaced,
    the extra lists added after the manifests' own items."""
    first = "/spec/template/spec/containers/0"
    return [
        _template_patch("DaemonSet", name, {"nodeSelector": node_selector,
                                            "containers": [{"name": container, "resources": PLUGIN_RESOURCES}]}),
        *_pod_patches("DaemonSet", name),
        _replace("DaemonSet", name, "/spec/template/spec/tolerations", TOLERATIONS),
        *(_add("DaemonSet", name, path, item) for path, items in (
            (f"{first}/env/-", EXTRA_ENV), (f"{first}/volumeMounts/-", EXTRA_MOUNTS),
            ("/spec/template/spec/volumes/-", EXTRA_VOLUMES)) for item in items),
    ]


def _delete(kind: str, name: str) -> Obj:
    return {"patch": yaml.safe_dump({"$patch": "delete", "apiVersion": "admissionregistration.k8s.io/v1",
                                     "kind": kind, "metadata": {"name": name}})}


def _exempt_patches(in_process: bool, delivery: str) -> list[Obj]:
    """The trusted namespaces written into each list that holds them, and in-process in cdi delivery the policy
    gpushare-neutralise deleted (docs/deploy.md, Ordinary pods inside the API server)."""
    lists = [POLICY_EXEMPT_LIST]
    deleted: list[Obj] = []
    if not in_process:
        lists.extend(WEBHOOK_EXEMPT_LISTS)
    elif delivery == "env":
        lists.append(IN_PROCESS_EXEMPT_LIST)
    else:
        deleted = [_delete(kind, "gpushare-neutralise")
                   for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")]
    return [*(_replace(kind, name, path, ["gpushare-system", *TRUSTED]) for kind, name, path in lists), *deleted]


def custom_kustomization(overlay: str, *, in_process: bool = False, delivery: str = "cdi") -> Obj:
    """... and the same settings as an operator writes them in a kustomize overlay of the manifests."""
    workloads = [("Deployment", "gpushare-webhook"), ("DaemonSet", "gpushare-device-plugin"),
                 ("DaemonSet", "gpushare-dra-plugin")]
    if overlay == "cert-manager":
        workloads.append(("Job", "gpushare-signing-key"))
    first = "/spec/template/spec/containers/0"
    return {
        "images": [{"name": "gpushare", "newName": IMAGE["repository"], "digest": DIGEST}],
        "replicas": [{"name": "gpushare-webhook", "count": 3}],
        "patches": [
            *(_replace(kind, name, f"{first}/imagePullPolicy", "Always") for kind, name in workloads),
            *(_add(kind, name, "/spec/template/spec/imagePullSecrets", PULL_SECRETS) for kind, name in workloads),
            *_pod_patches("Deployment", "gpushare-webhook"),
            _template_patch("Deployment", "gpushare-webhook", {"nodeSelector": WEBHOOK_NODES,
                                                               "tolerations": TOLERATIONS}),
            {"patch": yaml.safe_dump({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "gpushare-config", "namespace": "gpushare-system"},
                "data": {"GPUSHARE_DELIVERY": delivery, "GPUSHARE_PLACEMENT": "node", "GPUSHARE_UNIT": "MiB",
                         "GPUSHARE_LOG_LEVEL": "DEBUG"}})},
            _replace("Deployment", "gpushare-webhook", f"{first}/resources", WEBHOOK_RESOURCES),
            *_node_plugin_patches("gpushare-device-plugin", "device-plugin", NODE_SELECTOR),
            *_node_plugin_patches("gpushare-dra-plugin", "dra-plugin", DRA_NODE_SELECTOR),
            _replace("NetworkPolicy", "gpushare-webhook", "/spec/ingress/0/from", PEERS),
            _replace("NetworkPolicy", "gpushare-webhook", "/spec/ingress/1/from", SCRAPERS),
            _replace("NetworkPolicy", "gpushare-device-plugin", "/spec/ingress/0/from", SCRAPERS),
            _replace("NetworkPolicy", "gpushare-dra-plugin", "/spec/ingress/0/from", SCRAPERS),
            *_exempt_patches(in_process, delivery),
        ],
    }


def manifests(overlay: str, parts: list[str] | None = None, extra: Obj | None = None) -> list[Obj]:
    kubectl()  # skips, saying why, where kubectl is missing
    return kustomize.render(overlay, parts or [], extra)


def by_key(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    out = {kustomize.key(o): o for o in objs}
    assert len(out) == len(objs), "two objects share kind, namespace and name"
    return out


def _without_release_fields(obj: Obj) -> Obj:
    """The object without what only the chart adds: the release's labels (on the object and its pod template)
    and the config checksum (charts/release.py)."""
    obj = copy.deepcopy(obj)
    template = pod_template(obj)
    for metadata in (obj["metadata"], *([template["metadata"]] if template else [])):
        for label in HELM_LABELS:
            metadata["labels"].pop(label)
        annotations = metadata.get("annotations", {})
        annotations.pop(CONFIG_CHECKSUM, None)
        if "annotations" in metadata and not annotations:
            del metadata["annotations"]
    return obj


def assert_same_objects(chart: list[Obj], manifests: list[Obj]) -> None:
    """The chart renders the overlay's objects, but for the release's labels and the config checksum."""
    rendered, expected = by_key([_without_release_fields(o) for o in chart]), by_key(manifests)
    assert sorted(rendered) == sorted(expected), "the chart and the overlay render different sets of objects"
    for k, obj in expected.items():
        if rendered[k] != obj:
            diff = difflib.unified_diff(yaml.safe_dump(obj).splitlines(), yaml.safe_dump(rendered[k]).splitlines(),
                                        "kustomize", "helm", lineterm="")
            raise AssertionError(f"{k} differs:\n" + "\n".join(diff))


def test_committed_chart_is_what_the_generator_writes() -> None:
    kubectl()
    assert generate.differences() == [], "run `./dev chart` and commit charts/gpushare"


@pytest.mark.parametrize("overlay", ["cert-manager", "self-signed"])
def test_default_values_render_the_overlay(overlay: str) -> None:
    sets = [] if overlay == DEFAULT_MODE else [f"certificates={overlay}"]
    assert_same_objects(helm.template(sets=sets), manifests(overlay))


@pytest.mark.parametrize("overlay", ["cert-manager", "self-signed"])
def test_default_values_render_the_overlay_with_the_in_process_component_where_the_cluster_serves_it(
    overlay: str,
) -> None:
    sets = [] if overlay == DEFAULT_MODE else [f"certificates={overlay}"]
    assert_same_objects(helm.template(sets=sets, api_versions=[IN_PROCESS_API]), manifests(overlay, ["in-process"]))


@pytest.mark.parametrize(("in_process", "delivery"), [(False, "cdi"), (True, "cdi"), (True, "env")],
                         ids=["webhook", "in-process cdi", "in-process env"])
@pytest.mark.parametrize("overlay", ["cert-manager", "self-signed"])
def test_every_value_renders_what_the_same_kustomize_overlay_does(
    overlay: str, in_process: bool, delivery: str, tmp_path: Path,
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({**CUSTOM_VALUES, "certificates": overlay, "inProcess": {"enabled": in_process},
                                      "config": {**CUSTOM_VALUES["config"], "delivery": delivery}}))
    parts = [c for c in kustomize.components() if in_process or c != "in-process"]
    expected = manifests(overlay, parts, custom_kustomization(overlay, in_process=in_process, delivery=delivery))
    assert_same_objects(helm.template(values), expected)


def test_every_component_is_a_switch_of_the_chart() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for folder in kustomize.components():
        switch = component_value(folder)
        # Off by default, as in the overlays; a component the cluster's APIs decide, on where it serves them.
        default = values[switch]["enabled"]
        assert default == AUTO if folder in CAPABILITIES else default is False, folder
        added = {kustomize.key(o) for o in helm.template(sets=[f"{switch}.enabled=true"])} - {
            kustomize.key(o) for o in helm.template()}
        assert added == {kustomize.key(o) for o in manifests("cert-manager", [folder])} - {
            kustomize.key(o) for o in manifests("cert-manager")}


@pytest.mark.parametrize(("sets", "served", "in_process"), [
    ([], False, False),
    ([], True, True),
    (["inProcess.enabled=false"], True, False),
    (["inProcess.enabled=true"], False, True),
    (["inProcess.enabled=auto"], True, True),
    # `helm upgrade --reuse-values` from a chart without the value: no value at all, which counts as auto.
    (["inProcess=null"], True, True),
    (["inProcess=null"], False, False),
])
def test_the_in_process_component_follows_the_cluster_unless_the_value_says(
    sets: list[str], served: bool, in_process: bool,
) -> None:
    objs = helm.template(sets=sets, api_versions=[IN_PROCESS_API] if served else [])
    hooks = {h["name"] for o in objs if o["kind"].endswith("WebhookConfiguration") for h in o["webhooks"]}
    policies = {o["metadata"]["name"] for o in objs if o["kind"].startswith("MutatingAdmissionPolicy")}
    assert policies == ({"gpushare-neutralise"} if in_process else set())
    assert hooks.isdisjoint({"neutralise.gpushare.io", "validate-ordinary.gpushare.io"}) is in_process


def test_the_network_policies_are_on_by_default_and_a_switch_turns_them_off() -> None:
    policies = {kustomize.key(o) for o in manifests("cert-manager", ["dra"]) if o["kind"] == "NetworkPolicy"}
    assert len(policies) == 3
    assert policies <= {kustomize.key(o) for o in helm.template(sets=["dra.enabled=true"])}
    assert not policies & {kustomize.key(o) for o in helm.template(
        sets=["dra.enabled=true", "networkPolicy.enabled=false"])}


@pytest.mark.parametrize("sets", [
    [], ["certificates=self-signed"], ["networkPolicy.enabled=false"],
    ["config.delivery=cdi,config.placement=node"], ["inProcess.enabled=true"],
    ["inProcess.enabled=true,config.delivery=cdi,config.placement=node"],
])
def test_helm_lint_is_clean(sets: list[str]) -> None:
    args = ["lint", "--strict", str(CHART), *helm.kube_version_args()] + [a for s in sets for a in ("--set", s)]
    done = helm.run(args)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "0 chart(s) failed" in output
    assert "[WARNING]" not in output and "[ERROR]" not in output, output


SET, JSON = "--set", "--set-json"


@pytest.mark.parametrize(("option", "setting", "named"), [
    (SET, "certificates=letsencrypt", "certificates"),
    (SET, "config.delivery=both", "delivery"),
    (SET, "config.placement=anywhere", "placement"),
    (SET, "webhok.replicas=3", "webhok"),
    (SET, "webhook.replicas=two", "replicas"),
    (SET, "image.pullPolicy=Sometimes", "pullPolicy"),
    (SET, "trustedNamespaces=kube-system", "trustedNamespaces"),
    (SET, "trustedNamespaces={kube-system,GPU_Operator}", "trustedNamespaces/1"),
    # helm's --set reads {} as a list of one empty string; an empty list is --set-json 'trustedNamespaces=[]'.
    (SET, "trustedNamespaces={}", "trustedNamespaces/0"),
    (SET, "inProcess.enabled=sometimes", "inProcess"),
    (SET, "image.digest=latest", "digest"),
    (SET, "image.digest=sha256:abc", "digest"),
    (JSON, 'imagePullSecrets=[{"secret": "x"}]', "imagePullSecrets/0"),
    (JSON, 'webhook.priorityClassName="High_Priority"', "priorityClassName"),
    # A pod label may not replace a standard label (the selector's, or one the chart writes).
    (JSON, 'webhook.podLabels={"app.kubernetes.io/name": "other"}', "podLabels"),
    (JSON, 'devicePlugin.podLabels={"team": "a value with spaces"}', "podLabels"),
    (JSON, 'dra.podAnnotations={"checksum/config": "0"}', "podAnnotations"),
    (JSON, 'webhook.nodeSelector=["infra"]', "nodeSelector"),
])
def test_a_bad_value_is_refused_naming_it(option: str, setting: str, named: str) -> None:
    done = helm.run(["template", helm.RELEASE, str(CHART), *helm.kube_version_args(), option, setting])
    assert done.returncode != 0
    assert named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_chart_metadata_agrees_with_the_manifests() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == values["image"]["tag"]
    assert chart["kubeVersion"] == ">=1.35.0-0"  # the project supports Kubernetes 1.35 to 1.37
    assert values["certificates"] == DEFAULT_MODE


def test_the_chart_renders_under_the_helm_the_tests_run_with() -> None:
    assert re.fullmatch(r"v[34]\.\d+\.\d+", helm.version()), f"`helm version --short` printed {helm.version()!r}"
    kinds = {o["kind"] for o in helm.template()}
    assert {"Namespace", "Deployment", "DaemonSet", "MutatingWebhookConfiguration"} <= kinds, (
        f"helm {helm.version()} rendered only {sorted(kinds)}")


def test_helm_assumes_the_kubernetes_of_its_client_go() -> None:
    """Unstamped, helm v3 assumes Kubernetes 1.20: charts/build-helm.sh stamps v3's release from its client-go
    (v0.N.x is Kubernetes 1.N); v4 reads it from its own build information."""
    if shutil.which("go") is None:
        pytest.skip("reading which client-go the helm binary holds needs Go (`go version -m`)")
    modules = subprocess.run(["go", "version", "-m", helm.helm()], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    client_go = re.search(r"^\s+dep\s+k8s\.io/client-go\s+v0\.(\d+)\.", modules, flags=re.MULTILINE)
    assert client_go is not None, f"helm {helm.version()} holds no k8s.io/client-go:\n{modules}"
    assert helm.default_kube_version() == f"v1.{client_go.group(1)}.0", f"helm {helm.version()}"


@pytest.mark.parametrize(("kubernetes", "refused"), [
    ("1.34.0", True), ("v1.34.9-gke.100", True), ("1.35.0", False), ("1.37.2", False),
])
def test_a_cluster_older_than_1_35_is_refused_before_anything_renders(kubernetes: str, refused: bool) -> None:
    done = helm.run(["template", helm.RELEASE, str(CHART), "--kube-version", kubernetes])
    if not refused:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode != 0
    assert done.stdout == ""
    assert "Error: chart requires kubeVersion: >=1.35.0-0 which is incompatible with Kubernetes v1.34." in (
        done.stderr), done.stderr


def test_every_value_is_in_the_docs_table() -> None:
    docs = (helm.REPO / "docs" / "helm.md").read_text()
    paths = [MODE_VALUE, *(v.path for knob in KNOBS for v in knob.values), *(s.value for s in SWITCHES),
             *(f"{component_value(folder)}.enabled" for folder in kustomize.components())]
    missing = [p for p in paths if f"| `{p}` |" not in docs]
    assert missing == [], f"docs/helm.md's values table lacks {missing}"
