"""Serving: the reloading TLS context, the dev start-up (`python -m webhook.server.serve`) and its curl line."""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs.build import Issued, build_ca, build_serving_cert, dev_bundle
from certs.cli import write_files
from tests.harness.webhook.server import REPO, free_port
from webhook.rules.review import parse_review
from webhook.server.serve import SAMPLE_REVIEW, ReloadingTLS, curl_line, main, prepare_dev, sample_review

NOW = datetime.datetime.now(datetime.UTC)


def serial_of(context: ssl.SSLContext, directory: Path) -> int:
    """The serial number the context serves, by a handshake over a socket pair."""
    server_sock, client_sock = socket.socketpair()
    client = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    client.check_hostname = False
    with server_sock, client_sock:
        server = context.wrap_socket(server_sock, server_side=True, do_handshake_on_connect=False)
        tls = client.wrap_socket(client_sock, do_handshake_on_connect=False)
        server.setblocking(False)
        tls.setblocking(False)
        done = [False, False]
        while not all(done):
            for i, side in enumerate((server, tls)):
                if not done[i]:
                    try:
                        side.do_handshake()
                        done[i] = True
                    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        pass
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_reloading_context_follows_the_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_files(tmp_path, dev_bundle(NOW))
    tls = ReloadingTLS(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    first = tls.context()
    assert first.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.context() is first  # unchanged files: the cached context
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    fresh = build_serving_cert(Issued(ca_key, ca_cert), NOW)
    write_files(tmp_path, {"tls.crt": fresh.cert_pem, "tls.key": fresh.key_pem})
    second = tls.context()
    assert second is not first
    assert serial_of(second, tmp_path) == fresh.cert.serial_number

    (tmp_path / "tls.key").write_bytes(build_ca(NOW).key_pem)  # does not match tls.crt
    assert tls.context() is second
    assert tls.context() is second
    assert caplog.text.count("still serving the previous certificate") == 1
    (tmp_path / "tls.crt").unlink()  # mid-swap: a file briefly missing
    assert tls.context() is second


def test_first_load_failure_is_raised(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ReloadingTLS(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")).context()


@pytest.mark.parametrize(
    ("bind", "url"),
    [("127.0.0.1:8443", "https://127.0.0.1:8443/mutate"), ("0.0.0.0:9443", "https://127.0.0.1:9443/mutate"),
     ("localhost:8443", "https://localhost:8443/mutate")],
)
def test_curl_line(bind: str, url: str) -> None:
    line = curl_line(bind, Path("/d"))
    assert line == f"curl -sS --cacert /d/ca.crt -H 'Content-Type: application/json' --data @/d/{SAMPLE_REVIEW} {url}"


def test_sample_review_is_a_valid_review() -> None:
    req = parse_review(json.dumps(sample_review()).encode(), 1 << 20)
    assert req["operation"] == "CREATE"


def test_prepare_dev_creates_missing_files_once(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    prepare_dev(tmp_path, env)
    ca = (tmp_path / "ca.crt").read_bytes()
    assert env["GPUSHARE_TLS_CERT"] == str(tmp_path / "tls.crt")
    assert env["GPUSHARE_SIGNING_KEY"] == str(tmp_path / "signing.key")
    prepare_dev(tmp_path, env)
    assert (tmp_path / "ca.crt").read_bytes() == ca
    assert (tmp_path / SAMPLE_REVIEW).is_file()


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [({"GPUSHARE_UNIT": "TB"}, "GPUSHARE_UNIT"), ({"GPUSHARE_WORKERS": "0"}, "GPUSHARE_WORKERS=")],
)
def test_bad_settings_exit_2_with_the_variable_named(
    environ: dict[str, str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--no-dev"], environ=environ) == 2
    err = capsys.readouterr().err
    assert err.startswith("The webhook cannot start:")
    assert fragment in err
    assert "Traceback" not in err


def _dev_venv() -> dict[str, str]:
    """`./dev serve` run with the virtual environment of this test run, where `./dev` set it up (else it would
    install the project into it first)."""
    venv = Path(sys.executable).parent.parent
    stamp = venv / ".gpushare-installed"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != want:
        pytest.skip(f"{venv} was not set up by ./dev for this pyproject.toml (no current .gpushare-installed)")
    return {"GPUSHARE_VENV": str(venv)}


# The README's main command as written, and the module it runs.
@pytest.mark.parametrize("argv", [["./dev", "serve"], [sys.executable, "-m", "webhook.server.serve"]],
                         ids=["./dev serve", "python -m webhook.server.serve"])
@pytest.mark.timeout(60)
def test_webhook_serve_prints_a_working_curl_line(tmp_path: Path, argv: list[str]) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update({"GPUSHARE_DEV_CERTS": str(tmp_path / "dev"), "GPUSHARE_BIND": f"127.0.0.1:{port}",
                "GPUSHARE_METRICS_BIND": f"127.0.0.1:{free_port()}", "GPUSHARE_WORKERS": "1", "GPUSHARE_THREADS": "2"})
    if argv[0] == "./dev":
        env.update(_dev_venv())
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].strip().startswith("curl"):
            line = process.stdout.readline()
            assert line, f"serve exited early: {lines}"
            lines.append(line)
        command = lines[-1].strip()
        assert command == curl_line(f"127.0.0.1:{port}", tmp_path / "dev")
        context = ssl.create_default_context(cafile=str(tmp_path / "dev" / "ca.crt"))
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
                conn.request("POST", "/mutate", body=(tmp_path / "dev" / SAMPLE_REVIEW).read_bytes(),
                             headers={"Content-Type": "application/json"})
                answer = json.loads(conn.getresponse().read())
                conn.close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the dev server never answered"
                time.sleep(0.1)
        assert answer["response"]["allowed"] is True
        assert json.loads(base64.b64decode(answer["response"]["patch"]))
        if shutil.which("curl"):
            out = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=20, check=True)
            assert '"patchType":"JSONPatch"' in out.stdout.replace(" ", "")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


@pytest.mark.timeout(60)
def test_gunicorn_config_with_bad_settings_exits_2_with_the_variable_named() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env["GPUSHARE_DELIVERY"] = "carrier-pigeon"
    out = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py")], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert out.returncode == 2
    assert "The webhook cannot start:" in out.stderr
    assert "GPUSHARE_DELIVERY" in out.stderr
    assert "Traceback" not in out.stderr
