"""AdmissionReview v1 in and out: parse a request body, build every response (pure)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict

import orjson

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
# A Pod nests about 15 levels (managedFields included); anything far deeper is not a pod. This is the deepest
# orjson serializes (its recursion limit), checked by serializing, which costs a quarter of a walk in Python; it
# stays well clear of the interpreter's recursion limit (1000) for whatever reads the object next.
MAX_DEPTH: Final = 254
_CONTAINER_KINDS: Final = ("initContainers", "containers", "ephemeralContainers")
_TOO_DEEP: Final = f"the request body nests deeper than {MAX_DEPTH} levels; send an AdmissionReview"
_WORDS: Final[dict[type, str]] = {dict: "an object", list: "a list", str: "a string"}
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
            raise MalformedReview(_TOO_DEEP) from exc
        raise MalformedReview(_one_line(f"the request body is not JSON ({str(exc)[:200]})")) from exc
    if _too_deep(doc):
        raise MalformedReview(_TOO_DEEP)
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


def _too_deep(doc: object) -> bool:
    """True when `doc` nests deeper than MAX_DEPTH. Everything orjson parses it can serialize again, save what is
    past its recursion limit, so serializing is the check (about 6 us for a 6 KB pod, in native code)."""
    try:
        orjson.dumps(doc)
    except orjson.JSONEncodeError as exc:
        if "recursion" in str(exc).lower():
            return True
        raise
    return False


def _kind_problem(value: object, kind: type, where: str) -> str | None:
    """None when `value` is absent (null) or of `kind`; else a phrase naming the field and what it must be."""
    if value is None or isinstance(value, kind):
        return None
    return f"{where} is {type(value).__name__}, not {_WORDS[kind]}"


def _container_problem(container: object, where: str) -> str | None:
    if not isinstance(container, dict):
        return f"{where} is {type(container).__name__}, not an object"
    resources = container.get("resources")
    checks: list[tuple[object, type, str]] = [
        (container.get("name"), str, f"{where}.name"),
        (resources, dict, f"{where}.resources"),
        (container.get("env"), list, f"{where}.env"),
        (container.get("volumeMounts"), list, f"{where}.volumeMounts"),
    ]
    if isinstance(resources, dict):
        checks.append((resources.get("limits"), dict, f"{where}.resources.limits"))
    problem = next((p for p in (_kind_problem(*check) for check in checks) if p), None)
    if problem:
        return problem
    checks = []
    for i, entry in enumerate(container.get("env") or []):
        if not isinstance(entry, dict):
            return f"{where}.env[{i}] is {type(entry).__name__}, not an object"
        value_from = entry.get("valueFrom")
        checks += [
            (entry.get("name"), str, f"{where}.env[{i}].name"),
            (entry.get("value"), str, f"{where}.env[{i}].value"),
            (value_from, dict, f"{where}.env[{i}].valueFrom"),
        ]
        if isinstance(value_from, dict):
            field_ref = value_from.get("fieldRef")
            checks.append((field_ref, dict, f"{where}.env[{i}].valueFrom.fieldRef"))
            if isinstance(field_ref, dict):
                checks.append((field_ref.get("fieldPath"), str, f"{where}.env[{i}].valueFrom.fieldRef.fieldPath"))
    for i, mount in enumerate(container.get("volumeMounts") or []):
        if not isinstance(mount, dict):
            return f"{where}.volumeMounts[{i}] is {type(mount).__name__}, not an object"
        checks.append((mount.get("mountPath"), str, f"{where}.volumeMounts[{i}].mountPath"))
    return next((p for p in (_kind_problem(*check) for check in checks) if p), None)


def _absent_or(value: object, kind: type) -> bool:
    return value is None or isinstance(value, kind)


def _well_shaped_container(container: object) -> bool:
    if not isinstance(container, dict):
        return False
    resources, env, mounts = container.get("resources"), container.get("env"), container.get("volumeMounts")
    if not (_absent_or(container.get("name"), str) and _absent_or(resources, dict) and _absent_or(env, list)
            and _absent_or(mounts, list)):
        return False
    if isinstance(resources, dict) and not _absent_or(resources.get("limits"), dict):
        return False
    for entry in env or ():
        if not isinstance(entry, dict):
            return False
        value_from = entry.get("valueFrom")
        if not (_absent_or(entry.get("name"), str) and _absent_or(entry.get("value"), str)
                and _absent_or(value_from, dict)):
            return False
        if value_from:
            field_ref = value_from.get("fieldRef")
            if not _absent_or(field_ref, dict) or (field_ref and not _absent_or(field_ref.get("fieldPath"), str)):
                return False
    return all(isinstance(m, dict) and _absent_or(m.get("mountPath"), str) for m in mounts or ())


def well_shaped(pod: dict[str, Any]) -> bool:
    """True exactly when pod_shape_problem finds nothing; checked first, on every review, because it builds no
    message (the message is worked out only for a pod that has a problem)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not (_absent_or(meta, dict) and _absent_or(spec, dict)):
        return False
    if isinstance(meta, dict):
        annotations = meta.get("annotations")
        if not (_absent_or(annotations, dict) and _absent_or(meta.get("namespace"), str)):
            return False
        if isinstance(annotations, dict) and not all(_absent_or(v, str) for v in annotations.values()):
            return False
    if not isinstance(spec, dict):
        return True
    if not _absent_or(spec.get("nodeName"), str):
        return False
    lists = [spec.get(kind) for kind in _CONTAINER_KINDS]
    if not all(_absent_or(containers, list) for containers in lists):
        return False
    return all(_well_shaped_container(c) for containers in lists for c in containers or ())


