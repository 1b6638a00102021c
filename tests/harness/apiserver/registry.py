"""Write paths of the test API server: create, update, patch, delete, bind, each through the admission chain."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

from tests.harness.apiserver import strategy
from tests.harness.apiserver.admission import Attributes, Chain
from tests.harness.apiserver.auth import User
from tests.harness.apiserver.patching import apply_patch
from tests.harness.apiserver.resources import NAMESPACES, PODS, Resource
from tests.harness.apiserver.status import ApiError, bad_request, conflict, not_found, stale
from tests.harness.apiserver.store import Store

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Deletion = Literal["kubelet", "timer", "immediate"]
DELETION_MODES = ("kubelet", "timer", "immediate")
RETRIES = 16  # optimistic-concurrency retries of unconditional updates, like GuaranteedUpdate


def _options(kind: str, dry_run: bool, extra: Obj | None = None) -> Obj:
    options: Obj = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if dry_run:
        options["dryRun"] = ["All"]
    options.update(extra or {})
    return options


class Registry:
    """The storage strategies plus admission, with kube-apiserver's ordering.

    Order on create: defaults at decode -> mutating webhooks (no name yet for generateName, no uid) ->
    name, uid, timestamps -> validation -> validating webhooks -> store. Updates and patches run the same
    chain as UPDATE with the old object, and retry on a resourceVersion race unless the client set one.

    Pod deletion: `kubelet` (the real behaviour) marks a bound pod with deletionTimestamp and keeps it until
    someone deletes it with gracePeriodSeconds=0 (the kubelet, once its containers stopped); `timer` removes it
    after the grace period, capped by `grace_cap` seconds; `immediate` removes at once. Unbound or finished
    pods are removed at once in every mode, like the real server.
    """

    def __init__(self, store: Store, chain: Chain, deletion: Deletion = "kubelet",
                 grace_cap: float | None = None) -> None:
        if deletion not in DELETION_MODES:
            raise ValueError(f"deletion mode {deletion!r} is unknown; use one of {', '.join(DELETION_MODES)}")
        self.store = store
        self.chain = chain
        self.deletion = deletion
        self.grace_cap = grace_cap
        self._timers: list[threading.Timer] = []
        self._timers_lock = threading.Lock()
        self._local = threading.local()

    def _sink(self) -> list[str]:
        """This thread's admission warnings; the HTTP handler sends them as `Warning` headers."""
        sink: list[str] | None = getattr(self._local, "warnings", None)
        if sink is None:
            sink = []
            self._local.warnings = sink
        return sink

    def take_warnings(self) -> list[str]:
        sink = self._sink()
        taken = list(dict.fromkeys(sink))
        sink.clear()
        return taken

    def close(self) -> None:
        with self._timers_lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()

    # --- namespaces -------------------------------------------------------------------------------------------

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        """Namespaces exist implicitly (simplification: the real server answers 404 for a missing one)."""
        found = self.store.get(NAMESPACES.key, "", name)
        if found is not None:
            return found
        obj: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
        strategy.before_create(NAMESPACES, obj)
        try:
            return self.store.create(NAMESPACES.key, obj, NAMESPACES.plural)
        except ApiError:
            return self.store.get(NAMESPACES.key, "", name) or obj

    def namespace_labels(self, name: str) -> dict[str, str]:
        found = self.store.get(NAMESPACES.key, "", name)
        if found is None:
            return {"kubernetes.io/metadata.name": name}
        return dict((found.get("metadata") or {}).get("labels") or {})

    # --- writes -----------------------------------------------------------------------------------------------

    def create(self, resource: Resource, namespace: str, body: Any, user: User, dry_run: bool = False) -> Obj:
        obj = strategy.decode(resource, body, namespace)
        if resource.namespaced:
            self.ensure_namespace(namespace)
        metadata = strategy.meta(obj)
        ns = namespace if resource.namespaced else ""
        attrs = Attributes(resource, "CREATE", ns, str(metadata.get("name") or ""), obj, None, user, dry_run=dry_run,
                           options=_options("CreateOptions", dry_run), warnings=self._sink())
        obj = self.chain.admit(attrs) or obj
        strategy.decode(resource, obj, namespace)
        strategy.before_create(resource, obj)
        strategy.check(resource, obj)
        attrs.obj, attrs.name = obj, str(strategy.meta(obj)["name"])
        self.chain.validate(attrs)
        if dry_run:
            return obj
        return self.store.create(resource.key, obj, resource.plural, resource.group)

    def update(self, resource: Resource, namespace: str, name: str, body: Any, *, user: User,
               dry_run: bool = False, subresource: str = "") -> Obj:
        new = strategy.decode(resource, body, namespace)
        if strategy.meta(new).get("name") not in (None, name):
            raise bad_request(f"the name of the object ({strategy.meta(new).get('name')}) does not match the name "
                              f"on the URL ({name})")
        strategy.meta(new)["name"] = name
        wanted = str(strategy.meta(new).get("resourceVersion") or "")
        return self._guaranteed(resource, namespace, name, user=user, dry_run=dry_run, subresource=subresource,
                                change=lambda current: copy.deepcopy(new), wanted=wanted or None)

    def patch(self, resource: Resource, namespace: str, name: str, content_type: str, patch: Any, *, user: User,
              dry_run: bool = False, subresource: str = "") -> Obj:
        wanted: list[str | None] = [None]

        def patched(current: Obj) -> Obj:
            result = apply_patch(content_type, current, patch)
            rv = str(strategy.meta(result).get("resourceVersion") or "")
            if rv != current["metadata"]["resourceVersion"]:
                wanted[0] = rv  # the patch carried a resourceVersion: a precondition, no retry
            return strategy.decode(resource, result, namespace)

        return self._guaranteed(resource, namespace, name, user=user, dry_run=dry_run, subresource=subresource,
                                change=patched, wanted=None, patch_wanted=wanted)

    def _guaranteed(self, resource: Resource, namespace: str, name: str, *, user: User, dry_run: bool,
                    subresource: str, change: Callable[[Obj], Obj], wanted: str | None,
                    patch_wanted: list[str | None] | None = None) -> Obj:
        ns = namespace if resource.namespaced else ""
        for _ in range(RETRIES):
            current = self.store.get(resource.key, ns, name)
            if current is None:
                raise not_found(resource.plural, name, resource.group)
            new = change(current)
            precondition = wanted or (patch_wanted[0] if patch_wanted else None)
            if precondition and precondition != current["metadata"]["resourceVersion"]:
                raise stale(resource.plural, name, resource.group)
            strategy.meta(new)["resourceVersion"] = current["metadata"]["resourceVersion"]
            strategy.prepare_update(resource, subresource, new, current)
            attrs = Attributes(resource, "UPDATE", ns, name, new, current, user, subresource=subresource,
                               warnings=self._sink(),
                               dry_run=dry_run, options=_options("UpdateOptions", dry_run))
            new = self.chain.admit(attrs) or new
            strategy.prepare_update(resource, subresource, new, current)
            strategy.check(resource, new)
            attrs.obj = new
            self.chain.validate(attrs)
            if new == current or dry_run:
                return new
            try:
                return self.store.replace(resource.key, new, current["metadata"]["resourceVersion"],
                                          resource.plural, resource.group)
            except ApiError as exc:
                if exc.code != 409 or precondition:
                    raise
                log.debug("retrying the update of %s %s/%s after a concurrent write", resource.plural, ns, name)
        raise conflict(resource.plural, name, "too many concurrent writes; try again", resource.group)

    def delete(self, resource: Resource, namespace: str, name: str, options: Obj, *, user: User,
               dry_run: bool = False) -> Obj:
        ns = namespace if resource.namespaced else ""
        current = self.store.get(resource.key, ns, name)
        if current is None:
            raise not_found(resource.plural, name, resource.group)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != current["metadata"].get("uid"):
            raise conflict(resource.plural, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                           f"UID in object meta: {current['metadata'].get('uid')}", resource.group)
        if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise stale(resource.plural, name, resource.group)
        attrs = Attributes(resource, "DELETE", ns, name, None, current, user, dry_run=dry_run, warnings=self._sink(),
                           options=_options("DeleteOptions", dry_run, {k: v for k, v in options.items()
                                                                         if k not in ("kind", "apiVersion")}))
        self.chain.admit(attrs)
        self.chain.validate(attrs)
        if dry_run:
            return current
        grace = self._grace(resource, current, options)
        if grace is None:
            return self.store.remove(resource.key, ns, name, None, resource.plural, resource.group)
        return self._mark_deleting(current, grace)

    def _grace(self, resource: Resource, pod: Obj, options: Obj) -> int | None:
        """The grace period to wait, or None to remove now."""
        if resource is not PODS or self.deletion == "immediate":
            return None
        requested = options.get("gracePeriodSeconds")
        grace = int(requested) if requested is not None else int(
            (pod.get("spec") or {}).get("terminationGracePeriodSeconds", strategy.DEFAULT_GRACE))
        unbound = not (pod.get("spec") or {}).get("nodeName")
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if grace <= 0 or unbound or finished:
            return None
        return grace

    def _mark_deleting(self, pod: Obj, grace: int) -> Obj:
        metadata = pod["metadata"]
        namespace, name, uid = metadata.get("namespace", ""), metadata["name"], metadata.get("uid")
        current_grace = metadata.get("deletionGracePeriodSeconds")
        if current_grace is not None and grace >= int(current_grace):
            return pod  # already terminating with a shorter or equal grace period
        for _ in range(RETRIES):
            marked = copy.deepcopy(pod)
            marked["metadata"]["deletionTimestamp"] = strategy.later(grace)
            marked["metadata"]["deletionGracePeriodSeconds"] = grace
            try:
                pod = self.store.replace(PODS.key, marked, pod["metadata"]["resourceVersion"], PODS.plural)
                break
            except ApiError as exc:
                if exc.code != 409:
                    raise
                fresh = self.store.get(PODS.key, namespace, name)
                if fresh is None or fresh["metadata"].get("uid") != uid:
                    raise not_found(PODS.plural, name) from exc
                pod = fresh
        if self.deletion == "timer":
            delay = grace if self.grace_cap is None else min(float(grace), self.grace_cap)
            timer = threading.Timer(delay, self._expire, (namespace, name, uid))
            timer.daemon = True
            with self._timers_lock:
                self._timers.append(timer)
            timer.start()
        return pod

    def _expire(self, namespace: str, name: str, uid: str) -> None:
        pod = self.store.get(PODS.key, namespace, name)
        if pod is not None and pod["metadata"].get("uid") == uid:
            with contextlib.suppress(ApiError):  # removed meanwhile by the kubelet
                self.store.remove(PODS.key, namespace, name, None, PODS.plural)

    def bind(self, namespace: str, name: str, body: Any, user: User, dry_run: bool = False) -> Obj:
        """POST pods/binding: admission sees the Binding; then the pod gets the node and the annotations."""
        binding = strategy.decode(PODS, body, namespace, "binding")
        if strategy.meta(binding).get("name") not in (None, "", name):
            raise bad_request("the name in the Binding object does not match the pod name on the URL")
        strategy.meta(binding)["name"] = name
        target = binding.get("target") or {}
        node = target.get("name")
        if not node or target.get("kind") not in (None, "", "Node"):
            raise ApiError(422, f'Binding "{name}" is invalid: target.name: Required value: the node to bind to')
        attrs = Attributes(PODS, "CREATE", namespace, name, binding, None, user, subresource="binding",
                           warnings=self._sink(),
                           kind="Binding", dry_run=dry_run, options=_options("CreateOptions", dry_run))
        binding = self.chain.admit(attrs) or binding
        attrs.obj = binding
        self.chain.validate(attrs)
        annotations = dict(strategy.meta(binding).get("annotations") or {})
        for _ in range(RETRIES):
            pod = self.store.get(PODS.key, namespace, name)
            if pod is None:
                raise not_found(PODS.plural, name)
            if pod["metadata"].get("deletionTimestamp"):
                raise conflict(PODS.plural, name, f"pod {name} is being deleted, cannot be assigned to a host")
            if (pod.get("spec") or {}).get("nodeName"):
                raise conflict(PODS.plural, name, f"pod {name} is already assigned to node "
                               f'"{pod["spec"]["nodeName"]}"')
            bound = copy.deepcopy(pod)
            bound.setdefault("spec", {})["nodeName"] = node
            if annotations:
                bound["metadata"].setdefault("annotations", {}).update(annotations)
            conditions = bound.setdefault("status", {}).setdefault("conditions", [])
            conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": strategy.now()})
            if dry_run:
                return bound
            try:
                return self.store.replace(PODS.key, bound, pod["metadata"]["resourceVersion"], PODS.plural)
            except ApiError as exc:
                if exc.code != 409:
                    raise
        raise conflict(PODS.plural, name, "too many concurrent writes while binding; try again")
