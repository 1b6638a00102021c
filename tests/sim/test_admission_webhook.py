"""The admission chain through the real gunicorn webhook and the project's own webhook configurations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.apiserver.auth import pod_token, service_account, user
from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.configs import project_webhook_objects
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.harness.pods import unit_pod
from tests.harness.webhook.server import RunningWebhook, webhook_server

pytestmark = pytest.mark.timeout(120)

Obj = dict[str, Any]
EXTENDER = service_account("kube-system", "gpushare-schd-extender")


def gpu_pod(name: str = "gpu", units: int = 8) -> Obj:
    return unit_pod(name, {"main": units}, namespace=None)


def plain_pod(name: str = "plain") -> Obj:
    return unit_pod(name, {"main": 0}, namespace=None, image="busybox")


def placement(index: int = 1, units: int = 8) -> dict[str, str]:
    return {"ALIYUN_COM_GPU_MEM_IDX": str(index), "ALIYUN_COM_GPU_MEM_DEV": "64", "ALIYUN_COM_GPU_MEM_POD": str(units),
            "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000", "ALIYUN_COM_GPU_MEM_ASSIGNED": "false"}


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("webhook")) as running:
        yield running


@pytest.fixture
def api(hook: RunningWebhook) -> Iterator[ApiServer]:
    with ApiServer() as server:
        server.add_service("gpushare-system", "gpushare-webhook", 443, hook.url)
        loaded = server.load_webhook_configurations(project_webhook_objects(), hook.ca_pem)
        assert loaded == ["MutatingWebhookConfiguration/gpushare-webhook",
                          "ValidatingWebhookConfiguration/gpushare-webhook"]
        yield server


@pytest.fixture
def alice(api: ApiServer) -> SimClient:
    return api.client(api.add_user(user("alice", "developers")))


def test_gpu_pod_is_stamped_with_a_signed_intent(alice: SimClient) -> None:
    created = alice.create_pod("default", {**gpu_pod(), "metadata": {"generateName": "train-"}})
    annotations = created["metadata"]["annotations"]
    intent = json.loads(annotations["gpushare.io/intent"])
    assert intent["total"] == 8 and intent["containers"] == {"main": 8}
    assert annotations["gpushare.io/intent-signature"]
    env = {e["name"]: e for e in created["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['ALIYUN_COM_GPU_MEM_IDX']"


def test_user_supplied_reserved_annotation_is_refused_at_create(alice: SimClient) -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {"ALIYUN_COM_GPU_MEM_IDX": "0"}
    with pytest.raises(ApiError) as caught:
        alice.create_pod("default", pod)
    assert caught.value.code in (400, 403)
    assert caught.value.message.startswith('admission webhook "')
    assert "ALIYUN_COM_GPU_MEM_IDX" in caught.value.message


def test_ordinary_user_cannot_set_the_gpu_index(api: ApiServer, alice: SimClient) -> None:
    alice.create_pod("default", gpu_pod())
    with pytest.raises(ApiError) as caught:
        alice.patch_pod("default", "gpu", {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1"}}})
    assert caught.value.message.startswith('admission webhook "validate.gpushare.io" denied the request: ')
    assert "alice" in caught.value.message and "ALIYUN_COM_GPU_MEM_IDX" in caught.value.message
    assert "ALIYUN_COM_GPU_MEM_IDX" not in (api.client().get("pods", "gpu", "default")["metadata"]["annotations"])


def test_extender_assigns_then_binds(api: ApiServer, alice: SimClient) -> None:
    alice.create_pod("default", gpu_pod())
    extender = api.client(api.add_user(EXTENDER))
    extender.patch_pod("default", "gpu", {"metadata": {"annotations": placement()}})
    extender.bind("default", "gpu", "node-1")
    bound = alice.get("pods", "gpu", "default")
    assert bound["spec"]["nodeName"] == "node-1"
    assert bound["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    with pytest.raises(ApiError) as caught:  # frozen once bound
        extender.patch_pod("default", "gpu", {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_IDX": "2"}}})
    assert caught.value.message.startswith('admission webhook "validate.gpushare.io" denied the request: ')


def test_intent_is_immutable(api: ApiServer, alice: SimClient) -> None:
    alice.create_pod("default", gpu_pod())
    extender = api.client(api.add_user(EXTENDER))
    with pytest.raises(ApiError) as caught:
        extender.patch_pod("default", "gpu", {"metadata": {"annotations": {"gpushare.io/intent": "{}"}}})
    assert "gpushare.io/intent" in caught.value.message


def test_ordinary_pods_are_not_sent_to_the_webhook(alice: SimClient) -> None:
    created = alice.create_pod("default", plain_pod())
    assert "annotations" not in created["metadata"]
    alice.patch_pod("default", "plain", {"metadata": {"labels": {"x": "y"}}})


def test_webhook_down_refuses_gpu_pods_but_not_ordinary_ones(hook: RunningWebhook, tmp_path: Path) -> None:
    """failurePolicy Fail for GPU-share pods; matchConditions keep ordinary pods independent of the webhook."""
    with ApiServer() as server:
        server.add_service("gpushare-system", "gpushare-webhook", 443, "https://127.0.0.1:9")  # nothing listens
        server.load_webhook_configurations(project_webhook_objects(), hook.ca_pem)
        client = server.client(server.add_user(user("alice")))
        assert client.create_pod("default", plain_pod())["metadata"]["name"] == "plain"
        with pytest.raises(ApiError) as caught:
            client.create_pod("default", gpu_pod())
        assert caught.value.code == 500
        assert caught.value.message.startswith('Internal error occurred: failed calling webhook "mutate.gpushare.io": '
                                               'failed to call webhook: Post "https://gpushare-webhook.gpushare-system'
                                               '.svc:443/mutate?timeout=')
        assert "connection refused" in caught.value.message
        assert client.get_pod("default", "gpu") is None


PLUGIN = service_account("gpushare-system", "gpushare-device-plugin")


def plugin_of(api: ApiServer, node: str) -> SimClient:
    """The device plugin of `node`, with its pod's token (which names the node, as since Kubernetes 1.30)."""
    return api.client(api.add_user(pod_token(PLUGIN, f"gpushare-device-plugin-{node}", node)))


