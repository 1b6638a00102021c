"""The installed `kubectl-gpushare` executable (and `kubectl gpushare`, where kubectl is installed) against the test
API server holding the golden cluster: the same tables as the golden file, the same JSON, one line on failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubectlplugin import render
from tests.harness.apiserver.auth import user
from tests.harness.apiserver.server import ApiServer
from tests.kubectlplugin.test_render import GOLDEN, golden_report

EXECUTABLE = Path(sys.executable).parent / "kubectl-gpushare"
KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not EXECUTABLE.exists(), reason="kubectl-gpushare is not installed; run `pip install -e .`"),
]


def run(*args: str, home: Path, env: dict[str, str] | None = None, kubectl: bool = False
        ) -> subprocess.CompletedProcess[str]:
    base = {"PATH": f"{EXECUTABLE.parent}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home)}
    argv = [KUBECTL or "kubectl", "gpushare", *args] if kubectl else [str(EXECUTABLE), *args]
    return subprocess.run(argv, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def admin(api: ApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "admin.kubeconfig")


def test_the_table_is_the_golden_one(admin: Path, tmp_path: Path) -> None:
    done = run("-d", "--kubeconfig", str(admin), home=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == GOLDEN.read_text()


def test_json_and_kubeconfig_from_the_environment(admin: Path, tmp_path: Path) -> None:
    done = run("-o", "json", home=tmp_path, env={"KUBECONFIG": f"{tmp_path / 'absent'}:{admin}"})
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == render.document(golden_report())


def test_namespace_and_node_arguments(admin: Path, tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    shutil.copy(admin, tmp_path / ".kube" / "config")
    doc = json.loads(run("-n", "legacy", "-o", "json", "gpu-a", home=tmp_path).stdout)
    assert doc["namespace"] == "legacy"
    assert [(n["name"], [(g["index"], g["promised"]) for g in n["gpus"]]) for n in doc["nodes"]] == [
        ("gpu-a", [(0, 0), (1, 6)])]
    assert doc["pending"] == []


@pytest.mark.parametrize(("args", "expected"), [
    (["--kubeconfig", "/nonexistent/kubeconfig"],
     "error: The kubeconfig /nonexistent/kubeconfig given by --kubeconfig does not exist; pass the path of an "
     "existing kubeconfig file.\n"),
    (["--context", "nowhere"], "error: The kubeconfig {admin} has no context 'nowhere' (it has sim); pass one of them "
     "with --context.\n"),
])
def test_a_bad_kubeconfig_gives_one_line_and_exit_1(args: list[str], expected: str, admin: Path,
                                                     tmp_path: Path) -> None:
    done = run(*args, home=tmp_path, env={"KUBECONFIG": str(admin)})
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == expected.format(admin=admin)


def test_forbidden_access_gives_one_line_and_exit_1(api: ApiServer, tmp_path: Path) -> None:
    bob = api.write_kubeconfig(tmp_path / "bob", api.add_user(user("bob")))
    done = run("--kubeconfig", str(bob), "-n", "ml", home=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith('error: You may not list nodes (403 Forbidden: nodes is forbidden: User "bob" '
                                  'cannot list resource "nodes" in API group "" at the cluster scope); ask for a role')


def test_bad_arguments_exit_2_and_help_lists_the_settings(tmp_path: Path) -> None:
    done = run("-o", "yaml", home=tmp_path)
    assert done.returncode == 2 and "invalid choice: 'yaml'" in done.stderr
    assert run("-n", "a", "-A", home=tmp_path).returncode == 2
    assert run("--request-timeout", "-1", home=tmp_path).returncode == 2
    bad_unit = run(home=tmp_path, env={"GPUSHARE_UNIT": "TiB"})
    assert bad_unit.returncode == 2 and "GPUSHARE_UNIT" in bad_unit.stderr
    shown = run("--help", home=tmp_path).stdout
    for setting in ("GPUSHARE_RESOURCE_NAME", "GPUSHARE_UNIT", "GPUSHARE_ANNOTATION_PREFIX", "KUBECONFIG",
                    "--kubeconfig", "--context", "--namespace", "--all-namespaces", "Exit status"):
        assert setting in shown
    assert run("--version", home=tmp_path).stdout.startswith("kubectl-gpushare ")
    assert shown.startswith("usage: kubectl gpushare [NODE ...]")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed; `./dev test` installs it where it can")
def test_kubectl_finds_the_plugin(admin: Path, tmp_path: Path) -> None:
    done = run("-d", "--kubeconfig", str(admin), home=tmp_path, kubectl=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == GOLDEN.read_text()
    listed = subprocess.run([str(KUBECTL), "plugin", "list"], capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{EXECUTABLE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                                 "HOME": str(tmp_path)}, check=False)
    assert str(EXECUTABLE) in listed.stdout
