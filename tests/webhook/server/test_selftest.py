"""gpushare-webhook-selftest (what `helm test` runs) against an HTTPS server on 127.0.0.1 that answers as the API
server does to a dry-run pod creation: the request it sends, and its verdict on each answer."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.settings import contract_from
from tests.harness.tls import Authority, server_context
from webhook.server import selftest

CONTRACT = contract_from({})
STAMPED = {"metadata": {"name": "gpushare-selftest", "annotations": {"gpushare.io/intent": '{"version":1}'}}}


class _ApiServer(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, bytes] = (201, b"{}")
    seen: list[tuple[str, dict[str, str], Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, dict(self.headers), body))
        status, text = type(self).answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[selftest.SelfTest, Path]]:
    authority = Authority()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    server.socket = server_context(authority.issue(["localhost"], ["127.0.0.1"])).wrap_socket(
        server.socket, server_side=True)
    account = tmp_path / "account"
    account.mkdir()
    (account / "token").write_text("the-token\n")
    (account / "ca.crt").write_bytes(authority.cert_pem)
    _ApiServer.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield selftest.SelfTest("127.0.0.1", server.server_address[1], CONTRACT), account
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_it_asks_for_a_dry_run_of_a_gpu_share_pod_with_the_accounts_token(api: tuple[selftest.SelfTest, Path]) -> None:
    settings, account = api
    _ApiServer.answer = (201, json.dumps(STAMPED).encode())
    said = selftest.run(settings, "default", "gpushare:0.1.0", account)
    assert said.startswith("The API server admitted the GPU-share pod default/gpushare-selftest"), said
    ((path, headers, body),) = _ApiServer.seen
    assert path == "/api/v1/namespaces/default/pods?dryRun=All&fieldManager=gpushare-selftest"
    assert headers["Authorization"] == "Bearer the-token"
    assert body["spec"]["containers"][0]["resources"]["limits"] == {"aliyun.com/gpu-mem": "1"}
    assert body["spec"]["containers"][0]["image"] == "gpushare:0.1.0"


@pytest.mark.parametrize(("status", "answer", "said"), [
    (201, {"metadata": {"annotations": {}}}, "without gpushare.io/intent: the mutating webhook was not called"),
    (403, {"kind": "Status", "message": 'admission webhook "mutate.gpushare.io" denied the request: no'},
     'did not admit the GPU-share pod default/gpushare-selftest (HTTP 403): admission webhook "mutate.gpushare.io"'),
    (500, {"kind": "Status", "message": "failed calling webhook: context deadline exceeded"},
     "(HTTP 500): failed calling webhook"),
])
def test_an_answer_without_the_stamp_fails_saying_what_to_check(
    api: tuple[selftest.SelfTest, Path], status: int, answer: dict[str, Any], said: str,
) -> None:
    settings, account = api
    _ApiServer.answer = (status, json.dumps(answer).encode())
    with pytest.raises(selftest.SelfTestError) as caught:
        selftest.run(settings, "default", "gpushare:0.1.0", account)
    assert said in str(caught.value), caught.value
    assert "Check" in str(caught.value)


def test_an_unreachable_api_server_and_a_missing_token_are_named(tmp_path: Path) -> None:
    with pytest.raises(selftest.SelfTestError, match="ServiceAccount token or CA is missing"):
        selftest.run(selftest.SelfTest("127.0.0.1", 1, CONTRACT), "default", "x", tmp_path)


@pytest.mark.parametrize(("env", "message"), [
    ({}, "KUBERNETES_SERVICE_HOST is not set"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "https"}, "is not a port number"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "GPUSHARE_ANNOTATION_PREFIX": "no slash"}, "shared settings"),
])
def test_bad_settings_are_one_sentence(env: dict[str, str], message: str) -> None:
    with pytest.raises(selftest.SelfTestError, match=message):
        selftest.settings_from(env)


def test_main_prints_the_reason_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert selftest.main(["--image", "x"], {}) == 1
    assert capsys.readouterr().out.startswith("KUBERNETES_SERVICE_HOST is not set")
