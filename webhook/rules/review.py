"""AdmissionReview v1 in and out: parse a request body, build every response (pure)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict

import orjson

from webhook.rules.shape import TOO_DEEP, binding_shape_problem, pod_shape_problem, too_deep

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = ("CREATE", "UPDATE")
# The kinds a review may be about: the /validate endpoint also judges pods/binding (a Binding copies its annotations
# onto the pod); /mutate takes pods only.
POD_KINDS: Final = ("Pod",)
VALIDATED_KINDS: Final = ("Pod", "Binding")
# Where a bound ServiceAccount token names its node (k8s.io/apiserver pkg/authentication/serviceaccount, NodeNameKey):
# a pod's projected token since Kubernetes 1.30 (ServiceAccountTokenPodNodeInfo), a token bound to a Node object.
NODE_NAME_KEY: Final = "authentication.kubernetes.io/node-name"
_RESOURCES: Final = {"Pod": "pods", "Binding": "pods/binding"}


class MalformedReview(ValueError):
    """A body that is not an AdmissionReview v1 for a pod; the view answers HTTP 400 with this one line."""


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class Request(TypedDict):
    """The fields of AdmissionReview.request this webhook reads; parse_review guarantees them."""

    uid: str
    kind: GroupVersionKind
    namespace: str
    operation: Literal["CREATE", "UPDATE"]
    userInfo: UserInfo
    object: dict[str, Any]
    oldObject: dict[str, Any] | None
    dryRun: bool
    name: NotRequired[str]
    subResource: NotRequired[str]


class Status(TypedDict):
    code: int
    message: str


class Response(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]


class Review(TypedDict):
    apiVersion: str
    kind: str
    response: Response


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_review(body: bytes, max_bytes: int, kinds: tuple[str, ...] = POD_KINDS) -> Request:
    """The request of an AdmissionReview v1 about a pod CREATE or UPDATE (or, where `kinds` names it, a Binding's
    CREATE), or MalformedReview saying why not."""
    if len(body) > max_bytes:
        raise MalformedReview(
            f"the request body is {len(body)} bytes, over the {max_bytes}-byte limit (GPUSHARE_MAX_BODY_BYTES)"
        )
    try:
        # orjson: a third of the standard parser's time on a pod; it refuses nesting past 1024 levels itself.
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit"):
            raise MalformedReview(TOO_DEEP) from exc
        raise MalformedReview(_one_line(f"the request body is not JSON ({str(exc)[:200]})")) from exc
    if too_deep(doc):
        raise MalformedReview(TOO_DEEP)
    if not isinstance(doc, dict):
        raise MalformedReview("the request body is not a JSON object; send an AdmissionReview")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise MalformedReview(
            f"the body is apiVersion {doc.get('apiVersion')!r} kind {doc.get('kind')!r}; this webhook "
            f"answers only {API_VERSION} {KIND} (set admissionReviewVersions: [v1])"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("the AdmissionReview request has no uid")
    kind = request.get("kind")
    if not isinstance(kind, dict) or kind.get("kind") not in kinds or kind.get("group", "") != "":
        names = " or ".join(f"core/v1 {k}" for k in kinds)
        raise MalformedReview(
            f"the AdmissionReview {uid} is about {kind!r}, not a {names}; register this endpoint for "
            f"{' and '.join(_RESOURCES[k] for k in kinds)} only"
        )
    operation = request.get("operation")
    if operation not in OPERATIONS or (kind["kind"] == "Binding" and operation != "CREATE"):
        raise MalformedReview(
            f"the AdmissionReview {uid} is a {operation!r} operation; register this webhook for CREATE and UPDATE"
            f"{' (CREATE only for pods/binding)' if kind['kind'] == 'Binding' else ''}"
        )
    obj = request.get("object")
    if not isinstance(obj, dict):
        raise MalformedReview(f"the AdmissionReview {uid} has no object (the {kind['kind'].lower()})")
    old = request.get("oldObject")
    if operation == "UPDATE" and not isinstance(old, dict):
        raise MalformedReview(f"the AdmissionReview {uid} is an UPDATE without oldObject")
    shape = binding_shape_problem if kind["kind"] == "Binding" else pod_shape_problem
    for what, pod in (("object", obj), ("oldObject", old)):
        problem = shape(pod) if isinstance(pod, dict) else None
        if problem:
            raise MalformedReview(f"the AdmissionReview {uid} {what} is not a core/v1 {kind['kind']}: {problem}")
    namespace = request.get("namespace") or (obj.get("metadata") or {}).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise MalformedReview(f"the AdmissionReview {uid} names no namespace; pods are always namespaced")
    user = request.get("userInfo")
    parsed: Request = {
        "uid": uid,
        "kind": {"group": "", "version": str(kind.get("version", "v1")), "kind": str(kind["kind"])},
        "namespace": namespace,
        "operation": operation,
        "userInfo": _user_info(user),
        "object": obj,
        "oldObject": old if isinstance(old, dict) else None,
        "dryRun": request.get("dryRun") is True,
    }
    if isinstance(request.get("name"), str):
        parsed["name"] = request["name"]
    if isinstance(request.get("subResource"), str):
        parsed["subResource"] = request["subResource"]
    return parsed


def _user_info(value: object) -> UserInfo:
    info: UserInfo = {}
    if isinstance(value, dict):
        if isinstance(value.get("username"), str):
            info["username"] = value["username"]
        if isinstance(value.get("uid"), str):
            info["uid"] = value["uid"]
        if isinstance(value.get("groups"), list):
            info["groups"] = [str(g) for g in value["groups"]]
        extra = value.get("extra")
        if isinstance(extra, dict):
            info["extra"] = {str(k): [v for v in values if isinstance(v, str)]
                             for k, values in extra.items() if isinstance(values, list)}
    return info


def username(request: Request) -> str:
    return str(request["userInfo"].get("username") or "")


def token_node(request: Request) -> str | None:
    """The node the caller's token is bound to (userInfo.extra), or None where the token names none: a token minted
    before Kubernetes 1.30, a legacy Secret token, or a user that is not a ServiceAccount."""
    names = request["userInfo"].get("extra", {}).get(NODE_NAME_KEY) or []
    return names[0] if names and names[0] else None


def respond(
    uid: str,
    *,
    allowed: bool = True,
    patch: Sequence[dict[str, Any]] = (),
    message: str = "",
    code: int = 403,
    warnings: Sequence[str] = (),
) -> Review:
    """The one builder of every AdmissionReview answer: uid echoed, patch only when there is one."""
    response: Response = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": code, "message": message}
    if allowed and patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode()
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
