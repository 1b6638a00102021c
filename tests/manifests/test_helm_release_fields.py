"""What the chart adds to the manifests' objects: the standard labels, the pod-template values (each rendered only
where set, where it is not in the manifests), the image by digest, the config checksum, and the refusal of the
namespace the chart creates itself."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from charts.knobs import CONFIG_CHECKSUM, HELM_LABELS, MANIFEST_LABELS
from charts.release import pod_template
from charts.version import project_version
from tests.harness.manifests import helm
from tests.harness.manifests.helm import CHART, Obj

pytestmark = pytest.mark.timeout(helm.BUILD_TIMEOUT)

EVERY_COMPONENT = [f"{c}.enabled=true" for c in ("dra", "monitoring", "inProcess")]
# The workloads' selectors as every chart before had them: immutable, so an upgrade needs them unchanged.
SELECTORS = {("Deployment", "gpushare-webhook"): "gpushare-webhook",
             ("DaemonSet", "gpushare-device-plugin"): "gpushare-device-plugin",
             ("DaemonSet", "gpushare-dra-plugin"): "gpushare-dra-plugin"}
# The workloads with a pod template and the value group of each (the signing-key Job has none of its own).
WORKLOADS = {"webhook": ("Deployment", "gpushare-webhook"), "devicePlugin": ("DaemonSet", "gpushare-device-plugin"),
             "dra": ("DaemonSet", "gpushare-dra-plugin")}
JOB = ("Job", "gpushare-signing-key")
# kube-apiserver's IsValidLabelValue.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _render(sets: Sequence[str] = (), set_json: Sequence[str] = ()) -> dict[tuple[str, str], Obj]:
    """The chart's objects by kind and name, with the DRA driver (every workload)."""
    objs = helm.template(sets=["dra.enabled=true", *sets], set_json=set_json)
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def _pod(objs: dict[tuple[str, str], Obj], workload: tuple[str, str]) -> Obj:
    template = pod_template(objs[workload])
    assert template is not None, workload
    return template


@pytest.mark.parametrize("sets", [[], ["certificates=self-signed"], EVERY_COMPONENT,
                                  ["networkPolicy.enabled=false", "config.delivery=cdi", "config.placement=node"]],
                         ids=["cert-manager", "self-signed", "every component", "cdi"])
def test_every_object_and_pod_template_carries_the_standard_labels(sets: list[str]) -> None:
    objs = helm.template(sets=sets, tests=True)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    expected = {"app.kubernetes.io/instance": helm.RELEASE, "app.kubernetes.io/version": chart["appVersion"],
                "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/part-of": "gpushare",
                "helm.sh/chart": f"gpushare-{chart['version']}"}
    for obj in objs:
        template = pod_template(obj)
        for where, metadata in [("object", obj["metadata"]), *([("pod", template["metadata"])] if template else [])]:
            labels = metadata.get("labels") or {}
            what = f"{obj['kind']} {obj['metadata']['name']} ({where})"
            assert {k: labels.get(k) for k in expected} == expected, what
            assert labels.get("app.kubernetes.io/name") and labels.get("app.kubernetes.io/component"), what
            assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in labels.values()), (what, labels)
        if (obj["kind"], obj["metadata"]["name"]) in SELECTORS:
            name = SELECTORS[obj["kind"], obj["metadata"]["name"]]
            assert obj["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": name}}


