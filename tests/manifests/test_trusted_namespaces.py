"""Trusted GPU infrastructure namespaces: the chart's trustedNamespaces gives the webhook and the policy one verdict.

One table of pods that request no aliyun.com/gpu-mem, each created in a namespace under a setting of the value as an
operator passes it to helm. The webhook side is the chart's webhook configurations in the test API server's admission
chain (rules, namespaceSelector and matchConditions as kube-apiserver applies them) calling the real webhook. The
policy side is the chart's ValidatingAdmissionPolicies evaluated with cel-python, on the pod as sent (the webhook
down) and as the mutation left it (mutating admission runs first). Both sides give the row's outcome, and so does
the chart where the cluster serves MutatingAdmissionPolicy v1 (the in-process path: the policy gpushare-neutralise
instead of the webhook entries for ordinary pods; tests/harness/manifests/admission_paths.py).
"""

from __future__ import annotations

import copy
import enum
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from contract import IDX
from tests.harness.apiserver import policies
from tests.harness.apiserver.admission import Attributes
from tests.harness.apiserver.auth import service_account
from tests.harness.apiserver.resources import PODS
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.harness.manifests import helm
from tests.harness.manifests.admission_paths import IN_PROCESS, RenderedAdmission
from tests.harness.manifests.admission_paths import rendered as rendered_on
from tests.harness.pods import Pod, annotate, container, pod
from tests.harness.webhook.server import RunningWebhook, webhook_server
from webhook.rules.envrules import NEUTRAL_ENV

# A cold build of helm (once per machine) happens in the first test that needs it.
pytestmark = pytest.mark.timeout(helm.BUILD_TIMEOUT)

Obj = dict[str, Any]
SELF = "gpushare-system"
# Pods of a DaemonSet are created by its controller.
CREATOR = service_account("kube-system", "daemon-set-controller")


@dataclass(frozen=True)
class Setting:
    """The value as an operator passes it to helm, and the namespaces it trusts besides gpushare-system."""

    name: str
    trusted: tuple[str, ...]
    sets: tuple[str, ...] = ()
    set_json: tuple[str, ...] = ()


DEFAULT = Setting("default", ("kube-system",))
WITH_NVIDIA = Setting("with nvidia-device-plugin", ("kube-system", "nvidia-device-plugin"),
                      sets=("trustedNamespaces={kube-system,nvidia-device-plugin}",))
NONE = Setting("none", (), set_json=("trustedNamespaces=[]",))
SETTINGS = (DEFAULT, WITH_NVIDIA, NONE)


@functools.cache
def rendered(setting: Setting) -> list[Obj]:
    return helm.template(sets=setting.sets, set_json=setting.set_json)


def admission_policies(setting: Setting) -> list[Obj]:
    return [o for o in rendered(setting) if o["kind"] == "ValidatingAdmissionPolicy"]


# NVIDIA's device plugin as its Helm chart renders it with its defaults: chart 0.20.0 of NVIDIA/k8s-device-plugin at
# 1b826acc6af3079d8923bac395c3124b8861a9a6, deployments/helm/nvidia-device-plugin/templates/daemonset-device-plugin.yml,
# `helm template nvdp deployments/helm/nvidia-device-plugin --namespace nvidia-device-plugin`: the pod spec, without
# its node affinity.
NVIDIA_CHART_SPEC = yaml.safe_load("""
priorityClassName: system-node-critical
securityContext: {}
serviceAccountName: nvdp-nvidia-device-plugin-service-account
containers:
- image: nvcr.io/nvidia/k8s-device-plugin:v0.20.0
  imagePullPolicy: IfNotPresent
  name: nvidia-device-plugin-ctr
  command: ["nvidia-device-plugin"]
  env:
    - name: MPS_ROOT
      value: /run/nvidia/mps
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: compute,utility
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - {name: kubelet-device-plugins-dir, mountPath: /var/lib/kubelet/device-plugins}
    - {name: mps-shm, mountPath: /dev/shm}
    - {name: mps-root, mountPath: /mps}
    - {name: cdi-root, mountPath: /var/run/cdi}
volumes:
  - {name: kubelet-device-plugins-dir, hostPath: {path: /var/lib/kubelet/device-plugins, type: Directory}}
  - {name: mps-root, hostPath: {path: /run/nvidia/mps, type: DirectoryOrCreate}}
  - {name: mps-shm, hostPath: {path: /run/nvidia/mps/shm}}
  - {name: cdi-root, hostPath: {path: /var/run/cdi, type: DirectoryOrCreate}}
tolerations:
  - {key: CriticalAddonsOnly, operator: Exists}
  - {effect: NoSchedule, key: nvidia.com/gpu, operator: Exists}
""")


