"""The install tier: a cluster of the real-cluster tier without gpushare's host processes, where the chart is
installed as users install it (e2e.install). It runs after tests/e2e, in a pytest run of its own (`./dev e2e`), so
the two never hold the node at once; collected and skipped as tests/e2e is.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.cluster import Cluster
from e2e.settings import requested
from tests.e2e.conftest import kubectl, namespace, needs_extender, running_cluster  # noqa: F401  (the same fixtures)

if not requested():
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    yield from running_cluster("install tier", host_gpushare=False)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.timeout(900))