@pytest.mark.parametrize(("version", "label"), [
    ("0.1.0", "gpushare-0.1.0"),
    ("1.2.3+build.7", "gpushare-1.2.3_build.7"),
    ("1.2.3-rc.1+" + "a" * 60, ("gpushare-1.2.3-rc.1_" + "a" * 60)[:63]),
])
def test_the_chart_label_is_a_valid_label_value(version: str, label: str, tmp_path: Path) -> None:
    chart = tmp_path / "gpushare"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    (chart / "Chart.yaml").write_text(yaml.safe_dump({**meta, "version": version, "appVersion": version}))
    done = helm.run(["template", helm.RELEASE, str(chart), *helm.kube_version_args()])
    assert done.returncode == 0, done.stderr
    for obj in (o for o in yaml.safe_load_all(done.stdout) if o):
        labels = obj["metadata"]["labels"]
        assert labels["helm.sh/chart"] == label
        assert LABEL_VALUE.match(labels["app.kubernetes.io/version"])
        assert len(labels["app.kubernetes.io/version"]) <= 63


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}
TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}]


def _field(template: Obj, path: str) -> Any:
    node: Any = template
    for step in path.split("."):
        node = node.get(step) if isinstance(node, dict) else None
    return node


# value (under each workload's group), what it is set to, the field of the pod template, and what the field then
# holds: a map value merges into the manifests' map (the webhook's affinity, the plugins' node selectors, the pod
# labels and annotations), a list value replaces the list.
POD_VALUES = [
    ("priorityClassName", "gpushare-critical", "spec.priorityClassName", "gpushare-critical"),
    ("podAnnotations", {"example.com/owner": "gpu-team"}, "metadata.annotations", {"example.com/owner": "gpu-team"}),
    ("podLabels", {"example.com/team": "gpu"}, "metadata.labels", {"example.com/team": "gpu"}),
    ("affinity", AFFINITY, "spec.affinity", AFFINITY),
    ("nodeSelector", {"node-role.example.com/infra": "true"}, "spec.nodeSelector",
     {"node-role.example.com/infra": "true"}),
    ("tolerations", TOLERATIONS, "spec.tolerations", TOLERATIONS),
]


@pytest.mark.parametrize(("value", "setting", "path", "held"), POD_VALUES, ids=[v[0] for v in POD_VALUES])
@pytest.mark.parametrize("group", list(WORKLOADS))
def test_a_pod_template_value_renders_in_its_workloads_pod_template_only(
    group: str, value: str, setting: Any, path: str, held: Any,
) -> None:
    objs = _render(set_json=[f"{group}.{value}={json.dumps(setting)}"])
    default = _render()
    found = _field(_pod(objs, WORKLOADS[group]), path)
    if isinstance(held, dict):
        assert found.items() >= held.items()
    else:
        assert found == held
    for other, workload in WORKLOADS.items():
        if other != group:
            assert _pod(objs, workload) == _pod(default, workload), f"{group}.{value} changed {workload}"
    if value == "podLabels":
        kind, name = WORKLOADS[group]
        assert objs[kind, name]["spec"]["selector"] == default[kind, name]["spec"]["selector"]
        assert "example.com/team" not in objs[kind, name]["metadata"]["labels"]


# The fields the manifests lack, rendered only where a value sets them.
ABSENT = [("webhook", "spec.nodeSelector"), ("webhook", "spec.tolerations"), ("devicePlugin", "spec.affinity"),
          ("dra", "spec.affinity"), *((group, "spec.imagePullSecrets") for group in WORKLOADS)]


@pytest.mark.parametrize(("group", "path"), ABSENT)
def test_a_field_the_manifests_lack_is_left_out_while_its_value_is_empty(group: str, path: str) -> None:
    assert _field(_pod(_render(), WORKLOADS[group]), path) is None
    leaf = path.rsplit(".", 1)[1]
    value = "imagePullSecrets" if leaf == "imagePullSecrets" else f"{group}.{leaf}"
    empty = "[]" if leaf in ("tolerations", "imagePullSecrets") else "{}"
    assert _field(_pod(_render(set_json=[f"{value}={empty}"]), WORKLOADS[group]), path) is None


@pytest.mark.parametrize("group", list(WORKLOADS))
def test_pod_labels_and_annotations_are_only_the_charts_own_by_default(group: str) -> None:
    metadata = _pod(_render(), WORKLOADS[group])["metadata"]
    assert set(metadata["annotations"]) == {CONFIG_CHECKSUM}
    assert set(metadata["labels"]) == {*MANIFEST_LABELS, *HELM_LABELS}