def static_manifest_spec(chart: Obj) -> Obj:
    """The same project's static manifest (deployments/static/nvidia-device-plugin.yml, in kube-system): the chart's
    container with no env of its own (the image sets NVIDIA_VISIBLE_DEVICES=all, which admission cannot see), only
    the kubelet's device-plugin directory mounted."""
    [ctr] = chart["containers"]
    plugin_dir = ctr["volumeMounts"][0]["name"]
    return {"tolerations": chart["tolerations"][1:], "priorityClassName": chart["priorityClassName"],
            "containers": [{"image": ctr["image"], "name": ctr["name"], "env": [],
                            "securityContext": ctr["securityContext"], "volumeMounts": ctr["volumeMounts"][:1]}],
            "volumes": [v for v in chart["volumes"] if v["name"] == plugin_dir]}


def daemon_pod(name: str, spec: Obj) -> Pod:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": copy.deepcopy(spec)}


def env_pod(name: str, value: str, limits: dict[str, str] | None = None) -> Pod:
    """One container that sets the variable `name`, with the given resource limits."""
    ctr: Obj = {"name": "agent", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "env": [{"name": name, "value": value}]}
    if limits is not None:
        ctr["resources"] = {"limits": limits}
    return daemon_pod("agent-0", {"containers": [ctr]})


NVIDIA_CHART = daemon_pod("nvdp-nvidia-device-plugin-x7k2p", NVIDIA_CHART_SPEC)
NVIDIA_STATIC = daemon_pod("nvidia-device-plugin-daemonset-x7k2p", static_manifest_spec(NVIDIA_CHART_SPEC))
CUDA_VISIBLE = env_pod("CUDA_VISIBLE_DEVICES", "0")
PLAIN = daemon_pod("web-0", {"containers": [{"name": "web", "image": "nginx:1.27"}]})
WHOLE_GPU = env_pod("NVIDIA_VISIBLE_DEVICES", "all", {"nvidia.com/gpu": "1"})
WHOLE_GPU_ZERO = env_pod("NVIDIA_VISIBLE_DEVICES", "all", {"nvidia.com/gpu": "0"})


class Outcome(enum.Enum):
    REFUSED = "refused"
    # The webhook added NVIDIA_VISIBLE_DEVICES=void to its containers; the policy judged them as containers that
    # must see no GPU and found nothing to refuse.
    NEUTRALISED = "neutralised"
    AS_SENT = "admitted as sent"


@dataclass(frozen=True)
class Row:
    case: str
    namespace: str
    setting: Setting
    pod: Pod
    outcome: Outcome


