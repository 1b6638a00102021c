"""AdmissionReview v1 parsing (malformed bodies name their defect) and the one response builder."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.harness.pods import container, pod, review
from webhook.rules.review import (
    API_VERSION,
    KIND,
    VALIDATED_KINDS,
    MalformedReview,
    parse_review,
    respond,
    token_node,
    username,
)
from webhook.rules.shape import MAX_DEPTH

LIMIT = 1 << 20


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def broken(**request_changes: Any) -> bytes:
    doc = review("CREATE", pod(container("a", 1)))
    for key, value in request_changes.items():
        if value is None:
            doc["request"].pop(key, None)
        else:
            doc["request"][key] = value
    return body(doc)


def nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(depth):
        doc = {"x": doc}
    return {"metadata": {"name": "p"}, "spec": {"containers": []}, "extra": doc}


def confused(path: str, value: Any) -> dict[str, Any]:
    """A pod with the field at `path` (dot-separated; digits index lists) replaced by `value`."""
    doc = pod(container("a", 1, env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        volumeMounts=[{"name": "v", "mountPath": "/v"}]), annotations={"a": "b"})
    *parents, last = path.split(".")
    here: Any = doc
    for part in parents:
        here = here[int(part)] if part.isdigit() else here[part]
    if last.isdigit():
        here[int(last)] = value
    else:
        here[last] = value
    return doc


CONFUSED = [
    (confused("metadata", []), "object is not a core/v1 Pod: metadata is list, not an object"),
    (confused("metadata.annotations", ["a"]), "metadata.annotations is list"),
    (confused("metadata.annotations.a", 1), "metadata.annotations['a'] is int, not a string"),
    (confused("spec", "x"), "spec is str"),
    (confused("spec.containers", {"a": {}}), "spec.containers is dict, not a list"),
    (confused("spec.containers.0", "a"), "spec.containers[0] is str, not an object"),
    (confused("spec.containers.0.resources", []), "spec.containers[0].resources is list"),
    (confused("spec.containers.0.resources.limits", "8"), "spec.containers[0].resources.limits is str"),
    (confused("spec.containers.0.env", {"X": "1"}), "spec.containers[0].env is dict"),
    (confused("spec.containers.0.env.0", "X=1"), "spec.containers[0].env[0] is str"),
    (confused("spec.containers.0.env.0.name", 7), "spec.containers[0].env[0].name is int"),
    (confused("spec.containers.0.env.0.valueFrom", "x"), "env[0].valueFrom is str"),
    (confused("spec.containers.0.env.0.valueFrom.fieldRef", []), "valueFrom.fieldRef is list"),
    (confused("spec.containers.0.env.0.valueFrom.fieldRef.fieldPath", {}), "fieldRef.fieldPath is dict"),
    (confused("spec.containers.0.volumeMounts", "x"), "volumeMounts is str"),
    (confused("spec.containers.0.volumeMounts.0.mountPath", 1), "volumeMounts[0].mountPath is int"),
    (confused("spec.nodeName", 1), "spec.nodeName is int"),
    (confused("spec.initContainers", "x"), "spec.initContainers is str"),
    (confused("spec.ephemeralContainers", {}), "spec.ephemeralContainers is dict"),
]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{not json", "the request body is not JSON"),
        (b"\xff\xfe", "the request body is not JSON"),
        (b"[]", "is not a JSON object"),
        (body({**review("CREATE", pod()), "apiVersion": "admission.k8s.io/v1beta1"}), "answers only admission"),
        (body({**review("CREATE", pod()), "kind": "Pod"}), "kind 'Pod'"),
        (body({"apiVersion": API_VERSION, "kind": KIND}), "has no request object"),
        (broken(uid=None), "request has no uid"),
        (broken(uid=""), "request has no uid"),
        (broken(kind={"group": "apps", "version": "v1", "kind": "Deployment"}), "not a core/v1 Pod"),
        (broken(operation="DELETE"), "is a 'DELETE' operation"),
        (broken(object=None), "has no object"),
        (broken(operation="UPDATE"), "UPDATE without oldObject"),
        (body(review("CREATE", {"spec": {}}, namespace="")), "names no namespace"),
        (b" " * (LIMIT + 1), "over the 1048576-byte limit"),
        (b"[" * 100_000 + b"]" * 100_000, f"nests deeper than {MAX_DEPTH} levels"),
        # review -> request -> object -> extra adds 4 levels to nested()'s own
        (body(review("CREATE", nested(MAX_DEPTH - 3))), f"nests deeper than {MAX_DEPTH} levels"),
        (body(review("CREATE", nested(500))), f"nests deeper than {MAX_DEPTH} levels"),
        (b'{"a": ' + b"9" * 5000 + b"}", "the request body is not JSON"),
        *[(body(review("CREATE", obj)), fragment) for obj, fragment in CONFUSED],
        (body(review("UPDATE", pod(), {"metadata": []})), "oldObject is not a core/v1 Pod: metadata is list"),
    ],
)
def test_malformed_reviews_say_what_is_wrong_on_one_line(raw: bytes, fragment: str) -> None:
    with pytest.raises(MalformedReview) as caught:
        parse_review(raw, LIMIT)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_body_exactly_as_deep_as_the_limit_is_read() -> None:
    assert parse_review(body(review("CREATE", nested(MAX_DEPTH - 4))), LIMIT)["object"]["extra"]


def test_parse_keeps_what_the_webhook_reads() -> None:
    p = pod(container("a", 1), name=None)
    del p["metadata"]["namespace"]
    doc = review("UPDATE", p, old=p, user="system:serviceaccount:x:y")
    doc["request"]["dryRun"] = True
    req = parse_review(body(doc), LIMIT)
    assert (req["uid"], req["namespace"], req["operation"], req["dryRun"]) == ("uid-1", "ml", "UPDATE", True)
    assert username(req) == "system:serviceaccount:x:y"
    assert req["object"] == p
    assert req["oldObject"] == p


def test_missing_user_info_reads_as_no_username() -> None:
    assert username(parse_review(broken(userInfo=None), LIMIT)) == ""


def test_allowed_response_without_patch_has_no_patch_type() -> None:
    assert respond("u-1") == {"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": "u-1", "allowed": True}}


def test_allowed_response_with_patch_is_base64_json_patch() -> None:
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
    out = respond("u-2", patch=ops)["response"]
    assert out["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(out["patch"])) == ops


def test_denial_carries_code_and_message_and_never_a_patch() -> None:
    out = respond("u-3", allowed=False, message="No.", patch=[{"op": "add", "path": "/x", "value": 1}])["response"]
    assert out == {"uid": "u-3", "allowed": False, "status": {"code": 403, "message": "No."}}


def test_warnings_are_passed_through() -> None:
    assert respond("u-4", warnings=["careful"])["response"]["warnings"] == ["careful"]


def test_the_token_node_is_read_from_user_info_extra() -> None:
    doc = review("UPDATE", pod(), pod(), user="system:serviceaccount:gpushare-system:gpushare-device-plugin")
    doc["request"]["userInfo"]["extra"] = {
        "authentication.kubernetes.io/node-name": ["gpu-node-1"], "authentication.kubernetes.io/pod-uid": ["u"],
        "odd": "not a list", "mixed": ["a", 1],
    }
    req = parse_review(body(doc), LIMIT)
    assert token_node(req) == "gpu-node-1"
    assert req["userInfo"]["extra"] == {"authentication.kubernetes.io/node-name": ["gpu-node-1"],
                                        "authentication.kubernetes.io/pod-uid": ["u"], "mixed": ["a"]}


@pytest.mark.parametrize("extra", [None, {}, {"authentication.kubernetes.io/node-name": []},
                                   {"authentication.kubernetes.io/node-name": [""]}, "nodes"])
def test_a_token_without_a_node_names_none(extra: object) -> None:
    doc = review("UPDATE", pod(), pod())
    if extra is not None:
        doc["request"]["userInfo"]["extra"] = extra
    assert token_node(parse_review(body(doc), LIMIT)) is None


def binding_doc(operation: str = "CREATE", **binding_changes: Any) -> dict[str, Any]:
    doc = review(operation, {"metadata": {"name": "job-0", "namespace": "ml"}, "target": {"kind": "Node",
                                                                                          "name": "n1"}})
    doc["request"]["kind"] = {"group": "", "version": "v1", "kind": "Binding"}
    doc["request"]["object"].update(binding_changes)
    return doc


def test_a_binding_is_read_only_where_asked_for() -> None:
    req = parse_review(body(binding_doc()), LIMIT, VALIDATED_KINDS)
    assert req["kind"]["kind"] == "Binding" and req["object"]["target"]["name"] == "n1"
    with pytest.raises(MalformedReview, match="not a core/v1 Pod; register this endpoint for pods only"):
        parse_review(body(binding_doc()), LIMIT)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (binding_doc("UPDATE"), "is a 'UPDATE' operation; register this webhook for CREATE and UPDATE (CREATE only "
                                "for pods/binding)"),
        (binding_doc(target="n1"), "object is not a core/v1 Binding: target is str, not an object"),
        (binding_doc(metadata={"name": "p", "annotations": {"k": 1}}), "metadata.annotations['k'] is int"),
        (binding_doc(metadata=[]), "metadata is list"),
    ],
)
def test_a_malformed_binding_says_what_is_wrong(doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(MalformedReview) as caught:
        parse_review(body(doc), LIMIT, VALIDATED_KINDS)
    assert fragment in str(caught.value)
