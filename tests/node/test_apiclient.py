"""The API-server client both node programs build on: credentials that fail in one sentence, API classes, and
requests bounded by the call they serve."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from node import deadline
from node.apiclient import ApiServerError, KubeClient
from tests.harness.apiserver.kube_http import write_kubeconfig


def test_missing_credentials_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ApiServerError, match=r"GPUSHARE_KUBECONFIG=.* gives no API server credentials"):
        KubeClient(str(tmp_path / "absent"), timeout=1)


@pytest.mark.parametrize(("name", "found"), [("CoreV1Api", True), ("NoSuchV9Api", False)])
def test_an_api_class_the_client_lacks_says_what_to_install(tmp_path: Path, name: str, found: bool) -> None:
    client = KubeClient(write_kubeconfig(tmp_path / "kubeconfig", 1), timeout=1)
    try:
        if found:
            assert client.api(name, "install it") is not None
        else:
            with pytest.raises(ApiServerError, match=f"this kubernetes client has no {name}; install it"):
                client.api(name, "install it")
    finally:
        client.close()


def test_a_request_never_outlives_its_call(tmp_path: Path) -> None:
    api = KubeClient(write_kubeconfig(tmp_path / "kubeconfig", 1), timeout=5)
    seen: list[float] = []

    def method(*args: Any, _request_timeout: float, **kwargs: Any) -> str:
        seen.append(_request_timeout)
        return "answer"

    try:
        assert api.call("read a pod", method) == "answer"
        assert deadline.run_until(time.monotonic() + 2, lambda: api.call("read a pod", method)) == "answer"
        with pytest.raises(ApiServerError, match="could not read a pod: the kubelet call it serves has run out"):
            deadline.run_until(time.monotonic() - 1, lambda: api.call("read a pod", method))
    finally:
        api.close()
    assert seen[0] == 5 and 0 < seen[1] <= 2 and len(seen) == 2