ROWS = [
    Row("NVIDIA's chart in its trusted namespace", "nvidia-device-plugin", WITH_NVIDIA, NVIDIA_CHART, Outcome.AS_SENT),
    Row("NVIDIA's chart in its namespace, not listed", "nvidia-device-plugin", DEFAULT, NVIDIA_CHART,
        Outcome.REFUSED),
    Row("NVIDIA's chart in a tenant namespace", "team-a", WITH_NVIDIA, NVIDIA_CHART, Outcome.REFUSED),
    Row("NVIDIA's chart in gpushare-system, nothing listed", SELF, NONE, NVIDIA_CHART, Outcome.AS_SENT),
    Row("NVIDIA's static manifest in kube-system", "kube-system", DEFAULT, NVIDIA_STATIC, Outcome.AS_SENT),
    Row("NVIDIA's static manifest in kube-system, nothing listed", "kube-system", NONE, NVIDIA_STATIC,
        Outcome.NEUTRALISED),
    Row("CUDA_VISIBLE_DEVICES in kube-system", "kube-system", DEFAULT, CUDA_VISIBLE, Outcome.AS_SENT),
    Row("CUDA_VISIBLE_DEVICES in kube-system, listed with another", "kube-system", WITH_NVIDIA, CUDA_VISIBLE,
        Outcome.AS_SENT),
    Row("CUDA_VISIBLE_DEVICES in kube-system, nothing listed", "kube-system", NONE, CUDA_VISIBLE, Outcome.REFUSED),
    Row("CUDA_VISIBLE_DEVICES in a tenant namespace", "team-a", WITH_NVIDIA, CUDA_VISIBLE, Outcome.REFUSED),
    Row("a plain pod in a tenant namespace", "team-a", DEFAULT, PLAIN, Outcome.NEUTRALISED),
    Row("a plain pod in a trusted namespace", "nvidia-device-plugin", WITH_NVIDIA, PLAIN, Outcome.AS_SENT),
    # Whole GPUs of another device plugin: that plugin sets the container's env, so it is not held to see none.
    Row("nvidia.com/gpu 1 with NVIDIA_VISIBLE_DEVICES in a tenant namespace", "team-a", DEFAULT, WHOLE_GPU,
        Outcome.AS_SENT),
    Row("nvidia.com/gpu 0 with NVIDIA_VISIBLE_DEVICES in a tenant namespace", "team-a", DEFAULT, WHOLE_GPU_ZERO,
        Outcome.REFUSED),
]


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("webhook")) as running:
        yield running


@pytest.fixture(scope="module")
def chain(hook: RunningWebhook) -> Iterator[Callable[[Setting], ApiServer]]:
    """The test API server with the chart's webhook configurations of a setting, routed to the running webhook."""
    servers: dict[Setting, ApiServer] = {}

    def of(setting: Setting) -> ApiServer:
        if setting not in servers:
            api = ApiServer()
            api.add_service(SELF, "gpushare-webhook", 443, hook.url)
            api.load_webhook_configurations(rendered(setting), hook.ca_pem)
            servers[setting] = api
        return servers[setting]

    yield of
    for api in servers.values():
        api.stop()


@pytest.fixture(scope="module")
def in_process(hook: RunningWebhook) -> Iterator[Callable[[Setting], RenderedAdmission]]:
    """The chart of a setting on a cluster that serves MutatingAdmissionPolicy v1, its webhook entries routed to the
    running webhook."""
    clusters: dict[Setting, RenderedAdmission] = {}

    def of(setting: Setting) -> RenderedAdmission:
        if setting not in clusters:
            clusters[setting] = RenderedAdmission(rendered_on(IN_PROCESS, setting.sets, setting.set_json), hook.url,
                                        hook.ca_pem)
        return clusters[setting]

    yield of
    for cluster in clusters.values():
        cluster.stop()


def in_namespace(p: Pod, namespace: str) -> Pod:
    out = copy.deepcopy(p)
    out["metadata"]["namespace"] = namespace
    return out


def through_the_webhook(api: ApiServer, namespace: str, sent: Pod) -> tuple[Pod, str | None]:
    """The pod as the mutating entries leave it, and the entries' denial (None: admitted). A GPU-share pod is judged
    by the mutating entry that stamps it (webhook/rules/admit.py); then it is left as sent."""
    api.add_namespace(namespace)
    attrs = Attributes(PODS, "CREATE", namespace, sent["metadata"]["name"], copy.deepcopy(sent), None, CREATOR)
    try:
        mutated = api.chain.admit(attrs)
        assert mutated is not None
        api.chain.validate(attrs)
    except ApiError as exc:
        return copy.deepcopy(sent), exc.message
    return mutated, None


