"""Pure parts of the test API server: patch flavours, selectors, routing, rules of the store."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.apiserver.handler import parse_route
from tests.harness.apiserver.patching import apply_patch, merge_patch, strategic_merge
from tests.harness.apiserver.selectors import parse_field_selector, parse_label_selector, selector_matches
from tests.harness.apiserver.status import ApiError
from tests.harness.apiserver.store import Store

CONTAINER: dict[str, Any] = {"name": "c", "image": "a",
                             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
POD: dict[str, Any] = {"metadata": {"name": "p", "labels": {"x": "1"}, "annotations": {"k": "v"}},
                       "spec": {"containers": [CONTAINER, {"name": "d", "image": "b"}]}}


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        ({"a": 1}, {"a": None}, {}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}, {"a": {"c": 2, "d": 3}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": 1}, {"b": {"c": None}}, {"a": 1, "b": {}}),
    ],
)
def test_merge_patch(target: Any, patch: Any, expected: Any) -> None:
    assert merge_patch(target, patch) == expected


@pytest.mark.parametrize(
    ("patch", "check"),
    [
        ({"spec": {"containers": [{"name": "c", "env": [{"name": "B", "value": "3"}, {"name": "Z", "value": "9"}]}]}},
         lambda p: p["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"},
                                                          {"name": "Z", "value": "9"}]
         and p["spec"]["containers"][1] == {"name": "d", "image": "b"}),
        ({"spec": {"containers": [{"name": "c", "env": [{"name": "A", "$patch": "delete"}]}]}},
         lambda p: p["spec"]["containers"][0]["env"] == [{"name": "B", "value": "2"}]),
        ({"spec": {"containers": [{"name": "e", "image": "new"}]}},
         lambda p: [c["name"] for c in p["spec"]["containers"]] == ["c", "d", "e"]),
        ({"spec": {"containers": [{"name": "d", "image": "z"}, {"$patch": "replace"}]}},
         lambda p: p["spec"]["containers"] == [{"name": "d", "image": "z"}]),
        ({"metadata": {"annotations": {"k": None, "n": "m"}, "$setElementOrder/x": []}},
         lambda p: p["metadata"]["annotations"] == {"n": "m"} and "$setElementOrder/x" not in p["metadata"]),
        ({"metadata": {"finalizers": ["f"]}}, lambda p: p["metadata"]["finalizers"] == ["f"]),
    ],
)
def test_strategic_merge(patch: dict[str, Any], check: Any) -> None:
    assert check(strategic_merge(POD, patch))
    assert POD["spec"]["containers"][0] is CONTAINER and len(CONTAINER["env"]) == 2  # input untouched


def test_strategic_merge_needs_merge_keys() -> None:
    with pytest.raises(ApiError) as caught:
        strategic_merge(POD, {"spec": {"containers": [{"image": "x"}]}})
    assert caught.value.code == 400


@pytest.mark.parametrize(
    ("content_type", "patch", "code"),
    [
        ("application/json-patch+json", {"op": "add"}, 400),
        ("application/json-patch+json", [{"op": "remove", "path": "/nope"}], 422),
        ("application/merge-patch+json", [1], 400),
        ("application/apply-patch+yaml", {}, 415),
        ("text/plain", {}, 415),
    ],
)
def test_bad_patches(content_type: str, patch: Any, code: int) -> None:
    with pytest.raises(ApiError) as caught:
        apply_patch(content_type, POD, patch)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a in (b, c),d", {"a": "c", "d": ""}, True),
        ("a notin (b)", {"a": "b"}, False),
        ("!a", {"a": "x"}, False),
        ("a", {}, False),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(selector)(labels) is matches


def test_bad_label_selector() -> None:
    with pytest.raises(ApiError):
        parse_label_selector("a in b")


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (None, {"a": "b"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "b"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {"a": "b"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_label_selector_object(selector: Any, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


@pytest.mark.parametrize(
    ("selector", "matches"),
    [("spec.nodeName=", True), ("spec.nodeName=n1", False), ("metadata.name=p,metadata.name!=q", True),
     ("status.phase!=Running", True)],
)
def test_field_selector(selector: str, matches: bool) -> None:
    assert parse_field_selector(selector)(POD) is matches


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v1/pods", ("pods", "", "", "")),
        ("/api/v1/namespaces/default/pods/p/binding", ("pods", "default", "p", "binding")),
        ("/api/v1/namespaces/default", ("namespaces", "", "default", "")),
        ("/api/v1/namespaces/default/status", ("namespaces", "", "default", "status")),
        ("/api/v1/nodes/n1/status", ("nodes", "", "n1", "status")),
        ("/apis/events.k8s.io/v1/namespaces/x/events", ("events", "x", "", "")),
        ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/v",
         ("validatingwebhookconfigurations", "", "v", "")),
        ("/api/v1/namespaces/default/pods/p/exec", None),
        ("/api/v1/namespaces/default/nodes/n1", None),
        ("/apis/apps/v1/deployments", None),
    ],
)
def test_routes(path: str, expected: tuple[str, str, str, str] | None) -> None:
    route = parse_route([p for p in path.split("/") if p])
    got = None if route is None else (route.resource.plural, route.namespace, route.name, route.subresource)
    assert got == expected


def test_store_versions_and_replay() -> None:
    store = Store()
    created = store.create("pods", {"metadata": {"name": "a", "namespace": "n"}}, "pods")
    with pytest.raises(ApiError) as caught:
        store.replace("pods", {"metadata": {"name": "a", "namespace": "n"}}, "999", "pods")
    assert caught.value.code == 409
    updated = store.replace("pods", {"metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}}},
                            created["metadata"]["resourceVersion"], "pods")
    store.remove("pods", "n", "a", None, "pods")
    watcher = store.watch("pods", None, 0, lambda obj: True)
    watcher.close()
    assert [(e.type, e.obj["metadata"]["resourceVersion"]) for e in watcher] == [
        ("ADDED", "1"), ("MODIFIED", updated["metadata"]["resourceVersion"]), ("DELETED", "3")]
