"""JSON merge patch, a strategic merge patch for the fields pods use, and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from tests.harness.apiserver.status import ApiError, bad_request

Obj = dict[str, Any]

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE, STRATEGIC, JSON)

# Merge keys of the lists a strategic merge patch merges instead of replacing (from the Go struct tags
# `patchMergeKey`). Simplification: keyed by the list's field name wherever it appears, not by Go type.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "addresses": "type",
    "taints": "key",
}
# Lists of scalars merged as sets (patchStrategy: merge without a key).
SET_LISTS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_keyed_list(field: str, original: list[Any], patch: list[Any]) -> list[Any]:
    key = MERGE_KEYS[field]
    directive = {"$patch": "replace"}
    if directive in patch:
        return [_strip(item) for item in patch if item != directive]
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"strategic merge patch: every item of {field!r} needs its merge key {key!r}")
        index = next((i for i, old in enumerate(result) if isinstance(old, dict) and old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
            continue
        if index is None:
            result.append(_strip(item))
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def strategic_merge(target: Any, patch: Any) -> Any:
    """Strategic merge for the fields pods, nodes and events use.

    Simplification: merge keys come from MERGE_KEYS by field name rather than from the OpenAPI schema, and
    of the directives only `$patch: delete|replace` and `$deleteFromPrimitiveList/<field>` are honoured;
    `$setElementOrder/...` and `$retainKeys` are accepted and ignored.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip(patch)
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            drop = set(value or [])
            result[field] = [v for v in result.get(field) or [] if v not in drop]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_keyed_list(key, result[key], value)
        elif isinstance(value, list) and key in SET_LISTS and isinstance(result.get(key), list):
            result[key] = result[key] + [v for v in value if v not in result[key]]
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = _strip(value)
    return result


def json_patch(target: Obj, patch: Any) -> Obj:
    """RFC 6902; a failing `test` or a bad path is a 422 like the real server, a malformed patch a 400."""
    if not isinstance(patch, list):
        raise bad_request("a JSON patch must be a JSON array of operations")
    try:
        result = jsonpatch.JsonPatch(patch).apply(target)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise ApiError(422, f"the server rejected our request due to an error in our request: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError, IndexError) as exc:
        raise ApiError(422, f"the server rejected our request due to an error in our request: {exc}") from exc
    if not isinstance(result, dict):
        raise ApiError(422, "the JSON patch replaced the whole object with something that is not an object")
    return result


def apply_patch(content_type: str, target: Obj, patch: Any) -> Obj:
    """The patched copy of `target`; the content type picks the patch flavour like the real server."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == JSON:
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise bad_request(f"a {media} patch must be a JSON object")
    if media == MERGE:
        merged = merge_patch(target, patch)
    elif media == STRATEGIC:
        merged = strategic_merge(target, patch)
    elif media == APPLY:
        raise ApiError(415, "server-side apply is not supported by the test API server; use a merge or JSON patch")
    else:
        raise ApiError(415, f"the patch content type {media!r} is not supported; use one of {', '.join(PATCH_TYPES)}")
    if not isinstance(merged, dict):
        raise bad_request("the patch removed the whole object")
    return merged
