"""The Flask views: reviews in and out, 400 for malformed bodies, a well-formed denial for internal errors."""

from __future__ import annotations

import base64
import datetime
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient

from certs.build import dev_bundle
from certs.cli import write_files
from contract import IDX
from tests.harness.cases.plugin_cases import ALLOCATED_POD, ASSIGNED_POD, binding
from tests.harness.pods import EXTENDER, NODE, PLUGIN, container, counter, pod, review
from webhook.server.app import create_app
from webhook.server.settings import Settings, settings_from

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    write_files(out, dev_bundle(NOW))
    return out


def settings_for(cert_dir: Path, **extra: str) -> Settings:
    return settings_from({
        "GPUSHARE_TLS_CERT": str(cert_dir / "tls.crt"),
        "GPUSHARE_TLS_KEY": str(cert_dir / "tls.key"),
        "GPUSHARE_SIGNING_KEY": str(cert_dir / "signing.key"),
        "GPUSHARE_MAX_BODY_BYTES": "65536",
        **extra,
    })


@pytest.fixture
def client(cert_dir: Path) -> Iterator[FlaskClient]:
    app = create_app(settings_for(cert_dir), new_id=counter(), clock=lambda: NOW)
    with app.test_client() as c:
        yield c


def post(client: FlaskClient, path: str, doc: Any) -> tuple[int, Any]:
    res = client.post(path, data=json.dumps(doc), content_type="application/json")
    return res.status_code, res.get_json(silent=True) if res.is_json else res.get_data(as_text=True)


def test_mutate_then_validate_a_gpu_pod(client: FlaskClient) -> None:
    spec = pod(container("a", 2), name=None)
    status, answer = post(client, "/mutate", review("CREATE", spec, uid="u-42"))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u-42"
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(spec, json.loads(base64.b64decode(answer["response"]["patch"])))
    status, verdict = post(client, "/validate", review("CREATE", patched, uid="u-43"))
    assert (status, verdict["response"]) == (200, {"uid": "u-43", "allowed": True})
    assigned = json.loads(json.dumps(patched))
    assigned["metadata"]["annotations"].update({IDX: "0", "ALIYUN_COM_GPU_MEM_DEV": "8", "ALIYUN_COM_GPU_MEM_POD": "2"})
    status, verdict = post(client, "/validate", review("UPDATE", assigned, old=patched, user=EXTENDER))
    assert verdict["response"]["allowed"] is True
    status, verdict = post(client, "/validate", review("UPDATE", assigned, old=patched, user="mallory"))
    assert verdict["response"]["allowed"] is False
    assert verdict["response"]["status"]["code"] == 403
    assert f"Annotation {IDX} was added by mallory" in verdict["response"]["status"]["message"]