def pod_shape_problem(pod: dict[str, Any]) -> str | None:
    """Why `pod` does not have the shape of a Pod in the fields the rules read, or None when it does.

    The API server only sends objects it has decoded, so this refuses forged bodies, not real pods: past this
    check every reader may rely on the types.
    """
    return None if well_shaped(pod) else shape_problem(pod)


def shape_problem(pod: dict[str, Any]) -> str | None:
    """pod_shape_problem without the quick check first: the first field, in a fixed order, of the wrong type."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    checks: list[tuple[object, type, str]] = [(meta, dict, "metadata"), (spec, dict, "spec")]
    if isinstance(meta, dict):
        annotations = meta.get("annotations")
        checks += [(annotations, dict, "metadata.annotations"), (meta.get("namespace"), str, "metadata.namespace")]
        if isinstance(annotations, dict):
            checks += [(v, str, f"metadata.annotations[{k!r}]") for k, v in annotations.items()]
    if isinstance(spec, dict):
        checks.append((spec.get("nodeName"), str, "spec.nodeName"))
        checks += [(spec.get(kind), list, f"spec.{kind}") for kind in _CONTAINER_KINDS]
    problem = next((p for p in (_kind_problem(*check) for check in checks) if p), None)
    if problem or not isinstance(spec, dict):
        return problem
    for kind in _CONTAINER_KINDS:
        for i, container in enumerate(spec.get(kind) or []):
            problem = _container_problem(container, f"spec.{kind}[{i}]")
            if problem:
                return problem
    return None


def binding_shape_problem(binding: dict[str, Any]) -> str | None:
    """Why `binding` does not have the shape of a Binding in the fields the rules read, or None when it does."""
    meta = binding.get("metadata")
    checks: list[tuple[object, type, str]] = [(meta, dict, "metadata"), (binding.get("target"), dict, "target")]
    if isinstance(meta, dict):
        annotations = meta.get("annotations")
        checks += [(annotations, dict, "metadata.annotations"), (meta.get("name"), str, "metadata.name")]
        if isinstance(annotations, dict):
            checks += [(v, str, f"metadata.annotations[{k!r}]") for k, v in annotations.items()]
    return next((p for p in (_kind_problem(*check) for check in checks) if p), None)


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
