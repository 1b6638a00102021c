"""The real gunicorn server over TLS on 127.0.0.1: verified against the generated CA, real reviews, rotation."""

from __future__ import annotations

import base64
import datetime
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from certs.build import build_ca
from contract import IDX, parse_intent, signing
from contract.env import expected_env
from tests.harness.pods import EXTENDER, annotate, container, pod, review
from tests.harness.webhook.server import HOST, RunningWebhook, webhook_server
from tests.webhook.rules.test_envrules import ATTACKS, ephemeral

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("hook"), {"GPUSHARE_MAX_BODY_BYTES": "100000"}) as running:
        yield running


def patched(answer: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    out: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return out


def test_certificate_verifies_against_the_generated_ca_only(hook: RunningWebhook, tmp_path: Path) -> None:
    with (
        socket.create_connection((HOST, hook.port), timeout=10) as raw,
        hook.ssl_context().wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    stranger = tmp_path / "other-ca.crt"
    stranger.write_bytes(build_ca(datetime.datetime.now(datetime.UTC)).cert_pem)
    with (
        socket.create_connection((HOST, hook.port), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ssl.create_default_context(cafile=str(stranger)).wrap_socket(raw, server_hostname=HOST)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_tls_below_1_2_is_refused(hook: RunningWebhook) -> None:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(cafile=str(hook.ca_path))
    try:
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        old.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1 as a client")
    with socket.create_connection((HOST, hook.port), timeout=10) as raw, pytest.raises(ssl.SSLError):
        old.wrap_socket(raw, server_hostname=HOST)


@pytest.mark.parametrize("name", ["trainer-0", None])
def test_mutate_over_tls_and_apply_the_patch(hook: RunningWebhook, name: str | None) -> None:
    spec = pod(container("main", 4), container("helper", 2), container("cpu"), inits=[container("load", 1)], name=name)
    status, answer = hook.post_json("/mutate", review("CREATE", spec, uid="u-tls"))
    assert status == 200
    assert (answer["apiVersion"], answer["kind"], answer["response"]["uid"]) == (
        "admission.k8s.io/v1", "AdmissionReview", "u-tls")
    assert answer["response"]["patchType"] == "JSONPatch"
    out = patched(answer, spec)
    annotations = out["metadata"]["annotations"]
    intent = parse_intent(annotations["gpushare.io/intent"])
    assert (dict(intent.containers), dict(intent.init_containers), intent.total) == ({"main": 4, "helper": 2},
                                                                                    {"load": 1}, 6)
    assert signing.verify(hook.public_key, annotations["gpushare.io/intent"], "ml",
                          annotations["gpushare.io/intent-signature"])
    assert out["spec"]["containers"][0]["env"] == expected_env(4, 6)
    assert out["spec"]["initContainers"][0]["env"] == expected_env(1, 6)
    assert out["spec"]["containers"][2]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]

    status, again = hook.post_json("/mutate", review("CREATE", out))
    assert "patch" not in again["response"]
    status, verdict = hook.post_json("/validate", review("CREATE", out))
    assert verdict["response"] == {"uid": "uid-1", "allowed": True}
    placed = json.loads(json.dumps(out))
    placed["metadata"]["annotations"].update({IDX: "0", "ALIYUN_COM_GPU_MEM_DEV": "8", "ALIYUN_COM_GPU_MEM_POD": "6"})
    status, verdict = hook.post_json("/validate", review("UPDATE", placed, old=out, user=EXTENDER))
    assert verdict["response"]["allowed"] is True
    status, verdict = hook.post_json("/validate", review("UPDATE", placed, old=out, user="bob"))
    assert verdict["response"]["allowed"] is False
    assert f"Annotation {IDX} was added by bob" in verdict["response"]["status"]["message"]


def test_a_user_set_visible_devices_is_denied_in_the_one_call_of_a_gpu_share_pod(hook: RunningWebhook) -> None:
    """The mutating entry judges the GPU-share pod it stamps: no patch, the CREATE rules' denial; /validate says the
    same of the pod (without the stamp it lacks the intent too)."""
    spec = pod(container("main", 1, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))
    _, answer = hook.post_json("/mutate", review("CREATE", spec))
    assert answer["response"]["allowed"] is False and "patch" not in answer["response"]
    assert "Container 'main' sets NVIDIA_VISIBLE_DEVICES itself" in answer["response"]["status"]["message"]
    _, verdict = hook.post_json("/validate", review("CREATE", spec))
    assert verdict["response"]["allowed"] is False
    assert "Container 'main' sets NVIDIA_VISIBLE_DEVICES itself" in verdict["response"]["status"]["message"]


@pytest.mark.parametrize(("case", "spec", "fragments"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_containers_without_gpu_share_are_refused_gpus(
    hook: RunningWebhook, case: str, spec: dict[str, Any], fragments: list[str]
) -> None:
    _, answer = hook.post_json("/mutate", review("CREATE", spec))
    out = patched(answer, spec) if "patch" in answer["response"] else spec
    _, verdict = hook.post_json("/validate", review("CREATE", out))
    assert verdict["response"]["allowed"] is False, case
    message = verdict["response"]["status"]["message"]
    assert all(f[0].upper() + f[1:] in message or f in message for f in fragments), case


def test_ordinary_pod_is_neutralised_and_passes(hook: RunningWebhook) -> None:
    spec = pod(container("cpu"), inits=[container("init")])
    _, answer = hook.post_json("/mutate", review("CREATE", spec))
    out = patched(answer, spec)
    void = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert out["spec"]["containers"][0]["env"] == out["spec"]["initContainers"][0]["env"] == void
    _, verdict = hook.post_json("/validate", review("CREATE", out))
    assert verdict["response"]["allowed"] is True


def test_ephemeral_container_and_status_update_paths(hook: RunningWebhook) -> None:
    running = pod(container("cpu", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]))
    debug = ephemeral(running, {"name": "dbg", "image": "cuda:12"})
    req = review("UPDATE", debug, old=running)
    req["request"]["subResource"] = "ephemeralcontainers"
    _, answer = hook.post_json("/mutate", req)
    assert patched(answer, debug)["spec"]["ephemeralContainers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    req = review("UPDATE", ephemeral(running, {"name": "dbg", "image": "cuda:12", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}), old=running)
    req["request"]["subResource"] = "ephemeralcontainers"
    _, verdict = hook.post_json("/validate", req)
    assert verdict["response"]["allowed"] is False
    assert "Ephemeral container 'dbg' sets NVIDIA_VISIBLE_DEVICES" in verdict["response"]["status"]["message"]

    blocking = annotate(running, {IDX: "1", "ALIYUN_COM_GPU_MEM_POD": "16", "ALIYUN_COM_GPU_MEM_DEV": "16"})
    req = review("UPDATE", blocking, old=running, user="system:node:n1")
    req["request"]["subResource"] = "status"
    _, verdict = hook.post_json("/validate", req)
    assert verdict["response"]["allowed"] is False
    assert f"Annotation {IDX} was added by system:node:n1" in verdict["response"]["status"]["message"]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"<html>", "not JSON"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "no request object"),
        (json.dumps(review("CREATE", pod())).replace('"Pod"', '"Node"', 1).encode(), "not a core/v1 Pod"),
        (b"{" + b" " * 100001 + b"}", "over the 100000-byte limit"),
        (b"[" * 40000 + b"]" * 40000, "nests deeper than"),
        (json.dumps(review("CREATE", {"metadata": {"annotations": ["x"]}})).encode(), "annotations is list"),
        (json.dumps(review("CREATE", pod(container("a", 1), annotations={IDX: "9" * 5000}))).encode(), None),
    ],
)
def test_malformed_bodies_get_400(hook: RunningWebhook, path: str, body: bytes, fragment: str | None) -> None:
    status, text = hook.request("POST", path, body)
    if fragment is None:  # well-formed, with a value nobody can parse: answered, never a 500
        assert status == 200
        return
    assert status == 400
    assert fragment in text.decode()
    assert text.count(b"\n") == 1


def test_cdi_delivery_injects_no_env(tmp_path: Path) -> None:
    with webhook_server(tmp_path, {"GPUSHARE_DELIVERY": "cdi"}) as cdi:
        spec = pod(container("main", 2))
        _, answer = cdi.post_json("/mutate", review("CREATE", spec))
        out = patched(answer, spec)
    assert "gpushare.io/intent" in out["metadata"]["annotations"]
    assert "env" not in out["spec"]["containers"][0]


def test_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    with webhook_server(tmp_path) as running:
        first = running.peer_certificate()
        rotated = running.rotate()
        assert rotated.serial_number != first.serial_number
        assert running.peer_certificate().serial_number == rotated.serial_number

        # A broken pair (certificate and key that do not match) keeps the last good certificate in service.
        (tmp_path / "tls.key").write_bytes(build_ca(rotated.not_valid_before_utc).key_pem)
        assert running.peer_certificate().serial_number == rotated.serial_number
        status, _ = running.request("GET", "/healthz")
        assert status == 200
        deadline = time.monotonic() + 10
        while "still serving the previous certificate" not in running.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "still serving the previous certificate" in running.log_text()

        healed = running.rotate()
        assert running.peer_certificate().serial_number == healed.serial_number
