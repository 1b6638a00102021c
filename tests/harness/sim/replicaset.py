"""A ReplicaSet stand-in: keeps N pods of a generateName group alive, creating replacements concurrently."""

from __future__ import annotations

import copy
import logging
import threading
from concurrent import futures
from typing import Any

from tests.harness.apiserver.ports import ApiError, Pod, PodApi

log = logging.getLogger(__name__)

RS_USER = "system:serviceaccount:kube-system:replicaset-controller"
GROUP_LABEL = "sim.gpushare.io/group"
# How long a creation that met a server error waits before the group is reconciled again.
RETRY_S = 0.2


def _active(pod: Pod) -> bool:
    """What the ReplicaSet controller counts: not being deleted, not finished."""
    meta = pod.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class ReplicaSet:
    """Watches its group by label; whenever fewer than `replicas` are active, creates the difference at once."""

    def __init__(self, api: PodApi, namespace: str, name: str, replicas: int, template: Pod,
                 *, creators: int = 8) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.replicas = replicas
        self.template = template
        self.created: list[str] = []
        self.errors: list[str] = []  # refusals of the template: final, and read by the tests
        self.retried: list[str] = []  # server errors the creation was retried after
        self._lock = threading.Condition()
        self._pods: dict[str, Pod] = {}
        self._creating = 0
        self._closed = threading.Event()
        self._pool = futures.ThreadPoolExecutor(max_workers=creators, thread_name_prefix=f"sim-rs-{name}")
        self._thread = threading.Thread(target=self._loop, name=f"sim-rs-{name}", daemon=True)

    @property
    def selector(self) -> str:
        return f"{GROUP_LABEL}={self.name}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def active(self) -> list[Pod]:
        with self._lock:
            return [p for p in self._pods.values() if _active(p)]

    def settled(self) -> bool:
        """No creation in flight and the group at its size (or its template refused by admission)."""
        with self._lock:
            active = len([p for p in self._pods.values() if _active(p)])
            return self._creating == 0 and (active == self.replicas or bool(self.errors))

    def _pod_body(self) -> Pod:
        body = copy.deepcopy(self.template)
        meta: dict[str, Any] = body.setdefault("metadata", {})
        meta.pop("name", None)
        meta["generateName"] = f"{self.name}-"
        meta.setdefault("labels", {})[GROUP_LABEL] = self.name
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": self.name,
                                    "uid": f"rs-{self.name}", "controller": True}]
        return body

    def _create(self) -> None:
        retry = False
        try:
            pod = self.api.create_pod(self.namespace, self._pod_body())
            with self._lock:
                self.created.append(pod["metadata"]["name"])
                self._pods.setdefault(pod["metadata"]["uid"], pod)
        except ApiError as exc:
            # A refusal (4xx: admission denied the template) is final; a server error or a timeout (a webhook call
            # that failed under load) is retried, as the real controller requeues a failed creation with backoff
            # (k8s.io/kubernetes pkg/controller/replicaset/replica_set.go, manageReplicas / syncReplicaSet).
            retry = exc.code >= 500 or exc.code in (408, 429)
            log.info("replicaset %s: creating a pod failed%s: %s", self.name, "; retrying" if retry else "",
                     exc.message)
            with self._lock:
                (self.retried if retry else self.errors).append(exc.message)
        finally:
            with self._lock:
                self._creating -= 1
                self._lock.notify_all()
        if retry and not self._closed.wait(RETRY_S):
            self._reconcile()

    def _reconcile(self) -> None:
        with self._lock:
            if self.errors:  # a refused template is not retried in a loop; the test reads the error
                return
            missing = self.replicas - len([p for p in self._pods.values() if _active(p)]) - self._creating
            self._creating += max(missing, 0)
        for _ in range(max(missing, 0)):
            self._pool.submit(self._create)

    def _loop(self) -> None:
        version = ""
        while not self._closed.is_set():
            try:
                if not version:
                    pods, version = self.api.list_pods(label_selector=self.selector)
                    with self._lock:
                        self._pods = {p["metadata"]["uid"]: p for p in pods}
                    self._reconcile()
                for kind, pod in self.api.watch_pods(version, label_selector=self.selector, timeout_s=0.5):
                    version = pod["metadata"].get("resourceVersion", version)
                    with self._lock:
                        if kind == "DELETED":
                            self._pods.pop(pod["metadata"]["uid"], None)
                        else:
                            self._pods[pod["metadata"]["uid"]] = pod
                    self._reconcile()
            except ApiError as exc:
                if exc.code == 410:
                    version = ""
                self._closed.wait(0.1)
            except Exception:  # keep reconciling through a flaky server
                log.exception("replicaset %s: watch failed; retrying", self.name)
                self._closed.wait(0.1)
