"""Ordinary pods inside the API server: the in-process path leaves every pod as the webhook path leaves it.

One table: each container of tests/harness/cases/selection_cases.py, and a few of its own (env shapes, whole GPUs of
another plugin), placed as an app container of a plain pod, an init container of a plain pod, a sidecar of a
GPU-share pod, or an ephemeral container that a pods/ephemeralcontainers update adds to a plain pod or to a GPU-share
pod; created in a tenant's namespace and in a trusted one (kube-system), in env and in cdi delivery. Each request
goes through the chart's webhook path and its in-process path (tests/harness/manifests/admission_paths.py): both
leave the same pod and refuse the same requests with the same message. The table's own expectations (void added,
refused) are checked too, so that the paths cannot agree on a wrong answer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.harness.apiserver.auth import User, service_account
from tests.harness.cases.selection_cases import CASES, VOIDED, target
from tests.harness.manifests import helm
from tests.harness.manifests.admission_paths import (
    IN_PROCESS,
    PATHS,
    SELF,
    WEBHOOK,
    Admitted,
    RenderedAdmission,
    comparable,
    of_kind,
    rendered,
)
from tests.harness.manifests.render import MANIFESTS
from tests.harness.pods import Pod, container, pod
from tests.harness.webhook.server import RunningWebhook, free_port, webhook_server

pytestmark = pytest.mark.timeout(helm.BUILD_TIMEOUT)

Obj = dict[str, Any]
CREATOR = service_account("team-a", "job-controller")
DEBUGGER = User("alice")
TENANT, TRUSTED = "team-a", "kube-system"
DELIVERIES = ("env", "cdi")


@dataclass(frozen=True)
class Case:
    """A container that requests no GPU memory; `refused` names the deliveries in which it is refused (with the
    webhook up), `voided` whether env delivery adds NVIDIA_VISIBLE_DEVICES=void to it, `places` where it may be."""

    name: str
    container: Obj
    refused: frozenset[str]
    voided: bool
    places: tuple[str, ...] = ("app", "init", "sidecar", "ephemeral", "ephemeral of a GPU-share pod")


def _names(ctr: Obj) -> set[str]:
    return {str(e.get("name")) for e in ctr.get("env") or []}


# selection_cases: refused in cdi where the webhook down would refuse it too (no void in either); voided where its env
# names no NVIDIA_VISIBLE_DEVICES.
SELECTION = [Case(c.name, c.container, frozenset(d for d in DELIVERIES if d in c.refused), "NVIDIA_VISIBLE_DEVICES"
                  not in _names(c.container)) for c in CASES]
WHOLE_GPU = {"limits": {"nvidia.com/gpu": "1"}}
SHAPES = [
    Case("no env", target(), frozenset(), True),
    Case("an empty env list", target([]), frozenset(), True),
    Case("env of its own", target([{"name": "APP_MODE", "value": "batch"}]), frozenset(), True),
    Case("its own void", target([VOIDED]), frozenset(), False),
    Case("NVIDIA_VISIBLE_DEVICES all", target([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
         frozenset(DELIVERIES), False),
    Case("a reserved annotation through the downward API", target([{"name": "GPU", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['ALIYUN_COM_GPU_MEM_IDX']"}}}]), frozenset(DELIVERIES), True),
    Case("a mount under nvidia-container-devices", {**target(), "volumeMounts": [
        {"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}]}, frozenset(DELIVERIES), True),
    # Whole GPUs of another device plugin: that plugin sets the env, nothing is added or refused. Ephemeral containers
    # can have no resources, so these are not placed there.
    Case("whole GPU with NVIDIA_VISIBLE_DEVICES", {**target([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
                                                  "resources": WHOLE_GPU}, frozenset(), False,
         ("app", "init", "sidecar")),
    Case("whole GPU", {**target(), "resources": WHOLE_GPU}, frozenset(), False, ("app", "init", "sidecar")),
    Case("nvidia.com/gpu 0", {**target(), "resources": {"limits": {"nvidia.com/gpu": "0"}}}, frozenset(), True,
         ("app", "init", "sidecar")),
]
TABLE = SELECTION + SHAPES
WHERE = [(TENANT, "env"), (TRUSTED, "env"), (TENANT, "cdi")]
ROWS = [(case, place, namespace, delivery) for case in TABLE for place in case.places for namespace, delivery in WHERE]


def _plain(name: str) -> Obj:
    return {"name": name, "image": "nginx:1.27"}


def placed(place: str, ctr: Obj) -> tuple[Pod, Obj | None]:
    """(the pod created, the ephemeral container a later update adds or None). A plain container beside `ctr`, so
    that the patch names positions other than the first."""
    x = copy.deepcopy(ctr)
    if place == "app":
        return pod(_plain("web"), x), None
    if place == "init":
        return pod(_plain("web"), inits=[_plain("setup"), x]), None
    if place == "sidecar":
        return pod(container("train", 2), x), None
    if place == "ephemeral":
        return pod(_plain("web")), x
    return pod(container("train", 2)), x


@pytest.fixture(scope="module")
def hooks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningWebhook]]:
    """The real webhook, one per delivery (it reads GPUSHARE_DELIVERY as the chart's ConfigMap sets it)."""
    with webhook_server(tmp_path_factory.mktemp("env")) as env, \
            webhook_server(tmp_path_factory.mktemp("cdi"), {"GPUSHARE_DELIVERY": "cdi"}) as cdi:
        yield {"env": env, "cdi": cdi}


@pytest.fixture(scope="module")
def clusters(hooks: dict[str, RunningWebhook]) -> Iterator[Callable[..., RenderedAdmission]]:
    """A cluster of a path and a delivery, the webhook up or down (its Service routed to a port nobody serves)."""
    made: dict[tuple[str, str, bool], RenderedAdmission] = {}

    def of(path: str, delivery: str, *, up: bool = True) -> RenderedAdmission:
        key = (path, delivery, up)
        if key not in made:
            hook = hooks[delivery]
            url = hook.url if up else f"https://127.0.0.1:{free_port()}"
            made[key] = RenderedAdmission(rendered(path, (f"config.delivery={delivery}",)), url, hook.ca_pem)
        return made[key]

    yield of
    for cluster in made.values():
        cluster.stop()


def through(cluster: RenderedAdmission, place: str, ctr: Obj, namespace: str) -> Admitted:
    """The pod of `place` created, and where the container is ephemeral, the update that adds it."""
    created, added = placed(place, ctr)
    result = cluster.create(created, namespace, CREATOR)
    if added is None or result.refusal is not None:
        return result
    return cluster.add_ephemeral(result.pod, added, DEBUGGER)


def the_container(p: Pod, place: str) -> Obj:
    kind = {"init": "initContainers", "ephemeral": "ephemeralContainers",
            "ephemeral of a GPU-share pod": "ephemeralContainers"}.get(place, "containers")
    matches: list[Obj] = [c for c in p["spec"][kind] if c["name"] == "x"]
    [ctr] = matches
    return ctr


@pytest.mark.parametrize(("case", "place", "namespace", "delivery"), ROWS,
                         ids=[f"{c.name}-{p}-{n}-{d}" for c, p, n, d in ROWS])
def test_the_in_process_path_leaves_every_pod_as_the_webhook_path(
    case: Case, place: str, namespace: str, delivery: str, clusters: Callable[..., RenderedAdmission],
) -> None:
    webhook = through(clusters(WEBHOOK, delivery), place, case.container, namespace)
    in_process = through(clusters(IN_PROCESS, delivery), place, case.container, namespace)
    assert in_process.refusal == webhook.refusal
    assert comparable(in_process.pod) == comparable(webhook.pod), yaml.safe_dump(in_process.pod)
    # The table's answer: trusted namespaces leave ordinary pods alone; a GPU-share pod's containers are judged there
    # as anywhere.
    gpu_share = place in ("sidecar", "ephemeral of a GPU-share pod")
    judged = namespace == TENANT or gpu_share
    assert (in_process.refusal is not None) is (judged and delivery in case.refused), in_process.refusal
    if in_process.refusal is None:
        # NVIDIA_VISIBLE_DEVICES=void after the container's own env, or nothing added at all.
        own = case.container.get("env") or []
        added = [VOIDED] if judged and delivery == "env" and case.voided else []
        assert the_container(in_process.pod, place).get("env", []) == own + added


PLAIN = pod(_plain("web"), {**_plain("cuda"), "env": [{"name": "CUDA_VERSION", "value": "12.4"}]})
SHARE = pod(container("train", 2), _plain("web"))


@pytest.mark.parametrize("namespace", [TENANT, TRUSTED])
def test_while_the_webhook_is_down_in_process_neutralises_ordinary_pods_and_refuses_gpu_share_pods(
    namespace: str, clusters: Callable[..., RenderedAdmission],
) -> None:
    up = clusters(IN_PROCESS, "env").create(PLAIN, namespace, CREATOR)
    down = clusters(IN_PROCESS, "env", up=False).create(PLAIN, namespace, CREATOR)
    assert down == up and up.refusal is None
    voided = [c["name"] for c in up.pod["spec"]["containers"] if VOIDED in (c.get("env") or [])]
    assert voided == ([] if namespace == TRUSTED else ["web", "cuda"])
    refused = clusters(IN_PROCESS, "env", up=False).create(SHARE, namespace, CREATOR).refusal
    assert refused is not None and refused.startswith('Internal error occurred: failed calling webhook '
                                                      '"mutate.gpushare.io"'), refused


def test_while_the_webhook_is_down_the_webhook_path_creates_ordinary_pods_unneutralised(
    clusters: Callable[..., RenderedAdmission],
) -> None:
    """What the in-process path closes: the fail-open entries skipped, and the CUDA_VERSION container refused by the
    policy alone (an image's own CUDA_VERSION, which admission cannot see, would give it every GPU)."""
    plain = pod(_plain("web"))
    down = clusters(WEBHOOK, "env", up=False).create(plain, TENANT, CREATOR)
    assert down.refusal is None and "env" not in down.pod["spec"]["containers"][0]
    refused = clusters(WEBHOOK, "env", up=False).create(PLAIN, TENANT, CREATOR).refusal
    assert refused is not None and "gpushare-container-env" in refused and "sets CUDA_VERSION" in refused


def test_ordinary_pods_match_no_webhook_entry_in_process() -> None:
    """Every entry left in process matches GPU-share pods only, or the plugin's writes and Bindings: none is sent an
    ordinary pod's CREATE or ephemeral-container update."""
    objs = rendered(IN_PROCESS)
    entries = {h["name"]: h for o in objs if o["kind"].endswith("WebhookConfiguration") for h in o["webhooks"]}
    assert set(entries) == {"mutate.gpushare.io", "validate.gpushare.io", "validate-status.gpushare.io",
                            "validate-plugin.gpushare.io", "validate-binding.gpushare.io"}
    assert all(h["failurePolicy"] == "Fail" for h in entries.values())
    [policy] = of_kind(objs, "MutatingAdmissionPolicy")
    assert [b["spec"]["policyName"] for b in of_kind(objs, "MutatingAdmissionPolicyBinding")] == ["gpushare-neutralise"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    mutate = entries["mutate.gpushare.io"]
    # The policy takes over neutralise.gpushare.io: the same requests, the same condition, reinvoked alike.
    webhook_objs = rendered(WEBHOOK)
    [neutralise] = [h for o in webhook_objs if o["kind"] == "MutatingWebhookConfiguration" for h in o["webhooks"]
                    if h["name"] == "neutralise.gpushare.io"]
    assert policy["spec"]["matchConditions"] == neutralise["matchConditions"]
    assert policy["spec"]["reinvocationPolicy"] == neutralise["reinvocationPolicy"] == mutate["reinvocationPolicy"]
    assert [{k: r[k] for k in ("apiGroups", "apiVersions", "operations", "resources")}
            for r in policy["spec"]["matchConstraints"]["resourceRules"]] == [
        {k: r[k] for k in ("apiGroups", "apiVersions", "operations", "resources")} for r in neutralise["rules"]]
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == neutralise["namespaceSelector"]


def test_the_kustomize_component_removes_the_entries_by_name() -> None:
    doc = yaml.safe_load((MANIFESTS / "in-process" / "kustomization.yaml").read_text())
    removed = [hook["name"] for patch in doc["patches"] for hook in yaml.safe_load(patch["patch"])["webhooks"]
               if hook.get("$patch") == "delete"]
    assert removed == ["neutralise.gpushare.io", "validate-ordinary.gpushare.io"]
    assert doc["resources"] == ["neutralise-policy.yaml"]


@pytest.mark.parametrize("path", PATHS)
def test_gpushare_system_is_left_alone_on_both_paths(path: str, clusters: Callable[..., RenderedAdmission]) -> None:
    result = clusters(path, "env").create(PLAIN, SELF, CREATOR)
    assert result.refusal is None and comparable(result.pod)["spec"] == PLAIN["spec"]