@pytest.mark.parametrize("certificates", ["cert-manager", "self-signed"])
def test_image_pull_secrets_reach_every_pod_of_the_chart(certificates: str) -> None:
    secrets = [{"name": "registry-a"}, {"name": "registry-b"}]
    objs = _render(sets=[f"certificates={certificates}"], set_json=[f"imagePullSecrets={json.dumps(secrets)}"])
    workloads = [key for key, obj in objs.items() if pod_template(obj) is not None]
    assert (JOB in workloads) is (certificates == "cert-manager")
    assert len(workloads) == len(WORKLOADS) + (certificates == "cert-manager")
    for workload in workloads:
        assert _pod(objs, workload)["spec"]["imagePullSecrets"] == secrets, workload


DIGEST = "sha256:" + "0123456789abcdef" * 4
VERSION = project_version()  # the chart's default image tag


@pytest.mark.parametrize(("sets", "image"), [
    ([], f"gpushare:{VERSION}"),
    (["image.repository=registry.example/gpushare", "image.tag=1.2"], "registry.example/gpushare:1.2"),
    ([f"image.digest={DIGEST}"], f"gpushare@{DIGEST}"),
    (["image.repository=registry.example:5000/gpushare", "image.tag=1.2", f"image.digest={DIGEST}"],
     f"registry.example:5000/gpushare@{DIGEST}"),
    (["image.digest="], f"gpushare:{VERSION}"),
])
def test_every_container_runs_the_image_by_tag_or_by_digest(sets: list[str], image: str) -> None:
    objs = _render(sets=sets)
    containers = [c for obj in objs.values() if (t := pod_template(obj)) for c in t["spec"]["containers"]]
    assert len(containers) == len(WORKLOADS) + 1
    assert {c["image"] for c in containers} == {image}


def _checksums(sets: list[str]) -> set[str]:
    objs = _render(sets=sets)
    annotations = {key: (pod_template(obj) or {}).get("metadata", {}).get("annotations") or {}
                   for key, obj in objs.items() if pod_template(obj) is not None}
    assert CONFIG_CHECKSUM not in annotations[JOB]  # the Job does not read the ConfigMap
    found = {annotations[w][CONFIG_CHECKSUM] for w in WORKLOADS.values()}
    assert len(found) == 1, "the workloads that read one ConfigMap carry one checksum"
    return found


@pytest.mark.parametrize(("sets", "changes"), [
    (["config.logLevel=DEBUG"], True),
    (["config.unit=MiB"], True),
    (["config.delivery=cdi", "config.placement=node"], True),
    (["webhook.replicas=3"], False),
    (["image.tag=0.2.0"], False),
    (["networkPolicy.enabled=false"], False),
])
def test_the_config_checksum_changes_with_the_config_and_only_with_it(sets: list[str], changes: bool) -> None:
    assert (_checksums(sets) != _checksums([])) is changes


@pytest.mark.parametrize(("namespace", "namespace_object"), [
    ("gpushare-system", False), ("kube-system", True), ("default", True), ("gpushare", True),
])
def test_the_chart_leaves_the_namespace_to_helm_only_when_the_release_lives_in_it(
    namespace: str, namespace_object: bool,
) -> None:
    done = helm.run(["template", helm.RELEASE, str(CHART), *helm.kube_version_args(), "--skip-tests",
                     "--namespace", namespace])
    assert done.returncode == 0, done.stderr
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert {o["metadata"].get("namespace") for o in objects} <= {"gpushare-system", None}
    assert any(o["kind"] == "Namespace" for o in objects) is namespace_object
    assert any(o["kind"] == "DaemonSet" and o["metadata"]["namespace"] == "gpushare-system" for o in objects)
