"""Start-up of the real webhook commands: every bad setting or file is one line naming the variable, exit 2."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from certs.build import build_ca, dev_bundle
from certs.cli import write_files
from tests.harness.webhook.server import REPO, free_port

pytestmark = pytest.mark.timeout(120)

BIN = Path(sys.executable).parent
NOW = datetime.datetime.now(datetime.UTC)
WEBHOOK = [str(BIN / "gpushare-webhook"), "--no-dev"]
GUNICORN = [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py")]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("files")
    write_files(directory, dev_bundle(NOW))
    return directory


def good_env(files: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update({
        "GPUSHARE_TLS_CERT": str(files / "tls.crt"), "GPUSHARE_TLS_KEY": str(files / "tls.key"),
        "GPUSHARE_SIGNING_KEY": str(files / "signing.key"), "GPUSHARE_BIND": f"127.0.0.1:{free_port()}",
        "GPUSHARE_METRICS_BIND": f"127.0.0.1:{free_port()}",
    })
    return env


def start(command: list[str], env: dict[str, str], cwd: Path) -> tuple[int, list[str]]:
    """Run the command; it must stop by itself (a webhook that starts serving fails the test by timing out)."""
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stderr.splitlines()


def assert_one_line(code: int, lines: list[str], *fragments: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("The webhook cannot start: ") and lines[0].endswith(".")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("command", [WEBHOOK, GUNICORN], ids=["gpushare-webhook", "gunicorn"])
def test_defaults_without_files_name_each_missing_file(command: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env["GPUSHARE_METRICS_BIND"] = f"127.0.0.1:{free_port()}"  # the default port may be taken on a test machine
    code, lines = start(command, env, tmp_path)
    assert code == 2
    assert [line.split("=")[0] for line in lines] == [
        "The webhook cannot start: GPUSHARE_TLS_CERT", "The webhook cannot start: GPUSHARE_TLS_KEY",
        "The webhook cannot start: GPUSHARE_SIGNING_KEY",
    ]
    assert all("does not exist; mount the gpushare-" in line for line in lines)


def write(directory: Path, name: str, data: bytes) -> str:
    path = directory / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("command", [WEBHOOK, GUNICORN], ids=["gpushare-webhook", "gunicorn"])
@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        ("bind without port", ("GPUSHARE_BIND='nonsense' is not valid: it has no :PORT",)),
        ("bind host unknown", ("GPUSHARE_BIND=no-such-host.invalid:8443: the host no-such-host.invalid does not",)),
        ("signing key garbage", ("GPUSHARE_SIGNING_KEY=", "is not an unencrypted PEM private key")),
        ("signing key not Ed25519", ("GPUSHARE_SIGNING_KEY=", "not an Ed25519 key")),
        ("key of another certificate", ("GPUSHARE_TLS_KEY=", "is not the key of the certificate in GPUSHARE_TLS_CERT")),
        ("certificate not PEM", ("GPUSHARE_TLS_CERT=", "holds no PEM certificate")),
        ("key not PEM", ("GPUSHARE_TLS_KEY=", "is not an unencrypted PEM private key")),
        ("certificate is a directory", ("GPUSHARE_TLS_CERT=", "is not a file")),
        ("log format", ("GPUSHARE_LOG_FORMAT='xml' is not valid; expected text or json",)),
        ("delivery", ("GPUSHARE_DELIVERY",)),
    ],
)
def test_each_bad_setting_is_one_line_naming_the_variable(
    command: list[str], case: str, fragments: tuple[str, ...], files: Path, tmp_path: Path
) -> None:
    env = good_env(files)
    other = build_ca(NOW)  # an EC key pair unrelated to the serving certificate
    change = {
        "bind without port": {"GPUSHARE_BIND": "nonsense"},
        "bind host unknown": {"GPUSHARE_BIND": "no-such-host.invalid:8443"},
        "signing key garbage": {"GPUSHARE_SIGNING_KEY": write(tmp_path, "s.key", b"not a key\n")},
        "signing key not Ed25519": {"GPUSHARE_SIGNING_KEY": write(tmp_path, "ec.key", other.key_pem)},
        "key of another certificate": {"GPUSHARE_TLS_KEY": write(tmp_path, "other.key", other.key_pem)},
        "certificate not PEM": {"GPUSHARE_TLS_CERT": write(tmp_path, "tls.crt", b"\x00\x01binary")},
        "key not PEM": {"GPUSHARE_TLS_KEY": write(tmp_path, "tls.key", b"-----BEGIN NOTHING-----\n")},
        "certificate is a directory": {"GPUSHARE_TLS_CERT": str(tmp_path)},
        "log format": {"GPUSHARE_LOG_FORMAT": "xml"},
        "delivery": {"GPUSHARE_DELIVERY": "carrier-pigeon"},
    }[case]
    env.update(change)
    assert_one_line(*start(command, env, tmp_path), *fragments)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("variable", ["GPUSHARE_BIND", "GPUSHARE_METRICS_BIND"])
def test_an_address_in_use_is_one_line_not_a_bind_retry_loop(
    files: Path, tmp_path: Path, listener: int, variable: str
) -> None:
    env = good_env(files)
    env[variable] = f"127.0.0.1:{listener}"
    assert_one_line(*start(WEBHOOK, env, tmp_path), f"{variable}=127.0.0.1:{listener} cannot be bound",
                    "another program listens there")
