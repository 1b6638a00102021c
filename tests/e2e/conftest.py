"""The real-cluster tier's fixtures: one cluster per run, a namespace per test, the delivery mode per test.

Collected only when `./dev e2e` asks for the tier (GPUSHARE_E2E=1); where Go, root or cgroups are missing,
every test is skipped with one line that names what is missing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from e2e import toolchain
from e2e.cluster import TENANT, Cluster
from e2e.kube import Kubectl
from e2e.settings import E2eSettings, from_environ, requested
from e2e.toolchain import Toolchain

if not requested():
    collect_ignore_glob = ["test_*.py"]


def running_cluster(tier: str, host_gpushare: bool = True,
                    make: Callable[[E2eSettings, Toolchain], Cluster] = Cluster) -> Iterator[Cluster]:
    """A cluster for the whole run, or the skip with the line naming what is missing (tests/install uses it too,
    with a `make` that gives the cluster the release's image and chart)."""
    missing = toolchain.check()
    if missing:
        pytest.skip(f"{tier} skipped: " + "; ".join(missing))
    settings = from_environ()
    built = toolchain.ensure(settings)
    running = make(settings, built)
    running.up(host_gpushare=host_gpushare)
    try:
        yield running
    finally:
        running.down()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    yield from running_cluster("real-cluster tier")


@pytest.fixture(scope="session", params=["env", "cdi"])
def delivery(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    mode: str = request.param
    if cluster.delivery != mode:
        cluster.use_delivery(mode)
    return mode


@pytest.fixture(scope="session")
def needs_extender(cluster: Cluster) -> None:
    """GPU-share pods are placed by the reference scheduler extender, built from its sources; without them the
    scheduler cannot place such pods, and a test that needs it is skipped with the line that names what is missing."""
    if not cluster.has_extender:
        pytest.skip(toolchain.reference_missing(cluster.settings) or "the reference extender is not running")


@pytest.fixture
def kubectl(cluster: Cluster) -> Kubectl:
    return cluster.kubectl()


@pytest.fixture
def namespace(cluster: Cluster, kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace where the ordinary user may do what a tenant with `edit` may do."""
    name = "e2e-" + uuid.uuid4().hex[:8]
    kubectl.ok(["create", "namespace", name])
    kubectl.ok(["create", "rolebinding", "tenant-edit", "-n", name, "--clusterrole=edit", f"--user={TENANT}"])
    cluster.procs.wait_ready("kube-controller-manager", lambda: cluster.has("serviceaccount", "default", name), 60,
                             f"the default ServiceAccount of namespace {name}")
    yield name
    kubectl.run(["delete", "namespace", name, "--wait=false"])
    kubectl.run(["delete", "pods", "--all", "-n", name, "--grace-period=0", "--force"], timeout=60)


# Modules that reinstall gpushare on the running cluster (cert-manager in place of `gpushare-certs install`) run
# after every other test, so the rest of the tier always sees the install the cluster started with; the audit of the
# extender's writes runs last of all, over the whole run.
LAST = ("test_cert_manager.py", "test_extender_writes.py")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The cluster's start-up and a scenario with pulls of several seconds take minutes, not the unit tier's 120 s.
    for item in items:
        item.add_marker(pytest.mark.timeout(900))
    items.sort(key=lambda item: LAST.index(item.path.name) + 1 if item.path.name in LAST else 0)
