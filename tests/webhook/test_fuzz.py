"""A bounded fuzz run of the webhook's input surface: 0 crashes in the pure functions, 0 HTTP 500s, 0 hangs.

Every body is parsed as the view parses it; a MalformedReview (a 400) is a fine answer, any other exception from
parse_review, mutate, mutate_update or validate is a crash. GPUSHARE_FUZZ_CASES (tests/harness/fuzzing.py) raises
the number of cases per property.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import Contract, ProtocolError, parse_allocation, parse_assigned, parse_assignment, parse_intent
from tests.harness.fuzzing import CASES, RESERVED, annotation_values, fuzzed_bodies
from tests.harness.pods import EXTENDER, KEY, PLUGIN, container, counter, pod, review, stamped
from tests.harness.webhook.server import HOST, RunningWebhook, webhook_server
from webhook.rules.mutate import mutate, mutate_update
from webhook.rules.review import MalformedReview, Request, parse_review, username
from webhook.rules.validate import validate
from webhook.server.settings import settings_from

pytestmark = pytest.mark.timeout(300)
LIMIT = 1 << 20
SETTINGS = {mode: settings_from({"GPUSHARE_DELIVERY": mode}) for mode in ("env", "cdi")}
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def decide(req: Request, mode: str) -> None:
    """What the views do with a parsed request; an exception here is a crash."""
    s = SETTINGS[mode]
    if req["operation"] == "UPDATE" and req["oldObject"] is not None:
        mutate_update(req["oldObject"], req["object"], s.contract)
    else:
        mutate(req["object"], req["namespace"], s.contract, KEY, counter(), other_gpu=s.other_gpu_resources)
    validate(req["operation"], req["oldObject"], req["object"], username(req), req["namespace"], s, KEY.public_key())


def parse_or_refuse(body: bytes) -> Request | None:
    try:
        return parse_review(body, LIMIT)
    except MalformedReview:
        return None


@FUZZ
@given(body=fuzzed_bodies, mode=st.sampled_from(["env", "cdi"]))
def test_review_bodies_never_crash_the_pure_functions(body: bytes, mode: str) -> None:
    req = parse_or_refuse(body)
    if req is not None:
        decide(req, mode)


GPU_POD = pod(container("main", 2), container("side", 1), container("cpu"), inits=[container("load", 1)])
STAMPED = stamped(GPU_POD)


@FUZZ
@given(values=st.dictionaries(st.sampled_from(RESERVED), annotation_values, min_size=1),
       user=st.sampled_from([EXTENDER, PLUGIN, "alice"]), bound=st.booleans(), mode=st.sampled_from(["env", "cdi"]))
def test_annotation_values_of_every_reserved_key(values: dict[str, str], user: str, bound: bool, mode: str) -> None:
    new = json.loads(json.dumps(STAMPED))
    new["metadata"]["annotations"].update(values)
    if bound:
        new["spec"]["nodeName"] = "node-1"
    for old, operation in ((STAMPED, "UPDATE"), (None, "CREATE")):
        doc = review(operation, new, old, user=user)
        req = parse_or_refuse(json.dumps(doc).encode())
        if req is not None:
            decide(req, mode)
    annotations = new["metadata"]["annotations"]
    contract = Contract()
    for parse, key in ((parse_intent, contract.intent_key), (parse_allocation, contract.allocation_key)):
        if key in values:
            with suppress(ProtocolError):
                parse(annotations[key], key)
    for reader in (parse_assignment, parse_assigned):
        with suppress(ProtocolError):
            reader(annotations)


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("fuzz"), {"GPUSHARE_MAX_BODY_BYTES": str(LIMIT),
                                                          "GPUSHARE_LOG_LEVEL": "ERROR"}) as running:
        yield running


class Client:
    """One kept-alive connection, as the API server holds; reopened after the server closes it (a 400)."""

    def __init__(self, hook: RunningWebhook) -> None:
        self.hook = hook
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.conn is None:
            # A hang is an answer that does not come within this bound.
            self.conn = http.client.HTTPSConnection(HOST, self.hook.port, context=self.hook.ssl_context(), timeout=10)
        try:
            self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            res = self.conn.getresponse()
            return res.status, res.read()
        finally:
            if self.conn.sock is None:
                self.conn = None


def test_the_real_server_answers_every_fuzzed_body(hook: RunningWebhook) -> None:
    client = Client(hook)
    statuses: dict[int, int] = {}
    problems: list[str] = []

    @settings(max_examples=max(CASES * 2, 300), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=fuzzed_bodies, path=st.sampled_from(["/mutate", "/validate"]))
    def post(body: bytes, path: str) -> None:
        status, answer = client.post(path, body)
        statuses[status] = statuses.get(status, 0) + 1
        if status not in (200, 400):
            problems.append(f"{path} answered {status}: {answer[:200]!r}")
        elif status == 200:
            response: dict[str, Any] = json.loads(answer)["response"]
            if response.get("status", {}).get("code") == 500:
                problems.append(f"{path} denied with an internal error: {response['status']['message']}")

    post()
    assert not problems, problems[:5]
    assert sum(statuses.values()) >= 300
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0


