"""A signing key that becomes unreadable after the webhook started: ordinary pods, which need no signature, are
still admitted through the fail-open entries; GPU-share pods are refused with the key file and the fix; readiness
says why."""

from __future__ import annotations

import base64
import datetime
import json
import shutil
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask import Flask

from certs.build import dev_bundle
from certs.cli import write_files
from contract import DEV, IDX, POD
from tests.harness.pods import EXTENDER, KEY, container, counter, pod, review, stamped
from tests.webhook.server.test_app import post, settings_for
from webhook.server.app import create_app

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture
def lost(tmp_path: Path) -> tuple[Flask, Path]:
    """A webhook started with its signing key in place, which is gone before the first review."""
    write_files(tmp_path, dev_bundle(NOW))
    app = create_app(settings_for(tmp_path), new_id=counter(), clock=lambda: NOW)
    key = tmp_path / "signing.key"
    shutil.move(key, tmp_path / "elsewhere.key")
    return app, key


def patched(spec: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(spec, json.loads(base64.b64decode(answer["response"]["patch"])))
    return out


def test_an_ordinary_pod_is_still_neutralised_and_allowed(lost: tuple[Flask, Path]) -> None:
    app, _ = lost
    spec = pod(container("web"), container("tool", env=[{"name": "PATH", "value": "/bin"}]))
    with app.test_client() as c:
        status, answer = post(c, "/mutate", review("CREATE", spec, uid="u-plain"))
        assert (status, answer["response"]["uid"], answer["response"]["allowed"]) == (200, "u-plain", True)
        out = patched(spec, answer)
        assert [e for e in out["spec"]["containers"][0]["env"]] == [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                       "value": "void"}]
        status, verdict = post(c, "/validate", review("CREATE", out, uid="u-plain-2"))
        assert (status, verdict["response"]) == (200, {"uid": "u-plain-2", "allowed": True})


def test_an_update_needs_no_key(lost: tuple[Flask, Path]) -> None:
    app, _ = lost
    gpu = stamped(pod(container("a", 2)))
    placed = json.loads(json.dumps(gpu))
    placed["metadata"]["annotations"].update({IDX: "0", DEV: "8", POD: "2"})
    with app.test_client() as c:
        _, verdict = post(c, "/validate", review("UPDATE", placed, old=gpu, user=EXTENDER))
    assert verdict["response"]["allowed"] is True


def test_a_gpu_share_pod_is_refused_with_the_key_file_and_the_fix(lost: tuple[Flask, Path]) -> None:
    app, key = lost
    with app.test_client() as c:
        _, answer = post(c, "/mutate", review("CREATE", pod(container("a", 2)), uid="u-gpu"))
        # Stamped by another replica that still reads the key: not "forged", the key is what is missing here.
        _, verdict = post(c, "/validate", review("CREATE", stamped(pod(container("a", 2)), key=KEY), uid="u-v"))
        ready = c.get("/readyz")
    for response in (answer["response"], verdict["response"]):
        assert response["allowed"] is False
        message = response["status"]["message"]
        assert f"the signing key {key} cannot be read" in message, message
        assert "gpushare-signing-key Secret" in message and "GPUSHARE_SIGNING_KEY" in message
        assert "internal error" not in message and "does not verify" not in message
    assert answer["response"]["status"]["message"].startswith(
        "The gpushare webhook cannot stamp GPU-share pod ml/job-0")
    assert ready.status_code == 503 and f"the signing key {key} cannot be read" in ready.get_data(as_text=True)


def test_the_key_put_back_is_used_again(lost: tuple[Flask, Path]) -> None:
    app, key = lost
    shutil.move(key.parent / "elsewhere.key", key)
    with app.test_client() as c:
        _, answer = post(c, "/mutate", review("CREATE", pod(container("a", 2))))
        assert answer["response"]["allowed"] is True
        assert c.get("/readyz").status_code == 200
