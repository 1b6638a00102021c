"""The ValidatingAdmissionPolicies of policy.yaml, evaluated with cel-python the way kube-apiserver runs them."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from contract import IDX, Contract
from deviceplugin.apiserver import event_body
from tests.harness.apiserver import policies
from tests.harness.cases.plugin_cases import BINDINGS, PLUGIN_WRITES, binding
from tests.harness.cases.selection_cases import CASES, FORMS, PLACES, Case, request
from tests.harness.manifests.render import MANIFESTS
from tests.harness.pods import EXTENDER, PLUGIN, USER, Pod, annotate, container, pod, stamped
from tests.webhook.rules.test_envrules import ATTACKS, HARMLESS, ephemeral, webhook_refusal
from webhook.rules.envrules import DEVICE_ENV, ENV_SELECTING

pytestmark = pytest.mark.timeout(120)

Obj = dict[str, Any]


def documents() -> list[Obj]:
    return [d for d in yaml.safe_load_all((MANIFESTS / "base" / "policy.yaml").read_text()) if d]


def policy(name: str) -> Obj:
    return next(d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)


def evaluate(name: str, *args: Any, **kwargs: Any) -> tuple[Obj, Obj] | None:
    """The base's policy `name` as tests/harness/apiserver/policies.py evaluates it (in namespace ml)."""
    return policies.evaluate(policy(name), *args, **kwargs)


def admit(name: str, *args: Any, **kwargs: Any) -> list[str] | None:
    """None when the policy does not apply; else the messages of the validations that fail ([] = allowed)."""
    return policies.admit(policy(name), *args, **kwargs)


