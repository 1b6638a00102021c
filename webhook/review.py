"""AdmissionReview v1 in and out: parse a request body, build every response (pure)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = ("CREATE", "UPDATE")


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


def parse_review(body: bytes, max_bytes: int) -> Request:
    """The request of an AdmissionReview v1 about a pod CREATE or UPDATE, or MalformedReview saying why not."""
    if len(body) > max_bytes:
        raise MalformedReview(
            f"the request body is {len(body)} bytes, over the {max_bytes}-byte limit (GPUSHARE_MAX_BODY_BYTES)"
        )
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedReview(_one_line(f"the request body is not JSON ({exc})")) from exc
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
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or kind.get("group", "") != "":
        raise MalformedReview(
            f"the AdmissionReview {uid} is about {kind!r}, not a core/v1 Pod; register this webhook for pods only"
        )
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReview(
            f"the AdmissionReview {uid} is a {operation!r} operation; register this webhook for CREATE and UPDATE"
        )
    obj = request.get("object")
    if not isinstance(obj, dict):
        raise MalformedReview(f"the AdmissionReview {uid} has no object (the pod)")
    old = request.get("oldObject")
    if operation == "UPDATE" and not isinstance(old, dict):
        raise MalformedReview(f"the AdmissionReview {uid} is an UPDATE without oldObject")
    namespace = request.get("namespace") or (obj.get("metadata") or {}).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise MalformedReview(f"the AdmissionReview {uid} names no namespace; pods are always namespaced")
    user = request.get("userInfo")
    parsed: Request = {
        "uid": uid,
        "kind": {"group": "", "version": str(kind.get("version", "v1")), "kind": "Pod"},
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
    return info


def username(request: Request) -> str:
    return str(request["userInfo"].get("username") or "")


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
        response["patch"] = base64.b64encode(json.dumps(list(patch), separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