def test_pod_without_gpu_gets_only_the_void_env(client: FlaskClient) -> None:
    spec = pod(container("a"))
    status, answer = post(client, "/mutate", review("CREATE", spec))
    assert status == 200
    assert answer["response"]["allowed"] is True
    patched = jsonpatch.apply_patch(spec, json.loads(base64.b64decode(answer["response"]["patch"])))
    assert patched["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert "annotations" not in patched["metadata"]


def test_pod_without_gpu_in_cdi_mode_gets_no_patch(cert_dir: Path) -> None:
    app = create_app(settings_for(cert_dir, GPUSHARE_DELIVERY="cdi"), new_id=counter())
    with app.test_client() as c:
        status, answer = post(c, "/mutate", review("CREATE", pod(container("a"))))
    assert (status, answer["response"]) == (200, {"uid": "uid-1", "allowed": True})


def test_added_ephemeral_container_is_neutralised(client: FlaskClient) -> None:
    old = pod(container("a"))
    new = json.loads(json.dumps(old))
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "cuda:12"}]
    req = review("UPDATE", new, old)
    req["request"]["subResource"] = "ephemeralcontainers"
    _, answer = post(client, "/mutate", req)
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert ops == [{"op": "add", "path": "/spec/ephemeralContainers/0/env",
                    "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"nope", "not JSON"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "answers only admission.k8s.io/v1"),
        (json.dumps(review("CREATE", pod())).replace('"uid-1"', '""').encode(), "has no uid"),
        (b"x" * 70000, "over the 65536-byte limit"),
        (json.dumps(review("CREATE", {"spec": {"containers": {"a": {}}}})).encode(), "spec.containers is dict"),
        (b"[" * 30000 + b"]" * 30000, "nests deeper than"),
    ],
)
def test_malformed_bodies_get_400_with_one_line(client: FlaskClient, path: str, raw: bytes, fragment: str) -> None:
    res = client.post(path, data=raw, content_type="application/json")
    assert res.status_code == 400
    text = res.get_data(as_text=True)
    assert fragment in text
    assert text.count("\n") == 1
    assert "Traceback" not in text


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_internal_error_is_still_a_well_formed_denial(
    cert_dir: Path, path: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("id source exhausted")

    # /mutate fails on the id source, /validate on a rule that breaks (a signing key that cannot be read is no
    # internal error: tests/webhook/server/test_lost_key.py).
    monkeypatch.setattr("webhook.server.app.validate", broken)
    app = create_app(settings_for(cert_dir), new_id=broken)
    with app.test_client() as c, caplog.at_level(logging.ERROR):
        status, answer = post(c, path, review("CREATE", pod(container("a", 2)), uid="u-err"))
    assert status == 200
    assert answer["response"]["uid"] == "u-err"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 500
    assert "because of an internal error" in answer["response"]["status"]["message"]
    assert "ml/job-0 uid=u-err" in caplog.text


def test_admission_log_lines_name_the_pod_and_uid(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="webhook.server.app"):
        post(client, "/mutate", review("CREATE", pod(container("a", 1), name=None), uid="u-log"))
    assert "mutate ml/job-<generated> uid=u-log CREATE ops=2" in caplog.text


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").get_data(as_text=True) == "ok\n"


@pytest.mark.parametrize(
    ("env", "open_", "header"),
    [
        ({"GPUSHARE_BIND": "0.0.0.0:8443"}, True, "any"),
        ({"GPUSHARE_BIND": "0.0.0.0:8443", "GPUSHARE_ADMISSION_SOURCES": "10.0.0.10/32"}, False, "10.0.0.10/32"),
        ({"GPUSHARE_BIND": "127.0.0.1:8443"}, False, "any"),  # nothing else reaches loopback
    ],
)
def test_readiness_says_who_may_connect_to_the_admission_port(cert_dir: Path, env: dict[str, str], open_: bool,
                                                              header: str) -> None:
    res = create_app(settings_for(cert_dir, **env)).test_client().get("/readyz")
    assert res.status_code == 200
    assert res.headers["X-Admission-Sources"] == header
    said = res.get_data(as_text=True)
    assert ("every source may connect" in said and "GPUSHARE_ADMISSION_SOURCES" in said) is open_
    assert said.startswith("ok")


EXPIRES = NOW + datetime.timedelta(days=365)  # dev_bundle's serving certificate lasts a year


@pytest.mark.parametrize(
    ("now", "status", "warned"),
    [
        (NOW + datetime.timedelta(days=1), 200, False),
        (EXPIRES - datetime.timedelta(days=10), 200, True),
        (EXPIRES + datetime.timedelta(seconds=1), 503, False),
    ],
)
def test_readiness_follows_the_serving_certificate_expiry(
    cert_dir: Path, caplog: pytest.LogCaptureFixture, now: datetime.datetime, status: int, warned: bool
) -> None:
    app = create_app(settings_for(cert_dir), clock=lambda: now)
    with app.test_client() as c, caplog.at_level(logging.WARNING, logger="webhook.server.app"):
        first, second = c.get("/readyz"), c.get("/readyz")
    assert first.status_code == second.status_code == status
    assert first.headers["X-Serving-Certificate-Expires"].startswith(f"{EXPIRES:%Y-%m-%dT%H}")
    assert caplog.text.count("expires at") == (1 if warned else 0)  # once per certificate, not per probe
    if status == 503:
        assert "expired at" in first.get_data(as_text=True)
        assert "gpushare-certs rotate" in first.get_data(as_text=True)


def test_not_ready_when_the_key_does_not_match_the_certificate(cert_dir: Path, tmp_path: Path) -> None:
    other = dev_bundle(NOW)
    for name in ("tls.crt", "signing.key"):
        (tmp_path / name).write_bytes((cert_dir / name).read_bytes())
    (tmp_path / "tls.key").write_bytes(other["tls.key"])
    res = create_app(settings_for(tmp_path), clock=lambda: NOW).test_client().get("/readyz")
    assert res.status_code == 503
    assert "cannot be loaded" in res.get_data(as_text=True)


@pytest.mark.parametrize(
    ("missing", "fragment"),
    [("signing.key", "the signing key"), ("tls.crt", "the TLS certificate")],
)
def test_not_ready_without_key_or_certificate(cert_dir: Path, tmp_path: Path, missing: str, fragment: str) -> None:
    for name in ("tls.crt", "tls.key", "signing.key"):
        if name != missing:
            (tmp_path / name).write_bytes((cert_dir / name).read_bytes())
    app = create_app(settings_for(tmp_path), clock=lambda: NOW)
    res = app.test_client().get("/readyz")
    assert res.status_code == 503
    assert fragment in res.get_data(as_text=True)
    # A key mounted later is picked up without a restart.
    (tmp_path / missing).write_bytes((cert_dir / missing).read_bytes())
    assert app.test_client().get("/readyz").status_code == 200


def test_mutate_without_signing_key_denies_with_the_reason(tmp_path: Path) -> None:
    app = create_app(settings_for(tmp_path), clock=lambda: NOW)
    status, answer = post(app.test_client(), "/mutate", review("CREATE", pod(container("a", 1))))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert "GPUSHARE_SIGNING_KEY" in answer["response"]["status"]["message"]


def plugin_review(old: Any, new: Any, node: str | None, subresource: str = "") -> dict[str, Any]:
    doc = review("UPDATE", new, old, user=PLUGIN)
    if node is not None:
        doc["request"]["userInfo"]["extra"] = {"authentication.kubernetes.io/node-name": [node],
                                               "authentication.kubernetes.io/pod-name": ["gpushare-device-plugin-x"]}
    if subresource:
        doc["request"]["subResource"] = subresource
    return doc


@pytest.mark.parametrize(
    ("node", "subresource", "fragment"),
    [
        (NODE, "", None),
        (None, "", None),  # a token without a node (before Kubernetes 1.30): the node cannot be checked here
        ("gpu-node-2", "", f"The gpushare device plugin of node gpu-node-2 changed ALIYUN_COM_GPU_MEM_ASSIGNED of a "
                           f"pod bound to node {NODE}"),
        (NODE, "status", "updated pods/status, which it never needs"),
    ],
)
def test_the_plugin_tokens_node_reaches_the_rules(client: FlaskClient, node: str | None, subresource: str,
                                                  fragment: str | None) -> None:
    status, answer = post(client, "/validate", plugin_review(ASSIGNED_POD, ALLOCATED_POD, node, subresource))
    assert status == 200
    if fragment is None:
        assert answer["response"]["allowed"] is True, answer
    else:
        assert answer["response"]["allowed"] is False
        assert fragment in answer["response"]["status"]["message"]


def binding_review(annotations: dict[str, str] | None, user: str, *, legacy: bool = False) -> dict[str, Any]:
    """What kube-apiserver sends for POST pods/NAME/binding (or, `legacy`, POST bindings)."""
    request = {
        "uid": "u-bind", "kind": {"group": "", "version": "v1", "kind": "Binding"},
        "resource": {"group": "", "version": "v1", "resource": "bindings" if legacy else "pods"},
        "name": "job-0", "namespace": "ml", "operation": "CREATE",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": binding(annotations), "oldObject": None, "dryRun": False,
    }
    if not legacy:
        request["subResource"] = "binding"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@pytest.mark.parametrize("legacy", [False, True])
def test_a_binding_is_judged_by_validate(client: FlaskClient, legacy: bool, caplog: pytest.LogCaptureFixture) -> None:
    _, answer = post(client, "/validate", binding_review(None, EXTENDER, legacy=legacy))
    assert answer["response"] == {"uid": "u-bind", "allowed": True}
    with caplog.at_level(logging.INFO, logger="webhook.server.app"):
        _, answer = post(client, "/validate", binding_review({IDX: "0"}, "alice", legacy=legacy))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith(
        f"gpushare denied pod ml/job-0. The Binding carries annotation {IDX}, which the API server would copy onto "
        "the pod, but only the scheduler extender may place a pod's GPU and alice is not it")
    assert "validate ml/job-0 uid=u-bind CREATE pods/binding denied" in caplog.text


def test_a_binding_is_not_for_mutate(client: FlaskClient) -> None:
    res = client.post("/mutate", data=json.dumps(binding_review(None, EXTENDER)), content_type="application/json")
    assert res.status_code == 400
    assert "not a core/v1 Pod; register this endpoint for pods only" in res.get_data(as_text=True)