@pytest.mark.parametrize(("case", "spec", "fragments"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_container_env_policy_refuses_what_the_webhook_refuses(case: str, spec: Pod, fragments: list[str]) -> None:
    # As created with the webhook up (mutated) and down (not mutated): the policy needs no webhook.
    for candidate in (stamped(spec), spec):
        messages = admit("gpushare-container-env", "CREATE", candidate)
        assert messages, case
        assert messages[0].startswith("gpushare denied pod ml/job-0. Container "), case
        name = fragments[0].split("'")[1]
        assert f"Container {name} " in " ".join(messages), case


@pytest.mark.parametrize(("case", "spec"), HARMLESS, ids=[h[0] for h in HARMLESS])
def test_container_env_policy_allows_harmless_pods(case: str, spec: Pod) -> None:
    assert admit("gpushare-container-env", "CREATE", spec) == [], case
    assert admit("gpushare-container-env", "CREATE", stamped(spec)) == [], case


def test_container_env_policy_checks_only_added_ephemeral_containers() -> None:
    bad = {"name": "dbg", "image": "cuda", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    old = pod(container("a"))
    messages = admit("gpushare-container-env", "UPDATE", ephemeral(old, bad), old, subresource="ephemeralcontainers")
    assert messages and "Container dbg sets" in messages[0]
    legacy = ephemeral(old, bad)  # added while no policy was installed: later additions are not blamed for it
    later = ephemeral(legacy, {"name": "dbg2", "image": "busybox"})
    assert admit("gpushare-container-env", "UPDATE", later, legacy, subresource="ephemeralcontainers") == []
    assert admit("gpushare-container-env", "UPDATE", later, legacy) is None  # plain pods UPDATE: not matched


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_container_env_policy_gives_the_webhooks_verdict_on_gpu_selection(case: Case, place: str, form: str) -> None:
    # Down: created while the webhook is down, which the policy alone judges; env and cdi: as that delivery's
    # mutation leaves the pod (mutating admission runs before this policy), which the webhook judges too.
    operation, old, new = request(place, form, case.container)
    messages = admit("gpushare-container-env", operation, new, old,
                     subresource="ephemeralcontainers" if operation == "UPDATE" else "")
    assert messages is not None
    assert bool(messages) is (form in case.refused) is (webhook_refusal(place, form, case) is not None), messages
    if messages:
        assert messages[0].startswith("gpushare denied pod ml/job-0. Container x "), messages
        assert re.search(f"Container x [^;:]*{re.escape(case.fragment)}", " ".join(messages)), messages


def test_container_env_policy_names_the_variables_the_webhook_names() -> None:
    evaluated = evaluate("gpushare-container-env", "CREATE", pod(container("a")))
    assert evaluated is not None
    variables = evaluated[1]["variables"]
    assert list(variables["selectingEnv"]) == list(ENV_SELECTING)
    assert list(variables["deviceEnv"]) == list(DEVICE_ENV)


def test_container_env_policy_leaves_out_the_namespaces_the_fail_open_entries_leave_out() -> None:
    # The trusted namespaces (kube-system by default) select GPUs by env on purpose; gpushare-system runs the plugin.
    [selector] = policy("gpushare-container-env")["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert selector == {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                        "values": ["gpushare-system", "kube-system"]}


GPU = stamped(pod(container("a", 2)))
PLACED = annotate(GPU, {IDX: "0", "ALIYUN_COM_GPU_MEM_DEV": "16", "ALIYUN_COM_GPU_MEM_POD": "2"})
INTENT = Contract().intent_key


def bound(p: Pod, node: str = "n1") -> Pod:
    out = copy.deepcopy(p)
    out["spec"]["nodeName"] = node
    return out


BOUND = bound(PLACED)


@pytest.mark.parametrize(
    ("case", "operation", "new", "old", "user", "subresource", "denied"),
    [
        ("user-supplied placement at CREATE", "CREATE", annotate(pod(container("a")), {IDX: "1"}), None, USER, "",
         "are reserved"),
        ("stamped pod at CREATE", "CREATE", GPU, None, USER, "", None),
        ("status update moves the GPU", "UPDATE", annotate(PLACED, {IDX: "1"}), PLACED, "system:node:n1", "status",
         "system:node:n1 changed ALIYUN_COM_GPU_MEM_IDX, a reserved annotation"),
        ("status update gives a plain pod a placement", "UPDATE", annotate(pod(container("a")), {IDX: "1"}),
         pod(container("a")), "operator", "status", "operator changed ALIYUN_COM_GPU_MEM_IDX, a reserved"),
        ("status update removes the allocation state", "UPDATE", annotate(PLACED, {IDX: None}), PLACED, USER,
         "status", "changed ALIYUN_COM_GPU_MEM_IDX, a reserved annotation"),
        ("extender writes the placement", "UPDATE", PLACED, GPU, EXTENDER, "", None),
        ("plugin marks the pod assigned", "UPDATE", annotate(BOUND, {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}),
         BOUND, PLUGIN, "", None),
        ("extender edits the intent", "UPDATE", annotate(GPU, {INTENT: "{}"}), GPU, EXTENDER, "",
         "stamped once at creation"),
        ("status update that leaves annotations alone", "UPDATE", PLACED, PLACED, "system:node:n1", "status", None),
        ("label change by anyone", "UPDATE", annotate(PLACED, {"team": "a"}), PLACED, USER, "", None),
    ],
)
def test_reserved_annotations_policy(case: str, operation: str, new: Pod, old: Pod | None, user: str,
                                     subresource: str, denied: str | None) -> None:
    messages = admit("gpushare-reserved-annotations", operation, copy.deepcopy(new), old, user=user,
                     subresource=subresource, node="n1" if user == PLUGIN else None)
    if denied is None:
        assert not messages, f"{case}: {messages}"
    else:
        assert messages, case
        assert messages[0].startswith("gpushare denied pod ml/job-0. "), case
        assert denied in " ".join(messages), case


POLICIES = {"gpushare-container-env", "gpushare-gpu-share-pods", "gpushare-reserved-annotations",
            "gpushare-device-plugin-pods", "gpushare-device-plugin-node", "gpushare-device-plugin-events",
            "gpushare-binding-annotations"}


def test_every_policy_has_a_binding_that_denies() -> None:
    docs = documents()
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"]: d["spec"]["validationActions"] for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == set(bindings) == POLICIES
    assert all(actions == ["Deny"] for actions in bindings.values())
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy":
            assert doc["spec"]["failurePolicy"] == "Fail", doc["metadata"]["name"]


def test_trusted_identities_equal_the_configured_ones() -> None:
    config = yaml.safe_load((MANIFESTS / "base" / "config.yaml").read_text())["data"]
    extender, plugin = config["GPUSHARE_EXTENDER_IDENTITIES"], config["GPUSHARE_PLUGIN_IDENTITIES"]
    expression = next(v["expression"] for v in policy("gpushare-reserved-annotations")["spec"]["variables"]
                      if v["name"] == "trusted")
    assert f"'{extender}'" in expression and f"'{plugin}'" in expression
    for name in ("gpushare-device-plugin-pods", "gpushare-device-plugin-node", "gpushare-device-plugin-events"):
        [condition] = policy(name)["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username in ['{plugin}']", name
    extender_variable = next(v["expression"] for v in policy("gpushare-binding-annotations")["spec"]["variables"]
                             if v["name"] == "extender")
    assert extender_variable == f"request.userInfo.username in ['{extender}']"


# ---------------------------------------------------------------------------------------------------------
# The device plugin's identity: the same table as the webhook's (tests/harness/cases/plugin_cases.py).


@pytest.mark.parametrize(("case", "old", "new", "node", "subresource", "_webhook", "denied"), PLUGIN_WRITES,
                         ids=[c[0] for c in PLUGIN_WRITES])
def test_the_plugin_identity_changes_only_its_own_annotations_on_its_own_node(
    case: str, old: Pod, new: Pod, node: str | None, subresource: str, _webhook: str | None, denied: str | None
) -> None:
    messages = admit("gpushare-device-plugin-pods", "UPDATE", copy.deepcopy(new), old, user=PLUGIN, node=node,
                     subresource=subresource)
    assert messages is not None, case
    if denied is None:
        assert messages == [], f"{case}: {messages}"
    else:
        assert messages, case
        assert all(m.startswith("gpushare denied pod ml/") for m in messages), messages
        assert denied in " ".join(messages), f"{case}: {messages}"


def test_the_plugin_policy_message_names_the_change_and_the_rule() -> None:
    case = next(c for c in PLUGIN_WRITES if c[0] == "image of another node's pod")
    assert admit("gpushare-device-plugin-pods", "UPDATE", case[2], case[1], user=PLUGIN, node=case[3]) == [
        "gpushare denied pod ml/coredns-0. The gpushare device plugin of node gpu-node-1 changed spec of a pod bound "
        "to node gpu-node-2; a plugin may write only to pods bound to its own node, with a ServiceAccount token "
        "bound to its pod (Kubernetes 1.30 or newer).",
        "gpushare denied pod ml/coredns-0. The gpushare device plugin changed spec, but the plugin identity may "
        "change only its own annotations (ALIYUN_COM_GPU_MEM_ASSIGNED, gpushare.io/allocation, and the placement "
        "keys where the pod has none); leave spec as it was.",
    ]


@pytest.mark.parametrize("user", [USER, EXTENDER, "system:node:gpu-node-1"])
def test_other_identities_do_not_reach_the_plugin_policies(user: str) -> None:
    case = next(c for c in PLUGIN_WRITES if c[0] == "image of another node's pod")
    assert admit("gpushare-device-plugin-pods", "UPDATE", case[2], case[1], user=user, node="gpu-node-1") is None
    assert admit("gpushare-device-plugin-node", "UPDATE", NODE_OBJ, NODE_OBJ, user=user, resource="nodes",
                 subresource="status", node="gpu-node-1") is None
    assert admit("gpushare-device-plugin-events", "CREATE", EVENT, user=user, resource="events") is None


def gpu_node(name: str = "gpu-node-1", *, count: str = "2", labels: dict[str, str] | None = None) -> Obj:
    resources = {"cpu": "8", "aliyun.com/gpu-mem": "32", "aliyun.com/gpu-count": count}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels or {"kubernetes.io/hostname": name,
                                                         "gpushare.io/gpu-memory": "device-plugin"}},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": dict(resources), "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.34.4", "machineID": "m"},
        },
    }


def status_edit(node: Obj, path: str, value: Any) -> Obj:
    out = copy.deepcopy(node)
    *parents, last = path.split(".")
    here = out
    for part in parents:
        here = here[part]
    here[last] = value
    return out


NODE_OBJ = gpu_node(count="0")
COUNTED = status_edit(NODE_OBJ, "status.capacity", {**NODE_OBJ["status"]["capacity"], "aliyun.com/gpu-count": "2"})
ELSEWHERE = gpu_node("gpu-node-2", count="0")


@pytest.mark.parametrize(
    ("case", "old", "new", "node", "subresource", "denied"),
    [
        ("its own node's GPU count", NODE_OBJ, COUNTED, "gpu-node-1", "status", None),
        ("its own node's allocatable GPU count", NODE_OBJ, status_edit(NODE_OBJ, "status.allocatable", {
            **NODE_OBJ["status"]["allocatable"], "aliyun.com/gpu-count": "2"}), "gpu-node-1", "status", None),
        ("another node's GPU count", ELSEWHERE, status_edit(ELSEWHERE, "status.capacity", {
            **ELSEWHERE["status"]["capacity"], "aliyun.com/gpu-count": "2"}), "gpu-node-1", "status",
         "The gpushare device plugin of node gpu-node-1 updated the status of node gpu-node-2; a plugin may update "
         "only the status of its own node"),
        ("a token that names no node", NODE_OBJ, COUNTED, None, "status", "with a token that names no node"),
        ("a label through the status", NODE_OBJ, status_edit(NODE_OBJ, "metadata.labels", {
            "node-role.kubernetes.io/control-plane": ""}), "gpu-node-1", "status", "changed metadata.labels"),
        ("an annotation through the status", NODE_OBJ, status_edit(NODE_OBJ, "metadata.annotations", {"a": "b"}),
         "gpu-node-1", "status", "changed metadata.annotations"),
        ("its GPU memory", NODE_OBJ, status_edit(NODE_OBJ, "status.capacity", {
            **NODE_OBJ["status"]["capacity"], "aliyun.com/gpu-mem": "64"}), "gpu-node-1", "status",
         "changed resource aliyun.com/gpu-mem"),
        ("a capacity removed", NODE_OBJ, status_edit(NODE_OBJ, "status.capacity", {"aliyun.com/gpu-count": "0"}),
         "gpu-node-1", "status", "changed resource cpu"),
        ("its addresses", NODE_OBJ, status_edit(NODE_OBJ, "status.addresses", [
            {"type": "InternalIP", "address": "10.9.9.9"}]), "gpu-node-1", "status", "changed status.addresses"),
        ("its conditions", NODE_OBJ, status_edit(NODE_OBJ, "status.conditions", []), "gpu-node-1", "status",
         "changed status.conditions"),
        ("the kubelet port", NODE_OBJ, status_edit(NODE_OBJ, "status.daemonEndpoints", {
            "kubeletEndpoint": {"Port": 1}}), "gpu-node-1", "status", "changed status.daemonEndpoints"),
        ("the node itself, not its status", NODE_OBJ, status_edit(NODE_OBJ, "spec.unschedulable", True),
         "gpu-node-1", "", "updated node gpu-node-1"),
    ],
)
def test_the_plugin_identity_changes_only_its_own_nodes_gpu_count(
    case: str, old: Obj, new: Obj, node: str | None, subresource: str, denied: str | None
) -> None:
    messages = admit("gpushare-device-plugin-node", "UPDATE", new, old, user=PLUGIN, node=node, resource="nodes",
                     subresource=subresource)
    assert messages is not None, case
    if denied is None:
        assert messages == [], f"{case}: {messages}"
    else:
        assert messages and all(m.startswith(f"gpushare denied node {new['metadata']['name']}. ") for m in messages)
        assert denied in " ".join(messages), f"{case}: {messages}"


EVENT = event_body(bound(GPU, "gpu-node-1"), "Normal", "GpuShareAllocated", "allocated", "gpu-node-1")


@pytest.mark.parametrize(
    ("case", "operation", "event", "node", "denied"),
    [
        ("its Event about a pod", "CREATE", EVENT, "gpu-node-1", None),
        ("an Event from another node", "CREATE", EVENT, "gpu-node-2", "The gpushare device plugin of node gpu-node-2"),
        ("an Event as the kubelet", "CREATE", {**EVENT, "source": {"component": "kubelet", "host": "gpu-node-1"},
                                               "reportingComponent": "kubelet"}, "gpu-node-1", "may only create"),
        ("an Event about a Secret", "CREATE", {**EVENT, "involvedObject": {"kind": "Secret", "name": "s"}},
         "gpu-node-1", "may only create Events about pods"),
        ("a token that names no node", "CREATE", EVENT, None, "with a token that names no node"),
        ("an Event rewritten", "UPDATE", EVENT, "gpu-node-1", "may only create Events"),
    ],
)
def test_the_plugin_identity_posts_only_its_own_events(case: str, operation: str, event: Obj, node: str | None,
                                                        denied: str | None) -> None:
    messages = admit("gpushare-device-plugin-events", operation, event, event if operation == "UPDATE" else None,
                     user=PLUGIN, node=node, resource="events")
    assert messages is not None, case
    if denied is None:
        assert messages == [], f"{case}: {messages}"
    else:
        assert messages and messages[0].startswith("gpushare denied an Event in namespace ml. "), messages
        assert denied in messages[0], f"{case}: {messages}"


@pytest.mark.parametrize("resource", ["pods/binding", "bindings"])
@pytest.mark.parametrize(("case", "binding", "user", "denied"), BINDINGS, ids=[b[0] for b in BINDINGS])
def test_a_binding_carries_reserved_annotations_only_from_the_extender(
    case: str, binding: Obj, user: str, denied: str | None, resource: str
) -> None:
    plural, _, sub = resource.partition("/")
    messages = admit("gpushare-binding-annotations", "CREATE", binding, user=user, resource=plural, subresource=sub)
    if denied is None:
        assert not messages, f"{case}: {messages}"  # None: the Binding carries no reserved key, nothing is evaluated
    else:
        assert messages and messages[0].startswith("gpushare denied pod ml/job-0. The Binding "), messages
        assert denied in messages[0], f"{case}: {messages}"


def test_normal_scheduling_is_never_evaluated() -> None:
    for user in (EXTENDER, "system:kube-scheduler"):
        assert admit("gpushare-binding-annotations", "CREATE", binding(), user=user, resource="pods",
                     subresource="binding") is None


# A claim that asks for a share more than once is malformed, not forbidden: 422 Invalid is its answer.
INVALID = {"gpushare-dra-one-share-per-request"}


def test_every_refusal_of_every_policy_is_a_403() -> None:
    """A validation without a reason is answered 422 Invalid (k8s.io/apiserver pkg/admission/plugin/policy/validating
    dispatcher: the default reason); a refusal of who may do what, or of what a pod may select, is Forbidden."""
    found = []
    for path in sorted(MANIFESTS.glob("*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ValidatingAdmissionPolicy":
                found += [(doc["metadata"]["name"], v.get("reason")) for v in doc["spec"]["validations"]]
    assert len({name for name, _ in found}) >= 10
    assert [f for f in found if f[1] != "Forbidden" and f[0] not in INVALID] == []