def voided(sent: Pod) -> Pod:
    """`sent` with NVIDIA_VISIBLE_DEVICES=void added to every container's env (what env delivery adds)."""
    out = copy.deepcopy(sent)
    for ctr in out["spec"]["containers"]:
        ctr["env"] = [*(ctr.get("env") or []), NEUTRAL_ENV]
    return out


def webhook_outcome(sent: Pod, mutated: Pod, denial: str | None) -> Outcome:
    if denial is not None:
        return Outcome.REFUSED
    if mutated == sent:
        return Outcome.AS_SENT
    assert mutated == voided(sent), f"the webhook changed more than the env:\n{yaml.safe_dump(mutated)}"
    return Outcome.NEUTRALISED


def policy_verdicts(setting: Setting, namespace: str, candidate: Pod) -> dict[str, list[str] | None]:
    """Every policy of the chart on a pod CREATE: None where it does not apply, else its messages."""
    return {p["metadata"]["name"]: policies.admit(p, "CREATE", candidate, user=CREATOR.username, namespace=namespace)
            for p in admission_policies(setting)}


def policy_outcome(setting: Setting, namespace: str, candidate: Pod) -> Outcome:
    if any(policy_verdicts(setting, namespace, candidate).values()):
        return Outcome.REFUSED
    [env_policy] = [p for p in admission_policies(setting) if p["metadata"]["name"] == "gpushare-container-env"]
    judged = policies.evaluate(env_policy, "CREATE", candidate, user=CREATOR.username, namespace=namespace)
    return Outcome.NEUTRALISED if judged is not None and judged[1]["variables"]["neutral"] else Outcome.AS_SENT


@pytest.mark.parametrize("row", ROWS, ids=[r.case for r in ROWS])
def test_the_webhook_and_the_policy_give_one_verdict(row: Row, chain: Callable[[Setting], ApiServer]) -> None:
    sent = in_namespace(row.pod, row.namespace)
    mutated, denial = through_the_webhook(chain(row.setting), row.namespace, sent)
    assert webhook_outcome(sent, mutated, denial) is row.outcome, denial
    assert policy_outcome(row.setting, row.namespace, sent) is row.outcome, "the webhook down"
    assert policy_outcome(row.setting, row.namespace, mutated) is row.outcome, "the webhook up"
    if denial is not None:
        assert denial.startswith('admission webhook "validate-ordinary.gpushare.io" denied the request: gpushare '
                                 f"denied pod {row.namespace}/{sent['metadata']['name']}. "), denial


@pytest.mark.parametrize("row", ROWS, ids=[r.case for r in ROWS])
def test_in_process_the_policies_give_the_rows_outcome(
    row: Row, in_process: Callable[[Setting], RenderedAdmission]
) -> None:
    sent = in_namespace(row.pod, row.namespace)
    result = in_process(row.setting).create(row.pod, row.namespace, CREATOR)
    assert webhook_outcome(sent, result.pod, result.refusal) is row.outcome, result.refusal
    if result.refusal is not None:
        assert result.refusal.startswith("ValidatingAdmissionPolicy 'gpushare-container-env' with binding "
                                         "'gpushare-container-env' denied request: gpushare denied pod "
                                         f"{row.namespace}/{sent['metadata']['name']}. "), result.refusal


SHARE = pod(container("train", 2))
SIDECAR_ALL = pod(container("train", 2), container("agent", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))


