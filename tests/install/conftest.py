"""The install tier: a cluster of the real-cluster tier without gpushare's host processes, where the release's
artifacts are installed as users install them (e2e.install): `./dev release --allow-dirty` of the working tree
(tests/harness/realtier/releases.py), its OCI archive served by the tier's registry, its packaged chart given to
`helm install`. It runs after tests/e2e, in a pytest run of its own (`./dev e2e`), so the two never hold the node
at once; collected and skipped as tests/e2e is.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e import toolchain
from e2e.cluster import Cluster
from e2e.settings import from_environ, requested
from tests.e2e.conftest import kubectl, namespace, needs_extender, running_cluster  # noqa: F401  (the same fixtures)
from tests.harness.realtier import releases as built

if not requested():
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def releases() -> built.Releases:
    """The working tree's release and the previous one, built before the cluster starts: its registry serves both."""
    missing = toolchain.check()
    if missing:
        pytest.skip("install tier skipped: " + "; ".join(missing))
    return built.releases(from_environ())


@pytest.fixture(scope="session")
def cluster(releases: built.Releases) -> Iterator[Cluster]:
    yield from running_cluster("install tier", host_gpushare=False, make=releases.cluster)


@pytest.fixture(autouse=True)
def cluster_processes_stay_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, every process of the cluster still runs: a test that ends one (kube-proxy exits when its
    Node is deleted) fails itself, not the tests after it that find a Service unrouted."""
    yield
    cluster = request.node.funcargs.get("cluster")
    if isinstance(cluster, Cluster):
        exited = cluster.procs.exited()
        assert not exited, f"cluster processes ended during this test: {exited}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.timeout(900))
