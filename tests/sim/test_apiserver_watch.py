"""The test API server's read side over HTTPS: lists, watches, version, auth, and outside clients."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.apiserver.auth import User, service_account
from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.sim.test_apiserver import pod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


@pytest.fixture
def admin(api: ApiServer) -> SimClient:
    return api.client()


def test_list_with_selectors_and_all_namespaces(admin: SimClient) -> None:
    admin.create_pod("default", pod("a", "n1", app="web"))
    admin.create_pod("default", pod("b", "n2", app="web"))
    admin.create_pod("other", pod("c", "n1", app="db"))
    assert [p["metadata"]["name"] for p in admin.list_pods(node="n1")[0]] == ["a", "c"]
    assert [p["metadata"]["name"] for p in admin.list_pods(label_selector="app=web")[0]] == ["a", "b"]
    listed = admin.list_objects("pods", "default", label_selector="app in (db, web)", field_selector="metadata.name!=a")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["b"]
    assert listed["kind"] == "PodList"
    with pytest.raises(ApiError) as caught:
        admin.list_objects("pods", field_selector="spec.image=x")
    assert caught.value.code == 400 and "field label not supported" in caught.value.message


def test_watch_from_resource_version_with_field_selector(admin: SimClient) -> None:
    admin.create_pod("default", pod("early", "n1"))
    _, rv = admin.list_pods(node="n1")
    admin.create_pod("default", pod("bound-later"))
    admin.create_pod("default", pod("other-node", "n2"))
    admin.bind("default", "bound-later", "n1")
    admin.patch_pod("default", "bound-later", {"metadata": {"labels": {"x": "1"}}})
    admin.delete_pod("default", "bound-later", grace_seconds=0)
    seen = [(kind, p["metadata"]["name"]) for kind, p in admin.watch_pods(rv, node="n1", timeout_s=0.5)]
    assert seen == [("ADDED", "bound-later"), ("MODIFIED", "bound-later"), ("DELETED", "bound-later")]


def test_watch_without_resource_version_starts_with_state(admin: SimClient) -> None:
    admin.create_pod("default", pod("a"))
    with admin.watch("pods", "default", timeout_seconds=0.3) as stream:
        assert [(k, p["metadata"]["name"]) for k, p in stream] == [("ADDED", "a")]


def test_watch_is_live_and_label_transitions(admin: SimClient) -> None:
    admin.create_pod("default", pod("a", app="web"))
    _, rv = admin.list_pods()
    seen: list[tuple[str, str]] = []
    stream = admin.watch("pods", resource_version=rv, label_selector="app=web", timeout_seconds=10)

    def consume() -> None:
        for kind, obj in stream:
            seen.append((kind, obj["metadata"]["labels"].get("app", "")))
            if len(seen) == 2:
                stream.close()

    reader = threading.Thread(target=consume)
    reader.start()
    admin.patch_pod("default", "a", {"metadata": {"labels": {"app": "db"}}})  # leaves the selection
    admin.patch_pod("default", "a", {"metadata": {"labels": {"app": "web"}}})  # comes back
    reader.join(timeout=10)
    assert seen == [("DELETED", "db"), ("ADDED", "web")]


def test_watch_too_old_resource_version_is_410(api: ApiServer) -> None:
    with ApiServer(history=2) as small:
        client = small.client()
        for i in range(4):
            client.create_pod("default", pod(f"p{i}"))
        with pytest.raises(ApiError) as caught:
            list(client.watch_pods("1", timeout_s=0.2))
        assert caught.value.code == 410


def test_bookmarks_are_sent_and_skipped(api: ApiServer) -> None:
    api.bookmark_interval = 0.1
    client = api.client()
    with client.watch("pods", resource_version="1", timeout_seconds=0.6, bookmarks=True) as stream:
        assert list(stream) == []
        assert stream.resource_version  # the bookmark carried the current resourceVersion


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/api/v1/namespaces/default/widgets", 404),
        ("GET", "/api/v1/namespaces/default/pods/p/exec", 404),
        ("GET", "/apis/apps/v1/deployments", 404),
        ("DELETE", "/api/v1/namespaces/default/pods", 405),
        ("POST", "/api/v1/pods", 404),
        ("GET", "/openapi/v2", 404),
        ("GET", "/api/v1/namespaces/default/pods/p/binding", 405),
        ("PUT", "/api/v1/namespaces/default/pods/p/binding", 405),
        ("PATCH", "/api/v1/namespaces/default/pods/p/binding", 405),
        ("POST", "/api/v1/namespaces/default/pods/p/status", 405),
    ],
)
def test_unknown_paths(admin: SimClient, method: str, path: str, code: int) -> None:
    with pytest.raises(ApiError) as caught:
        admin.request(method, path, {} if method != "GET" else None)
    assert caught.value.code == code


def test_authentication_and_authorization() -> None:
    def only_reads(who: User, verb: str, *rest: Any) -> str | None:
        if who.username == "viewer" and verb not in ("get", "list", "watch"):
            return f'pods is forbidden: User "{who.username}" cannot {verb} resource "pods"'
        return None

    with ApiServer(authorize=only_reads) as server:
        with pytest.raises(ApiError) as caught:
            server.client("wrong-token").list_pods()
        assert (caught.value.code, caught.value.reason) == (401, "Unauthorized")
        viewer = server.client(server.add_user(User("viewer")))
        assert viewer.list_pods()[0] == []
        with pytest.raises(ApiError) as caught:
            viewer.create_pod("default", pod())
        assert caught.value.code == 403 and "cannot create" in caught.value.message


def test_version_and_health_are_served(admin: SimClient) -> None:
    assert admin.request("GET", "/version")["gitVersion"].startswith("v1.32")
    assert admin.request("GET", "/healthz") == "ok"


def test_python_kubernetes_client_through_kubeconfig(api: ApiServer, tmp_path: Any) -> None:
    """The device plugin reaches the API server with the kubernetes client and GPUSHARE_KUBECONFIG."""
    # The kubernetes client is only partly typed; used as Any here as in the device plugin's adapter.
    k8s: Any = importlib.import_module("kubernetes.client")
    config: Any = importlib.import_module("kubernetes.config")
    watch: Any = importlib.import_module("kubernetes.watch")

    token = api.add_user(service_account("gpushare-system", "gpushare-device-plugin"))
    path = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    api_client = config.new_client_from_config(config_file=str(path))
    core = k8s.CoreV1Api(api_client)
    try:
        api.client().create_pod("default", pod("p", "n1"))
        pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
        assert [p.metadata.name for p in pods.items] == ["p"]
        assigned = {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}}}
        core.patch_namespaced_pod("p", "default", assigned)
        seen = [e["type"] for e in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1,
                                                        resource_version=pods.metadata.resource_version)]
        assert seen == ["MODIFIED"]
        core.create_namespaced_event("default", k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name="p."), involved_object=k8s.V1ObjectReference(name="p"),
            reason="Allocated", message="ok", type="Normal"))
        assert len(core.list_namespaced_event("default").items) == 1
    finally:
        api_client.close()


def test_stop_ends_open_watches() -> None:
    server = ApiServer().start()
    client = server.client()
    stream = client.watch("pods", timeout_seconds=30)
    done = threading.Event()

    def consume() -> None:
        list(stream)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    server.stop()
    assert done.wait(10)
    server.stop()  # idempotent


def test_closed_watch_is_released(api: ApiServer, admin: SimClient) -> None:
    """A client that closes an idle watch frees the server's stream without waiting for timeoutSeconds."""
    stream = admin.watch("pods", timeout_seconds=60)
    deadline = time.monotonic() + 5
    while not api.store.watch_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api.store.watch_count == 1
    stream.close()
    while api.store.watch_count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert api.store.watch_count == 0


@pytest.mark.parametrize("query", ["labelSelector=a%20in%20b", "fieldSelector=spec.image%3Dx", "timeoutSeconds=soon",
                                   "resourceVersion=abc"])
def test_bad_watch_parameters_are_400_before_streaming(admin: SimClient, query: str) -> None:
    with pytest.raises(ApiError) as caught:
        admin.request("GET", f"/api/v1/pods?watch=true&{query}")
    assert caught.value.code == 400