@pytest.mark.parametrize("namespace", ["nvidia-device-plugin", "kube-system"])
def test_a_gpu_share_pod_in_a_trusted_namespace_is_stamped_and_checked(
    namespace: str, chain: Callable[[Setting], ApiServer]
) -> None:
    api = chain(WITH_NVIDIA)
    sent = in_namespace(SHARE, namespace)
    mutated, denial = through_the_webhook(api, namespace, sent)
    assert denial is None, denial
    assert {"gpushare.io/intent", "gpushare.io/intent-signature"} <= set(mutated["metadata"]["annotations"])
    [env] = [e for e in mutated["spec"]["containers"][0]["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{IDX}']"
    # The reserved-annotations policy judges the stamped pod in this namespace too.
    assert policy_verdicts(WITH_NVIDIA, namespace, mutated)["gpushare-reserved-annotations"] == []

    forged = in_namespace(annotate(SHARE, {IDX: "0"}), namespace)
    _, denial = through_the_webhook(api, namespace, forged)
    assert denial is not None and denial.startswith('admission webhook "mutate.gpushare.io" denied'), denial
    assert IDX in denial, denial
    refused = policy_verdicts(WITH_NVIDIA, namespace, forged)["gpushare-reserved-annotations"]
    assert refused and "The ALIYUN_COM_GPU_MEM_* and gpushare.io/allocation annotations are" in refused[0], refused

    # A sidecar of a GPU-share pod is checked by the entries that fail closed. The policy gpushare-container-env
    # leaves the namespace out; while the webhook is down such a pod is not created at all.
    sidecar = in_namespace(SIDECAR_ALL, namespace)
    _, denial = through_the_webhook(api, namespace, sidecar)
    assert denial is not None and denial.startswith('admission webhook "mutate.gpushare.io" denied'), denial
    assert "Container 'agent' sets NVIDIA_VISIBLE_DEVICES" in denial, denial
    assert policy_verdicts(WITH_NVIDIA, namespace, sidecar)["gpushare-container-env"] is None


def namespace_lists(objs: list[Obj]) -> dict[str, list[str]]:
    """The kubernetes.io/metadata.name NotIn list of every webhook entry and policy that has one, by name."""
    selected = [*((h["name"], h) for o in objs if o["kind"].endswith("WebhookConfiguration") for h in o["webhooks"]),
                *((o["metadata"]["name"], o["spec"]["matchConstraints"]) for o in objs
                  if o["kind"] in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"))]
    out: dict[str, list[str]] = {}
    for name, holder in selected:
        for expression in (holder.get("namespaceSelector") or {}).get("matchExpressions", []):
            assert (expression["key"], expression["operator"]) == ("kubernetes.io/metadata.name", "NotIn"), name
            out[name] = expression["values"]
    return out


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_the_value_sets_the_rules_for_ordinary_pods_only(setting: Setting) -> None:
    ordinary = [SELF, *setting.trusted]
    assert namespace_lists(rendered(setting)) == {
        "neutralise.gpushare.io": ordinary, "validate-ordinary.gpushare.io": ordinary,
        "gpushare-container-env": ordinary,
        # GPU-share pods and the reserved annotations: every namespace but gpushare-system, whatever the value.
        "mutate.gpushare.io": [SELF], "validate.gpushare.io": [SELF], "validate-status.gpushare.io": [SELF],
        "gpushare-reserved-annotations": [SELF], "gpushare-gpu-share-pods": [SELF],
    }


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_the_value_sets_the_rules_for_ordinary_pods_in_process_too(setting: Setting) -> None:
    ordinary = [SELF, *setting.trusted]
    assert namespace_lists(rendered_on(IN_PROCESS, setting.sets, setting.set_json)) == {
        "gpushare-neutralise": ordinary, "gpushare-container-env": ordinary,
        "mutate.gpushare.io": [SELF], "validate.gpushare.io": [SELF], "validate-status.gpushare.io": [SELF],
        "gpushare-reserved-annotations": [SELF], "gpushare-gpu-share-pods": [SELF],
    }
