"""A test API server holding the golden cluster (tests/harness/kubectl_fixtures.py) as real objects, and users.

Each pod is labelled app=<its name> and team=<its namespace>, for `-l`."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from tests.harness import kubectl_fixtures as f
from tests.harness.apiserver.auth import User
from tests.harness.apiserver.resources import Resource
from tests.harness.apiserver.server import ApiServer


def deny_bob(who: User, verb: str, res: Resource, subresource: str, namespace: str, name: str) -> str | None:
    """bob may read pods and events of namespace `ml` and nothing else (the shape of a tenant's RoleBinding)."""
    if who.username != "bob" or (res.plural in ("pods", "events") and namespace == "ml"):
        return None
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    return f'{res.plural} is forbidden: User "bob" cannot {verb} resource "{res.plural}" in API group ""{where}'


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    """The golden cluster's nodes, pods (with their status) and plugin Events, stored by the API server; the
    Events name the uids the server gave the pods."""
    with ApiServer(deletion="immediate", authorize=deny_bob) as server:
        admin = server.client()
        nodes, pods, events = f.golden_cluster()
        for node in nodes:
            admin.create("nodes", node)
        uids = {}
        for pod in pods:
            namespace = pod["metadata"]["namespace"]
            server.add_namespace(namespace)
            body = copy.deepcopy({k: v for k, v in pod.items() if k != "status"})
            del body["metadata"]["uid"]
            body["metadata"]["labels"] = {"app": body["metadata"]["name"], "team": namespace}  # for -l
            made = admin.create("pods", body, namespace)
            uids[pod["metadata"]["uid"]] = made["metadata"]["uid"]
            if pod["status"] != {"phase": "Pending"}:
                admin.patch("pods", made["metadata"]["name"], {"status": pod["status"]}, namespace,
                            subresource="status")
        for event in events:
            stored = copy.deepcopy(event)
            stored["involvedObject"]["uid"] = uids[event["involvedObject"]["uid"]]
            admin.create_event(stored["metadata"]["namespace"], stored)
        yield server
