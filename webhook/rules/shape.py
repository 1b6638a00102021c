"""The shape of what an AdmissionReview carries: how deep it nests, and whether a Pod or a Binding has the field
types of core/v1 where the rules read them (pure)."""

from __future__ import annotations

from typing import Any, Final

import orjson

# A Pod nests about 15 levels (managedFields included); anything far deeper is not a pod. This is the deepest
# orjson serializes (its recursion limit), checked by serializing, which costs a quarter of a walk in Python; it
# stays well clear of the interpreter's recursion limit (1000) for whatever reads the object next.
MAX_DEPTH: Final = 254
_CONTAINER_KINDS: Final = ("initContainers", "containers", "ephemeralContainers")
TOO_DEEP: Final = f"the request body nests deeper than {MAX_DEPTH} levels; send an AdmissionReview"
_WORDS: Final[dict[type, str]] = {dict: "an object", list: "a list", str: "a string"}


def too_deep(doc: object) -> bool:
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
