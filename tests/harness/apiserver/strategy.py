"""Per-kind rules of the test API server: defaults, system fields, what an update may change, basic validation."""

from __future__ import annotations

import copy
import datetime
import re
import secrets
import uuid
from typing import Any

from tests.harness.apiserver.resources import Resource
from tests.harness.apiserver.status import bad_request, invalid

Obj = dict[str, Any]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's SimpleNameGenerator alphabet
DEFAULT_GRACE = 30

# The system fields a client may not set or change; the server owns them.
SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generateName")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def later(seconds: int) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: Obj) -> Obj:
    value = obj.get("metadata")
    if not isinstance(value, dict):
        value = {}
        obj["metadata"] = value
    return value


def decode(resource: Resource, body: Any, namespace: str, subresource: str = "") -> Obj:
    """Check the body's kind and namespace against the URL and apply the defaults the decoder applies."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    obj = copy.deepcopy(body)
    kind = "Binding" if subresource == "binding" else resource.kind
    api_version = "v1" if subresource == "binding" else resource.api_version
    if obj.get("kind") not in (None, "", kind) or obj.get("apiVersion") not in (None, "", api_version):
        raise bad_request(
            f"the body is a {obj.get('apiVersion')}/{obj.get('kind')} but this URL expects {api_version}/{kind}"
        )
    obj["kind"], obj["apiVersion"] = kind, api_version
    metadata = meta(obj)
    if resource.namespaced:
        if metadata.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        metadata["namespace"] = namespace
    else:
        metadata.pop("namespace", None)
    if resource.kind == "Pod" and not subresource:
        _pod_defaults(obj)
    return obj


def _pod_defaults(pod: Obj) -> None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                container.setdefault("terminationMessagePath", "/dev/termination-log")
                container.setdefault("imagePullPolicy", "IfNotPresent")


def before_create(resource: Resource, obj: Obj) -> None:
    """Name generation, uid, timestamps, and the status the server starts an object with (BeforeCreate)."""
    metadata = meta(obj)
    if not metadata.get("name"):
        prefix = metadata.get("generateName")
        if not prefix:
            raise invalid(resource.kind, "", "metadata.name: Required value: name or generateName is required")
        # k8s.io/apiserver pkg/storage/names/generate.go: the first 58 characters of the prefix, five random ones.
        metadata["name"] = str(prefix)[:58] + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))
    for key in SYSTEM_META[:4]:
        metadata.pop(key, None)
    metadata["uid"] = str(uuid.uuid4())
    metadata["creationTimestamp"] = now()
    if resource.kind == "Pod":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    if resource.kind == "Namespace":
        metadata.setdefault("labels", {})["kubernetes.io/metadata.name"] = metadata["name"]
        obj["status"] = {"phase": "Active"}


def check(resource: Resource, obj: Obj) -> None:
    """The validation every write passes; a failure is 422 Invalid naming the field."""
    name = str(meta(obj).get("name") or "")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise invalid(resource.kind, name, f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain "
                      "must consist of lower case alphanumeric characters, '-' or '.'")
    if resource.kind != "Pod":
        return
    spec = obj.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        raise invalid("Pod", name, "spec.containers: Required value")
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for index, container in enumerate((spec or {}).get(key) or []):
            cname = container.get("name") if isinstance(container, dict) else None
            if not cname:
                raise invalid("Pod", name, f"spec.{key}[{index}].name: Required value")
            if cname in seen:
                raise invalid("Pod", name, f"spec.{key}[{index}].name: Duplicate value: {cname!r}")
            seen.add(cname)


def _mutable_view(spec: Any) -> Any:
    """The pod spec without the fields a pod update may change (images, activeDeadlineSeconds, tolerations)."""
    if not isinstance(spec, dict):
        return spec
    view = copy.deepcopy(spec)
    for key in ("containers", "initContainers"):
        for container in view.get(key) or []:
            if isinstance(container, dict):
                container.pop("image", None)
    view.pop("activeDeadlineSeconds", None)
    view.pop("tolerations", None)
    return view


def prepare_update(resource: Resource, subresource: str, new: Obj, old: Obj) -> None:
    """Keep what this endpoint may not change: system metadata always, the status on the main resource,
    the spec on the status subresource; a forbidden pod spec change is 422 like the real server."""
    metadata, old_meta = meta(new), meta(old)
    for key in SYSTEM_META:
        if key in old_meta:
            metadata[key] = old_meta[key]
        else:
            metadata.pop(key, None)
    name = str(old_meta.get("name", ""))
    if subresource == "status":
        if "spec" in old:
            new["spec"] = copy.deepcopy(old["spec"])
        return
    if resource.kind in ("Pod", "Node", "Namespace") and "status" in old:
        new["status"] = copy.deepcopy(old["status"])
    if resource.kind == "Pod":
        if (new.get("spec") or {}).get("nodeName") != (old.get("spec") or {}).get("nodeName"):
            raise invalid("Pod", name, "spec.nodeName: Forbidden: the node is set only through pods/binding")
        if _mutable_view(new.get("spec")) != _mutable_view(old.get("spec")):
            raise invalid(
                "Pod", name, "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                "(only additions to existing tolerations)",
            )
