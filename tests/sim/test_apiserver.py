"""The test API server's storage semantics over HTTPS: CRUD, watches, conflicts, binding, deletion, auth."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError

pytestmark = pytest.mark.timeout(60)

Obj = dict[str, Any]


def pod(name: str = "p", node: str | None = None, **labels: str) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "1"}]}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


@pytest.fixture
def admin(api: ApiServer) -> SimClient:
    return api.client()


def test_create_sets_system_fields_and_defaults(admin: SimClient) -> None:
    created = admin.create_pod("default", {**pod(), "status": {"phase": "Running"}})
    meta = created["metadata"]
    assert meta["namespace"] == "default" and meta["uid"] and meta["creationTimestamp"]
    assert int(meta["resourceVersion"]) > 0
    assert created["status"]["phase"] == "Pending"  # a client cannot create a pod with a status
    assert created["spec"]["terminationGracePeriodSeconds"] == 30
    assert admin.get("pods", "p", "default") == created


def test_generate_name(admin: SimClient) -> None:
    names = {admin.create_pod("default", {**pod(), "metadata": {"generateName": "web-"}})["metadata"]["name"]
             for _ in range(5)}
    assert len(names) == 5
    assert all(name.startswith("web-") and len(name) == 9 for name in names)


@pytest.mark.parametrize(
    ("body", "code", "text"),
    [
        ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}, 422, "spec.containers: Required"),
        ({"kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "c"}]}}, 422, "name or generateName"),
        ({"kind": "Pod", "metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c"}]}}, 422, "RFC 1123"),
        ({"kind": "Node", "metadata": {"name": "p"}}, 400, "this URL expects v1/Pod"),
        ({"kind": "Pod", "metadata": {"name": "p", "namespace": "other"}, "spec": {"containers": [{"name": "c"}]}},
         400, "does not match the namespace"),
        ({"kind": "Pod", "metadata": {"name": "p"},
          "spec": {"containers": [{"name": "c"}, {"name": "c"}]}}, 422, "Duplicate value"),
        ([1, 2], 400, "must be a JSON object"),
    ],
)
def test_create_rejects_bad_objects(admin: SimClient, body: Any, code: int, text: str) -> None:
    with pytest.raises(ApiError) as caught:
        admin.request("POST", "/api/v1/namespaces/default/pods", body)
    assert caught.value.code == code
    assert text in caught.value.message


def test_duplicate_and_missing(admin: SimClient) -> None:
    admin.create_pod("default", pod())
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert (caught.value.code, caught.value.reason) == (409, "AlreadyExists")
    assert caught.value.message == 'pods "p" already exists'
    with pytest.raises(ApiError) as caught:
        admin.get("pods", "nope", "default")
    assert (caught.value.code, caught.value.message) == (404, 'pods "nope" not found')
    assert admin.get_pod("default", "nope") is None


def test_update_conflict_and_unconditional_update(admin: SimClient) -> None:
    created = admin.create_pod("default", pod())
    first = admin.update("pods", {**created, "metadata": {**created["metadata"], "labels": {"a": "1"}}}, "default")
    assert int(first["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as caught:
        admin.update("pods", {**created, "metadata": {**created["metadata"], "labels": {"a": "2"}}}, "default")
    assert caught.value.code == 409
    assert "the object has been modified" in caught.value.message
    unconditional = {**created, "metadata": {**created["metadata"], "labels": {"a": "3"}}}
    del unconditional["metadata"]["resourceVersion"]
    assert admin.update("pods", unconditional, "default")["metadata"]["labels"] == {"a": "3"}


def test_update_keeps_status_and_forbids_spec_changes(admin: SimClient) -> None:
    created = admin.create_pod("default", pod())
    changed = {**created, "status": {"phase": "Running"}}
    changed["spec"] = {**created["spec"], "containers": [{**created["spec"]["containers"][0], "image": "alpine"}]}
    updated = admin.update("pods", changed, "default")
    assert updated["status"]["phase"] == "Pending"
    assert updated["spec"]["containers"][0]["image"] == "alpine"
    bad = {**updated, "spec": {**updated["spec"], "restartPolicy": "Never"}}
    with pytest.raises(ApiError) as caught:
        admin.update("pods", bad, "default")
    assert caught.value.code == 422 and "pod updates may not change fields" in caught.value.message
    with pytest.raises(ApiError) as caught:
        admin.patch_pod("default", "p", {"spec": {"nodeName": "n1"}})
    assert caught.value.code == 422 and "pods/binding" in caught.value.message


def test_status_subresource(admin: SimClient) -> None:
    admin.create_pod("default", pod())
    patched = admin.patch_pod_status("default", "p", {"status": {"phase": "Running"},
                                                      "spec": {"restartPolicy": "Never"}})
    assert patched["status"]["phase"] == "Running"
    assert patched["spec"]["restartPolicy"] == "Always"  # the status endpoint keeps the spec
    current = admin.get("pods", "p", "default", subresource="status")
    current["status"]["phase"] = "Succeeded"
    assert admin.update("pods", current, "default", subresource="status")["status"]["phase"] == "Succeeded"


def test_patch_with_resource_version_precondition(admin: SimClient) -> None:
    created = admin.create_pod("default", pod())
    admin.patch_pod("default", "p", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiError) as caught:
        admin.patch_pod("default", "p", {"metadata": {"labels": {"x": "2"},
                                                      "resourceVersion": created["metadata"]["resourceVersion"]}})
    assert caught.value.code == 409


def test_concurrent_patches_all_land(admin: SimClient) -> None:
    """Patches without a resourceVersion retry on races, like GuaranteedUpdate: none is lost."""
    admin.create_pod("default", pod())
    threads = [threading.Thread(target=admin.patch_pod, args=("default", "p", {"metadata": {"annotations": {
        f"k{i}": str(i)}}})) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admin.get("pods", "p", "default")["metadata"]["annotations"]) == 12


def test_strategic_merge_of_env_by_name(admin: SimClient) -> None:
    admin.create_pod("default", pod())
    patch = {"spec": {"containers": [{"name": "c", "image": "alpine"}]},
             "metadata": {"annotations": {"a": "b"}}}
    patched = admin.patch("pods", "p", patch, "default", patch_type="strategic")
    assert patched["spec"]["containers"][0]["image"] == "alpine"
    assert patched["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert patched["metadata"]["annotations"] == {"a": "b"}


def test_json_patch_and_failed_test_op(admin: SimClient) -> None:
    admin.create_pod("default", pod())
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
    assert admin.patch("pods", "p", ops, "default", patch_type="json")["metadata"]["annotations"] == {"a": "b"}
    with pytest.raises(ApiError) as caught:
        admin.patch("pods", "p", [{"op": "test", "path": "/metadata/name", "value": "q"}], "default",
                    patch_type="json")
    assert caught.value.code == 422


def test_unsupported_patch_type(admin: SimClient) -> None:
    admin.create_pod("default", pod())
    with pytest.raises(ApiError) as caught:
        admin.request("PATCH", "/api/v1/namespaces/default/pods/p", {}, content_type="application/apply-patch+yaml")
    assert caught.value.code == 415


def test_binding(api: ApiServer, admin: SimClient) -> None:
    admin.create_pod("default", pod())
    admin.bind("default", "p", "n1", {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_ASSIGNED": "false"})
    bound = admin.get("pods", "p", "default")
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_ASSIGNED": "false"}
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][0].items()
    with pytest.raises(ApiError) as caught:
        admin.bind("default", "p", "n2")
    assert caught.value.code == 409 and 'already assigned to node "n1"' in caught.value.message
    with pytest.raises(ApiError) as caught:
        admin.bind("default", "ghost", "n1")
    assert caught.value.code == 404


def test_concurrent_binds_only_one_wins(admin: SimClient) -> None:
    admin.create_pod("default", pod())
    outcomes: list[int] = []

    def bind(node: str) -> None:
        try:
            admin.bind("default", "p", node)
            outcomes.append(201)
        except ApiError as exc:
            outcomes.append(exc.code)

    threads = [threading.Thread(target=bind, args=(f"n{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [201, 409, 409, 409, 409, 409]


def test_graceful_delete_kubelet_mode(api: ApiServer, admin: SimClient) -> None:
    admin.create_pod("default", pod("unbound"))
    admin.delete_pod("default", "unbound")
    assert admin.get_pod("default", "unbound") is None  # never scheduled: removed at once
    admin.create_pod("default", pod("bound", "n1"))
    admin.delete_pod("default", "bound")
    marked = admin.get("pods", "bound", "default")
    assert marked["metadata"]["deletionTimestamp"] and marked["metadata"]["deletionGracePeriodSeconds"] == 30
    admin.delete_pod("default", "bound", grace_seconds=5)  # shortens
    assert admin.get("pods", "bound", "default")["metadata"]["deletionGracePeriodSeconds"] == 5
    admin.patch_pod_status("default", "bound", {"status": {"phase": "Running"}})  # the kubelet still writes
    with pytest.raises(ApiError) as caught:
        admin.bind("default", "bound", "n2")
    assert caught.value.code == 409
    with pytest.raises(ApiError) as caught:
        admin.delete("pods", "bound", "default", grace_period_seconds=0, uid="someone-else")
    assert caught.value.code == 409 and "Precondition failed" in caught.value.message
    admin.delete("pods", "bound", "default", grace_period_seconds=0, uid=marked["metadata"]["uid"])
    assert admin.get_pod("default", "bound") is None


def test_graceful_delete_timer_mode() -> None:
    with ApiServer(deletion="timer", grace_cap=0.2) as server:
        client = server.client()
        client.create_pod("default", pod("bound", "n1"))
        client.delete_pod("default", "bound")
        assert client.get("pods", "bound", "default")["metadata"]["deletionTimestamp"]
        deadline = time.monotonic() + 10
        while client.get_pod("default", "bound") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get_pod("default", "bound") is None


def test_nodes_status_patch(admin: SimClient) -> None:
    admin.create("nodes", {"metadata": {"name": "n1", "labels": {"gpu": "yes"}}})
    patched = admin.patch("nodes", "n1", {"status": {"capacity": {"aliyun.com/gpu-mem": "256"},
                                                     "allocatable": {"aliyun.com/gpu-mem": "256"}}},
                          subresource="status", patch_type="strategic")
    assert patched["status"]["allocatable"] == {"aliyun.com/gpu-mem": "256"}
    assert [n["metadata"]["name"] for n in admin.list_objects("nodes", label_selector="gpu")["items"]] == ["n1"]


def test_events_core_and_events_k8s_io(admin: SimClient) -> None:
    admin.create_event("default", {"involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
                                   "reason": "Failed", "message": "it broke", "type": "Warning"})
    admin.create_event("default", {"involvedObject": {"kind": "Pod", "name": "q"}, "reason": "Ok", "type": "Normal"})
    assert [e["message"] for e in admin.events("default", involved="p")] == ["it broke"]
    admin.create("events.events.k8s.io", {"metadata": {"name": "e1"}, "regarding": {"name": "p"}, "reason": "X",
                                          "note": "n", "type": "Normal", "action": "A",
                                          "eventTime": "2026-01-01T00:00:00.000000Z"}, "default")
    assert len(admin.list_objects("events.events.k8s.io", "default")["items"]) == 1


def test_namespaces_secrets_configmaps(api: ApiServer, admin: SimClient) -> None:
    api.add_namespace("team-a", {"tier": "gold"})
    namespace = admin.get("namespaces", "team-a")
    assert namespace["metadata"]["labels"] == {"tier": "gold", "kubernetes.io/metadata.name": "team-a"}
    admin.create_pod("fresh", pod())  # namespaces exist implicitly
    assert admin.get("namespaces", "fresh")["metadata"]["labels"] == {"kubernetes.io/metadata.name": "fresh"}
    admin.create("secrets", {"metadata": {"name": "s"}, "data": {"k": "dg=="}}, "gpushare-system")
    admin.patch("secrets", "s", {"data": {"k2": "dw=="}}, "gpushare-system")
    assert set(admin.get("secrets", "s", "gpushare-system")["data"]) == {"k", "k2"}
    admin.create("configmaps", {"metadata": {"name": "c"}, "data": {"signing.pub": "x"}}, "gpushare-system")
    current = admin.get("configmaps", "c", "gpushare-system")
    current["data"]["signing.pub"] = "y"
    assert admin.update("configmaps", current, "gpushare-system")["data"] == {"signing.pub": "y"}


def test_dry_run_create_stores_nothing(admin: SimClient) -> None:
    assert admin.create("pods", pod(), "default", dry_run=True)["metadata"]["uid"]
    assert admin.get_pod("default", "p") is None

