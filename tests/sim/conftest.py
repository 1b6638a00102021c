"""Fixtures of the admission-chain tests: a scriptable HTTPS webhook behind the test API server.

Modules that need another `api` or `hook` (the real webhook, no webhook at all) define their own, which
take precedence over these.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.fakehook import FakeWebhook
from tests.harness.apiserver.server import ApiServer
from tests.harness.tls import Authority

SERVICE = ("gpushare-system", "gpushare-webhook", 443)


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority("webhook-test-ca")


@pytest.fixture
def hook(authority: Authority) -> Iterator[FakeWebhook]:
    with FakeWebhook(authority) as running:
        yield running


@pytest.fixture
def api(hook: FakeWebhook) -> Iterator[ApiServer]:
    with ApiServer(deletion="immediate") as server:
        server.add_service(*SERVICE, hook.url)
        yield server


@pytest.fixture
def admin(api: ApiServer) -> SimClient:
    return api.client()