def bound_pod(api: ApiServer, namespace: str, pod: Obj, node: str) -> None:
    admin = api.client()
    admin.create_pod(namespace, pod)
    admin.bind(namespace, pod["metadata"]["name"], node)


def test_a_plugin_cannot_change_the_image_of_any_pod(api: ApiServer) -> None:
    bound_pod(api, "kube-system", plain_pod("coredns-0"), "node-1")
    patch = {"spec": {"containers": [{"name": "main", "image": "evil"}]}}
    for node, fragment in (
        ("node-0", "The gpushare device plugin of node node-0 changed spec.containers[0].image of a pod bound to "
                   "node node-1; a plugin may write only to pods bound to its own node"),
        ("node-1", "The gpushare device plugin changed spec.containers[0].image, but the plugin identity may change "
                   "only its own annotations"),
    ):
        with pytest.raises(ApiError) as caught:
            plugin_of(api, node).patch_pod("kube-system", "coredns-0", patch, strategic=True)
        assert caught.value.message.startswith('admission webhook "validate-plugin.gpushare.io" denied the request: '
                                               "gpushare denied pod kube-system/coredns-0. "), caught.value.message
        assert fragment in caught.value.message
    assert api.client().get("pods", "coredns-0", "kube-system")["spec"]["containers"][0]["image"] == "busybox"


def test_a_plugin_marks_only_its_own_nodes_pods_allocated(api: ApiServer, alice: SimClient) -> None:
    alice.create_pod("default", gpu_pod())
    extender = api.client(api.add_user(EXTENDER))
    extender.patch_pod("default", "gpu", {"metadata": {"annotations": placement()}})
    extender.bind("default", "gpu", "node-1")
    allocated = {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}}}
    with pytest.raises(ApiError) as caught:
        plugin_of(api, "node-0").patch_pod("default", "gpu", allocated)
    assert "The gpushare device plugin of node node-0 changed ALIYUN_COM_GPU_MEM_ASSIGNED of a pod bound to node " \
           "node-1" in caught.value.message
    with pytest.raises(ApiError) as caught:
        plugin_of(api, "node-1").patch_pod_status("default", "gpu", allocated)
    assert "updated pods/status, which it never needs" in caught.value.message
    done = plugin_of(api, "node-1").patch_pod("default", "gpu", allocated)
    assert done["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"


def test_a_binding_with_reserved_annotations_comes_only_from_the_extender(api: ApiServer, alice: SimClient) -> None:
    alice.create_pod("default", gpu_pod())
    for who in (api.client(), alice, plugin_of(api, "node-1")):
        with pytest.raises(ApiError) as caught:
            who.bind("default", "gpu", "node-1", {"ALIYUN_COM_GPU_MEM_IDX": "0"})
        assert caught.value.message.startswith(
            'admission webhook "validate-binding.gpushare.io" denied the request: gpushare denied pod default/gpu. '
            "The Binding carries annotation ALIYUN_COM_GPU_MEM_IDX, which the API server would copy onto the pod")
    assert "nodeName" not in alice.get("pods", "gpu", "default")["spec"]
    api.client(api.add_user(EXTENDER)).bind("default", "gpu", "node-1", placement())
    assert alice.get("pods", "gpu", "default")["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == "1"
