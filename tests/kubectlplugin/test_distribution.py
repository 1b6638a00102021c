"""`kubectl gpushare` on its own: the kubectl-gpushare wheel, built from a copy of the checkout, holds only the plugin
and what it imports, depends on no server package, runs from a fresh virtual environment against the test API
server, and its krew archive and manifest name the release."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml

from kubectlplugin import krew, render
from tests.harness.apiserver.server import ApiServer
from tests.harness.kubectl_alone import install_alone, wheel_from_copy
from tests.kubectlplugin.test_render import golden_report
from tests.test_architecture import PLUGIN_PROJECT

pytestmark = pytest.mark.timeout(120)

SERVER_DISTRIBUTIONS = ("flask", "gunicorn", "grpcio", "protobuf", "nvidia-ml-py", "prometheus-client",
                        "cryptography", "jsonpatch", "orjson")
SERVER_MODULES = ("flask", "werkzeug", "gunicorn", "grpc", "google.protobuf", "pynvml", "prometheus_client",
                  "cryptography", "jsonpatch", "orjson", "webhook", "deviceplugin", "certs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheel_from_copy(tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("wheel"))


def metadata(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    with zipfile.ZipFile(wheel) as opened:
        names = opened.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(opened.read(meta).decode())
    return names, {key: message.get_all(key) or [] for key in ("Name", "Version", "Requires-Dist")}


def test_the_wheel_holds_the_plugin_and_requires_only_the_kubernetes_client(wheel: Path) -> None:
    names, meta = metadata(wheel)
    assert meta["Name"] == ["kubectl-gpushare"]
    assert meta["Version"] == [krew.project_version()]
    assert sorted(meta["Requires-Dist"]) == ["PyYAML>=6.0", "kubernetes>=34.1", "urllib3>=2"]
    required = " ".join(meta["Requires-Dist"]).lower()
    assert not [d for d in SERVER_DISTRIBUTIONS if d in required]
    modules = {n.removesuffix(".py").replace("/", ".") for n in names if n.endswith(".py")}
    listed = set(tomllib.loads(PLUGIN_PROJECT.read_text())["tool"]["setuptools"]["py-modules"])
    assert modules == listed | {"common.__init__", "contract.__init__", "kubectlplugin.__init__"}
    assert {n.split("/")[0] for n in names if not n.startswith("kubectl_gpushare-")} == {
        "common", "contract", "kubectlplugin"}


@pytest.fixture(scope="module")
def alone(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("alone")
    install_alone(wheel, home)
    return home


PROBE = """\
import json, sys
from kubectlplugin import cli
code = cli.main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"common", "contract", "kubectlplugin"})
print(json.dumps({"code": code, "file": cli.__file__, "loaded": loaded, "all": sorted(sys.modules)}), file=sys.stderr)
"""


def test_the_installed_plugin_runs_alone_against_an_api_server(alone: Path, api: ApiServer, tmp_path: Path) -> None:
    config = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
    done = subprocess.run([str(alone / "bin" / "python"), "-c", PROBE, "-o", "json", "--kubeconfig", str(config)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
    *_, last = done.stderr.splitlines() or [""]
    seen = json.loads(last)
    assert seen["code"] == 0, done.stderr
    assert json.loads(done.stdout) == render.document(golden_report())
    assert seen["file"].startswith(str(alone)), seen["file"]
    assert not [m for m in seen["all"] if m.split(".")[0] in SERVER_MODULES or m in SERVER_MODULES]
    version = subprocess.run([str(alone / "bin" / "kubectl-gpushare"), "--version"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60, check=True)
    assert version.stdout == f"kubectl-gpushare {krew.project_version()}\n"


def test_the_krew_archive_runs_and_the_manifest_names_it(wheel: Path, tmp_path: Path) -> None:
    archive, out = tmp_path / "kubectl-gpushare.tar.gz", tmp_path / "gpushare.yaml"
    assert krew.main(["--wheel", str(wheel), "--archive", str(archive), "--out", str(out),
                      "--uri", "https://example.org/kubectl-gpushare.tar.gz"]) == 0
    with tarfile.open(archive) as opened:
        members = {m.name: m.mode for m in opened.getmembers()}
        opened.extractall(tmp_path / "installed", filter="data")
    assert members == {"kubectl-gpushare": 0o755, wheel.name: 0o644, "LICENSE": 0o644}
    doc = yaml.safe_load(out.read_text())
    (platform,) = doc["spec"]["platforms"]
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"], doc["spec"]["version"]) == (
        "krew.googlecontainertools.github.com/v1alpha2", "Plugin", "gpushare", f"v{krew.project_version()}")
    assert (platform["uri"], platform["sha256"], platform["bin"]) == (
        "https://example.org/kubectl-gpushare.tar.gz", krew.sha256(archive), "kubectl-gpushare")
    assert "python3 (3.11 or newer) with the kubernetes Python client" in doc["spec"]["caveats"]
    again = tmp_path / "again.tar.gz"
    assert krew.write_archive(wheel, again) == krew.sha256(archive)  # the same wheel gives the same archive
    launcher = tmp_path / "installed" / "kubectl-gpushare"
    shown = subprocess.run([sys.executable, str(launcher), "--version"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=60, check=True)
    assert shown.stdout == f"kubectl-gpushare {krew.project_version()}\n"


def test_the_manifest_refuses_an_archive_of_another_version(wheel: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "a.tar.gz"
    krew.write_archive(wheel, archive)
    assert krew.main(["--archive", str(archive), "--out", str(tmp_path / "m.yaml"), "--version", "v9.9.9"]) == 1
    assert capsys.readouterr().err == (f"error: The archive {archive} holds version {krew.project_version()}, not "
                                       f"9.9.9; pass --version {krew.project_version()} or write the archive again\n")
